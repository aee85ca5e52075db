// Row dot products for every weight format.
//
// Fast path: the weight row stays in its raw blocks and meets activations quantized once per
// step (Q8_0 or Q8_K): integer sums per (sub-)block, one float multiply per block. Block
// layouts: edgerunner/quant_blocks.h. Precise path: each weight block is decoded to float32
// and dotted with float32 activations.
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "edgerunner/half.h"
#include "edgerunner/quant_blocks.h"
#include "edgerunner/quants.h"
#include "kernels.h"

namespace edgerunner::cpu {
namespace {

// fp16 decode by table: 256 KiB, built once.
struct F16Table {
    float v[65536];
    F16Table() {
        for (uint32_t i = 0; i < 65536; ++i) v[i] = fp16_to_fp32(static_cast<uint16_t>(i));
    }
};
const F16Table& f16_table() {
    static const F16Table table;
    return table;
}
inline float h2f(uint16_t h) { return f16_table().v[h]; }

// ---- activations ---------------------------------------------------------------------------

const float* q8_0_sums(const void* x, int64_t nb) {
    return reinterpret_cast<const float*>(static_cast<const block_q8_0*>(x) + nb);
}

// ---- 32-element formats against Q8_0 -----------------------------------------------------

float dot_q4_0(const void* row, const void* xv, int64_t n) {
    const auto* w = static_cast<const block_q4_0*>(row);
    const auto* a = static_cast<const block_q8_0*>(xv);
    float sum = 0;
    for (int64_t b = 0; b < n / QK4_0; ++b) {
        int s = 0;
        for (int j = 0; j < 16; ++j)
            s += ((w[b].qs[j] & 0xF) - 8) * a[b].qs[j] + ((w[b].qs[j] >> 4) - 8) * a[b].qs[j + 16];
        sum += static_cast<float>(s) * (h2f(w[b].d) * h2f(a[b].d));
    }
    return sum;
}

float dot_q4_1(const void* row, const void* xv, int64_t n) {
    const auto* w = static_cast<const block_q4_1*>(row);
    const auto* a = static_cast<const block_q8_0*>(xv);
    const int64_t nb = n / QK4_1;
    const float* asum = q8_0_sums(xv, nb);
    float sum = 0;
    for (int64_t b = 0; b < nb; ++b) {
        int s = 0;
        for (int j = 0; j < 16; ++j) s += (w[b].qs[j] & 0xF) * a[b].qs[j] + (w[b].qs[j] >> 4) * a[b].qs[j + 16];
        sum += static_cast<float>(s) * (h2f(w[b].d) * h2f(a[b].d)) + h2f(w[b].m) * asum[b];
    }
    return sum;
}

inline uint32_t load_u32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

template <typename Block>
inline int q5_dot(const Block& w, const int8_t* a, int offset) {
    const uint32_t qh = load_u32(w.qh);
    int s = 0;
    for (int j = 0; j < 16; ++j) {
        const int lo = (w.qs[j] & 0xF) | static_cast<int>((qh >> j) & 1u) << 4;
        const int hi = (w.qs[j] >> 4) | static_cast<int>((qh >> (j + 16)) & 1u) << 4;
        s += (lo - offset) * a[j] + (hi - offset) * a[j + 16];
    }
    return s;
}

float dot_q5_0(const void* row, const void* xv, int64_t n) {
    const auto* w = static_cast<const block_q5_0*>(row);
    const auto* a = static_cast<const block_q8_0*>(xv);
    float sum = 0;
    for (int64_t b = 0; b < n / QK5_0; ++b)
        sum += static_cast<float>(q5_dot(w[b], a[b].qs, 16)) * (h2f(w[b].d) * h2f(a[b].d));
    return sum;
}

float dot_q5_1(const void* row, const void* xv, int64_t n) {
    const auto* w = static_cast<const block_q5_1*>(row);
    const auto* a = static_cast<const block_q8_0*>(xv);
    const int64_t nb = n / QK5_1;
    const float* asum = q8_0_sums(xv, nb);
    float sum = 0;
    for (int64_t b = 0; b < nb; ++b)
        sum += static_cast<float>(q5_dot(w[b], a[b].qs, 0)) * (h2f(w[b].d) * h2f(a[b].d)) + h2f(w[b].m) * asum[b];
    return sum;
}

float dot_q8_0(const void* row, const void* xv, int64_t n) {
    const auto* w = static_cast<const block_q8_0*>(row);
    const auto* a = static_cast<const block_q8_0*>(xv);
    float sum = 0;
    for (int64_t b = 0; b < n / QK8_0; ++b) {
        int s = 0;
        for (int j = 0; j < QK8_0; ++j) s += w[b].qs[j] * a[b].qs[j];
        sum += static_cast<float>(s) * (h2f(w[b].d) * h2f(a[b].d));
    }
    return sum;
}

float dot_iq4_nl(const void* row, const void* xv, int64_t n) {
    const auto* w = static_cast<const block_iq4_nl*>(row);
    const auto* a = static_cast<const block_q8_0*>(xv);
    float sum = 0;
    for (int64_t b = 0; b < n / QK4_NL; ++b) {
        int s = 0;
        for (int j = 0; j < 16; ++j)
            s += kvalues_iq4nl[w[b].qs[j] & 0xF] * a[b].qs[j] + kvalues_iq4nl[w[b].qs[j] >> 4] * a[b].qs[j + 16];
        sum += static_cast<float>(s) * (h2f(w[b].d) * h2f(a[b].d));
    }
    return sum;
}

// ---- k-quants against Q8_K ------------------------------------------------------------------

float dot_q2_K(const void* row, const void* xv, int64_t n) {
    const auto* w = static_cast<const block_q2_K*>(row);
    const auto* a = static_cast<const block_q8_K*>(xv);
    float sum = 0;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        int isum = 0, msum = 0;
        // element g*128 + s*32 + l is bits 2s..2s+1 of qs[g*32 + l]; sub-block of 16 = e / 16
        for (int g = 0; g < 2; ++g)
            for (int s = 0; s < 4; ++s)
                for (int half = 0; half < 2; ++half) {
                    const int sb = g * 8 + s * 2 + half;
                    int acc = 0;
                    for (int l = half * 16; l < half * 16 + 16; ++l)
                        acc += ((w[b].qs[g * 32 + l] >> (2 * s)) & 3) * a[b].qs[g * 128 + s * 32 + l];
                    isum += (w[b].scales[sb] & 0xF) * acc;
                    msum += (w[b].scales[sb] >> 4) * a[b].bsums[sb];
                }
        sum += a[b].d * (h2f(w[b].d) * static_cast<float>(isum) - h2f(w[b].dmin) * static_cast<float>(msum));
    }
    return sum;
}

float dot_q3_K(const void* row, const void* xv, int64_t n) {
    const auto* w = static_cast<const block_q3_K*>(row);
    const auto* a = static_cast<const block_q8_K*>(xv);
    float sum = 0;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const uint8_t* sc = w[b].scales;
        int isum = 0;
        for (int g = 0; g < 2; ++g)
            for (int s = 0; s < 4; ++s)
                for (int half = 0; half < 2; ++half) {
                    const int sb = g * 8 + s * 2 + half;
                    const int lo = (sc[sb % 8] >> (4 * (sb / 8))) & 0xF;
                    const int hi = (sc[8 + sb % 4] >> (2 * (sb / 4))) & 3;
                    const int scale = (lo | hi << 4) - 32;
                    const int hbit = g * 4 + s;  // bit of hmask[l] for elements g*128 + s*32 + l
                    int acc = 0;
                    for (int l = half * 16; l < half * 16 + 16; ++l) {
                        const int q = ((w[b].qs[g * 32 + l] >> (2 * s)) & 3) - (((w[b].hmask[l] >> hbit) & 1) ? 0 : 4);
                        acc += q * a[b].qs[g * 128 + s * 32 + l];
                    }
                    isum += scale * acc;
                }
        sum += h2f(w[b].d) * a[b].d * static_cast<float>(isum);
    }
    return sum;
}

inline void k_scale_min(const uint8_t* s, int j, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

template <bool kFiveBit, typename Block>
float dot_q45_K(const Block* w, const block_q8_K* a, int64_t n) {
    float sum = 0;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        int isum = 0, msum = 0;
        for (int sb = 0; sb < 8; ++sb) {
            int sc, m;
            k_scale_min(w[b].scales, sb, &sc, &m);
            const uint8_t* q = w[b].qs + (sb / 2) * 32;
            const int shift = 4 * (sb % 2);
            const int8_t* x = a[b].qs + sb * 32;
            int acc = 0;
            for (int l = 0; l < 32; ++l) {
                int v = (q[l] >> shift) & 0xF;
                if constexpr (kFiveBit) v |= ((w[b].qh[l] >> sb) & 1) << 4;
                acc += v * x[l];
            }
            isum += sc * acc;
            msum += m * (a[b].bsums[2 * sb] + a[b].bsums[2 * sb + 1]);
        }
        sum += a[b].d * (h2f(w[b].d) * static_cast<float>(isum) - h2f(w[b].dmin) * static_cast<float>(msum));
    }
    return sum;
}

float dot_q4_K(const void* row, const void* xv, int64_t n) {
    return dot_q45_K<false>(static_cast<const block_q4_K*>(row), static_cast<const block_q8_K*>(xv), n);
}

float dot_q5_K(const void* row, const void* xv, int64_t n) {
    return dot_q45_K<true>(static_cast<const block_q5_K*>(row), static_cast<const block_q8_K*>(xv), n);
}

float dot_q6_K(const void* row, const void* xv, int64_t n) {
    const auto* w = static_cast<const block_q6_K*>(row);
    const auto* a = static_cast<const block_q8_K*>(xv);
    float sum = 0;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        int isum = 0;
        // element h*128 + s*32 + l: low nibble of ql[h*64 + (s%2)*32 + l] (high nibble for
        // s >= 2), high 2 bits at shift 2s of qh[h*32 + l]; sub-block of 16 = e / 16
        for (int h = 0; h < 2; ++h)
            for (int s = 0; s < 4; ++s)
                for (int half = 0; half < 2; ++half) {
                    int acc = 0;
                    for (int l = half * 16; l < half * 16 + 16; ++l) {
                        const int lo = (w[b].ql[h * 64 + (s % 2) * 32 + l] >> (4 * (s / 2))) & 0xF;
                        const int hi = (w[b].qh[h * 32 + l] >> (2 * s)) & 3;
                        acc += ((lo | hi << 4) - 32) * a[b].qs[h * 128 + s * 32 + l];
                    }
                    isum += w[b].scales[h * 8 + s * 2 + half] * acc;
                }
        sum += h2f(w[b].d) * a[b].d * static_cast<float>(isum);
    }
    return sum;
}

float dot_iq4_xs(const void* row, const void* xv, int64_t n) {
    const auto* w = static_cast<const block_iq4_xs*>(row);
    const auto* a = static_cast<const block_q8_K*>(xv);
    float sum = 0;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        int isum = 0;
        for (int sb = 0; sb < 8; ++sb) {
            const int lo = (w[b].scales_l[sb / 2] >> (4 * (sb % 2))) & 0xF;
            const int hi = (w[b].scales_h >> (2 * sb)) & 3;
            const uint8_t* q = w[b].qs + sb * 16;
            const int8_t* x = a[b].qs + sb * 32;
            int acc = 0;
            for (int l = 0; l < 16; ++l) acc += kvalues_iq4nl[q[l] & 0xF] * x[l] + kvalues_iq4nl[q[l] >> 4] * x[l + 16];
            isum += ((lo | hi << 4) - 32) * acc;
        }
        sum += h2f(w[b].d) * a[b].d * static_cast<float>(isum);
    }
    return sum;
}

float dot_q8_K(const void* row, const void* xv, int64_t n) {
    const auto* w = static_cast<const block_q8_K*>(row);
    const auto* a = static_cast<const block_q8_K*>(xv);
    float sum = 0;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        int s = 0;
        for (int j = 0; j < QK_K; ++j) s += w[b].qs[j] * a[b].qs[j];
        sum += w[b].d * a[b].d * static_cast<float>(s);
    }
    return sum;
}

// ---- float activations ---------------------------------------------------------------------

float dot_f32(const void* row, const void* xv, int64_t n) {
    const auto* w = static_cast<const float*>(row);
    const auto* x = static_cast<const float*>(xv);
    float sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += w[i] * x[i];
    return sum;
}

float dot_f16(const void* row, const void* xv, int64_t n) {
    const auto* w = static_cast<const uint16_t*>(row);
    const auto* x = static_cast<const float*>(xv);
    float sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += h2f(w[i]) * x[i];
    return sum;
}

float dot_bf16(const void* row, const void* xv, int64_t n) {
    const auto* w = static_cast<const uint16_t*>(row);
    const auto* x = static_cast<const float*>(xv);
    float sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += bf16_to_fp32(w[i]) * x[i];
    return sum;
}

// Precise path for block formats: decode one block at a time, dot in float32.
template <TensorType kType>
float dot_dequant(const void* row, const void* xv, int64_t n) {
    static const TensorTypeInfo info = tensor_type_info(kType);
    const auto* w = static_cast<const uint8_t*>(row);
    const auto* x = static_cast<const float*>(xv);
    float tmp[QK_K];
    float sum = 0;
    for (int64_t i = 0; i < n; i += info.block_size, w += info.type_size) {
        dequantize_row(kType, w, tmp, info.block_size);
        for (uint32_t j = 0; j < info.block_size; ++j) sum += tmp[j] * x[i + j];
    }
    return sum;
}

// ---- attention over the KV cache (scalar) -------------------------------------------------------

float kv_dot_f32(const void* k, const float* q, int64_t n) { return dot_f32(k, q, n); }
float kv_dot_f16(const void* k, const float* q, int64_t n) { return dot_f16(k, q, n); }

float kv_dot_q8_0(const void* k, const float* q, int64_t n) {
    const auto* b = static_cast<const block_q8_0*>(k);
    float s = 0;
    for (int64_t i = 0; i < n / QK8_0; ++i) {
        float bs = 0;
        for (int j = 0; j < QK8_0; ++j) bs += q[i * QK8_0 + j] * static_cast<float>(b[i].qs[j]);
        s += bs * h2f(b[i].d);
    }
    return s;
}

void kv_axpy_f32(float w, const void* v, float* out, int64_t n) {
    const auto* x = static_cast<const float*>(v);
    for (int64_t i = 0; i < n; ++i) out[i] += w * x[i];
}

void kv_axpy_f16(float w, const void* v, float* out, int64_t n) {
    const auto* x = static_cast<const uint16_t*>(v);
    for (int64_t i = 0; i < n; ++i) out[i] += w * h2f(x[i]);
}

void kv_axpy_q8_0(float w, const void* v, float* out, int64_t n) {
    const auto* b = static_cast<const block_q8_0*>(v);
    for (int64_t i = 0; i < n / QK8_0; ++i) {
        const float wd = w * h2f(b[i].d);
        for (int j = 0; j < QK8_0; ++j) out[i * QK8_0 + j] += wd * static_cast<float>(b[i].qs[j]);
    }
}

[[noreturn]] void no_kernel(TensorType type) {
    throw std::invalid_argument("tensor type " + std::string(tensor_type_name(type)) +
                                " has no CPU matmul kernel; supported: " + std::string(dequantizable_type_names()));
}

}  // namespace

ActFormat act_format_for(TensorType type) {
    switch (type) {
        case TensorType::Q4_0: case TensorType::Q4_1: case TensorType::Q5_0: case TensorType::Q5_1:
        case TensorType::Q8_0: case TensorType::IQ4_NL:
            return ActFormat::Q8_0;
        case TensorType::Q2_K: case TensorType::Q3_K: case TensorType::Q4_K: case TensorType::Q5_K:
        case TensorType::Q6_K: case TensorType::Q8_K: case TensorType::IQ4_XS:
            return ActFormat::Q8_K;
        default:
            return ActFormat::Float;
    }
}

size_t act_bytes(ActFormat format, int64_t n) {
    switch (format) {
        case ActFormat::Float: return static_cast<size_t>(n) * sizeof(float);
        case ActFormat::Q8_0: return static_cast<size_t>(n / QK8_0) * (sizeof(block_q8_0) + sizeof(float) + sizeof(int32_t));
        case ActFormat::Q8_K: return static_cast<size_t>(n / QK_K) * sizeof(block_q8_K);
    }
    return 0;
}

void quantize_act(ActFormat format, const float* x, void* dst, int64_t n) { quantize_act(format, x, dst, n, best_isa()); }

void quantize_act(ActFormat format, const float* x, void* dst, int64_t n, Isa isa) {
    if (QuantizeFn fn = quantize_fn(format, isa)) return fn(x, dst, n);
    switch (format) {
        case ActFormat::Float: std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float)); return;
        case ActFormat::Q8_0: {
            quantize_row_q8_0(x, dst, n);
            const int64_t nb = n / QK8_0;
            const auto* blocks = static_cast<const block_q8_0*>(dst);
            auto* sums = reinterpret_cast<float*>(static_cast<block_q8_0*>(dst) + nb);
            auto* isums = reinterpret_cast<int32_t*>(sums + nb);
            for (int64_t b = 0; b < nb; ++b) {
                int s = 0;
                for (int j = 0; j < QK8_0; ++j) s += blocks[b].qs[j];
                isums[b] = s;
                sums[b] = h2f(blocks[b].d) * static_cast<float>(s);
            }
            return;
        }
        case ActFormat::Q8_K: quantize_row_q8_K(x, dst, n); return;
    }
}

DotFn dot_quant_fn_scalar(TensorType type) {
    switch (type) {
        case TensorType::F32: return dot_f32;
        case TensorType::F16: return dot_f16;
        case TensorType::BF16: return dot_bf16;
        case TensorType::Q4_0: return dot_q4_0;
        case TensorType::Q4_1: return dot_q4_1;
        case TensorType::Q5_0: return dot_q5_0;
        case TensorType::Q5_1: return dot_q5_1;
        case TensorType::Q8_0: return dot_q8_0;
        case TensorType::IQ4_NL: return dot_iq4_nl;
        case TensorType::Q2_K: return dot_q2_K;
        case TensorType::Q3_K: return dot_q3_K;
        case TensorType::Q4_K: return dot_q4_K;
        case TensorType::Q5_K: return dot_q5_K;
        case TensorType::Q6_K: return dot_q6_K;
        case TensorType::Q8_K: return dot_q8_K;
        case TensorType::IQ4_XS: return dot_iq4_xs;
        default: no_kernel(type);
    }
}

DotFn dot_float_fn(TensorType type) {
    switch (type) {
        case TensorType::F32: return dot_f32;
        case TensorType::F16: return dot_f16;
        case TensorType::BF16: return dot_bf16;
        case TensorType::Q4_0: return dot_dequant<TensorType::Q4_0>;
        case TensorType::Q4_1: return dot_dequant<TensorType::Q4_1>;
        case TensorType::Q5_0: return dot_dequant<TensorType::Q5_0>;
        case TensorType::Q5_1: return dot_dequant<TensorType::Q5_1>;
        case TensorType::Q8_0: return dot_dequant<TensorType::Q8_0>;
        case TensorType::IQ4_NL: return dot_dequant<TensorType::IQ4_NL>;
        case TensorType::Q2_K: return dot_dequant<TensorType::Q2_K>;
        case TensorType::Q3_K: return dot_dequant<TensorType::Q3_K>;
        case TensorType::Q4_K: return dot_dequant<TensorType::Q4_K>;
        case TensorType::Q5_K: return dot_dequant<TensorType::Q5_K>;
        case TensorType::Q6_K: return dot_dequant<TensorType::Q6_K>;
        case TensorType::Q8_K: return dot_dequant<TensorType::Q8_K>;
        case TensorType::IQ4_XS: return dot_dequant<TensorType::IQ4_XS>;
        default: no_kernel(type);
    }
}

void store_kv_row(KvType type, const float* x, uint8_t* slot, int64_t n) {
    switch (type) {
        case KvType::F32: std::memcpy(slot, x, static_cast<size_t>(n) * sizeof(float)); return;
        case KvType::F16: {
            auto* h = reinterpret_cast<uint16_t*>(slot);
            for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(x[i]);
            return;
        }
        case KvType::Q8_0: quantize_row_q8_0(x, slot, n); return;
    }
}

namespace {
void silu_mul_scalar(float* g, const float* u, int64_t n) {
    for (int64_t i = 0; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}
float exp_sum_scalar(float* x, int64_t n, float shift) {
    float sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += (x[i] = std::exp(x[i] - shift));
    return sum;
}
void gelu_mul_scalar(float* g, const float* u, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const float x = g[i];
        g[i] = 0.5f * x * (1.0f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x))) * u[i];
    }
}

}  // namespace

MathKernels math_kernels_scalar() { return {silu_mul_scalar, exp_sum_scalar, gelu_mul_scalar}; }

KvKernels kv_kernels_scalar(KvType type) {
    switch (type) {
        case KvType::F32: return {kv_scores_loop<kv_dot_f32>, kv_values_loop<kv_axpy_f32>};
        case KvType::F16: return {kv_scores_loop<kv_dot_f16>, kv_values_loop<kv_axpy_f16>};
        case KvType::Q8_0: return {kv_scores_loop<kv_dot_q8_0>, kv_values_loop<kv_axpy_q8_0>};
    }
    return {nullptr, nullptr};
}


}  // namespace edgerunner::cpu
