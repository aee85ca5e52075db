// A KV cache slot in the cache's precision (the CPU backend's layouts, core/kv_cache.h), as the
// RoPE + KV write kernel stores heads into it and the attention kernels read them back.
#pragma once

#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "../core/kv_cache.h"
#include "edgerunner/quant_blocks.h"
#include "quant_unit.cuh"
#include "warp.cuh"

namespace edgerunner::cuda {

// Two floats as one f16 pair (the first in the low half), as the tensor cores read them.
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
}

// A KV slot in the cache's precision: value d of a slot, and a head's values stored into it
// (a whole block of threads; f16 and f32 also value by value, store1; q8_0 per 32 values by one
// warp: d = max|v| / 127, q = round(v / d), as the CPU stores them).
template <KvType K>
struct Kv;

template <>
struct Kv<KvType::F16> {
    static __device__ float load(const uint8_t* slot, int d) { return __half2float(reinterpret_cast<const __half*>(slot)[d]); }
    // values d .. d + 7 (d a multiple of 8) as four f16 pairs
    static __device__ uint4 load8(const uint8_t* slot, int d) { return *reinterpret_cast<const uint4*>(slot + 2 * static_cast<size_t>(d)); }
    static __device__ void store1(uint8_t* slot, int64_t i, float v) { reinterpret_cast<__half*>(slot)[i] = __float2half_rn(v); }
    static __device__ void store(uint8_t* slot, int64_t first, const float* x, int n) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) store1(slot, first + i, x[i]);
    }
};

template <>
struct Kv<KvType::F32> {
    static __device__ float load(const uint8_t* slot, int d) { return reinterpret_cast<const float*>(slot)[d]; }
    static __device__ uint4 load8(const uint8_t* slot, int d) {
        const float4* f = reinterpret_cast<const float4*>(slot + 4 * static_cast<size_t>(d));
        const float4 a = f[0], b = f[1];
        return uint4{pack_half2(a.x, a.y), pack_half2(a.z, a.w), pack_half2(b.x, b.y), pack_half2(b.z, b.w)};
    }
    static __device__ void store1(uint8_t* slot, int64_t i, float v) { reinterpret_cast<float*>(slot)[i] = v; }
    static __device__ void store(uint8_t* slot, int64_t first, const float* x, int n) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) store1(slot, first + i, x[i]);
    }
};

template <>
struct Kv<KvType::Q8_0> {  // heads of a multiple of 32 values (checked at prepare)
    static __device__ float load(const uint8_t* slot, int d) {
        const block_q8_0& b = reinterpret_cast<const block_q8_0*>(slot)[d / 32];
        return h2f(b.d) * static_cast<float>(b.qs[d % 32]);
    }
    static __device__ uint4 load8(const uint8_t* slot, int d) {
        const block_q8_0& b = reinterpret_cast<const block_q8_0*>(slot)[d / 32];
        const float scale = h2f(b.d);
        const int8_t* q = b.qs + d % 32;
        return uint4{pack_half2(scale * q[0], scale * q[1]), pack_half2(scale * q[2], scale * q[3]), pack_half2(scale * q[4], scale * q[5]),
                     pack_half2(scale * q[6], scale * q[7])};
    }
    static __device__ void store(uint8_t* slot, int64_t first, const float* x, int n) {
        const int lane = threadIdx.x % 32;
        for (int g = threadIdx.x / 32; g < n / 32; g += blockDim.x / 32) {
            const float v = x[32 * g + lane];
            const float d = warp_max(fabsf(v)) / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
            block_q8_0& b = reinterpret_cast<block_q8_0*>(slot)[first / 32 + g];
            b.qs[lane] = static_cast<int8_t>(roundf(v * id));
            if (lane == 0) b.d = __float2half_rn(d);
        }
    }
};

}  // namespace edgerunner::cuda
