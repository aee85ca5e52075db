// The rotation of one RoPE pair, as the RoPE + KV write kernel (ops.cu) and the decode attention
// that rotates as it reads (attention.cu) both compute it: explicit roundings (no contraction
// into fused multiply-adds), so both give the same bits and a step's size never changes a result.
#pragma once

#include <cuda_runtime.h>

namespace edgerunner::cuda {

// cos and sin of pair i's angle at (scaled) position p, times attn_factor.
__device__ __forceinline__ void rope_angle(float p, float inv_freq, float attn_factor, float* cs, float* sn) {
    float s, c;
    sincosf(__fmul_rn(p, inv_freq), &s, &c);
    *cs = __fmul_rn(c, attn_factor);
    *sn = __fmul_rn(s, attn_factor);
}
// The pair (x0, x1) rotated: its first and its second value.
__device__ __forceinline__ float rope_first(float x0, float x1, float cs, float sn) { return __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn)); }
__device__ __forceinline__ float rope_second(float x0, float x1, float cs, float sn) { return __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, cs)); }

}  // namespace edgerunner::cuda
