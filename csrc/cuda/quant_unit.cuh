// One 32-element unit of a weight row, in the block layouts of edgerunner/quant_blocks.h (Q4_0's,
// Q5_0's, Q8_0's, IQ4_NL's, Q4_K's and Q6_K's as the upload rearranges them, below):
// load() into 32 floats (embedding rows) for every type; dot() with 32 float activations for the
// types whose GEMV has no int8 fast path (quant_dot.cuh covers Q4_0 … Q6_K). Every format
// splits into units of 32 consecutive elements (a 32-element block, or sub-block u % 8 of a
// 256-element super-block), so a warp spreads a row over its lanes the same way for every type. Nothing is ever dequantized to
// memory: the weights go from their bytes to registers to the FMA.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "edgerunner/quant_blocks.h"
#include "edgerunner/tensor_type.h"

namespace edgerunner::cuda {

__device__ __forceinline__ float h2f(er_half h) { return __half2float(h); }

// 6-bit scale and min j of a Q4_K / Q5_K block as the file holds it (ggml's get_scale_min_k4).
__device__ __forceinline__ void k_scale_min(const uint8_t* s, int j, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}
// Q4_K in the device layout the upload gives it (q4_k_device_layout, gemv.cu; the same 144 bytes a
// super-block, d and dmin where they are, scales and qs rearranged): unit j's 32 nibbles as 16
// bytes at qs[16j] (elements i and 16 + i in byte i, low and high nibble, as Q4_0's), its 6-bit
// scale in bits 0-5 of scales[j], its 6-bit min's low two bits in bits 6-7 of scales[j] and its high
// four in nibble j of scales[8..11]. (The file's layout puts a unit's nibbles in 32 bytes shared
// with the next unit and its scale and min in two forms: bench/NOTES.md, twenty-third CUDA session.)
__device__ __forceinline__ void q4_k_scale_min(const uint8_t* s, int j, int* sc, int* m) {
    *sc = s[j] & 63;
    *m = s[j] >> 6 | ((s[8 + j / 2] >> (4 * (j % 2))) & 0xF) << 2;
}

// Q4_0, Q5_0, Q8_0 and IQ4_NL in the device layout the upload gives them (group_device_layout,
// gemv.cu): the file's blocks in groups of eight, the eight d's first (then Q5_0's eight 4-byte
// qh), then the eight blocks' quants (16 bytes of nibbles, or Q8_0's 32 signed bytes: the same 144,
// 176 or 272 bytes), so that a unit's quants are aligned 16-byte loads; a row's blocks padded to
// whole groups (d = 0, quants 0: never read), so rows start on 16-byte boundaries. (The file's 18-,
// 22- and 34-byte blocks put the quants at 2-byte offsets: five or nine loads and four or eight
// funnel shifts a unit, on the decode GEMV's issue-bound dots: bench/NOTES.md, twenty-sixth CUDA
// session.)
template <typename Block>
struct Group8 {
    er_half d[8];
    decltype(Block::qs) qs[8];
};
template <>
struct Group8<block_q5_0> {
    er_half d[8];
    uint8_t qh[8][4];
    uint8_t qs[8][16];
};
using Q4_0Group = Group8<block_q4_0>;
using Q5_0Group = Group8<block_q5_0>;
using Q8_0Group = Group8<block_q8_0>;
using IQ4NLGroup = Group8<block_iq4_nl>;
static_assert(sizeof(Q4_0Group) == 8 * sizeof(block_q4_0) && sizeof(Q5_0Group) == 8 * sizeof(block_q5_0) &&
                  sizeof(Q8_0Group) == 8 * sizeof(block_q8_0) && sizeof(IQ4NLGroup) == 8 * sizeof(block_iq4_nl),
              "groups: the same bytes as eight blocks");
// The bytes of a group of `type` on the device; 0 for the formats not grouped.
constexpr size_t group_bytes(TensorType type) {
    return type == TensorType::Q4_0 ? sizeof(Q4_0Group) : type == TensorType::Q5_0 ? sizeof(Q5_0Group)
           : type == TensorType::Q8_0 ? sizeof(Q8_0Group) : type == TensorType::IQ4_NL ? sizeof(IQ4NLGroup) : 0;
}

template <TensorType T>
struct Unit;

template <>
struct Unit<TensorType::Q4_0> {
    using Block = Q4_0Group;
    static __device__ void load(const uint8_t* row, int64_t u, float* w) {
        const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
        const int j = static_cast<int>(u % 8);
        const float d = h2f(b.d[j]);
        for (int l = 0; l < 16; ++l) {
            w[l] = d * static_cast<float>((b.qs[j][l] & 0xF) - 8);
            w[l + 16] = d * static_cast<float>((b.qs[j][l] >> 4) - 8);
        }
    }
};

template <>
struct Unit<TensorType::Q4_1> {
    using Block = block_q4_1;
    static __device__ void load(const uint8_t* row, int64_t u, float* w) {
        const Block& b = reinterpret_cast<const Block*>(row)[u];
        const float d = h2f(b.d), m = h2f(b.m);
        for (int j = 0; j < 16; ++j) {
            w[j] = d * static_cast<float>(b.qs[j] & 0xF) + m;
            w[j + 16] = d * static_cast<float>(b.qs[j] >> 4) + m;
        }
    }
};

// A unit's 5-bit quants (16 bytes of nibbles, the fifth bits in qh) as d·q + offset.
__device__ __forceinline__ void q5_load(const uint8_t* qs, const uint8_t* qh4, float d, float offset, float* w) {
    const uint32_t qh = qh4[0] | qh4[1] << 8 | qh4[2] << 16 | static_cast<uint32_t>(qh4[3]) << 24;
    for (int j = 0; j < 16; ++j) {
        w[j] = d * static_cast<float>((qs[j] & 0xF) | ((qh >> j) & 1) << 4) + offset;
        w[j + 16] = d * static_cast<float>((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) + offset;
    }
}

template <>
struct Unit<TensorType::Q5_0> {
    using Block = Q5_0Group;
    static __device__ void load(const uint8_t* row, int64_t u, float* w) {
        const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
        const int j = static_cast<int>(u % 8);
        q5_load(b.qs[j], b.qh[j], h2f(b.d[j]), -16.0f * h2f(b.d[j]), w);
    }
};

template <>
struct Unit<TensorType::Q5_1> {
    using Block = block_q5_1;
    static __device__ void load(const uint8_t* row, int64_t u, float* w) {
        const Block& b = reinterpret_cast<const Block*>(row)[u];
        q5_load(b.qs, b.qh, h2f(b.d), h2f(b.m), w);
    }
};

template <>
struct Unit<TensorType::Q8_0> {
    using Block = Q8_0Group;
    static __device__ void load(const uint8_t* row, int64_t u, float* w) {
        const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
        const int j = static_cast<int>(u % 8);
        for (int l = 0; l < 32; ++l) w[l] = h2f(b.d[j]) * static_cast<float>(b.qs[j][l]);
    }
};

template <>
struct Unit<TensorType::IQ4_NL> {
    using Block = IQ4NLGroup;
    static __device__ void load(const uint8_t* row, int64_t u, float* w) {
        const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
        const int j = static_cast<int>(u % 8);
        const float d = h2f(b.d[j]);
        for (int l = 0; l < 16; ++l) {
            w[l] = d * static_cast<float>(kvalues_iq4nl[b.qs[j][l] & 0xF]);
            w[l + 16] = d * static_cast<float>(kvalues_iq4nl[b.qs[j][l] >> 4]);
        }
    }
};

// Q2_K / Q3_K: unit j = g·4 + s is bits 2s..2s+1 of qs[g·32 + l]; sub-blocks of 16 (two per unit).
template <>
struct Unit<TensorType::Q2_K> {
    using Block = block_q2_K;
    static __device__ float dot(const uint8_t* row, int64_t u, const float* x) {
        const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
        const int j = static_cast<int>(u % 8), g = j / 4, s = j % 4;
        float out = 0.0f;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const uint8_t sc = b.scales[g * 8 + s * 2 + half];
            float qx = 0.0f, xs = 0.0f;
#pragma unroll
            for (int l = 16 * half; l < 16 * half + 16; ++l) {
                qx += static_cast<float>((b.qs[g * 32 + l] >> (2 * s)) & 3) * x[l];
                xs += x[l];
            }
            out += h2f(b.d) * static_cast<float>(sc & 0xF) * qx - h2f(b.dmin) * static_cast<float>(sc >> 4) * xs;
        }
        return out;
    }
    static __device__ void load(const uint8_t* row, int64_t u, float* w) {
        const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
        const int j = static_cast<int>(u % 8), g = j / 4, s = j % 4;
        for (int l = 0; l < 32; ++l) {
            const uint8_t sc = b.scales[g * 8 + s * 2 + l / 16];
            w[l] = h2f(b.d) * static_cast<float>(sc & 0xF) * static_cast<float>((b.qs[g * 32 + l] >> (2 * s)) & 3) -
                   h2f(b.dmin) * static_cast<float>(sc >> 4);
        }
    }
};

template <>
struct Unit<TensorType::Q3_K> {
    using Block = block_q3_K;
    static __device__ float dot(const uint8_t* row, int64_t u, const float* x) {
        const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
        const int j = static_cast<int>(u % 8), g = j / 4, s = j % 4;
        float out = 0.0f;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int sb = g * 8 + s * 2 + half;
            const int lo = (b.scales[sb % 8] >> (4 * (sb / 8))) & 0xF;
            const int hi = (b.scales[8 + sb % 4] >> (2 * (sb / 4))) & 3;
            float qx = 0.0f;
#pragma unroll
            for (int l = 16 * half; l < 16 * half + 16; ++l) {
                const int q = ((b.qs[g * 32 + l] >> (2 * s)) & 3) - (((b.hmask[l] >> j) & 1) ? 0 : 4);
                qx += static_cast<float>(q) * x[l];
            }
            out += static_cast<float>((lo | hi << 4) - 32) * qx;
        }
        return h2f(b.d) * out;
    }
    static __device__ void load(const uint8_t* row, int64_t u, float* w) {
        const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
        const int j = static_cast<int>(u % 8), g = j / 4, s = j % 4;
        for (int l = 0; l < 32; ++l) {
            const int sb = g * 8 + s * 2 + l / 16;
            const int scale = (((b.scales[sb % 8] >> (4 * (sb / 8))) & 0xF) | ((b.scales[8 + sb % 4] >> (2 * (sb / 4))) & 3) << 4) - 32;
            const int q = ((b.qs[g * 32 + l] >> (2 * s)) & 3) - (((b.hmask[l] >> j) & 1) ? 0 : 4);
            w[l] = h2f(b.d) * static_cast<float>(scale) * static_cast<float>(q);
        }
    }
};

// Q4_K in its device layout (q4_k_scale_min): element l of unit j in the low (l < 16) or high
// nibble of qs[16j + l % 16]; weight = d·sc·q − dmin·m.
template <>
struct Unit<TensorType::Q4_K> {
    using Block = block_q4_K;
    static __device__ void load(const uint8_t* row, int64_t u, float* w) {
        const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
        const int j = static_cast<int>(u % 8);
        int sc, m;
        q4_k_scale_min(b.scales, j, &sc, &m);
        const float d = h2f(b.d) * static_cast<float>(sc), dm = h2f(b.dmin) * static_cast<float>(m);
        for (int l = 0; l < 16; ++l) {
            w[l] = d * static_cast<float>(b.qs[16 * j + l] & 0xF) - dm;
            w[l + 16] = d * static_cast<float>(b.qs[16 * j + l] >> 4) - dm;
        }
    }
};
template <>
struct Unit<TensorType::Q5_K> {
    using Block = block_q5_K;
    static __device__ void load(const uint8_t* row, int64_t u, float* w) {
        const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
        const int j = static_cast<int>(u % 8);
        int sc, m;
        k_scale_min(b.scales, j, &sc, &m);
        const float d = h2f(b.d) * static_cast<float>(sc), dm = h2f(b.dmin) * static_cast<float>(m);
        for (int l = 0; l < 32; ++l) {
            const int v = ((b.qs[(j / 2) * 32 + l] >> (4 * (j % 2))) & 0xF) | ((b.qh[l] >> j) & 1) << 4;
            w[l] = d * static_cast<float>(v) - dm;
        }
    }
};

// Q6_K in its device layout (quant_dot.cuh): element l of unit j: the low (l < 16) or high nibble
// of ql[16j + l % 16], two bits at 2·((l % 16) / 4) of qh[8j + 4·(l / 16) + l % 4], minus 32;
// scales[2j] for l < 16, the next above.
template <>
struct Unit<TensorType::Q6_K> {
    using Block = block_q6_K;
    static __device__ void load(const uint8_t* row, int64_t u, float* w) {
        const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
        const int j = static_cast<int>(u % 8);
        for (int l = 0; l < 32; ++l) {
            const int r = l % 16;
            const int lo = (b.ql[16 * j + r] >> (4 * (l / 16))) & 0xF;
            const int hi = (b.qh[8 * j + 4 * (l / 16) + r % 4] >> (2 * (r / 4))) & 3;
            w[l] = h2f(b.d) * static_cast<float>(b.scales[2 * j + l / 16]) * static_cast<float>((lo | hi << 4) - 32);
        }
    }
};

template <>
struct Unit<TensorType::IQ4_XS> {
    using Block = block_iq4_xs;
    static __device__ float dot(const uint8_t* row, int64_t u, const float* x) {
        const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
        const int sb = static_cast<int>(u % 8);
        const int scale = (((b.scales_l[sb / 2] >> (4 * (sb % 2))) & 0xF) | ((b.scales_h >> (2 * sb)) & 3) << 4) - 32;
        const uint8_t* qs = b.qs + 16 * sb;
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < 16; ++j)
            s += static_cast<float>(kvalues_iq4nl[qs[j] & 0xF]) * x[j] + static_cast<float>(kvalues_iq4nl[qs[j] >> 4]) * x[j + 16];
        return h2f(b.d) * static_cast<float>(scale) * s;
    }
    static __device__ void load(const uint8_t* row, int64_t u, float* w) {
        const Block& b = reinterpret_cast<const Block*>(row)[u / 8];
        const int sb = static_cast<int>(u % 8);
        const int scale = (((b.scales_l[sb / 2] >> (4 * (sb % 2))) & 0xF) | ((b.scales_h >> (2 * sb)) & 3) << 4) - 32;
        const float d = h2f(b.d) * static_cast<float>(scale);
        for (int j = 0; j < 16; ++j) {
            w[j] = d * static_cast<float>(kvalues_iq4nl[b.qs[16 * sb + j] & 0xF]);
            w[j + 16] = d * static_cast<float>(kvalues_iq4nl[b.qs[16 * sb + j] >> 4]);
        }
    }
};

template <>
struct Unit<TensorType::Q8_K> {
    static __device__ float dot(const uint8_t* row, int64_t u, const float* x) {
        const block_q8_K& b = reinterpret_cast<const block_q8_K*>(row)[u / 8];
        const int8_t* q = b.qs + 32 * (u % 8);
        float s = 0.0f;
#pragma unroll
        for (int l = 0; l < 32; ++l) s += static_cast<float>(q[l]) * x[l];
        return b.d * s;
    }
    static __device__ void load(const uint8_t* row, int64_t u, float* w) {
        const block_q8_K& b = reinterpret_cast<const block_q8_K*>(row)[u / 8];
        for (int l = 0; l < 32; ++l) w[l] = b.d * static_cast<float>(b.qs[32 * (u % 8) + l]);
    }
};

template <>
struct Unit<TensorType::F32> {
    // A row's 16 bytes (kPer16 values) against their activations (16-byte aligned), in order.
    static constexpr int kPer16 = 4;
    static __device__ float dot16(uint4 w, const float* x) {
        const float4 a = *reinterpret_cast<const float4*>(x);
        float s = __uint_as_float(w.x) * a.x;
        s = fmaf(__uint_as_float(w.y), a.y, s), s = fmaf(__uint_as_float(w.z), a.z, s);
        return fmaf(__uint_as_float(w.w), a.w, s);
    }
    static __device__ void load(const uint8_t* row, int64_t u, float* w) {
        for (int l = 0; l < 32; ++l) w[l] = reinterpret_cast<const float*>(row)[32 * u + l];
    }
};

template <>
struct Unit<TensorType::F16> {
    static constexpr int kPer16 = 8;
    static __device__ float dot16(uint4 w, const float* x) {
        const float4 a = reinterpret_cast<const float4*>(x)[0], b = reinterpret_cast<const float4*>(x)[1];
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
        const float xs[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&words[i]));
            s = i == 0 ? f.x * xs[0] : fmaf(f.x, xs[2 * i], s);
            s = fmaf(f.y, xs[2 * i + 1], s);
        }
        return s;
    }
    static __device__ void load(const uint8_t* row, int64_t u, float* w) {
        for (int l = 0; l < 32; ++l) w[l] = __half2float(reinterpret_cast<const __half*>(row)[32 * u + l]);
    }
};

template <>
struct Unit<TensorType::BF16> {
    static constexpr int kPer16 = 8;
    static __device__ float dot16(uint4 w, const float* x) {
        const float4 a = reinterpret_cast<const float4*>(x)[0], b = reinterpret_cast<const float4*>(x)[1];
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
        const float xs[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        float s = __uint_as_float(words[0] << 16) * xs[0];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            if (i > 0) s = fmaf(__uint_as_float(words[i] << 16), xs[2 * i], s);
            s = fmaf(__uint_as_float(words[i] & 0xFFFF0000u), xs[2 * i + 1], s);
        }
        return s;
    }
    static __device__ void load(const uint8_t* row, int64_t u, float* w) {
        for (int l = 0; l < 32; ++l) w[l] = __uint_as_float(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(row)[32 * u + l]) << 16);
    }
};

}  // namespace edgerunner::cuda
