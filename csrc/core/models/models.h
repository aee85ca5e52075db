// Architecture recipes: each family binds its tensors and builds its step plan.
#pragma once

#include "../plan.h"
#include <string>

#include "edgerunner/gguf.h"

namespace edgerunner {

// A tensor bound in place, its shape checked against the hyperparameters (cols × rows);
// bind_f32 for norm weights and biases, which are applied in float and must be F32.
Weight bind(const GGUFFile& f, const std::string& name, int64_t cols, int64_t rows, bool optional = false);
Weight bind_f32(const GGUFFile& f, const std::string& name, int64_t n, bool optional = false);

// token_embd, output_norm and the LM head (token_embd itself when the model ties them).
void bind_embeddings_and_head(const GGUFFile& f, const ModelConfig& c, ModelWeights& m);

ModelWeights bind_llama_weights(const GGUFFile& f, const ModelConfig& c);
Plan build_llama_plan(const ModelConfig& c, const ModelWeights& m, StepKind kind, int64_t max_tokens);
ModelWeights bind_gemma3_weights(const GGUFFile& f, const ModelConfig& c);
ModelWeights bind_phi3_weights(const GGUFFile& f, const ModelConfig& c);  // plan: build_llama_plan
Plan build_gemma3_plan(const ModelConfig& c, const ModelWeights& m, StepKind kind, int64_t max_tokens);

// Dispatch on c.arch (read_model_config has already refused unsupported architectures).
ModelWeights bind_weights(const GGUFFile& f, const ModelConfig& c);
Plan build_plan(const ModelConfig& c, const ModelWeights& m, StepKind kind, int64_t max_tokens);

}  // namespace edgerunner
