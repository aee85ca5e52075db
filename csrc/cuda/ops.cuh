// The CUDA backend's per-op kernels (besides GEMV, gemv.cuh): launch functions over device
// pointers, enqueued on a stream, no synchronization. One row per token, float32 activations;
// the KV cache is fp16, slot p at (p % capacity). Per-step values (the first position) are read
// from device memory, so a recorded step replays unchanged.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "edgerunner/tensor_type.h"

namespace edgerunner::cuda {

// x[t] = row tokens[t] of the embedding matrix, decoded from its blocks.
void embed(TensorType type, const uint8_t* w, size_t row_bytes, int64_t cols, const int32_t* tokens, int64_t n_tokens,
           float* x, cudaStream_t stream);

// out[r] = in[r] / rms(in[r]) · w for `rows` contiguous rows of n values (in == out allowed).
void rms_norm(const float* in, const float* w, float* out, int64_t rows, int64_t n, float eps, cudaStream_t stream);

struct RopeArgs {
    float* q;                 // n_tokens × n_head × head_dim
    float* k;                 // n_tokens × n_head_kv × head_dim
    const float* inv_freq;    // rope_dim / 2
    int64_t n_tokens;
    const int64_t* pos0;      // device: the step block's first position
    float pos_scale;          // positions × this (linear scaling)
    int n_head, n_head_kv, head_dim, rope_dim;
    bool neox;                // pairs (i, i + rope_dim/2); else adjacent pairs (2i, 2i + 1)
};
void rope(const RopeArgs& a, cudaStream_t stream);

// The step's K and V rows into the layer's cache slots.
void kv_store(const float* k, const float* v, __half* k_cache, __half* v_cache, int64_t n_tokens, const int64_t* pos0,
              int64_t capacity, int64_t kv_dim, cudaStream_t stream);

struct AttentionArgs {
    const float* q;           // n_tokens × n_head × head_dim
    const __half* k_cache;    // capacity × n_head_kv × head_dim (this layer)
    const __half* v_cache;
    float* out;               // n_tokens × n_head × head_dim
    int64_t n_tokens;
    const int64_t* pos0;      // device: the step block's first position
    int64_t capacity, window;  // window 0: full causal attention
    int n_head, n_head_kv, head_dim;
};
// Causal softmax(q kᵀ / √d) v with an online softmax: no score matrix is stored.
void attention(const AttentionArgs& a, cudaStream_t stream);

// g = silu(g) · u over n values.
void swiglu(float* g, const float* u, int64_t n, cudaStream_t stream);

}  // namespace edgerunner::cuda
