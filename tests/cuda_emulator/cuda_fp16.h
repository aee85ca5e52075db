// <cuda_fp16.h> for the CUDA emulator: IEEE half as its bits, converted through float (round to
// nearest even, as the __float2half_rn family), by the engine's own conversions (edgerunner/half.h).
#pragma once

#include <cstdint>

#include "cuda_runtime.h"
#include "edgerunner/half.h"

struct __half {
    uint16_t bits;
    __half() = default;
    __half(float f) : bits(edgerunner::fp32_to_fp16(f)) {}
    operator float() const { return edgerunner::fp16_to_fp32(bits); }
    static __half of_bits(uint16_t b) {
        __half h;
        h.bits = b;
        return h;
    }
};
typedef __half half;
struct __half2 {
    __half x, y;
};
inline float __half2float(__half h) { return static_cast<float>(h); }
inline __half __float2half_rn(float f) { return __half(f); }
inline __half2 __floats2half2_rn(float lo, float hi) { return __half2{__float2half_rn(lo), __float2half_rn(hi)}; }
inline float2 __half22float2(__half2 h) { return float2{__half2float(h.x), __half2float(h.y)}; }
inline __half __ushort_as_half(unsigned short u) { return __half::of_bits(u); }
