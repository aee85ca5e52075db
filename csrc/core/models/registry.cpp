#include <stdexcept>

#include "models.h"

namespace edgerunner {

ModelWeights bind_weights(const GGUFFile& f, const ModelConfig& c) {
    if (c.arch == "llama" || c.arch == "qwen2" || c.arch == "qwen3") return bind_llama_weights(f, c);
    if (c.arch == "gemma3") return bind_gemma3_weights(f, c);
    if (c.arch == "phi3") return bind_phi3_weights(f, c);
    throw std::invalid_argument("no recipe for architecture '" + c.arch + "'");
}

Plan build_plan(const ModelConfig& c, const ModelWeights& m, StepKind kind, int64_t max_tokens) {
    if (c.arch == "llama" || c.arch == "qwen2" || c.arch == "qwen3" || c.arch == "phi3") return build_llama_plan(c, m, kind, max_tokens);
    if (c.arch == "gemma3") return build_gemma3_plan(c, m, kind, max_tokens);
    throw std::invalid_argument("no recipe for architecture '" + c.arch + "'");
}

}  // namespace edgerunner
