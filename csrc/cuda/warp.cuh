// Device helpers every kernel file shares: warp reductions and the gated feed-forward's
// activation (as the CPU's math kernels compute it).
#pragma once

#include <cuda_runtime.h>

#include "gemv.cuh"

namespace edgerunner::cuda {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
    return v;
}

// act(g) of a gated feed-forward: SiLU, or GELU in its tanh form.
__device__ __forceinline__ float gate_act(Glu glu, float g) {
    if (glu == Glu::SiLU) return g / (1.0f + expf(-g));
    return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
}

}  // namespace edgerunner::cuda
