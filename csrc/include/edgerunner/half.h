// Exact scalar conversions between float32 and the 16-bit float formats GGUF stores:
// IEEE fp16 (half) and bfloat16, both held as their raw bits in uint16_t.
// Pure integer bit manipulation: results do not depend on FPU modes or compiler flags.
#pragma once

#include <cstdint>
#include <cstring>

namespace edgerunner {

inline float fp32_from_bits(uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

inline uint32_t fp32_to_bits(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    return bits;
}

// fp16 -> fp32, exact (every fp16 value, subnormals included, is a float32 value).
inline float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1Fu;
    const uint32_t mant = h & 0x3FFu;
    uint32_t bits;
    if (exp == 0x1F) {             // inf / NaN: keep the payload
        bits = sign | 0x7F800000u | (mant << 13);
    } else if (exp != 0) {         // normal: rebias 15 -> 127
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {        // signed zero
        bits = sign;
    } else {                       // subnormal mant * 2^-24: normalize around its top bit
        const int top = 31 - __builtin_clz(mant);  // 0..9
        bits = sign | (static_cast<uint32_t>(top + 103) << 23) | ((mant << (23 - top)) & 0x7FFFFFu);
    }
    return fp32_from_bits(bits);
}

// fp32 -> fp16, round to nearest even; overflow to inf, NaN stays (quiet) NaN.
inline uint16_t fp32_to_fp16(float f) {
    const uint32_t x = fp32_to_bits(f);
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) return sign | 0x7E00u | ((ax >> 13) & 0x3FFu);  // NaN
    if (ax >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 (halfway past 65504): inf
    if (ax < 0x38800000u) {
        // below 2^-14: fp16 subnormal q * 2^-24 with q = round(value * 2^24)
        const uint32_t e = ax >> 23;
        const uint32_t shift = 126u - e;  // value * 2^24 = mant >> shift, shift >= 14
        if (shift > 24) return sign;      // < 2^-25 (or float32 subnormal): rounds to zero
        const uint32_t mant = (ax & 0x7FFFFFu) | 0x800000u;
        uint32_t q = mant >> shift;
        const uint32_t rem = mant & ((1u << shift) - 1u);
        const uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) ++q;  // may carry into the smallest normal
        return sign | static_cast<uint16_t>(q);
    }
    uint32_t h = (ax - 0x38000000u) >> 13;  // rebias 127 -> 15, keep the top 10 mantissa bits
    const uint32_t rem = ax & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry bumps the exponent
    return sign | static_cast<uint16_t>(h);
}

// bf16 -> fp32, exact: bf16 is the top half of a float32.
inline float bf16_to_fp32(uint16_t b) { return fp32_from_bits(static_cast<uint32_t>(b) << 16); }

// fp32 -> bf16, round to nearest even; NaN forced quiet (as ggml_compute_fp32_to_bf16).
inline uint16_t fp32_to_bf16(float f) {
    const uint32_t x = fp32_to_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 64u);
    return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace edgerunner
