// GEMV's fast path: a quarter (8 elements) of a 32-element unit per thread, so four lanes share
// a unit and a warp reads 8 consecutive units with neighbouring loads, against activations
// quantized to int8 once per step (QBlock): integer dot products by dp4a, exact, then one
// float scale per quarter. Which 8 elements a quarter holds follows the block layout. Q4_0, Q4_K
// and Q5_K take a whole unit per lane instead (Whole, at the end: half the instructions).
#pragma once

#include "quant_unit.cuh"
#include "warp.cuh"

namespace edgerunner::cuda {

// Activations as the fast GEMV reads them, quantized once per step: 32 values = d · q.
struct QBlock {
    float d;
    int8_t q[32];
};
static_assert(sizeof(QBlock) == 36, "QBlock layout");

// A warp's 32 values (one per lane) into one block: d = max|v| / 127, q = round(v / d). Kernels
// that produce a matmul's input call it as they write the row (RMSNorm, attention).
__device__ __forceinline__ void quantize_block(float v, QBlock& out, int lane) {
    const float d = warp_max(fabsf(v)) / 127.0f;
    out.q[lane] = static_cast<int8_t>(d > 0.0f ? __float2int_rn(v / d) : 0);
    if (lane == 0) out.d = d;
}

// Blocks are only 2-byte aligned in a row (18-, 22-, 34-, 210-byte blocks): 32-bit words are
// assembled from two 16-bit loads.
__device__ __forceinline__ uint32_t ld32(const uint8_t* p) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
    return static_cast<uint32_t>(h[0]) | static_cast<uint32_t>(h[1]) << 16;
}
__device__ __forceinline__ int aq(const QBlock& a, int i) { return *reinterpret_cast<const int*>(a.q + i); }

// Bits 0..3 of b to bit 4 of bytes 0..3 (the fifth bit of four 5-bit quants): the products of
// the multiply land on distinct bits, so no carries mix them.
__device__ __forceinline__ int spread4(uint32_t b) { return static_cast<int>(((b & 0xF) * 0x00204081u & 0x01010101u) << 4); }

constexpr int kOnes = 0x01010101;

// Per format: the block type and how many 32-element units it holds, and (except for the formats
// with a Whole form below, which the GEMV kernels always take) the integer dot of one quarter
// (8 weights) with its 8 activations (dp4a, four products per instruction), and the activations'
// sum where an offset or minimum needs it:
//   nibble formats: bytes 4k..4k+3 of qs = elements 4k.. (low nibbles) and 16 + 4k.. (high);
//   the others: elements 8k..8k+7 of the 32-element unit.
template <TensorType T>
struct Quarter {
    static constexpr bool kFast = false;
};

template <>
struct Quarter<TensorType::Q4_0> {
    static constexpr bool kFast = true;
    using Block = block_q4_0;
    static constexpr int kUnits = 1;  // 32-element units per block
    // the dot: a whole unit a lane (Whole, below)
};

template <>
struct Quarter<TensorType::Q4_1> {
    static constexpr bool kFast = true;
    using Block = block_q4_1;
    static constexpr int kUnits = 1;  // 32-element units per block
    static __device__ float dot(const uint8_t* row, int64_t u, int k, const QBlock& a) {
        const block_q4_1& b = reinterpret_cast<const block_q4_1*>(row)[u];
        const uint32_t w = ld32(b.qs + 4 * k);
        const int lo = aq(a, 4 * k), hi = aq(a, 16 + 4 * k);
        const int dot = __dp4a(static_cast<int>(w & 0x0F0F0F0F), lo, __dp4a(static_cast<int>(w >> 4 & 0x0F0F0F0F), hi, 0));
        const int sum = __dp4a(kOnes, lo, __dp4a(kOnes, hi, 0));
        return a.d * (h2f(b.d) * static_cast<float>(dot) + h2f(b.m) * static_cast<float>(sum));
    }
};

template <typename Block, int kOffset>
__device__ __forceinline__ float q5_quarter(const Block& b, int k, const QBlock& a, float* sum_out) {
    const uint32_t w = ld32(b.qs + 4 * k), qh = ld32(b.qh);
    const int lo = aq(a, 4 * k), hi = aq(a, 16 + 4 * k);
    const int wl = static_cast<int>(w & 0x0F0F0F0F) | spread4(qh >> (4 * k));
    const int wh = static_cast<int>(w >> 4 & 0x0F0F0F0F) | spread4(qh >> (16 + 4 * k));
    const int sum = __dp4a(kOnes, lo, __dp4a(kOnes, hi, 0));
    *sum_out = static_cast<float>(sum);
    return static_cast<float>(__dp4a(wl, lo, __dp4a(wh, hi, 0)) - kOffset * sum);
}

template <>
struct Quarter<TensorType::Q5_0> {
    static constexpr bool kFast = true;
    using Block = block_q5_0;
    static constexpr int kUnits = 1;  // 32-element units per block
    static __device__ float dot(const uint8_t* row, int64_t u, int k, const QBlock& a) {
        const block_q5_0& b = reinterpret_cast<const block_q5_0*>(row)[u];
        float sum;
        return h2f(b.d) * a.d * q5_quarter<block_q5_0, 16>(b, k, a, &sum);
    }
};

template <>
struct Quarter<TensorType::Q5_1> {
    static constexpr bool kFast = true;
    using Block = block_q5_1;
    static constexpr int kUnits = 1;  // 32-element units per block
    static __device__ float dot(const uint8_t* row, int64_t u, int k, const QBlock& a) {
        const block_q5_1& b = reinterpret_cast<const block_q5_1*>(row)[u];
        float sum;
        const float dot = q5_quarter<block_q5_1, 0>(b, k, a, &sum);
        return a.d * (h2f(b.d) * dot + h2f(b.m) * sum);
    }
};

template <>
struct Quarter<TensorType::Q8_0> {
    static constexpr bool kFast = true;
    using Block = block_q8_0;
    static constexpr int kUnits = 1;  // 32-element units per block
    static __device__ float dot(const uint8_t* row, int64_t u, int k, const QBlock& a) {
        const block_q8_0& b = reinterpret_cast<const block_q8_0*>(row)[u];
        const uint8_t* q = reinterpret_cast<const uint8_t*>(b.qs) + 8 * k;
        const int dot = __dp4a(static_cast<int>(ld32(q)), aq(a, 8 * k), __dp4a(static_cast<int>(ld32(q + 4)), aq(a, 8 * k + 4), 0));
        return h2f(b.d) * a.d * static_cast<float>(dot);
    }
};

template <>
struct Quarter<TensorType::Q4_K> {
    static constexpr bool kFast = true;
    using Block = block_q4_K;
    static constexpr int kUnits = 8;  // 32-element units per block; the dot: a whole unit a lane (Whole, below)
};
template <>
struct Quarter<TensorType::Q5_K> {
    static constexpr bool kFast = true;
    using Block = block_q5_K;
    static constexpr int kUnits = 8;  // 32-element units per block; the dot: a whole unit a lane (Whole, below)
};

// Q6_K: unit j = h·4 + s; quarter k = elements l = 8k..8k+7 (scale h·8 + s·2 + k/2).
template <>
struct Quarter<TensorType::Q6_K> {
    static constexpr bool kFast = true;
    using Block = block_q6_K;
    static constexpr int kUnits = 8;  // 32-element units per block
    static __device__ float dot(const uint8_t* row, int64_t u, int k, const QBlock& a) {
        const block_q6_K& b = reinterpret_cast<const block_q6_K*>(row)[u / 8];
        const int j = static_cast<int>(u % 8), h = j / 4, s = j % 4;
        const uint8_t* ql = b.ql + h * 64 + (s % 2) * 32 + 8 * k;
        const uint8_t* qh = b.qh + h * 32 + 8 * k;
        const int shift = 4 * (s / 2);
        const int w0 = static_cast<int>((ld32(ql) >> shift & 0x0F0F0F0F) | (ld32(qh) >> (2 * s) & 0x03030303) << 4);
        const int w1 = static_cast<int>((ld32(ql + 4) >> shift & 0x0F0F0F0F) | (ld32(qh + 4) >> (2 * s) & 0x03030303) << 4);
        const int a0 = aq(a, 8 * k), a1 = aq(a, 8 * k + 4);
        const int dot = __dp4a(w0, a0, __dp4a(w1, a1, 0)) - 32 * __dp4a(kOnes, a0, __dp4a(kOnes, a1, 0));
        return h2f(b.d) * a.d * static_cast<float>(b.scales[h * 8 + s * 2 + k / 2] * dot);
    }
};

// A whole 32-element unit per lane, where a format has the form (the decode GEMV's cheaper
// path: one scale multiply per unit instead of per quarter, four-byte loads): the unit's
// integer dot with its 32 int8 activations (eight words, and their sum for the formats with
// an offset), times both scales.
struct XUnit {
    int w[8];  // the 32 int8 values
    int sum;   // their sum
    float d;
};
__device__ __forceinline__ XUnit load_x(const QBlock& x) {
    XUnit u;
    u.sum = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        u.w[j] = aq(x, 4 * j);
        u.sum = __dp4a(kOnes, u.w[j], u.sum);
    }
    u.d = x.d;
    return u;
}

// Four 32-bit words from a 2-byte aligned address: five aligned loads and funnel shifts (the
// word past the sixteen bytes may be read, and is not used when the address is aligned).
__device__ __forceinline__ void words4(const uint8_t* p, uint32_t (&w)[4]) {
    const uint32_t* base = reinterpret_cast<const uint32_t*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t{3});
    const unsigned shift = static_cast<unsigned>(reinterpret_cast<uintptr_t>(p) & 3) * 8;
    uint32_t a[5];
#pragma unroll
    for (int i = 0; i < 5; ++i) a[i] = base[i];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = __funnelshift_r(a[i], a[i + 1], shift);
}

template <TensorType T>
struct Whole {
    static constexpr bool kFast = false;
};

template <>
struct Whole<TensorType::Q4_0> {
    static constexpr bool kFast = true;
    static __device__ float dot(const uint8_t* row, int64_t u, const XUnit& x) {
        const block_q4_0& b = reinterpret_cast<const block_q4_0*>(row)[u];
        uint32_t w[4];
        words4(b.qs, w);
        int dot = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            dot = __dp4a(static_cast<int>(w[i] & 0x0F0F0F0F), x.w[i], dot);
            dot = __dp4a(static_cast<int>(w[i] >> 4 & 0x0F0F0F0F), x.w[4 + i], dot);
        }
        return h2f(b.d) * x.d * static_cast<float>(dot - 8 * x.sum);
    }
};

// Q4_K / Q5_K: unit j of a super-block is sub-block j (blocks of 144 and 176 bytes, so on
// 16-byte boundaries in rows of whole blocks: aligned four-byte loads).
template <typename Block, bool kFiveBit>
__device__ __forceinline__ float q45_k_whole(const uint8_t* row, int64_t u, const XUnit& x) {
    const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
    const int j = static_cast<int>(u % 8);
    int sc, m;
    k_scale_min(b.scales, j, &sc, &m);
    const uint32_t* q = reinterpret_cast<const uint32_t*>(b.qs + (j / 2) * 32);
    const int shift = 4 * (j % 2);
    int dot = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        int w = static_cast<int>(q[i] >> shift & 0x0F0F0F0F);
        if constexpr (kFiveBit) w |= static_cast<int>((reinterpret_cast<const uint32_t*>(b.qh)[i] >> j & 0x01010101) << 4);
        dot = __dp4a(w, x.w[i], dot);
    }
    return x.d * (h2f(b.d) * static_cast<float>(sc * dot) - h2f(b.dmin) * static_cast<float>(m * x.sum));
}

template <>
struct Whole<TensorType::Q4_K> {
    static constexpr bool kFast = true;
    static __device__ float dot(const uint8_t* row, int64_t u, const XUnit& x) { return q45_k_whole<block_q4_K, false>(row, u, x); }
};
template <>
struct Whole<TensorType::Q5_K> {
    static constexpr bool kFast = true;
    static __device__ float dot(const uint8_t* row, int64_t u, const XUnit& x) { return q45_k_whole<block_q5_K, true>(row, u, x); }
};

}  // namespace edgerunner::cuda
