// The RMSNorm's arithmetic, shared by its kernel (ops.cu) and by the one-token GEMV that does the
// norm after it in its last block (GemvTail, gemv.cu): both give the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "quant_dot.cuh"
#include "warp.cuh"

namespace edgerunner::cuda {

constexpr int kNormPasses = 4;  // float4s per thread at most: rows of up to 16384 values at 1024 threads

// The kernel's block size for a row of n values: a float4 per thread and pass.
__host__ __device__ inline int rms_norm_threads(int64_t n) {
    const int64_t t = (n / 4 + 31) / 32 * 32;
    return static_cast<int>(t < 32 ? 32 : t > 1024 ? 1024 : t);
}

__device__ __forceinline__ float sum_sq(float4 v) { return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w; }

__device__ __forceinline__ float4 norm4(float4 v, float scale, float4 g) {
    return make_float4(v.x * scale * g.x, v.y * scale * g.y, v.z * scale * g.z, v.w * scale * g.w);
}

// Float4 i of a row into its int8 block (i / 8): eight consecutive lanes hold a block's 32 values
// (rows a multiple of 32 wide: the eight are all in or all out). Every lane of the warp calls it.
__device__ __forceinline__ void quantize4(float4 o, QBlock* q, int i, bool in) {
    float m = fmaxf(fmaxf(fabsf(o.x), fabsf(o.y)), fmaxf(fabsf(o.z), fabsf(o.w)));
#pragma unroll
    for (int offset = 4; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, offset));
    if (in) {
        const float d = m / 127.0f;
        QBlock& out = q[i / 8];
        *reinterpret_cast<uint32_t*>(out.q + 4 * (i % 8)) =
            quantize_value(o.x, d) | quantize_value(o.y, d) << 8 | quantize_value(o.z, d) << 16 | quantize_value(o.w, d) << 24;
        if (i % 8 == 0) out.d = d;
    }
}

// One row's RMSNorm, y = x / rms(x) · w (and its int8 copy q, or null), by a block of any size,
// bit for bit as the RMSNorm kernel computes it with `threads` threads (its launch for this row):
// each warp here plays whole warps of that block (thread i: that block's threads i, i +
// blockDim.x, ...), with the same passes, the same sums in the same order. x is read from L2
// (other blocks of the running kernel wrote it), twice: not kept in registers.
__device__ inline void rms_norm_row(const float* x, const float* w, float* y, QBlock* q, int64_t n, float eps, int threads) {
    __shared__ float partial[32];
    const int n4 = static_cast<int>(n / 4), lane = threadIdx.x % 32;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const float4* w4 = reinterpret_cast<const float4*>(w);
    float4* y4 = reinterpret_cast<float4*>(y);
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int base = static_cast<int>(threadIdx.x) - lane; base < threads; base += blockDim.x) {  // (warp-uniform)
        const int t = base + lane;
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < kNormPasses; ++k) {
            const int i = t + k * threads;
            ss += sum_sq(i < n4 ? __ldcg(x4 + i) : zero);
        }
        ss = warp_sum(ss);
        if (lane == 0) partial[base / 32] = ss;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        float s = static_cast<int>(threadIdx.x) < threads / 32 ? partial[threadIdx.x] : 0.0f;
        s = warp_sum(s);
        if (threadIdx.x == 0) partial[0] = s;
    }
    __syncthreads();
    const float scale = 1.0f / sqrtf(partial[0] / static_cast<float>(n) + eps);
    for (int base = static_cast<int>(threadIdx.x) - lane; base < threads; base += blockDim.x) {
        const int t = base + lane;
#pragma unroll
        for (int k = 0; k < kNormPasses; ++k) {
            if (k * threads >= n4) break;  // (uniform)
            const int i = t + k * threads;
            float4 o = zero;
            if (i < n4) {
                o = norm4(__ldcg(x4 + i), scale, w4[i]);
                y4[i] = o;
            }
            if (q) quantize4(o, q, i, i < n4);
        }
    }
}

}  // namespace edgerunner::cuda
