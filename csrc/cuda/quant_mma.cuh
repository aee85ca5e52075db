// The tensor-core GEMM's view of a weight block (gemm.cu). For unit u (32 elements) of a row:
//   scale(tile, u)      its halves' scales and offsets (elements 0..15: s_lo, m_lo; 16..31: s_hi,
//                       m_hi), decoded once per tile and row (the GEMM keeps them as bf16 pairs
//                       in shared memory for the warps that multiply that row);
//   quants(tile, u, t)  for thread t of a quad, elements 4t..4t+3 (x) and 16+4t..16+4t+3 (y) as
//                       four bytes each,
// so that   weight = s · (byte − kBias) + m    (kSigned formats: the bytes are signed, no bias;
// m = 0 unless kMin; s_hi = s_lo and m_hi = m_lo unless kSplit; unsigned bytes below 128). The
// GEMM turns them into bf16 mma operands (the integer parts exactly: at most 8 bits) and
// multiplies them with bf16 activations; no float weights are written anywhere.
//
// The float formats (F32, F16, BF16) have no scales: `weights(tile, u, t)` gives thread t's eight
// elements of unit u as the pairs the mma takes, straight from the file's values (F32 rounded once
// to the nearest bf16, BF16 as it is; F16 as it is, for the mma's f16 form).
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstring>
#include <type_traits>

#include "quant_dot.cuh"

namespace edgerunner::cuda {

struct UnitScale {
    float s_lo, s_hi, m_lo, m_hi;
};

template <TensorType T>
struct MmaUnit {
    static constexpr bool kFast = false;
};

constexpr uint32_t kLowNibbles = 0x0F0F0F0Fu;

// A word of quants from a 4-byte aligned address (blocks whose size is a multiple of 4 keep
// that alignment in a row, and in the GEMM's staged copy).
__device__ __forceinline__ uint32_t ld32a(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// A small integer scale (|v| < 2^22) as a float: its bits added to those of 1.5·2^23, less that
// (the integer-to-float conversion instruction issues at a quarter of the rate).
__device__ __forceinline__ float exact_float(int v) { return __int_as_float(0x4B400000 + v) - 12582912.0f; }

// Formats of one 32-element block per unit: `tile` holds whole blocks, unit u is block u; its
// scale d (and offset m, where the block has one).
template <typename Block, bool kOffset>
__device__ __forceinline__ UnitScale block_scale(const uint8_t* tile, int u) {
    const Block& b = reinterpret_cast<const Block*>(tile)[u];
    const float d = h2f(b.d);
    if constexpr (kOffset) {
        const float m = h2f(b.m);
        return {d, d, m, m};
    } else {
        return {d, d, 0.0f, 0.0f};
    }
}

template <>
struct MmaUnit<TensorType::Q4_1> {
    static constexpr bool kFast = true, kMin = true, kSplit = false, kSigned = false;
    static constexpr int kBias = 0, kUnits = 1;
    using Block = block_q4_1;
    static __device__ UnitScale scale(const uint8_t* tile, int u) { return block_scale<Block, kMin>(tile, u); }
    static __device__ uint2 quants(const uint8_t* tile, int u, int t) {
        const uint32_t w = ld32a(reinterpret_cast<const Block*>(tile)[u].qs + 4 * t);  // (20-byte blocks)
        return {w & kLowNibbles, w >> 4 & kLowNibbles};
    }
};

// Q5_0 / Q5_1: the fifth bit of element j is bit j of qh (both 4-byte aligned: Q5_1's 24-byte
// blocks, Q5_0's device layout).
__device__ __forceinline__ uint2 q5_words(const uint8_t* qs, const uint8_t* qh4, int t) {
    const uint32_t w = ld32a(qs + 4 * t), qh = ld32a(qh4);
    return {(w & kLowNibbles) | static_cast<uint32_t>(spread4(qh >> (4 * t))),
            (w >> 4 & kLowNibbles) | static_cast<uint32_t>(spread4(qh >> (16 + 4 * t)))};
}

template <>
struct MmaUnit<TensorType::Q5_1> {
    static constexpr bool kFast = true, kMin = true, kSplit = false, kSigned = false;
    static constexpr int kBias = 0, kUnits = 1;
    using Block = block_q5_1;
    static __device__ UnitScale scale(const uint8_t* tile, int u) { return block_scale<Block, kMin>(tile, u); }
    static __device__ uint2 quants(const uint8_t* tile, int u, int t) {
        const Block& b = reinterpret_cast<const Block*>(tile)[u];
        return q5_words(b.qs, b.qh, t);
    }
};

// IQ4_XS (and IQ4_NL, below): the code book's values of the indices (iq4_values), signed bytes.
// Super-block formats (256 elements): `tile` holds the super-block, unit u is its sub-block u.
template <>
struct MmaUnit<TensorType::IQ4_XS> {
    static constexpr bool kFast = true, kMin = false, kSplit = false, kSigned = true;
    static constexpr int kBias = 0, kUnits = 8;
    using Block = block_iq4_xs;
    static __device__ UnitScale scale(const uint8_t* tile, int u) {
        const Block& b = *reinterpret_cast<const Block*>(tile);
        const float d = h2f(b.d) * exact_float(iq4_xs_scale(b, u));
        return {d, d, 0.0f, 0.0f};
    }
    static __device__ uint2 quants(const uint8_t* tile, int u, int t) {
        const int2 v = iq4_values(ld32a(reinterpret_cast<const Block*>(tile)->qs + 16 * u + 4 * t));  // (136-byte blocks)
        return {static_cast<uint32_t>(v.x), static_cast<uint32_t>(v.y)};
    }
};

// Q2_K: unit u = g·4 + s, elements l: bits 2s, 2s+1 of qs[g·32 + l]; its two 16-element
// sub-blocks (2u, 2u + 1) each with a scale (low nibble) and a minimum (high nibble):
// weight = d·sc·q − dmin·m.
template <>
struct MmaUnit<TensorType::Q2_K> {
    static constexpr bool kFast = true, kMin = true, kSplit = true, kSigned = false;
    static constexpr int kBias = 0, kUnits = 8;
    using Block = block_q2_K;
    static __device__ UnitScale scale(const uint8_t* tile, int u) {
        const Block& b = *reinterpret_cast<const Block*>(tile);
        const float d = h2f(b.d), dmin = h2f(b.dmin);
        const int s0 = b.scales[2 * u], s1 = b.scales[2 * u + 1];
        return {d * exact_float(s0 & 0xF), d * exact_float(s1 & 0xF), -dmin * exact_float(s0 >> 4), -dmin * exact_float(s1 >> 4)};
    }
    static __device__ uint2 quants(const uint8_t* tile, int u, int t) {
        const uint8_t* q = reinterpret_cast<const Block*>(tile)->qs + (u / 4) * 32;
        const int shift = 2 * (u % 4);
        return {ld32a(q + 4 * t) >> shift & 0x03030303u, ld32a(q + 16 + 4 * t) >> shift & 0x03030303u};  // (84-byte blocks)
    }
};

// Q3_K: unit u = g·4 + s, elements l: bits 2s, 2s+1 of qs[g·32 + l], + 4 where bit u of
// hmask[l] is set, − 4; the two sub-blocks' 6-bit scales − 32.
template <>
struct MmaUnit<TensorType::Q3_K> {
    static constexpr bool kFast = true, kMin = false, kSplit = true, kSigned = false;
    static constexpr int kBias = 4, kUnits = 8;
    using Block = block_q3_K;
    static __device__ UnitScale scale(const uint8_t* tile, int u) {
        const Block& b = *reinterpret_cast<const Block*>(tile);
        const float d = h2f(b.d);
        return {d * exact_float(q3_k_scale(b, 2 * u)), d * exact_float(q3_k_scale(b, 2 * u + 1)), 0.0f, 0.0f};
    }
    static __device__ uint2 quants(const uint8_t* tile, int u, int t) {
        const Block& b = *reinterpret_cast<const Block*>(tile);
        const uint8_t* q = b.qs + (u / 4) * 32;
        const int shift = 2 * (u % 4);
        auto word = [&](int l) { return (ld32(q + l) >> shift & 0x03030303u) | (ld32(b.hmask + l) >> u & 0x01010101u) << 2; };
        return {word(4 * t), word(16 + 4 * t)};
    }
};

// Q4_K / Q5_K: unit u = sub-block u; weight = d·sc·q − dmin·m. Q4_K in its device layout
// (q4_k_scale_min, quant_unit.cuh): element l of unit u in nibble l / 16 of qs[16u + l % 16]. Q5_K as
// the file holds it: element l = nibble u % 2 of qs[(u / 2)·32 + l], bit u of qh[l] the fifth bit.
// Their blocks are whole 16-byte pieces (rows stay on 16-byte boundaries), so the GEMM stages only
// what a half (units 4h..4h+3) reads: the pieces before qs (d, dmin, scales, Q5_K's qh) and the
// 64 bytes of qs that hold it (qs[64h..64h+63] in both layouts), in that order (kHalfPieces,
// half_piece) — `tile` is that staged copy: unit u's qs at qs + (u % 4)·16 (Q4_K) or
// qs + ((u % 4) / 2)·32 (Q5_K). (kQuantPieces: the 16-byte pieces of qs a half takes, 4; Q8_0's
// groups below, of 32 bytes a unit, 8.)
template <typename Block, int kQuantPieces = 4>
struct KHalf {
    static constexpr int kHead = offsetof(Block, qs) / 16, kHalfQuantPieces = kQuantPieces, kHalfPieces = kHead + kQuantPieces;
    static __device__ int half_piece(int h, int i) { return i < kHead ? i : i + kQuantPieces * h; }
};

// Q4_0, Q5_0, IQ4_NL and Q8_0 in their device layouts (Group8, quant_unit.cuh), a group staged as a
// K-quant's half: its eight d's (and Q5_0's eight qh), then the quants of units 4h..4h+3 (unit u's
// at qs[u % 4]).
template <typename Group>
__device__ __forceinline__ UnitScale group_scale(const uint8_t* tile, int u) {
    const float d = h2f(reinterpret_cast<const Group*>(tile)->d[u]);
    return {d, d, 0.0f, 0.0f};
}
template <>
struct MmaUnit<TensorType::Q4_0> : KHalf<Q4_0Group> {
    static constexpr bool kFast = true, kMin = false, kSplit = false, kSigned = false;
    static constexpr int kBias = 8, kUnits = 8;
    using Block = Q4_0Group;
    static __device__ UnitScale scale(const uint8_t* tile, int u) { return group_scale<Block>(tile, u); }
    static __device__ uint2 quants(const uint8_t* tile, int u, int t) {
        const uint32_t w = ld32a(reinterpret_cast<const Block*>(tile)->qs[u % 4] + 4 * t);  // (the staged half)
        return {w & kLowNibbles, w >> 4 & kLowNibbles};
    }
};
template <>
struct MmaUnit<TensorType::Q5_0> : KHalf<Q5_0Group> {  // (the head: the d's, then the eight qh)
    static constexpr bool kFast = true, kMin = false, kSplit = false, kSigned = false;
    static constexpr int kBias = 16, kUnits = 8;
    using Block = Q5_0Group;
    static __device__ UnitScale scale(const uint8_t* tile, int u) { return group_scale<Block>(tile, u); }
    static __device__ uint2 quants(const uint8_t* tile, int u, int t) {
        const Block& b = *reinterpret_cast<const Block*>(tile);
        return q5_words(b.qs[u % 4], b.qh[u], t);  // (the staged half)
    }
};
template <>
struct MmaUnit<TensorType::IQ4_NL> : KHalf<IQ4NLGroup> {
    static constexpr bool kFast = true, kMin = false, kSplit = false, kSigned = true;
    static constexpr int kBias = 0, kUnits = 8;
    using Block = IQ4NLGroup;
    static __device__ UnitScale scale(const uint8_t* tile, int u) { return group_scale<Block>(tile, u); }
    static __device__ uint2 quants(const uint8_t* tile, int u, int t) {
        const int2 v = iq4_values(ld32a(reinterpret_cast<const Block*>(tile)->qs[u % 4] + 4 * t));  // (the staged half)
        return {static_cast<uint32_t>(v.x), static_cast<uint32_t>(v.y)};
    }
};
template <>
struct MmaUnit<TensorType::Q8_0> : KHalf<Q8_0Group, 8> {
    static constexpr bool kFast = true, kMin = false, kSplit = false, kSigned = true;
    static constexpr int kBias = 0, kUnits = 8;
    using Block = Q8_0Group;
    static __device__ UnitScale scale(const uint8_t* tile, int u) { return group_scale<Block>(tile, u); }
    static __device__ uint2 quants(const uint8_t* tile, int u, int t) {
        const uint8_t* q = reinterpret_cast<const uint8_t*>(reinterpret_cast<const Block*>(tile)->qs[u % 4]);  // (the staged half)
        return {ld32a(q + 4 * t), ld32a(q + 16 + 4 * t)};
    }
};

template <typename Block>
__device__ __forceinline__ UnitScale k_scale(const uint8_t* tile, int u) {
    const Block& b = *reinterpret_cast<const Block*>(tile);
    int sc, m;
    if constexpr (std::is_same_v<Block, block_q4_K>) q4_k_scale_min(b.scales, u, &sc, &m);
    else k_scale_min(b.scales, u, &sc, &m);
    const float s = h2f(b.d) * exact_float(sc), mn = -h2f(b.dmin) * exact_float(m);
    return {s, s, mn, mn};
}

template <>
struct MmaUnit<TensorType::Q4_K> : KHalf<block_q4_K> {
    static constexpr bool kFast = true, kMin = true, kSplit = false, kSigned = false;
    static constexpr int kBias = 0, kUnits = 8;
    using Block = block_q4_K;
    static __device__ UnitScale scale(const uint8_t* tile, int u) { return k_scale<Block>(tile, u); }
    static __device__ uint2 quants(const uint8_t* tile, int u, int t) {
        const uint32_t w = ld32a(reinterpret_cast<const Block*>(tile)->qs + 16 * (u % 4) + 4 * t);  // (the staged half)
        return {w & kLowNibbles, w >> 4 & kLowNibbles};
    }
};

template <>
struct MmaUnit<TensorType::Q5_K> : KHalf<block_q5_K> {
    static constexpr bool kFast = true, kMin = true, kSplit = false, kSigned = false;
    static constexpr int kBias = 0, kUnits = 8;
    using Block = block_q5_K;
    static __device__ UnitScale scale(const uint8_t* tile, int u) { return k_scale<Block>(tile, u); }
    static __device__ uint2 quants(const uint8_t* tile, int u, int t) {
        const Block& b = *reinterpret_cast<const Block*>(tile);
        const uint8_t* q = b.qs + ((u % 4) / 2) * 32;  // (the staged half)
        const int shift = 4 * (u % 2);
        const uint2 w = {ld32a(q + 4 * t) >> shift & kLowNibbles, ld32a(q + 16 + 4 * t) >> shift & kLowNibbles};  // (176-byte blocks)
        return {w.x | (ld32a(b.qh + 4 * t) >> u & 0x01010101u) << 4, w.y | (ld32a(b.qh + 16 + 4 * t) >> u & 0x01010101u) << 4};
    }
};

// Q6_K in its device layout (quant_dot.cuh): unit u's elements i and 16 + i in the low and high
// nibble of ql[16u + i], element 16w + 4k + i's two high bits at 2k of qh[8u + 4w + i], − 32;
// scales[2u] for the first 16 elements, the next above.
template <>
struct MmaUnit<TensorType::Q6_K> {
    static constexpr bool kFast = true, kMin = false, kSplit = true, kSigned = false;
    static constexpr int kBias = 32, kUnits = 8;
    using Block = block_q6_K;
    static __device__ UnitScale scale(const uint8_t* tile, int u) {
        const Block& b = *reinterpret_cast<const Block*>(tile);
        const float d = h2f(b.d);
        return {d * exact_float(b.scales[2 * u]), d * exact_float(b.scales[2 * u + 1]), 0.0f, 0.0f};
    }
    static __device__ uint2 quants(const uint8_t* tile, int u, int t) {
        const Block& b = *reinterpret_cast<const Block*>(tile);
        const uint32_t lo = ld32(b.ql + 16 * u + 4 * t);
        const uint8_t* qh = b.qh + 8 * u;
        return {(lo & kLowNibbles) | (ld32(qh) >> (2 * t) & 0x03030303u) << 4,
                (lo >> 4 & kLowNibbles) | (ld32(qh + 4) >> (2 * t) & 0x03030303u) << 4};
    }
};

// F32, F16, BF16: a unit is 32 values as the file holds them (a staged tile: four units, rows on
// 16-byte boundaries); thread t of a quad takes elements 4t..4t+3 and 16+4t..16+4t+3 as pairs
// (4t, 4t+1), (4t+2, 4t+3), then the same + 16: bf16 pairs, or F16's as they are (the GEMM
// multiplies F16 weights in f16).
template <typename V>
struct FloatUnitBlock {
    V v[32];
};
struct FloatMma {
    static constexpr bool kFast = true, kFloat = true, kMin = false, kSplit = false, kSigned = false;
    static constexpr int kBias = 0, kUnits = 1;
};
// A bf16 pair as the 32-bit word the mma takes (the low half first), and back.
__device__ __forceinline__ uint32_t bits(__nv_bfloat162 v) {
    uint32_t r;
    memcpy(&r, &v, sizeof r);
    return r;
}
__device__ __forceinline__ __nv_bfloat162 bf16x2(uint32_t r) {
    __nv_bfloat162 v;
    memcpy(&v, &r, sizeof v);
    return v;
}
__device__ __forceinline__ uint32_t bf16_bits(float lo, float hi) { return bits(__floats2bfloat162_rn(lo, hi)); }
// Thread t's eight 16-bit values of unit u (64 bytes a unit), as four words of pairs.
__device__ __forceinline__ uint4 unit_pairs16(const uint8_t* tile, int u, int t) {
    const uint8_t* p = tile + 64 * u + 8 * t;
    const uint2 lo = *reinterpret_cast<const uint2*>(p), hi = *reinterpret_cast<const uint2*>(p + 32);
    return {lo.x, lo.y, hi.x, hi.y};
}
template <>
struct MmaUnit<TensorType::BF16> : FloatMma {
    using Block = FloatUnitBlock<uint16_t>;
    static __device__ uint4 weights(const uint8_t* tile, int u, int t) { return unit_pairs16(tile, u, t); }
};
template <>
struct MmaUnit<TensorType::F16> : FloatMma {
    using Block = FloatUnitBlock<uint16_t>;
    static __device__ uint4 weights(const uint8_t* tile, int u, int t) { return unit_pairs16(tile, u, t); }
};
template <>
struct MmaUnit<TensorType::F32> : FloatMma {
    using Block = FloatUnitBlock<float>;
    static __device__ uint4 weights(const uint8_t* tile, int u, int t) {
        const uint8_t* p = tile + sizeof(Block) * u + 16 * t;
        const float4 lo = *reinterpret_cast<const float4*>(p), hi = *reinterpret_cast<const float4*>(p + 64);
        return {bf16_bits(lo.x, lo.y), bf16_bits(lo.z, lo.w), bf16_bits(hi.x, hi.y), bf16_bits(hi.z, hi.w)};
    }
};

// Whether a format's units are floats (FloatMma: weights(), no scale()).
template <class M, class = void>
constexpr bool kFloatUnit = false;
template <class M>
constexpr bool kFloatUnit<M, std::void_t<decltype(M::kFloat)>> = M::kFloat;

}  // namespace edgerunner::cuda
