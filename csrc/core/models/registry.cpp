#include <cmath>
#include <stdexcept>

#include "models.h"

namespace edgerunner {

ModelWeights bind_weights(const GGUFFile& f, const ModelConfig& c) {
    if (c.arch == "llama" || c.arch == "qwen2" || c.arch == "qwen3") return bind_llama_weights(f, c);
    if (c.arch == "gemma3") return bind_gemma3_weights(f, c);
    if (c.arch == "phi3") return bind_phi3_weights(f, c);
    throw std::invalid_argument("no recipe for architecture '" + c.arch + "'");
}

std::vector<float> rope_inv_freq(const ModelConfig& c, const Plan& plan, bool local) {
    const float* factors = nullptr;
    for (const Op& op : plan.ops)
        if (op.kind == OpKind::Rope && op.weight) factors = reinterpret_cast<const float*>(op.weight->data);
    const float base = local && c.rope_base_swa > 0 ? c.rope_base_swa : c.rope_base;
    std::vector<float> inv(static_cast<size_t>(c.rope_dim / 2));
    for (int64_t i = 0; i < c.rope_dim / 2; ++i) {
        inv[i] = 1.0f / std::pow(base, static_cast<float>(2 * i) / static_cast<float>(c.rope_dim));
        if (factors) inv[i] /= factors[i];
    }
    return inv;
}

Plan build_plan(const ModelConfig& c, const ModelWeights& m, StepKind kind, int64_t max_tokens) {
    if (c.arch == "llama" || c.arch == "qwen2" || c.arch == "qwen3" || c.arch == "phi3") return build_llama_plan(c, m, kind, max_tokens);
    if (c.arch == "gemma3") return build_gemma3_plan(c, m, kind, max_tokens);
    throw std::invalid_argument("no recipe for architecture '" + c.arch + "'");
}

}  // namespace edgerunner
