// The KV cache as the kernels see it: the layout of csrc/core/kv_cache.h (per layer a K and a V
// region of `capacity` slots; position p in slot p % capacity; a slot is n_head_kv heads of
// head_dim values) in the precision kKvType: f32, f16, or q8_0 (head_dim / 32 block_q8_0 per
// head, quantized exactly as the CPU's quantize_row_q8_0: d = max|x| / 127, q = round(x / d)).
#pragma once

#include "common.h"

// Head `head` of the slot holding position pos.
inline device uint8_t* kv_head(device uint8_t* cache, uint pos, uint capacity, uint slot_bytes, uint head, uint n_head_kv) {
    return cache + uint64_t(pos % capacity) * slot_bytes + head * (slot_bytes / n_head_kv);
}
inline device const uint8_t* kv_head(device const uint8_t* cache, uint pos, uint capacity, uint slot_bytes, uint head,
                                     uint n_head_kv) {
    return cache + uint64_t(pos % capacity) * slot_bytes + head * (slot_bytes / n_head_kv);
}

// Stores head x (head_dim floats) into a cache head; the 32 lanes of one simdgroup call it
// together (q8_0 takes each block's max with simd_max: lane = element).
inline void store_kv_head(device const float* x, device uint8_t* dst, uint head_dim, uint lane) {
    if (kKvType == ER_KV_F32) {
        for (uint d = lane; d < head_dim; d += ER_SIMD) reinterpret_cast<device float*>(dst)[d] = x[d];
    } else if (kKvType == ER_KV_F16) {
        for (uint d = lane; d < head_dim; d += ER_SIMD) reinterpret_cast<device half*>(dst)[d] = half(x[d]);
    } else {
        for (uint b = 0; b < head_dim / QK8_0; ++b) {
            const float v = x[QK8_0 * b + lane];
            const float amax = simd_max(fabs(v));
            const float d = amax / 127.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            device block_q8_0* blk = reinterpret_cast<device block_q8_0*>(dst) + b;
            blk->qs[lane] = int8_t(round(v * id));
            if (lane == 0) blk->d = half(d);
        }
    }
}

// Element d of a cached head, as float.
inline float load_kv(device const uint8_t* head, uint d) {
    if (kKvType == ER_KV_F32) return reinterpret_cast<device const float*>(head)[d];
    if (kKvType == ER_KV_F16) return float(reinterpret_cast<device const half*>(head)[d]);
    device const block_q8_0* blk = reinterpret_cast<device const block_q8_0*>(head) + d / QK8_0;
    return float(blk->qs[d % QK8_0]) * float(blk->d);
}
