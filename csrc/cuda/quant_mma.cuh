// The tensor-core GEMM's view of a weight block (gemm.cu): for unit u (32 elements) of a row and
// thread t of its quad, the operand words of an int8 mma.m16n8k32 — elements 4t..4t+3 (`lo`)
// and 16+4t..16+4t+3 (`hi`) as four signed bytes each — and the unit's float scale `d` and
// offset `m`, so that weight = d · q + m. The activations are the int8 QBlocks of the GEMV
// (quant_dot.cuh), so Σ w·x over the unit = d_x · (d · Σ q·q_x + m · Σ q_x): integer
// products exact, as in the one-token GEMV. Q6_K's two 16-element halves have their own
// integer scales (s0 for lo, s1 for hi): its kernel multiplies each half separately.
#pragma once

#include "quant_dot.cuh"

namespace edgerunner::cuda {

struct MmaFrag {
    int lo, hi;    // four int8 weights each
    float d, m;    // weight = d · q + m (m = 0: symmetric formats)
    int s0, s1;    // Q6_K: the halves' integer scales
};

template <TensorType T>
struct MmaUnit {
    static constexpr bool kFast = false;
};

// Four nibbles minus `offset` each, as signed bytes.
__device__ __forceinline__ int nibbles(uint32_t w, int shift, uint32_t offset) {
    return static_cast<int>(__vsub4(w >> shift & 0x0F0F0F0Fu, offset));
}

template <>
struct MmaUnit<TensorType::Q4_0> {
    static constexpr bool kFast = true, kMin = false, kTwoScales = false;
    using Block = block_q4_0;
    static constexpr int kUnits = 1;
    static __device__ MmaFrag load(const uint8_t* tile, int u, int t) {
        const Block& b = reinterpret_cast<const Block*>(tile)[u];
        const uint32_t w = ld32(b.qs + 4 * t);
        return {nibbles(w, 0, 0x08080808u), nibbles(w, 4, 0x08080808u), h2f(b.d), 0.0f, 0, 0};
    }
};

template <>
struct MmaUnit<TensorType::Q4_1> {
    static constexpr bool kFast = true, kMin = true, kTwoScales = false;
    using Block = block_q4_1;
    static constexpr int kUnits = 1;
    static __device__ MmaFrag load(const uint8_t* tile, int u, int t) {
        const Block& b = reinterpret_cast<const Block*>(tile)[u];
        const uint32_t w = ld32(b.qs + 4 * t);
        return {nibbles(w, 0, 0), nibbles(w, 4, 0), h2f(b.d), h2f(b.m), 0, 0};
    }
};

// Q5_0 / Q5_1: the fifth bit of element j is bit j of qh.
template <typename Block>
__device__ __forceinline__ void q5_words(const Block& b, int t, int* lo, int* hi) {
    const uint32_t w = ld32(b.qs + 4 * t), qh = ld32(b.qh);
    *lo = static_cast<int>(w & 0x0F0F0F0Fu) | spread4(qh >> (4 * t));
    *hi = static_cast<int>(w >> 4 & 0x0F0F0F0Fu) | spread4(qh >> (16 + 4 * t));
}

template <>
struct MmaUnit<TensorType::Q5_0> {
    static constexpr bool kFast = true, kMin = false, kTwoScales = false;
    using Block = block_q5_0;
    static constexpr int kUnits = 1;
    static __device__ MmaFrag load(const uint8_t* tile, int u, int t) {
        const Block& b = reinterpret_cast<const Block*>(tile)[u];
        int lo, hi;
        q5_words(b, t, &lo, &hi);
        return {static_cast<int>(__vsub4(lo, 0x10101010u)), static_cast<int>(__vsub4(hi, 0x10101010u)), h2f(b.d), 0.0f, 0, 0};
    }
};

template <>
struct MmaUnit<TensorType::Q5_1> {
    static constexpr bool kFast = true, kMin = true, kTwoScales = false;
    using Block = block_q5_1;
    static constexpr int kUnits = 1;
    static __device__ MmaFrag load(const uint8_t* tile, int u, int t) {
        const Block& b = reinterpret_cast<const Block*>(tile)[u];
        int lo, hi;
        q5_words(b, t, &lo, &hi);
        return {lo, hi, h2f(b.d), h2f(b.m), 0, 0};
    }
};

template <>
struct MmaUnit<TensorType::Q8_0> {
    static constexpr bool kFast = true, kMin = false, kTwoScales = false;
    using Block = block_q8_0;
    static constexpr int kUnits = 1;
    static __device__ MmaFrag load(const uint8_t* tile, int u, int t) {
        const Block& b = reinterpret_cast<const Block*>(tile)[u];
        const uint8_t* q = reinterpret_cast<const uint8_t*>(b.qs);
        return {static_cast<int>(ld32(q + 4 * t)), static_cast<int>(ld32(q + 16 + 4 * t)), h2f(b.d), 0.0f, 0, 0};
    }
};

// IQ4_NL / IQ4_XS: the code book's values of the indices (iq4_values); IQ4_XS's unit u is
// sub-block u of the tile's super-block, with its scale.
template <>
struct MmaUnit<TensorType::IQ4_NL> {
    static constexpr bool kFast = true, kMin = false, kTwoScales = false;
    using Block = block_iq4_nl;
    static constexpr int kUnits = 1;
    static __device__ MmaFrag load(const uint8_t* tile, int u, int t) {
        const Block& b = reinterpret_cast<const Block*>(tile)[u];
        const int2 v = iq4_values(ld32(b.qs + 4 * t));
        return {v.x, v.y, h2f(b.d), 0.0f, 0, 0};
    }
};

template <>
struct MmaUnit<TensorType::IQ4_XS> {
    static constexpr bool kFast = true, kMin = false, kTwoScales = false;
    using Block = block_iq4_xs;
    static constexpr int kUnits = 8;
    static __device__ MmaFrag load(const uint8_t* tile, int u, int t) {
        const Block& b = *reinterpret_cast<const Block*>(tile);
        const int2 v = iq4_values(ld32(b.qs + 16 * u + 4 * t));
        return {v.x, v.y, h2f(b.d) * static_cast<float>(iq4_xs_scale(b, u)), 0.0f, 0, 0};
    }
};

// Q3_K: unit u = g·4 + s, elements l: bits 2s, 2s+1 of qs[g·32 + l], − 4 unless bit u of
// hmask[l] is set; the two sub-blocks' 6-bit scales − 32. (Q2_K, whose sub-blocks each have a
// minimum, would need the activations' sums per 16: it takes the eight-token GEMV.)
template <>
struct MmaUnit<TensorType::Q3_K> {
    static constexpr bool kFast = true, kMin = false, kTwoScales = true;
    using Block = block_q3_K;
    static constexpr int kUnits = 8;
    static __device__ MmaFrag load(const uint8_t* tile, int u, int t) {
        const Block& b = *reinterpret_cast<const Block*>(tile);
        const uint8_t* q = b.qs + (u / 4) * 32;
        const int shift = 2 * (u % 4);
        auto word = [&](int l) {
            return static_cast<int>(__vsub4((ld32(q + l) >> shift & 0x03030303u) | (ld32(b.hmask + l) >> u & 0x01010101u) << 2, 0x04040404u));
        };
        return {word(4 * t), word(16 + 4 * t), h2f(b.d), 0.0f, q3_k_scale(b, 2 * u), q3_k_scale(b, 2 * u + 1)};
    }
};

// Q4_K / Q5_K: unit u = sub-block u of the tile's super-block, elements l = nibble u % 2 of
// qs[(u / 2)·32 + l] (+ bit u of qh[l] for Q5_K); weight = d·sc·q − dmin·m.
template <typename Block, bool kFiveBit>
__device__ __forceinline__ MmaFrag q45_k_frag(const uint8_t* tile, int u, int t) {
    const Block& b = *reinterpret_cast<const Block*>(tile);
    int sc, m;
    k_scale_min(b.scales, u, &sc, &m);
    const uint8_t* q = b.qs + (u / 2) * 32;
    const int shift = 4 * (u % 2);
    int lo = nibbles(ld32(q + 4 * t), shift, 0), hi = nibbles(ld32(q + 16 + 4 * t), shift, 0);
    if constexpr (kFiveBit) {
        lo |= static_cast<int>((ld32(b.qh + 4 * t) >> u & 0x01010101u) << 4);
        hi |= static_cast<int>((ld32(b.qh + 16 + 4 * t) >> u & 0x01010101u) << 4);
    }
    return {lo, hi, h2f(b.d) * static_cast<float>(sc), -h2f(b.dmin) * static_cast<float>(m), 0, 0};
}

template <>
struct MmaUnit<TensorType::Q4_K> {
    static constexpr bool kFast = true, kMin = true, kTwoScales = false;
    using Block = block_q4_K;
    static constexpr int kUnits = 8;
    static __device__ MmaFrag load(const uint8_t* tile, int u, int t) { return q45_k_frag<Block, false>(tile, u, t); }
};

template <>
struct MmaUnit<TensorType::Q5_K> {
    static constexpr bool kFast = true, kMin = true, kTwoScales = false;
    using Block = block_q5_K;
    static constexpr int kUnits = 8;
    static __device__ MmaFrag load(const uint8_t* tile, int u, int t) { return q45_k_frag<Block, true>(tile, u, t); }
};

// Q6_K: unit u = h·4 + s, elements l: low nibble of ql[h·64 + (s % 2)·32 + l] (high nibble for
// s ≥ 2), two bits at 2s of qh[h·32 + l], minus 32; scales[h·8 + s·2] for l < 16, the next above.
template <>
struct MmaUnit<TensorType::Q6_K> {
    static constexpr bool kFast = true, kMin = false, kTwoScales = true;
    using Block = block_q6_K;
    static constexpr int kUnits = 8;
    static __device__ MmaFrag load(const uint8_t* tile, int u, int t) {
        const Block& b = *reinterpret_cast<const Block*>(tile);
        const int h = u / 4, s = u % 4;
        const uint8_t* ql = b.ql + h * 64 + (s % 2) * 32;
        const uint8_t* qh = b.qh + h * 32;
        const int shift = 4 * (s / 2);
        auto word = [&](int l) {
            return static_cast<int>(__vsub4((ld32(ql + l) >> shift & 0x0F0F0F0Fu) | (ld32(qh + l) >> (2 * s) & 0x03030303u) << 4, 0x20202020u));
        };
        return {word(4 * t), word(16 + 4 * t), h2f(b.d), 0.0f, b.scales[h * 8 + s * 2], b.scales[h * 8 + s * 2 + 1]};
    }
};

}  // namespace edgerunner::cuda
