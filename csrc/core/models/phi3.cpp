// Phi-3 / Phi-3.5: the llama recipe over fused tensors, which GGUF keeps fused:
//   attn_qkv = [Wq; Wk; Wv] (rows q, then k, then v)   ffn_up = [Wgate; Wup] (gate rows first)
// bound as row ranges of the one tensor, in place. RoPE: neox pairs; the 128k models' LongRoPE
// factors (short below the original context, long above) divide the frequencies.
#include <stdexcept>

#include "models.h"

namespace edgerunner {
namespace {

// Rows [r0, r0 + rows) of w, in place.
Weight rows_of(const Weight& w, int64_t r0, int64_t rows) {
    Weight v = w;
    v.data = w.data + static_cast<size_t>(r0) * w.row_bytes;
    v.rows = rows;
    return v;
}

}  // namespace

ModelWeights bind_phi3_weights(const GGUFFile& f, const ModelConfig& c) {
    ModelWeights m;
    const int64_t q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
    bind_embeddings_and_head(f, c, m);
    if (c.rope_longrope) {  // Model::load picks one set for its context length
        m.rope_factors_short = bind_f32(f, "rope_factors_short.weight", c.rope_dim / 2);
        m.rope_factors_long = bind_f32(f, "rope_factors_long.weight", c.rope_dim / 2);
    }
    for (int64_t i = 0; i < c.n_layer; ++i) {
        const std::string p = "blk." + std::to_string(i) + ".";
        LayerWeights l;
        l.attn_norm = bind_f32(f, p + "attn_norm.weight", c.n_embd);
        const Weight qkv = bind(f, p + "attn_qkv.weight", c.n_embd, q_dim + 2 * kv_dim);
        l.wq = rows_of(qkv, 0, q_dim);
        l.wk = rows_of(qkv, q_dim, kv_dim);
        l.wv = rows_of(qkv, q_dim + kv_dim, kv_dim);
        l.wo = bind(f, p + "attn_output.weight", q_dim, c.n_embd);
        l.ffn_norm = bind_f32(f, p + "ffn_norm.weight", c.n_embd);
        const Weight gate_up = bind(f, p + "ffn_up.weight", c.n_embd, 2 * c.n_ff);
        l.w_gate = rows_of(gate_up, 0, c.n_ff);
        l.w_up = rows_of(gate_up, c.n_ff, c.n_ff);
        l.w_down = bind(f, p + "ffn_down.weight", c.n_ff, c.n_embd);
        m.layers.push_back(l);
    }
    return m;
}

}  // namespace edgerunner
