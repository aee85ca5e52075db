// The int8 formats' GEMV arithmetic: a whole 32-element unit of a weight row per lane, against
// activations quantized to int8 once per step (QBlock). The unit's integer dot product by dp4a
// (four products per instruction, exact), then one float multiply by both scales. Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS have the form
// (QuantDot<T>::kFast); the float formats take float activations (quant_unit.cuh).
#pragma once

#include <type_traits>

#include "quant_unit.cuh"
#include "warp.cuh"

namespace edgerunner::cuda {

// Activations as the fast GEMV reads them, quantized once per step: 32 values = d · q.
struct QBlock {
    float d;
    int8_t q[32];
};
static_assert(sizeof(QBlock) == 36, "QBlock layout");

// One value of a block with scale d = max|v| / 127: q = round(v / d), as its byte. Every kernel
// that quantizes activations goes through it, so all give the same bits.
__device__ __forceinline__ uint32_t quantize_value(float v, float d) {
    return static_cast<uint32_t>(static_cast<uint8_t>(d > 0.0f ? __float2int_rn(v / d) : 0));
}

// A warp's 32 values (one per lane) into one block (the quantize kernel; attention as it writes
// its output).
__device__ __forceinline__ void quantize_block(float v, QBlock& out, int lane) {
    const float d = warp_max(fabsf(v)) / 127.0f;
    out.q[lane] = static_cast<int8_t>(quantize_value(v, d));
    if (lane == 0) out.d = d;
}

// A 32-bit word from a 2-byte aligned address (two 16-bit loads).
__device__ __forceinline__ uint32_t ld32(const uint8_t* p) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
    return static_cast<uint32_t>(h[0]) | static_cast<uint32_t>(h[1]) << 16;
}

// N consecutive 32-bit words from a 2-byte aligned address: N + 1 aligned loads and funnel
// shifts (the word past the N may be read, and is not used when the address is aligned). The
// aligned base is found by pointer arithmetic, so loads from shared memory stay shared loads.
template <int N>
__device__ __forceinline__ void words(const uint8_t* p, uint32_t (&w)[N]) {
    const unsigned skew = static_cast<unsigned>(reinterpret_cast<uintptr_t>(p) & 3);
    const uint32_t* base = reinterpret_cast<const uint32_t*>(p - skew);
    uint32_t a[N + 1];
#pragma unroll
    for (int i = 0; i <= N; ++i) a[i] = base[i];
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = __funnelshift_r(a[i], a[i + 1], 8 * skew);
}
// N words from a 4-byte aligned address.
template <int N>
__device__ __forceinline__ void words_aligned(const uint8_t* p, uint32_t (&w)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = reinterpret_cast<const uint32_t*>(p)[i];
}

// Bits 0..3 of b to bit 4 of bytes 0..3 (the fifth bit of four 5-bit quants): the products of
// the multiply land on distinct bits, so no carries mix them.
__device__ __forceinline__ int spread4(uint32_t b) { return static_cast<int>(((b & 0xF) * 0x00204081u & 0x01010101u) << 4); }

constexpr int kOnes = 0x01010101;

// c + the dot of a's four unsigned bytes with b's four signed ones (dp4a.u32.s32: bytes up to 255,
// such as nibbles left in place, 16 times their value).
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
#ifndef ER_CUDA_EMULATOR
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#else
    for (int i = 0; i < 4; ++i) c += static_cast<int>(a >> 8 * i & 0xFFu) * static_cast<int8_t>(b >> 8 * i);
    return c;
#endif
}

// A unit of activations as the dot products take it: the 32 int8 values as eight words, their
// sum and the sum of the first 16 (for offsets and minimums), the scale.
struct XUnit {
    int w[8];
    int sum, sum_lo;
    float d;
};
__device__ __forceinline__ XUnit load_x(const QBlock& x) {
    XUnit u;
    u.sum_lo = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) u.w[j] = *reinterpret_cast<const int*>(x.q + 4 * j);
#pragma unroll
    for (int j = 0; j < 4; ++j) u.sum_lo = __dp4a(kOnes, u.w[j], u.sum_lo);
    u.sum = u.sum_lo;
#pragma unroll
    for (int j = 4; j < 8; ++j) u.sum = __dp4a(kOnes, u.w[j], u.sum);
    u.d = x.d;
    return u;
}

// IQ4_NL / IQ4_XS: the code book's values (kvalues_iq4nl) of the eight nibbles of a word of
// quants (bytes b0..b3): .x those of the low nibbles (elements 4i..4i+3 of a unit), .y those of
// the high ones (16+4i..), as signed bytes. Byte permutes: a nibble's low three bits pick a
// byte of one half of the book, its top bit the half.
__device__ __forceinline__ int2 iq4_values(uint32_t q) {
    constexpr uint32_t kBook[4] = {0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u};  // -127, -104, ... 113
    uint32_t v[2];  // (b0 lo, b0 hi, b1 lo, b1 hi), (b2 lo, b2 hi, b3 lo, b3 hi)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const uint32_t sel = q >> (16 * i);  // four nibbles
        const uint32_t low = __byte_perm(kBook[0], kBook[1], sel & 0x7777u), high = __byte_perm(kBook[2], kBook[3], sel & 0x7777u);
        v[i] = __byte_perm(low, high, 0x3210u | (sel & 0x8888u) >> 1);
    }
    return make_int2(static_cast<int>(__byte_perm(v[0], v[1], 0x6420u)), static_cast<int>(__byte_perm(v[0], v[1], 0x7531u)));
}

// A unit's integer dot with the activations, its weights' word i (elements 4i..4i+3, signed
// bytes) given by word(i): over the two 16-element halves apart (formats with a scale per 16).
template <typename Word>
__device__ __forceinline__ int2 half_dots(Word word, const XUnit& x) {
    int2 d = {0, 0};
#pragma unroll
    for (int i = 0; i < 4; ++i) d.x = __dp4a(word(i), x.w[i], d.x);
#pragma unroll
    for (int i = 4; i < 8; ++i) d.y = __dp4a(word(i), x.w[i], d.y);
    return d;
}

// IQ4_NL / IQ4_XS: the code book's values of a unit's four words of indices dotted with x.
__device__ __forceinline__ int iq4_dot(const uint32_t (&w)[4], const XUnit& x) {
    int dot = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int2 v = iq4_values(w[i]);
        dot = __dp4a(v.x, x.w[i], __dp4a(v.y, x.w[4 + i], dot));
    }
    return dot;
}

// Nibble words w (bytes 4i..4i+3 of a unit's 16 bytes of quants: elements 4i.. in the low
// nibbles, 16 + 4i.. in the high ones), with the fifth bits from qh where given, dotted with x.
// Four-bit quants: the high nibbles masked where they lie and dotted as unsigned bytes (dp4a_us),
// 16 times their dot, shifted back once: a mask a word instead of a shift and a mask, and two
// chains of four dp4a, not one of eight; the same integer (bench/NOTES.md, twenty-fifth CUDA
// session).
template <bool kFiveBit>
__device__ __forceinline__ int nibble_dot(const uint32_t (&w)[4], uint32_t qh, const XUnit& x) {
    if constexpr (kFiveBit) {
        int dot = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int lo = static_cast<int>(w[i] & 0x0F0F0F0F) | spread4(qh >> (4 * i));
            const int hi = static_cast<int>(w[i] >> 4 & 0x0F0F0F0F) | spread4(qh >> (16 + 4 * i));
            dot = __dp4a(lo, x.w[i], __dp4a(hi, x.w[4 + i], dot));
        }
        return dot;
    } else {
        int lo = 0, hi = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            lo = __dp4a(static_cast<int>(w[i] & 0x0F0F0F0Fu), x.w[i], lo);
            hi = dp4a_us(w[i] & 0xF0F0F0F0u, x.w[4 + i], hi);
        }
        return lo + (hi >> 4);  // (hi: 16 times the high nibbles' dot)
    }
}

// Per format: the block type, how many 32-element units it holds, and the dot product of unit u
// of a row (of whole blocks, at `row`) with a unit of activations.
template <TensorType T>
struct QuantDot {
    static constexpr bool kFast = false;
};

// Q4_0 in its device layout (Q4_0Group, quant_unit.cuh): unit u's d from its group's eight, its
// 16 bytes of nibbles in one 16-byte load (rows on 16-byte boundaries: gemv() checks).
template <>
struct QuantDot<TensorType::Q4_0> {
    static constexpr bool kFast = true;
    using Block = Q4_0Group;
    static constexpr int kUnits = 8;
    static __device__ float dot(const uint8_t* row, int64_t u, const XUnit& x) {
        const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
        const int j = static_cast<int>(u % 8);
        const uint4 q = *reinterpret_cast<const uint4*>(b.qs[j]);
        const uint32_t w[4] = {q.x, q.y, q.z, q.w};
        return h2f(b.d[j]) * x.d * static_cast<float>(nibble_dot<false>(w, 0, x) - 8 * x.sum);
    }
};

template <>
struct QuantDot<TensorType::Q4_1> {
    static constexpr bool kFast = true;
    using Block = block_q4_1;
    static constexpr int kUnits = 1;
    static __device__ float dot(const uint8_t* row, int64_t u, const XUnit& x) {
        const Block& b = reinterpret_cast<const Block*>(row)[u];
        uint32_t w[4];
        words_aligned(b.qs, w);  // 20-byte blocks: 4-byte aligned
        return x.d * (h2f(b.d) * static_cast<float>(nibble_dot<false>(w, 0, x)) + h2f(b.m) * static_cast<float>(x.sum));
    }
};

// Q5_0 in its device layout (Q5_0Group, quant_unit.cuh): unit u's nibbles in one 16-byte load, its
// fifth bits in one 4-byte load.
template <>
struct QuantDot<TensorType::Q5_0> {
    static constexpr bool kFast = true;
    using Block = Q5_0Group;
    static constexpr int kUnits = 8;
    static __device__ float dot(const uint8_t* row, int64_t u, const XUnit& x) {
        const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
        const int j = static_cast<int>(u % 8);
        const uint4 q = *reinterpret_cast<const uint4*>(b.qs[j]);
        const uint32_t w[4] = {q.x, q.y, q.z, q.w};
        const uint32_t qh = *reinterpret_cast<const uint32_t*>(b.qh[j]);
        return h2f(b.d[j]) * x.d * static_cast<float>(nibble_dot<true>(w, qh, x) - 16 * x.sum);
    }
};

template <>
struct QuantDot<TensorType::Q5_1> {
    static constexpr bool kFast = true;
    using Block = block_q5_1;
    static constexpr int kUnits = 1;
    static __device__ float dot(const uint8_t* row, int64_t u, const XUnit& x) {
        const Block& b = reinterpret_cast<const Block*>(row)[u];
        uint32_t w[4];
        words_aligned(b.qs, w);  // 24-byte blocks: 4-byte aligned
        const uint32_t qh = *reinterpret_cast<const uint32_t*>(b.qh);
        return x.d * (h2f(b.d) * static_cast<float>(nibble_dot<true>(w, qh, x)) + h2f(b.m) * static_cast<float>(x.sum));
    }
};

// Q8_0 in its device layout (Q8_0Group, quant_unit.cuh): unit u's d from its group's eight, its 32
// signed bytes in two 16-byte loads (rows on 16-byte boundaries: gemv() checks).
template <>
struct QuantDot<TensorType::Q8_0> {
    static constexpr bool kFast = true;
    using Block = Q8_0Group;
    static constexpr int kUnits = 8;
    static __device__ float dot(const uint8_t* row, int64_t u, const XUnit& x) {
        const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
        const int j = static_cast<int>(u % 8);
        const uint4 lo = reinterpret_cast<const uint4*>(b.qs[j])[0], hi = reinterpret_cast<const uint4*>(b.qs[j])[1];
        const int w[8] = {static_cast<int>(lo.x), static_cast<int>(lo.y), static_cast<int>(lo.z), static_cast<int>(lo.w),
                          static_cast<int>(hi.x), static_cast<int>(hi.y), static_cast<int>(hi.z), static_cast<int>(hi.w)};
        int dot = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) dot = __dp4a(w[i], x.w[i], dot);
        return h2f(b.d[j]) * x.d * static_cast<float>(dot);
    }
};

// Q4_K, in its device layout (q4_k_scale_min, quant_unit.cuh): the block's first 16 bytes (d, dmin
// and the twelve bytes of scales) in one load, the unit's scale and min picked by a byte permute
// and a shift, its 16 bytes of nibbles in one 16-byte load (rows on 16-byte boundaries: gemv()
// checks), dotted by nibble_dot (the high nibbles masked where they lie). The same integers as the
// plain form (Q5_K's below without its fifth bits): the same bits.
template <>
struct QuantDot<TensorType::Q4_K> {
    static constexpr bool kFast = true;
    using Block = block_q4_K;
    static constexpr int kUnits = 8;
    static __device__ float dot(const uint8_t* row, int64_t u, const XUnit& x) {
        const uint8_t* b = row + (u / 8) * sizeof(Block);
        const int j = static_cast<int>(u % 8);
        const uint4 head = *reinterpret_cast<const uint4*>(b);  // d | dmin, scales 0-3, 4-7, the mins' high nibbles
        const int s = static_cast<int>(__byte_perm(head.y, head.z, static_cast<uint32_t>(j)));  // (scales[j] in byte 0)
        const int sc = s & 63, m = (s >> 6 & 3) | static_cast<int>(head.w >> (4 * j) & 0xF) << 2;
        const uint4 q = *reinterpret_cast<const uint4*>(b + 16 + 16 * j);
        const uint32_t w[4] = {q.x, q.y, q.z, q.w};
        const int dot = nibble_dot<false>(w, 0, x);
        const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(head.x & 0xFFFF)));
        const float dmin = __half2float(__ushort_as_half(static_cast<unsigned short>(head.x >> 16)));
        return x.d * (d * static_cast<float>(sc * dot) - dmin * static_cast<float>(m * x.sum));
    }
};
// Q5_K: unit j of a super-block is sub-block j (176-byte blocks, so on 16-byte boundaries in rows
// of whole blocks: aligned four-byte loads), Q4_K's nibbles with a fifth bit from qh.
template <>
struct QuantDot<TensorType::Q5_K> {
    static constexpr bool kFast = true;
    using Block = block_q5_K;
    static constexpr int kUnits = 8;
    static __device__ float dot(const uint8_t* row, int64_t u, const XUnit& x) {
        const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
        const int j = static_cast<int>(u % 8);
        int sc, m;
        k_scale_min(b.scales, j, &sc, &m);
        const uint32_t* q = reinterpret_cast<const uint32_t*>(b.qs + (j / 2) * 32);
        const int shift = 4 * (j % 2);
        int dot = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int w = static_cast<int>(q[i] >> shift & 0x0F0F0F0F) |
                          static_cast<int>((reinterpret_cast<const uint32_t*>(b.qh)[i] >> j & 0x01010101) << 4);
            dot = __dp4a(w, x.w[i], dot);
        }
        return x.d * (h2f(b.d) * static_cast<float>(sc * dot) - h2f(b.dmin) * static_cast<float>(m * x.sum));
    }
};

// IQ4_NL: 4-bit indices into the code book, nibbles as Q4_0's, in the same device layout
// (IQ4NLGroup, quant_unit.cuh).
template <>
struct QuantDot<TensorType::IQ4_NL> {
    static constexpr bool kFast = true;
    using Block = IQ4NLGroup;
    static constexpr int kUnits = 8;
    static __device__ float dot(const uint8_t* row, int64_t u, const XUnit& x) {
        const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
        const int j = static_cast<int>(u % 8);
        const uint4 q = *reinterpret_cast<const uint4*>(b.qs[j]);
        const uint32_t w[4] = {q.x, q.y, q.z, q.w};
        return h2f(b.d[j]) * x.d * static_cast<float>(iq4_dot(w, x));
    }
};

// IQ4_XS: unit j of a super-block (136 bytes: 8-byte aligned) is sub-block j, 16 bytes of
// indices as IQ4_NL's, with the 6-bit scale (low 4 bits in scales_l, high 2 in scales_h) − 32.
__device__ __forceinline__ int iq4_xs_scale(const block_iq4_xs& b, int j) {
    return ((b.scales_l[j / 2] >> (4 * (j % 2)) & 0xF) | (b.scales_h >> (2 * j) & 3) << 4) - 32;
}
template <>
struct QuantDot<TensorType::IQ4_XS> {
    static constexpr bool kFast = true;
    using Block = block_iq4_xs;
    static constexpr int kUnits = 8;
    static __device__ float dot(const uint8_t* row, int64_t u, const XUnit& x) {
        const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
        const int j = static_cast<int>(u % 8);
        uint32_t w[4];
        words_aligned(b.qs + 16 * j, w);
        return h2f(b.d) * x.d * static_cast<float>(iq4_xs_scale(b, j) * iq4_dot(w, x));
    }
};

// Q2_K / Q3_K: unit j = g·4 + s of a super-block is bits 2s, 2s+1 of qs[g·32 + l] (l = 0..31),
// two sub-blocks of 16 with their own scales (sub-block 2j + l / 16). Q2_K: scale and min in a
// byte's nibbles, weight = d·sc·q − dmin·m (84-byte blocks: 4-byte aligned); Q3_K: q − 4 unless
// bit j of hmask[l] is set, 6-bit scales − 32 (110-byte blocks: 2-byte aligned).
__device__ __forceinline__ int q3_k_scale(const block_q3_K& b, int sb) {
    return ((b.scales[sb % 8] >> (4 * (sb / 8)) & 0xF) | (b.scales[8 + sb % 4] >> (2 * (sb / 4)) & 3) << 4) - 32;
}
template <>
struct QuantDot<TensorType::Q2_K> {
    static constexpr bool kFast = true;
    using Block = block_q2_K;
    static constexpr int kUnits = 8;
    static __device__ float dot(const uint8_t* row, int64_t u, const XUnit& x) {
        const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
        const int j = static_cast<int>(u % 8), g = j / 4, s = j % 4;
        uint32_t q[8];
        words_aligned(b.qs + 32 * g, q);
        const int2 dot = half_dots([&](int i) { return static_cast<int>(q[i] >> (2 * s) & 0x03030303u); }, x);
        const int s0 = b.scales[2 * j], s1 = b.scales[2 * j + 1];
        const int scaled = (s0 & 0xF) * dot.x + (s1 & 0xF) * dot.y, mins = (s0 >> 4) * x.sum_lo + (s1 >> 4) * (x.sum - x.sum_lo);
        return x.d * (h2f(b.d) * static_cast<float>(scaled) - h2f(b.dmin) * static_cast<float>(mins));
    }
};
template <>
struct QuantDot<TensorType::Q3_K> {
    static constexpr bool kFast = true;
    using Block = block_q3_K;
    static constexpr int kUnits = 8;
    static __device__ float dot(const uint8_t* row, int64_t u, const XUnit& x) {
        const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
        const int j = static_cast<int>(u % 8), g = j / 4, s = j % 4;
        uint32_t q[8], h[8];
        words(b.qs + 32 * g, q);
        words(b.hmask, h);
        const int2 dot = half_dots(
            [&](int i) { return static_cast<int>(__vsub4((q[i] >> (2 * s) & 0x03030303u) | (h[i] >> j & 0x01010101u) << 2, 0x04040404u)); }, x);
        return h2f(b.d) * x.d * static_cast<float>(q3_k_scale(b, 2 * j) * dot.x + q3_k_scale(b, 2 * j + 1) * dot.y);
    }
};

// Q6_K, in the device layout the upload gives it (q6_k_device_layout, gemv.cu; the same 210 bytes a
// super-block, ql and qh rearranged, the scales and d where they are): unit j's 32 low nibbles as
// 16 bytes at ql[16j] (elements i and 16 + i in byte i, low and high nibble), its high two bits
// as 8 bytes at qh[8j] (word w, byte i, bits 2k, 2k + 1: element 16w + 4k + i), two integer scales
// at scales[2j], one per 16 elements; weights are q − 32. (The file's layout spreads a unit's bits
// over 64 bytes of ql and qh, four-byte loads of which bounded the decode GEMV's dots: bench/NOTES.md,
// twenty-second CUDA session.) q6_k_words: the unit's 6-bit q as eight words of bytes (elements
// 4m..4m+3 in word m). The blocks are 2-byte aligned: the words come from aligned loads and funnel
// shifts (the low nibbles' shift for the high half, 4, joins the aligning one).
// q6_k_lane: where unit u of blocks that start k bytes past a 4-byte boundary lies from that
// boundary (the first ql and qh words read, the scales, d) and the two aligning shifts; the staged
// GEMV works it out once per row (QuantDot<Q6_K>::Lane).
struct Q6KLane {
    int ql, qh, sc, d;
    int nl, nh;
};
__device__ __forceinline__ Q6KLane q6_k_lane(int k, int u) {
    const int b = k + (u / 8) * static_cast<int>(sizeof(block_q6_K)), j = u % 8;
    const int pl = b + 16 * j, ph = b + 128 + 8 * j;
    return {pl - (pl & 3), ph - (ph & 3), b + 192 + 2 * j, b + 208, 8 * (pl & 3), 8 * (ph & 3)};
}
// The unit's eight words from the boundary `base` (five aligned words of ql and three of qh read).
__device__ __forceinline__ void q6_k_join(const uint8_t* base, const Q6KLane& p, uint32_t (&w)[8]) {
    const uint32_t* al = reinterpret_cast<const uint32_t*>(base + p.ql);
    const uint32_t* ah = reinterpret_cast<const uint32_t*>(base + p.qh);
    uint32_t l[5], a[3], h[2];
#pragma unroll
    for (int i = 0; i < 5; ++i) l[i] = al[i];
#pragma unroll
    for (int i = 0; i < 3; ++i) a[i] = ah[i];
#pragma unroll
    for (int i = 0; i < 2; ++i) h[i] = __funnelshift_r(a[i], a[i + 1], p.nh);
#pragma unroll
    for (int m = 0; m < 8; ++m) {
        const int k = m % 4;  // (element 4m + i's high bits: bits 2k of word m / 4's byte i, to bits 4-5)
        const uint32_t hi = k < 2 ? h[m / 4] << (4 - 2 * k) : h[m / 4] >> (2 * k - 4);
        w[m] = (__funnelshift_r(l[m % 4], l[m % 4 + 1], p.nl + 4 * (m / 4)) & 0x0F0F0F0Fu) | (hi & 0x30303030u);
    }
}
__device__ __forceinline__ void q6_k_words(const block_q6_K& b, int j, uint32_t (&w)[8]) {
    const uint8_t* block = reinterpret_cast<const uint8_t*>(&b);
    const int k = static_cast<int>(reinterpret_cast<uintptr_t>(block) & 3);
    q6_k_join(block - k, q6_k_lane(k, j), w);
}
// A unit's float from its words' half dots, its two scales and the block's d.
__device__ __forceinline__ float q6_k_unit(const int2& d, int s0, int s1, er_half scale, const XUnit& x) {
    const int dot = s0 * (d.x - 32 * x.sum_lo) + s1 * (d.y - 32 * (x.sum - x.sum_lo));
    return h2f(scale) * x.d * static_cast<float>(dot);
}
template <>
struct QuantDot<TensorType::Q6_K> {
    static constexpr bool kFast = true;
    using Block = block_q6_K;
    static constexpr int kUnits = 8;
    static __device__ float dot(const uint8_t* row, int64_t u, const XUnit& x) {
        const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
        const int j = static_cast<int>(u % 8);
        uint32_t w[8];
        q6_k_words(b, j, w);
        const int2 d = half_dots([&](int i) { return static_cast<int>(w[i]); }, x);
        return q6_k_unit(d, b.scales[2 * j], b.scales[2 * j + 1], b.d, x);
    }

    // The staged GEMV's form (GemvStaged::kLanes). Its chunks of whole blocks are a multiple of 4
    // bytes, so every chunk of a row starts as far past a 4-byte boundary: where a lane's unit
    // lies from that boundary, and its shifts, are worked out once per row (Lane), not for every
    // unit. The same words, so the same bits.
    using Lane = Q6KLane;
    // unit u of a chunk that starts k bytes past the boundary
    static __device__ Lane lane(int k, int u) { return q6_k_lane(k, u); }
    static __device__ float dot(const uint8_t* base, const Lane& p, const XUnit& x) {
        uint32_t w[8];
        q6_k_join(base, p, w);
        const int2 d = half_dots([&](int i) { return static_cast<int>(w[i]); }, x);
        return q6_k_unit(d, static_cast<int8_t>(base[p.sc]), static_cast<int8_t>(base[p.sc + 1]), *reinterpret_cast<const er_half*>(base + p.d), x);
    }
};

// Whether a QuantDot has the staged GEMV's per-lane form, and its Lane.
template <class D, class = void>
struct LanesOf {
    static constexpr bool value = false;
    struct type {};
};
template <class D>
struct LanesOf<D, std::void_t<typename D::Lane>> {
    static constexpr bool value = true;
    using type = typename D::Lane;
};

// The staged GEMV's packed chunks (GemvStaged's kPack: a grid of one wave whose rows fit in its
// ring). Such a block's chunks land in shared memory long before its input is ready. While it
// waits, each warp rewrites them from raw blocks into aligned fields, so that the dot after the
// wait reads a unit's quants with 16-byte loads and its scales from arrays of their own: no funnel
// shifts, no bank conflicts, fewer shared-memory wavefronts (what the dots of a one-wave GEMV wait
// on: bench/NOTES.md, sixteenth CUDA session). A packed chunk of n units (bytes(n) in all): unit u's
// quants at [q·u] (q = 16 bytes for Q4_K, 32 for Q6_K), a 16-bit field per
// unit at [n·q + 2u], and for the K-quants a 32-bit field per block at [n·(q + 2) + 4·(u / 8)].
// dot() is the raw dot's arithmetic: the same bits. Formats without it: kPacks = false (Q4_0 and
// Q8_0, whose device layouts already give their dots those loads).
template <TensorType T>
struct Packed {
    static constexpr bool kPacks = false;
    static constexpr int bytes(int) { return 0; }
};

// Q4_K: a unit's 32 nibbles as 16 bytes (as its device layout holds them: low nibbles
// elements 0..15, high ones 16..31), its 6-bit scale and min as two bytes, the block's d and dmin
// per block.
template <>
struct Packed<TensorType::Q4_K> {
    static constexpr bool kPacks = true;
    static constexpr int bytes(int n) { return 18 * n + 4 * (n / 8); }
    struct Unit {
        uint4 q;
        uint16_t sm;      // scale | min << 8
        uint32_t d_dmin;  // the block's d and dmin (as stored)
    };
    static __device__ Unit load(const uint8_t* raw, int u) {
        const block_q4_K& b = reinterpret_cast<const block_q4_K*>(raw)[u / 8];
        const int j = u % 8;
        int sc, m;
        q4_k_scale_min(b.scales, j, &sc, &m);
        return {reinterpret_cast<const uint4*>(b.qs)[j], static_cast<uint16_t>(sc | m << 8), *reinterpret_cast<const uint32_t*>(&b.d)};
    }
    static __device__ void store(uint8_t* chunk, int n, int u, const Unit& v) {
        reinterpret_cast<uint4*>(chunk)[u] = v.q;
        reinterpret_cast<uint16_t*>(chunk + 16 * n)[u] = v.sm;
        if (u % 8 == 0) reinterpret_cast<uint32_t*>(chunk + 18 * n)[u / 8] = v.d_dmin;
    }
    static __device__ float dot(const uint8_t* chunk, int n, int u, const XUnit& x) {
        const uint4 q = reinterpret_cast<const uint4*>(chunk)[u];
        const uint32_t w[4] = {q.x, q.y, q.z, q.w};
        const int sm = reinterpret_cast<const uint16_t*>(chunk + 16 * n)[u];
        const er_half* d = reinterpret_cast<const er_half*>(chunk + 18 * n) + 2 * (u / 8);  // d, dmin
        const int dot = nibble_dot<false>(w, 0, x);
        return x.d * (h2f(d[0]) * static_cast<float>((sm & 0xFF) * dot) - h2f(d[1]) * static_cast<float>((sm >> 8) * x.sum));
    }
};

// Q6_K: a unit's 32 weights as signed bytes (q − 32), its two scales as two bytes, the block's d
// per block. The raw dot's integer sum without its offsets: the same integer.
template <>
struct Packed<TensorType::Q6_K> {
    static constexpr bool kPacks = true;
    static constexpr int bytes(int n) { return 34 * n + 4 * (n / 8); }
    struct Unit {
        uint4 q[2];
        uint16_t scales;  // s0 | s1 << 8 (the bytes as stored)
        er_half d;
    };
    static __device__ Unit load(const uint8_t* raw, int u) {
        const block_q6_K& b = reinterpret_cast<const block_q6_K*>(raw)[u / 8];
        const int j = u % 8;
        uint32_t w[8];
        q6_k_words(b, j, w);
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = __vsub4(w[i], 0x20202020u);
        const uint16_t scales = static_cast<uint16_t>(static_cast<uint8_t>(b.scales[2 * j]) | static_cast<uint8_t>(b.scales[2 * j + 1]) << 8);
        return {{make_uint4(w[0], w[1], w[2], w[3]), make_uint4(w[4], w[5], w[6], w[7])}, scales, b.d};
    }
    static __device__ void store(uint8_t* chunk, int n, int u, const Unit& v) {
        reinterpret_cast<uint4*>(chunk)[2 * u] = v.q[0];
        reinterpret_cast<uint4*>(chunk)[2 * u + 1] = v.q[1];
        reinterpret_cast<uint16_t*>(chunk + 32 * n)[u] = v.scales;
        if (u % 8 == 0) reinterpret_cast<er_half*>(chunk + 34 * n)[2 * (u / 8)] = v.d;
    }
    static __device__ float dot(const uint8_t* chunk, int n, int u, const XUnit& x) {
        const uint4 lo = reinterpret_cast<const uint4*>(chunk)[2 * u], hi = reinterpret_cast<const uint4*>(chunk)[2 * u + 1];
        const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
        const int2 d = half_dots([&](int i) { return static_cast<int>(w[i]); }, x);
        const int scales = reinterpret_cast<const uint16_t*>(chunk + 32 * n)[u];
        const int dot = static_cast<int8_t>(scales & 0xFF) * d.x + static_cast<int8_t>(scales >> 8) * d.y;
        return h2f(reinterpret_cast<const er_half*>(chunk + 34 * n)[2 * (u / 8)]) * x.d * static_cast<float>(dot);
    }
};

}  // namespace edgerunner::cuda
