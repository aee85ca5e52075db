// Attention for the step runner, over a layer's KV cache slots (kv_slot.cuh): each head's output,
// and for the output projection its int8 copy.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../core/kv_cache.h"
#include "gemv.cuh"
#include "launch.cuh"

namespace edgerunner::cuda {

struct AttentionArgs {
    const float* q;           // n_tokens × n_head × head_dim
    const uint8_t* k_cache;   // capacity slots (this layer)
    const uint8_t* v_cache;
    float* out;               // n_tokens × n_head × head_dim
    QBlock* q_out;            // or null: out also quantized for the output projection
    int64_t q_stride;         // blocks between tokens of q_out
    int64_t n_tokens;
    const int64_t* pos0;      // device: the step block's first position
    int64_t capacity, window;  // window 0: full causal attention
    size_t slot_bytes;
    int32_t n_head, n_head_kv, head_dim;
    float* partial;           // decode steps: attention_scratch().partial floats
    int32_t* done;            // decode steps: attention_scratch().counters, zero before the first step
    int32_t short_keys = 0;   // (set by attention(): tokens with this many keys or fewer take one block)
};
// Causal softmax(q kᵀ / √d) v with an online softmax: no score matrix is stored. Steps of
// kPrefillKernelTokens or more share each key and value among the query rows of a block; smaller
// ones (decode) split each token's keys into runs over several blocks, whose partial results
// meet in `partial` (flash-decoding); tokens with few keys take one block each (the short path,
// in shared memory sized at launch). fewest_keys: the fewest keys a token of the step has, where
// the caller knows it for every time the launch runs (0: it does not; a graph replayed at every
// position); the short path's memory is left out where no token can take it.
Launch attention(KvType kv, const AttentionArgs& a, int64_t fewest_keys = 0);

// The decode attention's scratch for steps of up to n_tokens tokens: floats of partial results,
// and int32 counters that must start at zero (the kernel leaves them at zero).
struct AttentionScratch {
    int64_t partial, counters;
};
AttentionScratch attention_scratch(int64_t n_tokens, int32_t n_head, int32_t n_head_kv, int32_t head_dim);

}  // namespace edgerunner::cuda
