// RMSNorm's arithmetic, shared by the RmsNorm kernel (ops.cu) and the one-token GEMVs that fold
// the norm in (GemvArgs::norm, gemv.cu), so both give the same bits whatever their block size.
//
// A block of P threads (a multiple of 32) holds a row of n values as float4s: thread t has
// float4s t, t + P, ... in registers, so a 32-value unit's eight float4s sit in eight consecutive
// lanes. The sum of squares goes in an order no block size changes: each unit's by its eight
// lanes (a butterfly, whose every lane gets the same bits: addition commutes), the units' sums
// through shared memory, then every warp adds units l, l + 32, ... in lane l and reduces its lanes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "quant_dot.cuh"
#include "warp.cuh"

namespace edgerunner::cuda {

constexpr int64_t kRmsNormMaxCols = 16384;  // rows of up to this many values (the kernel: 1024 threads, four float4s each)

__device__ __forceinline__ float squares4(float4 v) {
    return __fmaf_rn(v.w, v.w, __fmaf_rn(v.z, v.z, __fmaf_rn(v.y, v.y, __fmul_rn(v.x, v.x))));
}

// The row's float4s into v (thread t: t, t + P, ...; zeros past n4), all loads in flight at once.
template <int kPasses>
__device__ __forceinline__ void load_row(const float4* x, int n4, float4 (&v)[kPasses]) {
#pragma unroll
    for (int k = 0; k < kPasses; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        v[k] = i < n4 ? x[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

// 1 / rms of a row from its units' sums of squares (unit u's as block_rms_scale computes it), by
// one warp: lane l adds units l, l + 32, ..., then the warp adds its lanes. Every lane gets the
// same bits. kUnroll: the loop's unrolling, where not the compiler's (sums from global memory: their
// loads batched; the order of the additions is the same).
template <int kUnroll = 0>
__device__ __forceinline__ float units_rms_scale(const float* unit_ss, int n_units, int64_t n, float eps) {
    float total = 0.0f;
    if constexpr (kUnroll > 0) {
#pragma unroll(kUnroll)
        for (int u = threadIdx.x % 32; u < n_units; u += 32) total += unit_ss[u];
    } else {
        for (int u = threadIdx.x % 32; u < n_units; u += 32) total += unit_ss[u];
    }
    total = warp_sum(total);
    return 1.0f / sqrtf(total / static_cast<float>(n) + eps);
}

// The sum of squares of the 32-value unit whose eight float4s eight consecutive lanes hold (all
// 32 lanes call it; every lane of the eight gets the same bits).
__device__ __forceinline__ float unit_squares(float4 v) {
    float ss = squares4(v);
#pragma unroll
    for (int offset = 1; offset < 8; offset *= 2) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, offset);
    return ss;
}

// 1 / rms of the row held in v (load_row), by the whole block; unit_ss: (n4 + 7) / 8 floats of
// shared memory (a row of n % 32 != 0, as a head norm's may be, ends in a part unit: its lanes
// past the row hold zeros). Every thread gets the same bits.
template <int kPasses>
__device__ __forceinline__ float block_rms_scale(const float4 (&v)[kPasses], int n4, int64_t n, float eps, float* unit_ss) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int k = 0; k < kPasses; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i - lane >= n4) break;  // (the warp's lanes together: the shuffles take all 32)
        const float ss = unit_squares(v[k]);
        if (i < n4 && i % 8 == 0) unit_ss[i / 8] = ss;
    }
    __syncthreads();
    return units_rms_scale(unit_ss, (n4 + 7) / 8, n, eps);
}

__device__ __forceinline__ float4 normed4(float4 v, float scale, float4 g) {
    return make_float4(v.x * scale * g.x, v.y * scale * g.y, v.z * scale * g.z, v.w * scale * g.w);
}

// Four consecutive values of a 32-value unit whose eight float4s are held by eight consecutive
// lanes (all 32 lanes call it): the unit's scale d = max|v| / 127 over the eight, and these four
// values' int8 bytes as one word (quantize_value, as every quantizing kernel).
__device__ __forceinline__ uint32_t quantize4(float4 o, float& d) {
    float m = fmaxf(fmaxf(fabsf(o.x), fabsf(o.y)), fmaxf(fabsf(o.z), fabsf(o.w)));
#pragma unroll
    for (int offset = 4; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, offset));
    d = m / 127.0f;
    return quantize_value(o.x, d) | quantize_value(o.y, d) << 8 | quantize_value(o.z, d) << 16 | quantize_value(o.w, d) << 24;
}

// The int8 copy of a normed row, a unit at a time: the unit's values v·g (times the norm's weight,
// not yet its 1/rms) quantized by quantize4, d' = max|v·g| / 127, and the unit's scale then
// d = d' · (1/rms). The bytes and d' need only the unit, not the whole row: the GEMV that writes
// the residual quantizes its units as it stores them (GemvArgs::norm_out), and the GEMVs that read
// them scale d once the row's sum of squares is known (GemvArgs::xq_ss). Every writer of a norm's
// int8 copy goes through this, so all give the same bits.
__device__ __forceinline__ uint32_t quantize_normed4(float4 v, float4 g, float& d_unscaled) {
    return quantize4(make_float4(v.x * g.x, v.y * g.y, v.z * g.z, v.w * g.w), d_unscaled);
}

}  // namespace edgerunner::cuda
