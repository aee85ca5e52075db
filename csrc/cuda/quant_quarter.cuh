// GEMV's fast path: a quarter (8 elements) of a 32-element unit per thread, so four lanes share
// a unit and a warp reads 8 consecutive units with neighbouring loads. Per format, which 8
// elements a quarter holds follows the block layout (quant_blocks.h): for the nibble formats,
// bytes 4k..4k+3 of qs (elements 4k.. and 16 + 4k..); otherwise elements 8k..8k+7.
#pragma once

#include "quant_unit.cuh"

namespace edgerunner::cuda {

// Blocks are only 2-byte aligned in a row (18-, 22-, 34-, 210-byte blocks): 32-bit words are
// assembled from two 16-bit loads.
__device__ __forceinline__ uint32_t ld32(const uint8_t* p) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
    return static_cast<uint32_t>(h[0]) | static_cast<uint32_t>(h[1]) << 16;
}
__device__ __forceinline__ float4 ldx(const float* x) { return *reinterpret_cast<const float4*>(x); }
__device__ __forceinline__ float sum4(float4 v) { return (v.x + v.y) + (v.z + v.w); }

// Σ_i nibble i (of 4 at `shift` + 8i in w) · x_i, with an offset subtracted from each nibble.
__device__ __forceinline__ float nib4(uint32_t w, int shift, float4 x, float offset) {
    return (static_cast<float>((w >> shift) & 0xF) - offset) * x.x + (static_cast<float>((w >> (shift + 8)) & 0xF) - offset) * x.y +
           (static_cast<float>((w >> (shift + 16)) & 0xF) - offset) * x.z + (static_cast<float>((w >> (shift + 24)) & 0xF) - offset) * x.w;
}
// Bytes of w as signed int8 · x.
__device__ __forceinline__ float s8x4(uint32_t w, float4 x) {
    return static_cast<float>(static_cast<int8_t>(w)) * x.x + static_cast<float>(static_cast<int8_t>(w >> 8)) * x.y +
           static_cast<float>(static_cast<int8_t>(w >> 16)) * x.z + static_cast<float>(static_cast<int8_t>(w >> 24)) * x.w;
}
// Adds bit (b0 + i) of qh, as 16, to nibble i of the 4 in the values v (one per byte).
__device__ __forceinline__ float five4(uint32_t w, int shift, uint32_t qh, int b0, float4 x, float offset) {
    float s = 0.0f;
    const float xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int q = ((w >> (shift + 8 * i)) & 0xF) | ((qh >> (b0 + i)) & 1) << 4;
        s += (static_cast<float>(q) - offset) * xs[i];
    }
    return s;
}

// Quarter<T>::x0(k), x1(k): where the quarter's two runs of 4 activations start in the unit;
// dot(row, u, k, a, b) takes those 8 activations already loaded (a warp working on several
// rows loads them once).
template <TensorType T>
struct Quarter {
    static constexpr bool kFast = false;
};

struct NibbleQuarter {  // elements 4k..4k+3 (low nibbles) and 16 + 4k.. (high nibbles)
    static constexpr bool kFast = true;
    static __device__ int x0(int k) { return 4 * k; }
    static __device__ int x1(int k) { return 16 + 4 * k; }
};
struct LinearQuarter {  // elements 8k..8k+7
    static constexpr bool kFast = true;
    static __device__ int x0(int k) { return 8 * k; }
    static __device__ int x1(int k) { return 8 * k + 4; }
};

template <>
struct Quarter<TensorType::Q4_0> : NibbleQuarter {
    static __device__ float dot(const uint8_t* row, int64_t u, int k, float4 lo, float4 hi) {
        const block_q4_0& b = reinterpret_cast<const block_q4_0*>(row)[u];
        const uint32_t w = ld32(b.qs + 4 * k);
        return h2f(b.d) * (nib4(w, 0, lo, 8.0f) + nib4(w, 4, hi, 8.0f));
    }
};

template <>
struct Quarter<TensorType::Q4_1> : NibbleQuarter {
    static __device__ float dot(const uint8_t* row, int64_t u, int k, float4 lo, float4 hi) {
        const block_q4_1& b = reinterpret_cast<const block_q4_1*>(row)[u];
        const uint32_t w = ld32(b.qs + 4 * k);
        return h2f(b.d) * (nib4(w, 0, lo, 0.0f) + nib4(w, 4, hi, 0.0f)) + h2f(b.m) * (sum4(lo) + sum4(hi));
    }
};

template <>
struct Quarter<TensorType::Q5_0> : NibbleQuarter {
    static __device__ float dot(const uint8_t* row, int64_t u, int k, float4 lo, float4 hi) {
        const block_q5_0& b = reinterpret_cast<const block_q5_0*>(row)[u];
        const uint32_t w = ld32(b.qs + 4 * k), qh = ld32(b.qh);
        return h2f(b.d) * (five4(w, 0, qh, 4 * k, lo, 16.0f) + five4(w, 4, qh, 16 + 4 * k, hi, 16.0f));
    }
};

template <>
struct Quarter<TensorType::Q5_1> : NibbleQuarter {
    static __device__ float dot(const uint8_t* row, int64_t u, int k, float4 lo, float4 hi) {
        const block_q5_1& b = reinterpret_cast<const block_q5_1*>(row)[u];
        const uint32_t w = ld32(b.qs + 4 * k), qh = ld32(b.qh);
        return h2f(b.d) * (five4(w, 0, qh, 4 * k, lo, 0.0f) + five4(w, 4, qh, 16 + 4 * k, hi, 0.0f)) + h2f(b.m) * (sum4(lo) + sum4(hi));
    }
};

template <>
struct Quarter<TensorType::Q8_0> : LinearQuarter {
    static __device__ float dot(const uint8_t* row, int64_t u, int k, float4 x0, float4 x1) {
        const block_q8_0& b = reinterpret_cast<const block_q8_0*>(row)[u];
        const uint8_t* q = reinterpret_cast<const uint8_t*>(b.qs) + 8 * k;
        return h2f(b.d) * (s8x4(ld32(q), x0) + s8x4(ld32(q + 4), x1));
    }
};

// Q4_K / Q5_K: unit j = sub-block j; quarter k = its elements 8k..8k+7.
template <typename Block, bool kFiveBit>
__device__ __forceinline__ float q45_k_quarter(const uint8_t* row, int64_t u, int k, float4 x0, float4 x1) {
    const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
    const int j = static_cast<int>(u % 8);
    int sc, m;
    k_scale_min(b.scales, j, &sc, &m);
    const uint8_t* q = b.qs + (j / 2) * 32 + 8 * k;
    const int shift = 4 * (j % 2);
    float qx;
    if constexpr (kFiveBit) {
        // bit j of qh[l] for l = 8k..8k+7, gathered into a word per 4 bytes
        const uint32_t h0 = ld32(b.qh + 8 * k) >> j, h1 = ld32(b.qh + 8 * k + 4) >> j;
        const uint32_t g0 = (h0 & 1) | (h0 >> 7 & 2) | (h0 >> 14 & 4) | (h0 >> 21 & 8);
        const uint32_t g1 = (h1 & 1) | (h1 >> 7 & 2) | (h1 >> 14 & 4) | (h1 >> 21 & 8);
        qx = five4(ld32(q), shift, g0, 0, x0, 0.0f) + five4(ld32(q + 4), shift, g1, 0, x1, 0.0f);
    } else {
        qx = nib4(ld32(q), shift, x0, 0.0f) + nib4(ld32(q + 4), shift, x1, 0.0f);
    }
    return h2f(b.d) * static_cast<float>(sc) * qx - h2f(b.dmin) * static_cast<float>(m) * (sum4(x0) + sum4(x1));
}

template <>
struct Quarter<TensorType::Q4_K> : LinearQuarter {
    static __device__ float dot(const uint8_t* row, int64_t u, int k, float4 a, float4 b) { return q45_k_quarter<block_q4_K, false>(row, u, k, a, b); }
};
template <>
struct Quarter<TensorType::Q5_K> : LinearQuarter {
    static __device__ float dot(const uint8_t* row, int64_t u, int k, float4 a, float4 b) { return q45_k_quarter<block_q5_K, true>(row, u, k, a, b); }
};

// Q6_K: unit j = h·4 + s; quarter k = elements l = 8k..8k+7 (scale h·8 + s·2 + k/2).
template <>
struct Quarter<TensorType::Q6_K> : LinearQuarter {
    static __device__ float dot(const uint8_t* row, int64_t u, int k, float4 x0, float4 x1) {
        const block_q6_K& b = reinterpret_cast<const block_q6_K*>(row)[u / 8];
        const int j = static_cast<int>(u % 8), h = j / 4, s = j % 4;
        const uint8_t* ql = b.ql + h * 64 + (s % 2) * 32 + 8 * k;
        const uint8_t* qh = b.qh + h * 32 + 8 * k;
        const int shift = 4 * (s / 2);
        float qx = 0.0f;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const uint32_t lo = ld32(ql + 4 * half), hi = ld32(qh + 4 * half);
            const float4 xv = half ? x1 : x0;
            const float xs[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int q = ((lo >> (shift + 8 * i)) & 0xF) | ((hi >> (2 * s + 8 * i)) & 3) << 4;
                qx += static_cast<float>(q - 32) * xs[i];
            }
        }
        return h2f(b.d) * static_cast<float>(b.scales[h * 8 + s * 2 + k / 2]) * qx;
    }
};

}  // namespace edgerunner::cuda
