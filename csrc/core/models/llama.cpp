// The llama family (llama, qwen2, qwen3): tensor names and the recipe of one step.
//
//   x = embed(tokens)
//   per layer:  h = rms_norm(x) · attn_norm
//               q, k, v = Wq h (+bq), Wk h (+bk), Wv h (+bv)      qwen2: biases
//               q, k = head_rms_norm(q, k)                         qwen3
//               q, k = rope(q, k); cache ← k, v
//               x += Wo attention(q, cache)
//               h = rms_norm(x) · ffn_norm
//               x += Wdown (silu(Wgate h) * Wup h)
//   logits = Woutput (rms_norm(x) · output_norm)                    tied: Woutput = token_embd
#include <stdexcept>
#include <string>

#include "models.h"

namespace edgerunner {

Weight bind(const GGUFFile& f, const std::string& name, int64_t cols, int64_t rows, bool optional) {
    const GGUFTensorInfo* t = f.find_tensor(name);
    if (!t) {
        if (optional) return {};
        throw std::invalid_argument(f.path() + ": tensor '" + name + "' is missing");
    }
    const int64_t got_cols = static_cast<int64_t>(t->shape[0]);
    const int64_t got_rows = t->shape.size() > 1 ? static_cast<int64_t>(t->shape[1]) : 1;
    bool extra_dims = false;
    for (size_t d = 2; d < t->shape.size(); ++d) extra_dims |= t->shape[d] != 1;
    if (got_cols != cols || got_rows != rows || extra_dims)
        throw std::invalid_argument(f.path() + ": tensor '" + name + "' has shape [" + std::to_string(got_cols) + ", " +
                                    std::to_string(got_rows) + "], expected [" + std::to_string(cols) + ", " +
                                    std::to_string(rows) + "] from the model's hyperparameters");
    const auto info = tensor_type_info(t->type);
    if (!info.dequantize)
        throw std::invalid_argument(f.path() + ": tensor '" + name + "' has type " + std::string(info.name) +
                                    ", which this build does not support; supported: " +
                                    std::string(dequantizable_type_names()));
    Weight w;
    w.name = t->name;
    w.data = f.tensor_data(*t);
    w.type = t->type;
    w.cols = cols;
    w.rows = rows;
    w.row_bytes = static_cast<size_t>(cols / info.block_size) * info.type_size;
    return w;
}

Weight bind_f32(const GGUFFile& f, const std::string& name, int64_t n, bool optional) {
    Weight w = bind(f, name, n, 1, optional);
    if (w.data && w.type != TensorType::F32)
        throw std::invalid_argument(f.path() + ": tensor '" + name + "' has type " +
                                    std::string(tensor_type_name(w.type)) + "; norm weights and biases must be F32");
    return w;
}

void bind_embeddings_and_head(const GGUFFile& f, const ModelConfig& c, ModelWeights& m) {
    m.token_embd = bind(f, "token_embd.weight", c.n_embd, c.n_vocab);
    m.output_norm = bind_f32(f, "output_norm.weight", c.n_embd);
    m.output = c.tied_output ? m.token_embd : bind(f, "output.weight", c.n_embd, c.n_vocab);
}

ModelWeights bind_llama_weights(const GGUFFile& f, const ModelConfig& c) {
    ModelWeights m;
    const int64_t q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
    bind_embeddings_and_head(f, c, m);
    if (c.rope_freq_factors) m.rope_freqs = bind_f32(f, "rope_freqs.weight", c.rope_dim / 2);
    for (int64_t i = 0; i < c.n_layer; ++i) {
        const std::string p = "blk." + std::to_string(i) + ".";
        LayerWeights l;
        l.attn_norm = bind_f32(f, p + "attn_norm.weight", c.n_embd);
        l.wq = bind(f, p + "attn_q.weight", c.n_embd, q_dim);
        l.wk = bind(f, p + "attn_k.weight", c.n_embd, kv_dim);
        l.wv = bind(f, p + "attn_v.weight", c.n_embd, kv_dim);
        l.bq = bind_f32(f, p + "attn_q.bias", q_dim, !c.qkv_bias);
        l.bk = bind_f32(f, p + "attn_k.bias", kv_dim, !c.qkv_bias);
        l.bv = bind_f32(f, p + "attn_v.bias", kv_dim, !c.qkv_bias);
        if (c.qk_norm) {
            l.q_norm = bind_f32(f, p + "attn_q_norm.weight", c.head_dim);
            l.k_norm = bind_f32(f, p + "attn_k_norm.weight", c.head_dim);
        }
        l.wo = bind(f, p + "attn_output.weight", q_dim, c.n_embd);
        l.ffn_norm = bind_f32(f, p + "ffn_norm.weight", c.n_embd);
        l.w_gate = bind(f, p + "ffn_gate.weight", c.n_embd, c.n_ff);
        l.w_up = bind(f, p + "ffn_up.weight", c.n_embd, c.n_ff);
        l.w_down = bind(f, p + "ffn_down.weight", c.n_ff, c.n_embd);
        m.layers.push_back(l);
    }
    return m;
}

Plan build_llama_plan(const ModelConfig& c, const ModelWeights& m, StepKind kind, int64_t max_tokens) {
    Plan plan{kind, max_tokens, {}};
    auto& ops = plan.ops;
    auto opt = [](const Weight& w) { return w.data ? &w : nullptr; };
    ops.push_back({OpKind::Embed, Buf::X, Buf::X, &m.token_embd});
    for (int32_t i = 0; i < static_cast<int32_t>(c.n_layer); ++i) {
        const LayerWeights& l = m.layers[i];
        ops.push_back({OpKind::RmsNorm, Buf::X, Buf::XN, &l.attn_norm});
        ops.push_back({OpKind::MatMul, Buf::XN, Buf::Q, &l.wq, opt(l.bq)});
        ops.push_back({OpKind::MatMul, Buf::XN, Buf::K, &l.wk, opt(l.bk)});
        ops.push_back({OpKind::MatMul, Buf::XN, Buf::V, &l.wv, opt(l.bv)});
        if (c.qk_norm) {
            ops.push_back({OpKind::HeadRmsNorm, Buf::Q, Buf::Q, &l.q_norm, nullptr, i, static_cast<int32_t>(c.n_head)});
            ops.push_back({OpKind::HeadRmsNorm, Buf::K, Buf::K, &l.k_norm, nullptr, i, static_cast<int32_t>(c.n_head_kv)});
        }
        ops.push_back({OpKind::Rope, Buf::Q, Buf::Q, opt(m.rope_freqs), nullptr, i, static_cast<int32_t>(c.n_head)});
        ops.push_back({OpKind::Rope, Buf::K, Buf::K, opt(m.rope_freqs), nullptr, i, static_cast<int32_t>(c.n_head_kv)});
        ops.push_back({OpKind::KvStore, Buf::K, Buf::V, nullptr, nullptr, i});
        Op attention{OpKind::Attention, Buf::Q, Buf::ATT, nullptr, nullptr, i, static_cast<int32_t>(c.n_head)};
        attention.window = c.layer_is_local(i) ? c.sliding_window : 0;
        ops.push_back(attention);
        ops.push_back({OpKind::MatMul, Buf::ATT, Buf::X, &l.wo, nullptr, i, 0, /*accumulate=*/true});
        ops.push_back({OpKind::RmsNorm, Buf::X, Buf::XN, &l.ffn_norm});
        ops.push_back({OpKind::MatMul, Buf::XN, Buf::GATE, &l.w_gate});
        ops.push_back({OpKind::MatMul, Buf::XN, Buf::UP, &l.w_up});
        ops.push_back({OpKind::SwiGLU, Buf::GATE, Buf::GATE});
        ops.push_back({OpKind::MatMul, Buf::GATE, Buf::X, &l.w_down, nullptr, i, 0, /*accumulate=*/true});
    }
    ops.push_back({OpKind::RmsNorm, Buf::X, Buf::XN, &m.output_norm, nullptr, -1, 0, false, /*tail=*/true});
    ops.push_back({OpKind::MatMul, Buf::XN, Buf::LOGITS, &m.output, nullptr, -1, 0, false, /*tail=*/true});
    return plan;
}

}  // namespace edgerunner
