// <cuda_bf16.h> for the CUDA emulator: bfloat16 as its bits (round to nearest even from float).
#pragma once

#include <cstdint>

#include "cuda_runtime.h"
#include "edgerunner/half.h"

struct __nv_bfloat16 {
    uint16_t bits;
};
struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
    return __nv_bfloat162{{edgerunner::fp32_to_bf16(lo)}, {edgerunner::fp32_to_bf16(hi)}};
}
inline __nv_bfloat162 __float2bfloat162_rn(float f) { return __floats2bfloat162_rn(f, f); }
