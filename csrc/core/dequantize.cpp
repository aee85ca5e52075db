// Scalar reference dequantization: each format's definition, decoded one block at a time.
//
// Bit-exactness contract: results equal gguf.quants.dequantize (NumPy, float32) bit for bit.
// So every float operation below is a single float32 multiply or add in NumPy's order
// (e.g. (d * sc) * q - dmin * m), and this file must be compiled without -ffast-math and
// without FMA contraction (-ffp-contract=off; GCC ignores the STDC pragma below).
#include "edgerunner/quants.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "edgerunner/half.h"
#include "edgerunner/quant_blocks.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

namespace edgerunner {
namespace {

// Q4_0, Q4_1, IQ4_NL: byte j holds element j (low nibble) and element j + 16 (high nibble).
void dequantize_q4_0(const block_q4_0* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK4_0) {
        const float d = fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK4_0 / 2; ++j) {
            y[j] = d * static_cast<float>((x[i].qs[j] & 0xF) - 8);
            y[j + QK4_0 / 2] = d * static_cast<float>((x[i].qs[j] >> 4) - 8);
        }
    }
}

void dequantize_q4_1(const block_q4_1* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK4_1) {
        const float d = fp16_to_fp32(x[i].d);
        const float m = fp16_to_fp32(x[i].m);
        for (int j = 0; j < QK4_1 / 2; ++j) {
            y[j] = d * static_cast<float>(x[i].qs[j] & 0xF) + m;
            y[j + QK4_1 / 2] = d * static_cast<float>(x[i].qs[j] >> 4) + m;
        }
    }
}

inline uint32_t load_u32_le(const uint8_t* p) {
    return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

// Q5_0 / Q5_1: 5-bit quant of element j = nibble | (bit j of qh) << 4.
inline int q5_quant(const uint8_t* qs, uint32_t qh, int j) {
    const int lo = j < 16 ? (qs[j] & 0xF) : (qs[j - 16] >> 4);
    return lo | static_cast<int>((qh >> j) & 1u) << 4;
}

void dequantize_q5_0(const block_q5_0* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK5_0) {
        const float d = fp16_to_fp32(x[i].d);
        const uint32_t qh = load_u32_le(x[i].qh);
        for (int j = 0; j < QK5_0; ++j) y[j] = d * static_cast<float>(q5_quant(x[i].qs, qh, j) - 16);
    }
}

void dequantize_q5_1(const block_q5_1* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK5_1) {
        const float d = fp16_to_fp32(x[i].d);
        const float m = fp16_to_fp32(x[i].m);
        const uint32_t qh = load_u32_le(x[i].qh);
        for (int j = 0; j < QK5_1; ++j) y[j] = d * static_cast<float>(q5_quant(x[i].qs, qh, j)) + m;
    }
}

void dequantize_q8_0(const block_q8_0* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK8_0) {
        const float d = fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK8_0; ++j) y[j] = static_cast<float>(x[i].qs[j]) * d;
    }
}

void dequantize_iq4_nl(const block_iq4_nl* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK4_NL) {
        const float d = fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK4_NL / 2; ++j) {
            y[j] = d * static_cast<float>(kvalues_iq4nl[x[i].qs[j] & 0xF]);
            y[j + QK4_NL / 2] = d * static_cast<float>(kvalues_iq4nl[x[i].qs[j] >> 4]);
        }
    }
}

// Q2_K and Q3_K low bits: element e = g*128 + s*32 + l is bits 2s..2s+1 of qs[g*32 + l].
inline int q2_bits(const uint8_t* qs, int e) {
    return (qs[(e / 128) * 32 + e % 32] >> (2 * ((e / 32) % 4))) & 3;
}

void dequantize_q2_K(const block_q2_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK_K) {
        const float d = fp16_to_fp32(x[i].d);
        const float dmin = fp16_to_fp32(x[i].dmin);
        for (int sb = 0; sb < QK_K / 16; ++sb) {
            const float dl = d * static_cast<float>(x[i].scales[sb] & 0xF);
            const float ml = dmin * static_cast<float>(x[i].scales[sb] >> 4);
            for (int e = sb * 16; e < sb * 16 + 16; ++e)
                y[e] = dl * static_cast<float>(q2_bits(x[i].qs, e)) - ml;
        }
    }
}

void dequantize_q3_K(const block_q3_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK_K) {
        const float d = fp16_to_fp32(x[i].d);
        const uint8_t* sc = x[i].scales;
        for (int sb = 0; sb < QK_K / 16; ++sb) {
            // low 4 bits: nibble sb/8 of byte sb%8; high 2 bits: field sb/4 of byte 8 + sb%4
            const int lo = (sc[sb % 8] >> (4 * (sb / 8))) & 0xF;
            const int hi = (sc[8 + sb % 4] >> (2 * (sb / 4))) & 3;
            const float dl = d * static_cast<float>((lo | hi << 4) - 32);
            for (int e = sb * 16; e < sb * 16 + 16; ++e) {
                const int high_clear = ((x[i].hmask[e % 32] >> (e / 32)) & 1) ^ 1;
                y[e] = dl * static_cast<float>(q2_bits(x[i].qs, e) - (high_clear << 2));
            }
        }
    }
}

// Q4_K / Q5_K: 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
inline void k_scale_min(const uint8_t* s, int j, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

void dequantize_q4_K(const block_q4_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK_K) {
        const float d = fp16_to_fp32(x[i].d);
        const float dmin = fp16_to_fp32(x[i].dmin);
        for (int sb = 0; sb < QK_K / 32; ++sb) {
            int sc, m;
            k_scale_min(x[i].scales, sb, &sc, &m);
            const float dl = d * static_cast<float>(sc);
            const float ml = dmin * static_cast<float>(m);
            // sub-block sb: nibble sb%2 of the 32 bytes qs[(sb/2)*32 ...]
            const uint8_t* q = x[i].qs + (sb / 2) * 32;
            const int shift = 4 * (sb % 2);
            for (int l = 0; l < 32; ++l)
                y[sb * 32 + l] = dl * static_cast<float>((q[l] >> shift) & 0xF) - ml;
        }
    }
}

void dequantize_q5_K(const block_q5_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK_K) {
        const float d = fp16_to_fp32(x[i].d);
        const float dmin = fp16_to_fp32(x[i].dmin);
        for (int sb = 0; sb < QK_K / 32; ++sb) {
            int sc, m;
            k_scale_min(x[i].scales, sb, &sc, &m);
            const float dl = d * static_cast<float>(sc);
            const float ml = dmin * static_cast<float>(m);
            const uint8_t* q = x[i].qs + (sb / 2) * 32;
            const int shift = 4 * (sb % 2);
            for (int l = 0; l < 32; ++l) {
                const int q5 = ((q[l] >> shift) & 0xF) | ((x[i].qh[l] >> sb) & 1) << 4;
                y[sb * 32 + l] = dl * static_cast<float>(q5) - ml;
            }
        }
    }
}

void dequantize_q6_K(const block_q6_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK_K) {
        const float d = fp16_to_fp32(x[i].d);
        for (int sb = 0; sb < QK_K / 16; ++sb) {
            const float dl = d * static_cast<float>(x[i].scales[sb]);
            for (int e = sb * 16; e < sb * 16 + 16; ++e) {
                // half h = e/128; within it r = e%128: low nibble of ql[h*64 + r%64]
                // (shift 4 for r >= 64), high 2 bits at shift 2*(r/32) of qh[h*32 + r%32]
                const int h = e / 128, r = e % 128;
                const int lo = (x[i].ql[h * 64 + r % 64] >> (4 * (r / 64))) & 0xF;
                const int hi = (x[i].qh[h * 32 + r % 32] >> (2 * (r / 32))) & 3;
                y[e] = dl * static_cast<float>((lo | hi << 4) - 32);
            }
        }
    }
}

void dequantize_q8_K(const block_q8_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK_K)
        for (int j = 0; j < QK_K; ++j) y[j] = x[i].d * static_cast<float>(x[i].qs[j]);
}

void dequantize_iq4_xs(const block_iq4_xs* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK_K) {
        const float d = fp16_to_fp32(x[i].d);
        for (int sb = 0; sb < QK_K / 32; ++sb) {
            const int lo = (x[i].scales_l[sb / 2] >> (4 * (sb % 2))) & 0xF;
            const int hi = (x[i].scales_h >> (2 * sb)) & 3;
            const float dl = d * static_cast<float>((lo | hi << 4) - 32);
            const uint8_t* q = x[i].qs + sb * 16;
            for (int l = 0; l < 16; ++l) {
                y[sb * 32 + l] = dl * static_cast<float>(kvalues_iq4nl[q[l] & 0xF]);
                y[sb * 32 + l + 16] = dl * static_cast<float>(kvalues_iq4nl[q[l] >> 4]);
            }
        }
    }
}

void dequantize_f16(const uint16_t* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_fp32(x[i]);
}

void dequantize_bf16(const uint16_t* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_fp32(x[i]);
}

template <typename Block>
const Block* as_blocks(const void* src) {
    return static_cast<const Block*>(src);
}

}  // namespace

void dequantize_row(TensorType type, const void* src, float* dst, int64_t n) {
    const auto info = tensor_type_info(static_cast<uint32_t>(type));
    if (!info || !info->dequantize) {
        const std::string name = info ? std::string(info->name)
                                      : "unknown type id " + std::to_string(static_cast<uint32_t>(type));
        throw std::invalid_argument("cannot dequantize tensor type " + name +
                                    ": no dequantizer in this build; supported: " +
                                    std::string(dequantizable_type_names()));
    }
    if (n < 0 || n % info->block_size != 0)
        throw std::invalid_argument("cannot dequantize " + std::to_string(n) + " elements of " +
                                    std::string(info->name) + ": not a whole number of " +
                                    std::to_string(info->block_size) + "-element blocks");
    const int64_t nb = n / info->block_size;
    switch (type) {
        case TensorType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); return;
        case TensorType::F16: dequantize_f16(static_cast<const uint16_t*>(src), dst, n); return;
        case TensorType::BF16: dequantize_bf16(static_cast<const uint16_t*>(src), dst, n); return;
        case TensorType::Q4_0: dequantize_q4_0(as_blocks<block_q4_0>(src), dst, nb); return;
        case TensorType::Q4_1: dequantize_q4_1(as_blocks<block_q4_1>(src), dst, nb); return;
        case TensorType::Q5_0: dequantize_q5_0(as_blocks<block_q5_0>(src), dst, nb); return;
        case TensorType::Q5_1: dequantize_q5_1(as_blocks<block_q5_1>(src), dst, nb); return;
        case TensorType::Q8_0: dequantize_q8_0(as_blocks<block_q8_0>(src), dst, nb); return;
        case TensorType::Q2_K: dequantize_q2_K(as_blocks<block_q2_K>(src), dst, nb); return;
        case TensorType::Q3_K: dequantize_q3_K(as_blocks<block_q3_K>(src), dst, nb); return;
        case TensorType::Q4_K: dequantize_q4_K(as_blocks<block_q4_K>(src), dst, nb); return;
        case TensorType::Q5_K: dequantize_q5_K(as_blocks<block_q5_K>(src), dst, nb); return;
        case TensorType::Q6_K: dequantize_q6_K(as_blocks<block_q6_K>(src), dst, nb); return;
        case TensorType::Q8_K: dequantize_q8_K(as_blocks<block_q8_K>(src), dst, nb); return;
        case TensorType::IQ4_NL: dequantize_iq4_nl(as_blocks<block_iq4_nl>(src), dst, nb); return;
        case TensorType::IQ4_XS: dequantize_iq4_xs(as_blocks<block_iq4_xs>(src), dst, nb); return;
        default: break;
    }
    // The table says "dequantize" but the switch has no case: a bug here, not bad input.
    throw std::logic_error("dequantize_row: tensor type " + std::string(info->name) +
                           " is marked dequantizable but has no implementation");
}

}  // namespace edgerunner
