// Gemma 3: tensor names and the recipe of one step.
//
//   x = embed(tokens) · √n_embd
//   per layer:  h = rms_norm(x) · attn_norm
//               q, k, v = Wq h, Wk h, Wv h;  q, k = head_rms_norm(q, k)
//               q, k = rope(q, k)   local layers: base rope_base_swa, attention over the window
//               x += rms_norm(Wo attention(q, cache)) · post_attention_norm
//               h = rms_norm(x) · ffn_norm
//               x += rms_norm(Wdown (gelu_tanh(Wgate h) * Wup h)) · post_ffw_norm
//   logits = token_embd (rms_norm(x) · output_norm)
// The GGUF norm weights already hold Gemma's (1 + w).
#include "models.h"

namespace edgerunner {

ModelWeights bind_gemma3_weights(const GGUFFile& f, const ModelConfig& c) {
    ModelWeights m;
    const int64_t q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
    bind_embeddings_and_head(f, c, m);
    for (int64_t i = 0; i < c.n_layer; ++i) {
        const std::string p = "blk." + std::to_string(i) + ".";
        LayerWeights l;
        l.attn_norm = bind_f32(f, p + "attn_norm.weight", c.n_embd);
        l.wq = bind(f, p + "attn_q.weight", c.n_embd, q_dim);
        l.wk = bind(f, p + "attn_k.weight", c.n_embd, kv_dim);
        l.wv = bind(f, p + "attn_v.weight", c.n_embd, kv_dim);
        l.q_norm = bind_f32(f, p + "attn_q_norm.weight", c.head_dim);
        l.k_norm = bind_f32(f, p + "attn_k_norm.weight", c.head_dim);
        l.wo = bind(f, p + "attn_output.weight", q_dim, c.n_embd);
        l.post_attn_norm = bind_f32(f, p + "post_attention_norm.weight", c.n_embd);
        l.ffn_norm = bind_f32(f, p + "ffn_norm.weight", c.n_embd);
        l.w_gate = bind(f, p + "ffn_gate.weight", c.n_embd, c.n_ff);
        l.w_up = bind(f, p + "ffn_up.weight", c.n_embd, c.n_ff);
        l.w_down = bind(f, p + "ffn_down.weight", c.n_ff, c.n_embd);
        l.post_ffn_norm = bind_f32(f, p + "post_ffw_norm.weight", c.n_embd);
        m.layers.push_back(l);
    }
    return m;
}

Plan build_gemma3_plan(const ModelConfig& c, const ModelWeights& m, StepKind kind, int64_t max_tokens) {
    Plan plan{kind, max_tokens, {}};
    auto& ops = plan.ops;
    Op embed{OpKind::Embed, Buf::X, Buf::X, &m.token_embd};
    embed.scale = c.embd_scale;
    ops.push_back(embed);
    for (int32_t i = 0; i < static_cast<int32_t>(c.n_layer); ++i) {
        const LayerWeights& l = m.layers[i];
        const bool local = c.layer_is_local(i);
        ops.push_back({OpKind::RmsNorm, Buf::X, Buf::XN, &l.attn_norm});
        ops.push_back({OpKind::MatMul, Buf::XN, Buf::Q, &l.wq});
        ops.push_back({OpKind::MatMul, Buf::XN, Buf::K, &l.wk});
        ops.push_back({OpKind::MatMul, Buf::XN, Buf::V, &l.wv});
        ops.push_back({OpKind::HeadRmsNorm, Buf::Q, Buf::Q, &l.q_norm, nullptr, i, static_cast<int32_t>(c.n_head)});
        ops.push_back({OpKind::HeadRmsNorm, Buf::K, Buf::K, &l.k_norm, nullptr, i, static_cast<int32_t>(c.n_head_kv)});
        for (Buf b : {Buf::Q, Buf::K}) {
            Op rope{OpKind::Rope, b, b, nullptr, nullptr, i, static_cast<int32_t>(b == Buf::Q ? c.n_head : c.n_head_kv)};
            rope.local_rope = local;
            ops.push_back(rope);
        }
        ops.push_back({OpKind::KvStore, Buf::K, Buf::V, nullptr, nullptr, i});
        Op attention{OpKind::Attention, Buf::Q, Buf::ATT, nullptr, nullptr, i, static_cast<int32_t>(c.n_head)};
        attention.window = local ? c.sliding_window : 0;
        ops.push_back(attention);
        ops.push_back({OpKind::MatMul, Buf::ATT, Buf::Y, &l.wo, nullptr, i});
        ops.push_back({OpKind::RmsNorm, Buf::Y, Buf::X, &l.post_attn_norm, nullptr, i, 0, /*accumulate=*/true});
        ops.push_back({OpKind::RmsNorm, Buf::X, Buf::XN, &l.ffn_norm});
        ops.push_back({OpKind::MatMul, Buf::XN, Buf::GATE, &l.w_gate});
        ops.push_back({OpKind::MatMul, Buf::XN, Buf::UP, &l.w_up});
        ops.push_back({OpKind::GeGLU, Buf::GATE, Buf::GATE});
        ops.push_back({OpKind::MatMul, Buf::GATE, Buf::Y, &l.w_down, nullptr, i});
        ops.push_back({OpKind::RmsNorm, Buf::Y, Buf::X, &l.post_ffn_norm, nullptr, i, 0, /*accumulate=*/true});
    }
    ops.push_back({OpKind::RmsNorm, Buf::X, Buf::XN, &m.output_norm, nullptr, -1, 0, false, /*tail=*/true});
    ops.push_back({OpKind::MatMul, Buf::XN, Buf::LOGITS, &m.output, nullptr, -1, 0, false, /*tail=*/true});
    return plan;
}

}  // namespace edgerunner
