// RMSNorm of one row by the threads of one block: the kernel of its own (ops.cu) runs it one
// block per row; the one-token GEMV runs it in its last block (gemv.cu). The row is read through
// L2 (ld.global.cg): in the GEMV it was written by other blocks in this same grid.
#pragma once

#include "gemv.cuh"
#include "launch.cuh"
#include "quant_quarter.cuh"
#include "warp.cuh"

namespace edgerunner::cuda {

// Threads per row, wherever it runs (blockDim.x must be this): the sums of squares then add up in
// one order, so a row comes out bit for bit the same from the kernel and from the GEMV's last block.
constexpr int kNormThreads = 256;

// Thread (warp w, lane l) holds values 32·(w + 8k) + l, k = 0 … kNormValues − 1, in registers:
// each warp owns whole 32-value runs, which it writes and quantizes. One pass of loads, all in
// flight at once (rows up to 32 · kNormValues · 8 = 8192 wide; wider ones loop over the row twice).
constexpr int kNormValues = 32;

__device__ __forceinline__ void rms_norm_row(const NormArgs& a, int64_t r) {
    __shared__ float partial[kNormThreads / 32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    constexpr int kWarps = kNormThreads / 32;
    const float* x = a.in + r * a.n;
    float* y = a.out + r * a.n;
    const int64_t runs = (a.n + 31) / 32;
    const bool in_registers = runs <= static_cast<int64_t>(kNormValues) * kWarps;
    float v[kNormValues], w[kNormValues];
    float ss = 0.0f;
    if (in_registers) {
#pragma unroll
        for (int k = 0; k < kNormValues; ++k) {
            const int64_t i = 32 * (warp + static_cast<int64_t>(k) * kWarps) + lane;
            v[k] = i < a.n ? __ldcg(x + i) : 0.0f;
            w[k] = i < a.n ? a.w[i] : 0.0f;
            ss += v[k] * v[k];
        }
    } else {
        for (int64_t b = warp; b < runs; b += kWarps) {
            const int64_t i = 32 * b + lane;
            const float xi = i < a.n ? __ldcg(x + i) : 0.0f;
            ss += xi * xi;
        }
    }
    ss = warp_sum(ss);
    if (lane == 0) partial[warp] = ss;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) total += partial[k];
    const float scale = 1.0f / sqrtf(total / static_cast<float>(a.n) + a.eps);
    auto emit = [&](int64_t b, float xi, float wi) {  // value lane of run b (in == out: read before written)
        const int64_t i = 32 * b + lane;
        float o = 0.0f;
        if (i < a.n) {
            o = (xi * scale) * wi;
            if (a.accumulate) o += __ldcg(y + i);
            y[i] = o;
        }
        if (a.q) quantize_block(o, a.q[r * a.q_stride + b], lane);
    };
    if (in_registers) {
#pragma unroll
        for (int k = 0; k < kNormValues; ++k) {
            const int64_t b = warp + static_cast<int64_t>(k) * kWarps;
            if (b < runs) emit(b, v[k], w[k]);
        }
    } else {
        for (int64_t b = warp; b < runs; b += kWarps) {
            const int64_t i = 32 * b + lane;
            emit(b, i < a.n ? __ldcg(x + i) : 0.0f, i < a.n ? a.w[i] : 0.0f);
        }
    }
}

}  // namespace edgerunner::cuda
