// RMSNorm's arithmetic in one fixed order, shared by the RMSNorm kernel (ops.cu) and the
// one-token GEMV that folds the norm in (gemv.cu), so that both give the same bits: a row's sum
// of squares is the sum of its 32-value runs' sums, each run's eight float4s combined pairwise.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "warp.cuh"

namespace edgerunner::cuda {

__device__ __forceinline__ float sumsq4(float4 v) {
    return __fmaf_rn(v.w, v.w, __fmaf_rn(v.z, v.z, __fmaf_rn(v.y, v.y, __fmul_rn(v.x, v.x))));
}

// One thread holding the whole run.
__device__ __forceinline__ float run_sumsq(const float4 (&v)[8]) {
    float p[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) p[j] = sumsq4(v[j]);
    return __fadd_rn(__fadd_rn(__fadd_rn(p[0], p[1]), __fadd_rn(p[2], p[3])), __fadd_rn(__fadd_rn(p[4], p[5]), __fadd_rn(p[6], p[7])));
}

// Eight lanes (8r .. 8r + 7 of the warp) holding float4 j of the run each: the same tree, in
// every one of them (float addition commutes exactly).
__device__ __forceinline__ float run_sumsq_lanes(float4 v) {
    float s = sumsq4(v);
#pragma unroll
    for (int offset = 1; offset < 8; offset *= 2) s = __fadd_rn(s, __shfl_xor_sync(0xFFFFFFFFu, s, offset));
    return s;
}

// The row's sum from its runs' sums (lane l adds runs l, l + 32, ...; then the warp's tree),
// the same in every warp that calls it.
__device__ __forceinline__ float row_sumsq(const float* runs, int n_runs, int lane) {
    float t = 0.0f;
    for (int r = lane; r < n_runs; r += 32) t = __fadd_rn(t, runs[r]);
    return warp_sum(t);
}

__device__ __forceinline__ float rms_scale(float sumsq, int64_t n, float eps) {
    return 1.0f / sqrtf(sumsq / static_cast<float>(n) + eps);
}

// out = v · scale · g, as the RMSNorm writes it.
__device__ __forceinline__ float4 rms_apply(float4 v, float scale, float4 g) {
    return make_float4(v.x * scale * g.x, v.y * scale * g.y, v.z * scale * g.z, v.w * scale * g.w);
}

}  // namespace edgerunner::cuda
