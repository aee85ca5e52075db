// RMSNorm's arithmetic for one row, shared by its own kernel (RmsNorm, ops.cu) and the residual
// GEMV that normalizes the row it completes (GemvNorm, gemv.cu), so both give the same bits.
//
// `threads` threads hold the row, four consecutive values each and pass (thread i: values
// 4(i + k·threads) .. +3 in pass k); threads past them in the block hold zeros and take part in
// the block's barriers. The sum of squares is reduced per warp, then over the warps' partial
// sums by warp 0; each holder then writes its normalized values, and each eight holders
// quantize their 32-value run together.
#pragma once

#include <cuda_runtime.h>

#include "ops.cuh"
#include "quant_dot.cuh"
#include "warp.cuh"

namespace edgerunner::cuda {

// float4s per thread at most: rows of up to 4 · 1024 · 4 = 16384 values
constexpr int kRmsNormPasses = 4;

// The threads RMSNorm takes for rows of n values: a thread per float4, in whole warps, up to 1024.
__host__ __device__ constexpr int rms_norm_threads(int64_t n) {
    return static_cast<int>(n / 4 > 1024 ? 1024 : ((n / 4 + 31) / 32 * 32 < 32 ? 32 : (n / 4 + 31) / 32 * 32));
}

// This thread's float4s of the norm's weight (they do not depend on the previous kernel: loaded
// before its wait).
template <int kPasses>
__device__ __forceinline__ void rms_norm_weights(const NormArgs& a, int threads, float4 (&g)[kPasses]) {
    const int n4 = static_cast<int>(a.n / 4);
    const float4* w = reinterpret_cast<const float4*>(a.w);
#pragma unroll
    for (int k = 0; k < kPasses; ++k) {
        const int i = static_cast<int>(threadIdx.x) + k * threads;
        g[k] = static_cast<int>(threadIdx.x) < threads && i < n4 ? w[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

// Row `row` of a.out (and of a.q) from this thread's values v of it and weights g (zeros for the
// threads past `threads` and past the row). Every thread of the block calls it.
template <int kPasses>
__device__ __forceinline__ void rms_norm_store(const NormArgs& a, int64_t row, int threads, const float4 (&v)[kPasses],
                                               const float4 (&g)[kPasses]) {
    __shared__ float partial[32];
    const int n4 = static_cast<int>(a.n / 4);
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < kPasses; ++k) ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
    ss = warp_sum(ss);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float t = static_cast<int>(threadIdx.x) < threads / 32 ? partial[threadIdx.x] : 0.0f;
        t = warp_sum(t);
        if (threadIdx.x == 0) partial[0] = t;
    }
    __syncthreads();
    const float scale = 1.0f / sqrtf(partial[0] / static_cast<float>(a.n) + a.eps);
    float4* y = reinterpret_cast<float4*>(a.out + row * a.n);
#pragma unroll
    for (int k = 0; k < kPasses; ++k) {
        const int i = static_cast<int>(threadIdx.x) + k * threads;
        if (k * threads >= n4) break;  // (uniform)
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i < n4) {  // (in == out: the whole row was read before)
            o = make_float4(v[k].x * scale * g[k].x, v[k].y * scale * g[k].y, v[k].z * scale * g[k].z, v[k].w * scale * g[k].w);
            if (a.accumulate) {
                const float4 r = y[i];
                o.x += r.x, o.y += r.y, o.z += r.z, o.w += r.w;
            }
            y[i] = o;
        }
        if (a.q) {  // run i / 8 (rows a multiple of 32 wide: the eight threads are all in or all out)
            float m = fmaxf(fmaxf(fabsf(o.x), fabsf(o.y)), fmaxf(fabsf(o.z), fabsf(o.w)));
#pragma unroll
            for (int offset = 4; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, offset));
            if (i < n4) {
                const float d = m / 127.0f;
                QBlock& out = a.q[row * a.q_stride + i / 8];
                *reinterpret_cast<uint32_t*>(out.q + 4 * (i % 8)) =
                    quantize_value(o.x, d) | quantize_value(o.y, d) << 8 | quantize_value(o.z, d) << 16 | quantize_value(o.w, d) << 24;
                if (i % 8 == 0) out.d = d;
            }
        }
    }
}

}  // namespace edgerunner::cuda
