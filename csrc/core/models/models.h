// Architecture recipes: each family binds its tensors and builds its step plan.
#pragma once

#include "../plan.h"
#include "edgerunner/gguf.h"

namespace edgerunner {

ModelWeights bind_llama_weights(const GGUFFile& f, const ModelConfig& c);
Plan build_llama_plan(const ModelConfig& c, const ModelWeights& m, StepKind kind, int64_t max_tokens);

// Dispatch on c.arch (read_model_config has already refused unsupported architectures).
ModelWeights bind_weights(const GGUFFile& f, const ModelConfig& c);
Plan build_plan(const ModelConfig& c, const ModelWeights& m, StepKind kind, int64_t max_tokens);

}  // namespace edgerunner
