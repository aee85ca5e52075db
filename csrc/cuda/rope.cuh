// RoPE's arithmetic, each rounding spelled out (no contraction left to the compiler), shared by
// the RoPE + KV write kernel (ops.cu) and the one-token GEMV that rotates Q and K as it stores
// them (gemv.cu): both give the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace edgerunner::cuda {

// cos and sin of pair i's angle at `pos` (inv_freq: pair i's frequency), × attn_factor.
__device__ __forceinline__ void rope_angle(int64_t pos, float pos_scale, float inv_freq, float attn_factor, float& cs, float& sn) {
    float s = 0.0f, c = 0.0f;
    sincosf(__fmul_rn(__fmul_rn(static_cast<float>(pos), pos_scale), inv_freq), &s, &c);
    cs = __fmul_rn(c, attn_factor);
    sn = __fmul_rn(s, attn_factor);
}

// The pair (x0, x1) rotated.
__device__ __forceinline__ float2 rope_rotate(float x0, float x1, float cs, float sn) {
    return make_float2(__fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn)), __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, cs)));
}

}  // namespace edgerunner::cuda
