// The CUDA backend's per-op kernels besides GEMV (gemv.cuh), each made into a Launch for the
// step runner. One row per token, float32 activations; the KV cache holds one slot per position,
// slot p of a layer at (p % that layer's capacity), each slot kv_dim values in the cache's
// precision (f16, f32, or q8_0 blocks of 32: the CPU backend's layouts, core/kv_cache.h). Per-step values (the first position, the tokens) are read from
// the device step block, so a recorded or table-driven step replays unchanged.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../core/kv_cache.h"
#include "edgerunner/tensor_type.h"
#include "gemv.cuh"
#include "launch.cuh"

namespace edgerunner::cuda {

// x[t] = row tokens[t] of the embedding matrix, decoded from its blocks, × scale; with q, also
// the int8 copy of x[t]'s RMSNorm (weight norm_w: the first layer's norm, in one-token steps
// whose readers of that norm all take its int8 copy), the RmsNorm kernel's bits.
struct EmbedArgs {
    const uint8_t* w;  // in the device layout (to_device_layout)
    size_t row_bytes;  // device_row_bytes
    int64_t rows, cols;     // rows: the vocabulary (a token outside it reads row 0: a chained step's input
                            // after a draw of -1, no finite logit, which the runner then reports)
    const int32_t* tokens;  // device: the step block's tokens
    int64_t n_tokens;
    float* x;
    float scale;
    const float* norm_w = nullptr;  // with q: cols floats
    float eps = 0.0f;
    QBlock* q = nullptr;  // or null; cols / 32 blocks a token, q_stride apart
    int64_t q_stride = 0;
    // or null: each token also written at its position here (the penalties' history, n_ctx ints)
    int32_t* history = nullptr;
    const int64_t* pos0 = nullptr;  // device: the step block's first position
};
Launch embed(TensorType type, const EmbedArgs& a);
constexpr int64_t kEmbedNormMaxCols = 8192;  // rows of up to this many values take q (wider: the norm kernel runs)

// out[r] = in[r] / rms(in[r]) · w (or out[r] += that: a post-norm into the residual) for `rows`
// contiguous rows of n values (in == out allowed); with q, each written row is also quantized
// for the matmuls that read it.
struct NormArgs {
    const float* in;
    const float* w;
    float* out;          // or null: only the int8 copy q (a one-token norm whose readers all take that)
    int64_t rows, n;
    float eps;
    bool accumulate;
    QBlock* q;           // the output's int8 copy (rms_norm.cuh: quantize_normed4), or null
    int64_t q_stride;    // blocks between rows of q
};
Launch rms_norm(const NormArgs& a);

// Rotate each head of Q and K at the step's positions; with k_cache, then store the rotated K
// and V rows into the layer's cache slots (RoPE + KV write in one kernel; a one-token step of
// adjacent pairs has the Q, K and V GEMVs do it instead: GemvRope).
struct RopeKvArgs {
    float* q;               // n_tokens × n_head × head_dim
    float* k;               // n_tokens × n_head_kv × head_dim
    const float* v;
    uint8_t* k_cache;       // capacity slots (this layer), or null
    uint8_t* v_cache;
    const float* inv_freq;  // rope_dim / 2
    int64_t n_tokens;
    const int64_t* pos0;    // device: the step block's first position
    int64_t capacity;
    size_t slot_bytes;      // bytes of one slot's K (or V)
    float pos_scale;        // positions × this (linear scaling)
    float attn_factor;      // cos and sin × this (LongRoPE)
    int32_t n_head, n_head_kv, head_dim, rope_dim;
    bool neox;              // pairs (i, i + rope_dim/2); else adjacent pairs (2i, 2i + 1)
};
Launch rope_kv(KvType kv, const RopeKvArgs& a);

// g = act(g) · u over n values (when gate and up could not be fused into one GEMV).
struct GluArgs {
    float* g;
    const float* u;
    int64_t n;
    Glu glu;
};
Launch glu(const GluArgs& a);

}  // namespace edgerunner::cuda
