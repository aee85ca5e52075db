// The step plan: a model turned into an ordered list of ops over named buffers, built once at
// load per step kind. Backends prepare a plan once and run it per step (see cpu/executable.h).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "edgerunner/model_config.h"
#include "edgerunner/tensor_type.h"

namespace edgerunner {

// A weight matrix (or vector) used in place from the mapped file: `rows` rows of `cols`
// elements, each row `row_bytes` long in its stored format.
struct Weight {
    std::string_view name;
    const uint8_t* data = nullptr;
    TensorType type = TensorType::F32;
    int64_t cols = 0;
    int64_t rows = 1;
    size_t row_bytes = 0;
};

// Scratch activations: one row per token of the step, float32.
// Y: a sublayer's output before its post-norm joins the residual (gemma3).
enum class Buf : uint8_t { X, XN, Q, K, V, ATT, GATE, UP, Y, LOGITS, Count };
constexpr int kBufCount = static_cast<int>(Buf::Count);

enum class OpKind : uint8_t {
    Embed,        // X[t] = token_embd row of token t (× scale)
    RmsNorm,      // out[t] (+)= in[t] / rms(in[t]) * weight
    HeadRmsNorm,  // in place over each head of `in` (heads × head_dim): RMSNorm * weight
    MatMul,       // out[t] (+)= weight · in[t] (+ bias)
    Rope,         // in place: rotate each head of `in` at the step's positions
    KvStore,      // the step's K and V rows → the layer's cache slots
    Attention,    // out = causal softmax(Q Kᵀ / √d) V over the layer's cache (GQA)
    SwiGLU,       // out = silu(in) * UP   (in = GATE)
    GeGLU,        // out = gelu_tanh(in) * UP
};

struct Op {
    OpKind kind;
    Buf in = Buf::X;
    Buf out = Buf::X;
    const Weight* weight = nullptr;
    const Weight* bias = nullptr;
    int32_t layer = -1;
    int32_t heads = 0;
    bool accumulate = false;  // MatMul, RmsNorm: out += result (the residual connection)
    bool tail = false;        // only the rows whose logits are wanted (final norm, LM head)
    int64_t window = 0;       // Attention: the sliding window (0: full causal attention)
    bool local_rope = false;  // Rope: the local layers' base (rope_base_swa)
    float scale = 1.0f;       // Embed: rows × scale
};

enum class StepKind { Decode, Prefill };

struct Plan {
    StepKind kind;
    int64_t max_tokens;  // rows per buffer: 1 for decode, the chunk size for prefill
    std::vector<Op> ops;
};

// RoPE's inverse frequencies for every backend, as Hugging Face computes them (float32 pow of
// the base), divided by the per-pair factors a Rope op of `plan` carries (rope_freqs, LongRoPE's
// chosen set): rope_dim / 2 of them, for the global base or (local) the local layers' own.
std::vector<float> rope_inv_freq(const ModelConfig& c, const Plan& plan, bool local);

// Every weight a llama-family model uses, resolved from tensor names at load.
struct LayerWeights {
    Weight attn_norm, wq, wk, wv, bq, bk, bv, q_norm, k_norm, wo, post_attn_norm;
    Weight ffn_norm, w_gate, w_up, w_down, post_ffn_norm;
};
struct ModelWeights {
    Weight token_embd, output_norm, output, rope_freqs;  // rope_freqs: the per-pair factors RoPE uses
    Weight rope_factors_short, rope_factors_long;        // LongRoPE's two sets (one becomes rope_freqs)
    std::vector<LayerWeights> layers;
};

}  // namespace edgerunner
