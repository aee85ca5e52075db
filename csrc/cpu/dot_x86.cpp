// x86 dot products: AVX2 (+FMA, F16C), built three times: for plain AVX2 (int8 products by
// maddubs + madd), with AVX-VNNI (one dpbusd), and with AVX-512 VNNI (EVEX dpbusd on 256-bit
// vectors, and 32 vector registers). ER_ISA names the variant's namespace;
// dispatch.cpp picks one at run time. Same results as quant_dot.cpp's scalar kernels: the
// integer sums are identical, only the float accumulation order differs.
//
// Layout reminders (edgerunner/quant_blocks.h): 32-element formats keep element j in the low
// nibble of qs[j] and element j+16 in the high nibble; Q4_K/Q5_K sub-blocks 2g and 2g+1 are
// the low and high nibbles of the 32 bytes qs[32g..]; Q8_K activations carry 16-element sums.
#include <immintrin.h>

#include <cstddef>
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "edgerunner/half.h"
#include "edgerunner/quant_blocks.h"
#include "kernels.h"

#ifndef ER_ISA
#error "define ER_ISA (avx2, avxvnni or avx512)"
#endif

namespace edgerunner::cpu::ER_ISA {
namespace {

inline float h2f(er_half h) { return _cvtsh_ss(h); }

// Sum of the 8 int32 lanes of u8 × s8 products of 32 byte pairs, 4 pairs per lane.
inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// s8 × s8 via the sign trick: |a| is unsigned, b takes a's sign.
inline __m256i dot_s8s8(__m256i a, __m256i b) {
    return dot_u8s8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

inline float hsum(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

inline int hsum_i32(__m256i v) {
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(1, 0, 3, 2)));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(x);
}

// Sum of the 4 int32 lanes of a 128-bit half (one 16-element sub-block's products).
inline int hsum_i32x4(__m128i v) {
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 3, 2)));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(v);
}

// 16 bytes of nibbles → 32 bytes: elements 0-15 (low nibbles) then 16-31 (high nibbles).
inline __m256i nibbles(const uint8_t* qs) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i lo = _mm_and_si128(x, _mm_set1_epi8(0x0F));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(x, 4), _mm_set1_epi8(0x0F));
    return _mm256_set_m128i(hi, lo);
}

inline __m256i load32(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

const float* q8_0_sums(const void* x, int64_t nb) {
    return reinterpret_cast<const float*>(static_cast<const block_q8_0*>(x) + nb);
}

}  // namespace

// dot_q4_0 ... dot_q8_0 are defined with the several-token kernels below (one implementation).
float dot_q4_0(const void* row, const void* x, int64_t n);
float dot_q4_1(const void* row, const void* x, int64_t n);
float dot_q5_0(const void* row, const void* x, int64_t n);
float dot_q5_1(const void* row, const void* x, int64_t n);
float dot_q8_0(const void* row, const void* x, int64_t n);

float dot_iq4_nl(const void* row, const void* xv, int64_t n) {
    const auto* w = static_cast<const block_iq4_nl*>(row);
    const auto* a = static_cast<const block_q8_0*>(xv);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kvalues_iq4nl)));
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / QK4_NL; ++b) {
        const __m256i q = _mm256_shuffle_epi8(table, nibbles(w[b].qs));
        const __m256 p = _mm256_cvtepi32_ps(dot_s8s8(q, load32(a[b].qs)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[b].d) * h2f(a[b].d)), p, acc);
    }
    return hsum(acc);
}

// ---- k-quants ---------------------------------------------------------------------------

// dot_q4_K, dot_q5_K, dot_q6_K are the one-token case of the tiles further down.
float dot_q4_K(const void* row, const void* x, int64_t n);
float dot_q5_K(const void* row, const void* x, int64_t n);
float dot_q6_K(const void* row, const void* x, int64_t n);

float dot_q2_K(const void* row, const void* xv, int64_t n) {
    const auto* w = static_cast<const block_q2_K*>(row);
    const auto* a = static_cast<const block_q8_K*>(xv);
    const __m256i two = _mm256_set1_epi8(3);
    float sum = 0;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        int isum = 0, msum = 0;
        for (int g = 0; g < 2; ++g) {
            const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs + 32 * g));
            for (int s = 0; s < 4; ++s) {
                const __m256i v = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s), two);
                const __m256i prod = dot_u8s8(v, load32(a[b].qs + g * 128 + s * 32));
                const __m128i lo = _mm256_castsi256_si128(prod), hi = _mm256_extracti128_si256(prod, 1);
                const int sb = g * 8 + s * 2;
                isum += (w[b].scales[sb] & 0xF) * hsum_i32x4(lo) + (w[b].scales[sb + 1] & 0xF) * hsum_i32x4(hi);
                msum += (w[b].scales[sb] >> 4) * a[b].bsums[sb] + (w[b].scales[sb + 1] >> 4) * a[b].bsums[sb + 1];
            }
        }
        sum += a[b].d * (h2f(w[b].d) * static_cast<float>(isum) - h2f(w[b].dmin) * static_cast<float>(msum));
    }
    return sum;
}

float dot_q3_K(const void* row, const void* xv, int64_t n) {
    const auto* w = static_cast<const block_q3_K*>(row);
    const auto* a = static_cast<const block_q8_K*>(xv);
    const __m256i two = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    float sum = 0;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const uint8_t* sc = w[b].scales;
        const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].hmask));
        int isum = 0;
        for (int g = 0; g < 2; ++g) {
            const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs + 32 * g));
            for (int s = 0; s < 4; ++s) {
                // q + 4 * hbit is 0..7; the -4 comes from bsums
                const __m256i hbit = _mm256_and_si256(_mm256_srli_epi16(hm, g * 4 + s), one);
                const __m256i v = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * s), two), _mm256_slli_epi16(hbit, 2));
                const __m256i prod = dot_u8s8(v, load32(a[b].qs + g * 128 + s * 32));
                const __m128i lo = _mm256_castsi256_si128(prod), hi = _mm256_extracti128_si256(prod, 1);
                for (int half = 0; half < 2; ++half) {
                    const int sb = g * 8 + s * 2 + half;
                    const int lo4 = (sc[sb % 8] >> (4 * (sb / 8))) & 0xF;
                    const int hi2 = (sc[8 + sb % 4] >> (2 * (sb / 4))) & 3;
                    isum += ((lo4 | hi2 << 4) - 32) * ((half ? hsum_i32x4(hi) : hsum_i32x4(lo)) - 4 * a[b].bsums[sb]);
                }
            }
        }
        sum += h2f(w[b].d) * a[b].d * static_cast<float>(isum);
    }
    return sum;
}

float dot_iq4_xs(const void* row, const void* xv, int64_t n) {
    const auto* w = static_cast<const block_iq4_xs*>(row);
    const auto* a = static_cast<const block_q8_K*>(xv);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kvalues_iq4nl)));
    float sum = 0;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        __m256i isum = _mm256_setzero_si256();
        for (int sb = 0; sb < 8; ++sb) {
            const int lo = (w[b].scales_l[sb / 2] >> (4 * (sb % 2))) & 0xF;
            const int hi = (w[b].scales_h >> (2 * sb)) & 3;
            const __m256i q = _mm256_shuffle_epi8(table, nibbles(w[b].qs + 16 * sb));
            const __m256i p = dot_s8s8(q, load32(a[b].qs + 32 * sb));
            isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(p, _mm256_set1_epi32((lo | hi << 4) - 32)));
        }
        sum += h2f(w[b].d) * a[b].d * static_cast<float>(hsum_i32(isum));
    }
    return sum;
}

float dot_q8_K(const void* row, const void* xv, int64_t n) {
    const auto* w = static_cast<const block_q8_K*>(row);
    const auto* a = static_cast<const block_q8_K*>(xv);
    float sum = 0;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        __m256i isum = _mm256_setzero_si256();
        for (int j = 0; j < QK_K; j += 32) isum = _mm256_add_epi32(isum, dot_s8s8(load32(w[b].qs + j), load32(a[b].qs + j)));
        sum += w[b].d * a[b].d * static_cast<float>(hsum_i32(isum));
    }
    return sum;
}

// ---- float activations ----------------------------------------------------------------------

float dot_f32(const void* row, const void* xv, int64_t n) {
    const auto* w = static_cast<const float*>(row);
    const auto* x = static_cast<const float*>(xv);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), acc1);
    }
    float s = hsum(_mm256_add_ps(acc0, acc1));
    for (; i < n; ++i) s += w[i] * x[i];
    return s;
}

float dot_f16(const void* row, const void* xv, int64_t n) {
    const auto* w = static_cast<const uint16_t*>(row);
    const auto* x = static_cast<const float*>(xv);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 wf = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i)));
        acc = _mm256_fmadd_ps(wf, _mm256_loadu_ps(x + i), acc);
    }
    float s = hsum(acc);
    for (; i < n; ++i) s += _cvtsh_ss(w[i]) * x[i];
    return s;
}

}  // namespace edgerunner::cpu::ER_ISA

namespace edgerunner::cpu::ER_ISA {

DotFn dot_fn(TensorType type) {
    switch (type) {
        case TensorType::F32: return dot_f32;
        case TensorType::F16: return dot_f16;
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
        default: return nullptr;  // BF16: the scalar kernel
    }
}

}  // namespace edgerunner::cpu::ER_ISA

// ---- attention over the KV cache ----------------------------------------------------------------

namespace edgerunner::cpu::ER_ISA {
namespace {

float kv_dot_f32(const void* k, const float* q, int64_t n) { return dot_f32(k, q, n); }
float kv_dot_f16(const void* k, const float* q, int64_t n) { return dot_f16(k, q, n); }

float kv_dot_q8_0(const void* k, const float* q, int64_t n) {
    const auto* b = static_cast<const block_q8_0*>(k);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK8_0; ++i) {
        __m256 part = _mm256_setzero_ps();
        for (int j = 0; j < QK8_0; j += 8) {
            const __m256 kv = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b[i].qs + j))));
            part = _mm256_fmadd_ps(kv, _mm256_loadu_ps(q + i * QK8_0 + j), part);
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(b[i].d)), part, acc);
    }
    return hsum(acc);
}

void kv_axpy_f32(float w, const void* v, float* out, int64_t n) {
    const auto* x = static_cast<const float*>(v);
    const __m256 wv = _mm256_set1_ps(w);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(out + i)));
    for (; i < n; ++i) out[i] += w * x[i];
}

void kv_axpy_f16(float w, const void* v, float* out, int64_t n) {
    const auto* x = static_cast<const uint16_t*>(v);
    const __m256 wv = _mm256_set1_ps(w);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 xf = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
        _mm256_storeu_ps(out + i, _mm256_fmadd_ps(wv, xf, _mm256_loadu_ps(out + i)));
    }
    for (; i < n; ++i) out[i] += w * _cvtsh_ss(x[i]);
}

void kv_axpy_q8_0(float w, const void* v, float* out, int64_t n) {
    const auto* b = static_cast<const block_q8_0*>(v);
    for (int64_t i = 0; i < n / QK8_0; ++i) {
        const __m256 wd = _mm256_set1_ps(w * h2f(b[i].d));
        for (int j = 0; j < QK8_0; j += 8) {
            const __m256 kv = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b[i].qs + j))));
            float* o = out + i * QK8_0 + j;
            _mm256_storeu_ps(o, _mm256_fmadd_ps(wd, kv, _mm256_loadu_ps(o)));
        }
    }
}

}  // namespace

// ---- elementwise math ---------------------------------------------------------------------------

// e^x, within 2 ulp over the range that matters here (Cephes' expf: x = n·ln2 + r, a degree-6
// polynomial in r, times 2^n); inputs clamped to [-87.3, 88] so 2^n stays a normal float.
inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33654f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 y = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// Lanes [0, k) of a mask, k in 1..8: the tail of a row, loaded and stored without a scalar loop.
inline __m256i tail_mask(int64_t k) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(k)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

void silu_mul(float* g, const float* u, int64_t n) {
    for (int64_t i = 0; i < n; i += 8) {
        const __m256i m = tail_mask(n - i);
        const __m256 gv = _mm256_maskload_ps(g + i, m), uv = _mm256_maskload_ps(u + i, m);
        const __m256 s = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
        _mm256_maskstore_ps(g + i, m, _mm256_mul_ps(s, uv));
    }
}

// tanh(y) = 1 - 2 / (e^{2y} + 1), with the same exp; gelu(g) = g/2 · (1 + tanh(√(2/π)(g + 0.044715 g³))).
void gelu_mul(float* g, const float* u, int64_t n) {
    for (int64_t i = 0; i < n; i += 8) {
        const __m256i m = tail_mask(n - i);
        const __m256 x = _mm256_maskload_ps(g + i, m), uv = _mm256_maskload_ps(u + i, m);
        const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
        const __m256 y = _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f), _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), x3, x));
        const __m256 e = exp256(_mm256_add_ps(y, y));
        const __m256 t = _mm256_sub_ps(_mm256_set1_ps(1.0f), _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
        const __m256 r = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), _mm256_add_ps(_mm256_set1_ps(1.0f), t)), uv);
        _mm256_maskstore_ps(g + i, m, r);
    }
}

float exp_sum(float* x, int64_t n, float shift) {
    __m256 sum = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        const __m256i m = tail_mask(n - i);
        const __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(_mm256_maskload_ps(x + i, m), _mm256_set1_ps(shift))),
                                       _mm256_castsi256_ps(m));
        _mm256_maskstore_ps(x + i, m, e);
        sum = _mm256_add_ps(sum, e);
    }
    return hsum(sum);
}

// f32 / f16 caches. Scores: eight positions per pass, eight independent dot products reduced
// together; values: 64 output columns stay in registers across all positions (one pass over
// each V row).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

template <typename E>
void kv_scores_x4(const uint8_t* base, size_t slot_bytes, int64_t capacity, int64_t start, int64_t end, const float* q,
                  int64_t n, float scale, float* out) {
    if (n % 8 != 0) return kv_scores_loop<std::is_same_v<E, float> ? kv_dot_f32 : kv_dot_f16>(base, slot_bytes, capacity, start, end, q, n, scale, out);
    const auto at = [&](int64_t s) { return reinterpret_cast<const E*>(base + static_cast<size_t>(s) * slot_bytes); };
    int64_t slot = start % capacity;
    for (int64_t p = start; p < end;) {
        if (p + 8 <= end && slot + 8 <= capacity) {  // eight slots in a row: eight independent sums
            const E* k[8];
            __m256 a[8];
            for (int j = 0; j < 8; ++j) {
                k[j] = at(slot + j);
                a[j] = _mm256_setzero_ps();
            }
            for (int64_t i = 0; i < n; i += 8) {
                const __m256 qv = _mm256_loadu_ps(q + i);
                for (int j = 0; j < 8; ++j) a[j] = _mm256_fmadd_ps(load8(k[j] + i), qv, a[j]);
            }
            for (int h = 0; h < 2; ++h) {
                const __m256 r = _mm256_hadd_ps(_mm256_hadd_ps(a[4 * h], a[4 * h + 1]), _mm256_hadd_ps(a[4 * h + 2], a[4 * h + 3]));
                const __m128 sum = _mm_add_ps(_mm256_castps256_ps128(r), _mm256_extractf128_ps(r, 1));
                _mm_storeu_ps(out + (p - start) + 4 * h, _mm_mul_ps(sum, _mm_set1_ps(scale)));
            }
            p += 8;
            slot += 8;
        } else {  // the last few positions, or the ones at the ring's end
            const E* k = at(slot);
            __m256 acc = _mm256_setzero_ps();
            for (int64_t i = 0; i < n; i += 8) acc = _mm256_fmadd_ps(load8(k + i), _mm256_loadu_ps(q + i), acc);
            out[p - start] = hsum(acc) * scale;
            ++p;
            ++slot;
        }
        if (slot == capacity) slot = 0;
    }
}

template <typename E>
void kv_values_x4(const uint8_t* base, size_t slot_bytes, int64_t capacity, int64_t start, int64_t end, const float* w,
                  int64_t n, float* out) {
    if (n % 8 != 0) return kv_values_loop<std::is_same_v<E, float> ? kv_axpy_f32 : kv_axpy_f16>(base, slot_bytes, capacity, start, end, w, n, out);
    const auto at = [&](int64_t s) { return reinterpret_cast<const E*>(base + static_cast<size_t>(s) * slot_bytes); };
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {  // 64 output columns (a whole 64-wide head) in registers
        __m256 a[8];
        for (int c = 0; c < 8; ++c) a[c] = _mm256_loadu_ps(out + i + 8 * c);
        int64_t slot = start % capacity;
        for (int64_t p = start; p < end; ++p) {
            const E* v = at(slot) + i;
            const __m256 wv = _mm256_set1_ps(w[p - start]);
            for (int c = 0; c < 8; ++c) a[c] = _mm256_fmadd_ps(wv, load8(v + 8 * c), a[c]);
            if (++slot == capacity) slot = 0;
        }
        for (int c = 0; c < 8; ++c) _mm256_storeu_ps(out + i + 8 * c, a[c]);
    }
    for (; i < n; i += 8) {  // the columns past the last multiple of 64
        __m256 a = _mm256_loadu_ps(out + i);
        int64_t slot = start % capacity;
        for (int64_t p = start; p < end; ++p) {
            a = _mm256_fmadd_ps(_mm256_set1_ps(w[p - start]), load8(at(slot) + i), a);
            if (++slot == capacity) slot = 0;
        }
        _mm256_storeu_ps(out + i, a);
    }
}

MathKernels math_kernels() { return {silu_mul, exp_sum, gelu_mul}; }

// q8_0 caches have head sizes that are multiples of 32 (checked at load).
KvKernels kv_kernels(KvType type) {
    switch (type) {
        case KvType::F32: return {kv_scores_x4<float>, kv_values_x4<float>};
        case KvType::F16: return {kv_scores_x4<uint16_t>, kv_values_x4<uint16_t>};
        case KvType::Q8_0: return {kv_scores_loop<kv_dot_q8_0>, kv_values_loop<kv_axpy_q8_0>};
    }
    return {nullptr, nullptr};
}

}  // namespace edgerunner::cpu::ER_ISA

// ---- several tokens per weight row (prefill) ---------------------------------------------------
// The same arithmetic as the single-token kernels above, in the same order per token, so a
// token's result does not depend on how many tokens shared the step; each weight block is
// loaded and unpacked once for up to 4 tokens.

namespace edgerunner::cpu::ER_ISA {
namespace {

// ---- activation quantization -------------------------------------------------------------------
// Q8_0 activations with their float and int block sums, byte for byte what the reference
// quantize_row_q8_0 + quantize_act write: d = max|x| / 127, q = round-half-away(x · (1/d)).

// roundf: round to nearest, ties away from zero (the SIMD rounding mode breaks ties to even).
inline __m256 round_half_away(__m256 p) {
    const __m256 t = _mm256_round_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 r = _mm256_round_ps(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 sign = _mm256_and_ps(p, _mm256_set1_ps(-0.0f));
    const __m256 frac = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_sub_ps(p, t));  // |p - trunc p|, exact
    const __m256 away = _mm256_add_ps(t, _mm256_or_ps(_mm256_set1_ps(1.0f), sign));
    return _mm256_blendv_ps(r, away, _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_EQ_OQ));
}

void quantize_q8_0_act(const float* x, void* dst, int64_t n) {
    const int64_t nb = n / QK8_0;
    auto* y = static_cast<block_q8_0*>(dst);
    auto* fsum = reinterpret_cast<float*>(y + nb);
    auto* isum = reinterpret_cast<int32_t*>(fsum + nb);
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    for (int64_t b = 0; b < nb; ++b, x += QK8_0) {
        __m256 v[4];
        __m256 amax = _mm256_setzero_ps();
        for (int k = 0; k < 4; ++k) {
            v[k] = _mm256_loadu_ps(x + 8 * k);
            amax = _mm256_max_ps(_mm256_and_ps(v[k], abs_mask), amax);  // NaN lanes keep amax, as fmax does
        }
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float d = _mm_cvtss_f32(m) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = fp32_to_fp16(d);
        __m256i q[4];
        for (int k = 0; k < 4; ++k) q[k] = _mm256_cvtps_epi32(round_half_away(_mm256_mul_ps(v[k], _mm256_set1_ps(id))));
        // int32 → int8 (values in [-127, 127]); the packs interleave 128-bit halves, the permute undoes it
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[b].qs),
                            _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        const int s = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
        isum[b] = s;
        fsum[b] = h2f(y[b].d) * static_cast<float>(s);
    }
}

// ---- 32-element formats, one SIMD lane per weight row --------------------------------------
// Eight weight rows are transposed in registers so that one 32-bit lane holds four consecutive
// elements of one row: a block of 8 rows × 32 elements is 8 operands, each meeting 4 broadcast
// activation bytes in one dpbusd. The block's integer dot of every row then sits in its own
// lane, exact, and the float scale work is one multiply-add per 8 rows. Per (row, token):
//     s    = Σ (q - offset) · a            (int, exact; offset from the activations' int sums)
//     sum += float(s) · (d · d_a)  [+ m · d_a·Σa for the formats with a minimum]
// which is the scalar reference's arithmetic, in the same order: bitwise equal to it.

// 8 rows' 16 bytes at row[i] + off → 4 vectors; vector k, lane i = bytes 4k..4k+3 of row i.
inline void transpose_8x16(const uint8_t* const row[8], size_t off, __m256i y[4]) {
    __m256i z[4];
    for (int i = 0; i < 4; ++i)
        z[i] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row[i] + off))),
                                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(row[i + 4] + off)), 1);
    // z[i] = [row i | row i+4]; two rounds of unpacking gather lane i from z[i % 4]'s half
    const __m256i a = _mm256_unpacklo_epi32(z[0], z[1]), b = _mm256_unpackhi_epi32(z[0], z[1]);
    const __m256i c = _mm256_unpacklo_epi32(z[2], z[3]), d = _mm256_unpackhi_epi32(z[2], z[3]);
    // lanes come out in row order 0, 1, 2, 3 | 4, 5, 6, 7
    y[0] = _mm256_unpacklo_epi64(a, c);
    y[1] = _mm256_unpackhi_epi64(a, c);
    y[2] = _mm256_unpacklo_epi64(b, d);
    y[3] = _mm256_unpackhi_epi64(b, d);
}

// Nibble formats: qs[j] holds element j (low) and j + 16 (high): operands g < 4 are the low
// nibbles of transposed vector g, operands 4..7 its high nibbles (elements 16 + 4g..).
inline void nibble_operands(const uint8_t* const row[8], size_t qs_off, __m256i op[8]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    __m256i y[4];
    transpose_8x16(row, qs_off, y);
    for (int g = 0; g < 4; ++g) {
        op[g] = _mm256_and_si256(y[g], low4);
        op[g + 4] = _mm256_and_si256(_mm256_srli_epi16(y[g], 4), low4);
    }
}

// Q5: bit j of the 32-bit qh is bit 4 of element j; operand g (elements 4g..4g+3) takes bits
// 4g..4g+3 of its row's qh, one per byte.
inline void add_fifth_bits(const uint8_t* const row[8], size_t qh_off, __m256i op[8]) {
    uint32_t h[8];
    for (int i = 0; i < 8; ++i) std::memcpy(&h[i], row[i] + qh_off, 4);
    const __m256i qh = _mm256_setr_epi32(static_cast<int>(h[0]), static_cast<int>(h[1]), static_cast<int>(h[2]),
                                         static_cast<int>(h[3]), static_cast<int>(h[4]), static_cast<int>(h[5]),
                                         static_cast<int>(h[6]), static_cast<int>(h[7]));
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12,
                                            0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
    const __m256i bit = _mm256_set1_epi32(0x08040201);
    for (int g = 0; g < 8; ++g) {
        const __m256i b = _mm256_shuffle_epi8(_mm256_srli_epi32(qh, 4 * g), spread);
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit);
        op[g] = _mm256_or_si256(op[g], _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    }
}

// 8 rows' fp16 at row[i] + off, as floats.
inline __m256 gather_half(const uint8_t* const row[8], size_t off) {
    uint16_t h[8];
    for (int i = 0; i < 8; ++i) std::memcpy(&h[i], row[i] + off, 2);
    return _mm256_cvtph_ps(_mm_setr_epi16(static_cast<short>(h[0]), static_cast<short>(h[1]), static_cast<short>(h[2]),
                                          static_cast<short>(h[3]), static_cast<short>(h[4]), static_cast<short>(h[5]),
                                          static_cast<short>(h[6]), static_cast<short>(h[7])));
}

// Accumulate the 8 operands against one token's block (4 activation bytes broadcast each).
inline __m256i block_dot(const __m256i op[8], const int8_t* a) {
    __m256i s = _mm256_setzero_si256();
    for (int g = 0; g < 8; ++g) {
        uint32_t v;
        std::memcpy(&v, a + 4 * g, 4);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
        s = _mm256_dpbusd_epi32(s, op[g], _mm256_set1_epi32(static_cast<int>(v)));
#elif defined(__AVXVNNI__)
        s = _mm256_dpbusd_avx_epi32(s, op[g], _mm256_set1_epi32(static_cast<int>(v)));
#else
        s = _mm256_add_epi32(s, dot_u8s8(op[g], _mm256_set1_epi32(static_cast<int>(v))));
#endif
    }
    return s;
}

#if defined(__AVX512F__)
// The same for 16 rows in 512-bit vectors (the avx512 kernel set): 128-bit chunk c of vector k
// holds bytes 4k..4k+3 of rows 4c..4c+3, so lane i is row i.
inline void transpose_16x16(const uint8_t* const row[16], size_t off, __m512i y[4]) {
    __m512i z[4];
    for (int i = 0; i < 4; ++i) {
        const auto ld = [&](int r) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(row[r] + off)); };
        z[i] = _mm512_inserti32x4(_mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(ld(i)), ld(i + 4), 1), ld(i + 8), 2),
                                  ld(i + 12), 3);
    }
    const __m512i a = _mm512_unpacklo_epi32(z[0], z[1]), b = _mm512_unpackhi_epi32(z[0], z[1]);
    const __m512i c = _mm512_unpacklo_epi32(z[2], z[3]), d = _mm512_unpackhi_epi32(z[2], z[3]);
    y[0] = _mm512_unpacklo_epi64(a, c);
    y[1] = _mm512_unpackhi_epi64(a, c);
    y[2] = _mm512_unpacklo_epi64(b, d);
    y[3] = _mm512_unpackhi_epi64(b, d);
}

inline void nibble_operands(const uint8_t* const row[16], size_t qs_off, __m512i op[8]) {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    __m512i y[4];
    transpose_16x16(row, qs_off, y);
    for (int g = 0; g < 4; ++g) {
        op[g] = _mm512_and_si512(y[g], low4);
        op[g + 4] = _mm512_and_si512(_mm512_srli_epi16(y[g], 4), low4);
    }
}

inline void add_fifth_bits(const uint8_t* const row[16], size_t qh_off, __m512i op[8]) {
    alignas(64) uint32_t h[16];
    for (int i = 0; i < 16; ++i) std::memcpy(&h[i], row[i] + qh_off, 4);
    const __m512i qh = _mm512_load_si512(h);
    const __m512i spread = _mm512_set4_epi32(0x0C0C0C0C, 0x08080808, 0x04040404, 0x00000000);
    const __m512i bit = _mm512_set1_epi32(0x08040201);
    for (int g = 0; g < 8; ++g) {
        const __mmask64 set = _mm512_test_epi8_mask(_mm512_shuffle_epi8(_mm512_srli_epi32(qh, 4 * g), spread), bit);
        op[g] = _mm512_mask_or_epi32(op[g], 0xFFFF, op[g], _mm512_maskz_mov_epi8(set, _mm512_set1_epi8(0x10)));
    }
}

inline __m512 gather_half16(const uint8_t* const row[16], size_t off) {
    alignas(32) uint16_t h[16];
    for (int i = 0; i < 16; ++i) std::memcpy(&h[i], row[i] + off, 2);
    return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(h)));
}

inline __m512i block_dot(const __m512i op[8], const int8_t* a) {
    __m512i s = _mm512_setzero_si512();
    for (int g = 0; g < 8; ++g) {
        uint32_t v;
        std::memcpy(&v, a + 4 * g, 4);
        s = _mm512_dpbusd_epi32(s, op[g], _mm512_set1_epi32(static_cast<int>(v)));
    }
    return s;
}
#endif

// Per format: its 8 unsigned operands for a block of 8 rows, the integer offset subtracted per
// element (× the activations' int sum), and whether a float minimum m is added.
template <typename B, int Offset, bool Min, bool FifthBit>
struct NibbleFormat {
    using Block = B;
    static constexpr int kOffset = Offset;
    static constexpr bool kMin = Min;
    template <int R, typename V>
    static void operands(const uint8_t* const (&row)[R], size_t off, V op[8]) {
        nibble_operands(row, off + offsetof(Block, qs), op);
        if constexpr (FifthBit) add_fifth_bits(row, off + offsetof(Block, qh), op);
    }
};
using Q4_0 = NibbleFormat<block_q4_0, 8, false, false>;
using Q4_1 = NibbleFormat<block_q4_1, 0, true, false>;
using Q5_0 = NibbleFormat<block_q5_0, 16, false, true>;
using Q5_1 = NibbleFormat<block_q5_1, 0, true, true>;
// Signed weights become unsigned with a +128 bias (x ^ 0x80), taken back out through Σa.
// Without VNNI the 16-bit pair sums of maddubs would saturate (255 · 127 · 2), so the plain
// AVX2 build multiplies |w| by a carrying w's sign instead (see block_dot_signed).
struct Q8_0 {
    using Block = block_q8_0;
    static constexpr int kOffset = 128;
    static constexpr bool kMin = false;
    static void operands(const uint8_t* const (&row)[8], size_t off, __m256i op[8]) {
        __m256i lo[4], hi[4];
        transpose_8x16(row, off + offsetof(Block, qs), lo);
        transpose_8x16(row, off + offsetof(Block, qs) + 16, hi);
        for (int g = 0; g < 4; ++g) {
            op[g] = lo[g];
            op[g + 4] = hi[g];
        }
#if defined(__AVXVNNI__) || defined(__AVX512VNNI__)
        for (int g = 0; g < 8; ++g) op[g] = _mm256_xor_si256(op[g], _mm256_set1_epi8(static_cast<char>(0x80)));
#endif
    }
#if defined(__AVX512F__)
    static void operands(const uint8_t* const (&row)[16], size_t off, __m512i op[8]) {
        __m512i lo[4], hi[4];
        transpose_16x16(row, off + offsetof(Block, qs), lo);
        transpose_16x16(row, off + offsetof(Block, qs) + 16, hi);
        for (int g = 0; g < 4; ++g) {
            op[g] = _mm512_xor_si512(lo[g], _mm512_set1_epi8(static_cast<char>(0x80)));
            op[g + 4] = _mm512_xor_si512(hi[g], _mm512_set1_epi8(static_cast<char>(0x80)));
        }
    }
#endif
};

template <typename F>
inline __m256i block_isum(const __m256i op[8], const block_q8_0& a, int32_t asum) {
#if !defined(__AVXVNNI__) && !defined(__AVX512VNNI__)
    if constexpr (F::kOffset == 128) {  // plain AVX2, Q8_0: signed × signed by the sign trick
        __m256i s = _mm256_setzero_si256();
        for (int g = 0; g < 8; ++g) {
            uint32_t v;
            std::memcpy(&v, a.qs + 4 * g, 4);
            s = _mm256_add_epi32(s, dot_s8s8(op[g], _mm256_set1_epi32(static_cast<int>(v))));
        }
        return s;
    }
#endif
    const __m256i s = block_dot(op, a.qs);
    if constexpr (F::kOffset != 0) return _mm256_sub_epi32(s, _mm256_set1_epi32(F::kOffset * asum));
    return s;
}

// Rows [0, n_rows) (≤ 8; the missing ones repeat the last row, their lanes are dropped) × T
// tokens: out[row * 4 + token].
template <typename F, int T>
void tile_32(const uint8_t* w, size_t w_stride, int n_rows, const uint8_t* x, size_t x_stride, int64_t nb, float* out) {
    using Block = typename F::Block;
    const uint8_t* row[8];
    for (int i = 0; i < 8; ++i) row[i] = w + static_cast<size_t>(i < n_rows ? i : n_rows - 1) * w_stride;
    const block_q8_0* a[T];
    const float* fsum[T];
    const int32_t* isum[T];
    __m256 acc[T];
    for (int k = 0; k < T; ++k) {
        a[k] = reinterpret_cast<const block_q8_0*>(x + k * x_stride);
        fsum[k] = q8_0_sums(a[k], nb);
        isum[k] = reinterpret_cast<const int32_t*>(fsum[k] + nb);
        acc[k] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; ++b) {
        const size_t off = static_cast<size_t>(b) * sizeof(Block);
        __m256i op[8];
        F::operands(row, off, op);
        const __m256 d = gather_half(row, off + offsetof(Block, d));
        __m256 m = _mm256_setzero_ps();
        if constexpr (F::kMin) m = gather_half(row, off + offsetof(Block, m));
        for (int k = 0; k < T; ++k) {
            const __m256i s = block_isum<F>(op, a[k][b], isum[k][b]);
            __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d, _mm256_set1_ps(h2f(a[k][b].d))));
            if constexpr (F::kMin) t = _mm256_add_ps(t, _mm256_mul_ps(m, _mm256_set1_ps(fsum[k][b])));
            acc[k] = _mm256_add_ps(acc[k], t);
        }
    }
    for (int k = 0; k < T; ++k) {
        alignas(32) float v[8];
        _mm256_store_ps(v, acc[k]);
        for (int i = 0; i < n_rows; ++i) out[i * 4 + k] = v[i];
    }
}

#if defined(__AVX512F__)
// tile_32 on 16 rows in 512-bit vectors: the same per-lane arithmetic, twice the rows per
// broadcast activation word.
template <typename F, int T>
void tile_32x16(const uint8_t* w, size_t w_stride, int n_rows, const uint8_t* x, size_t x_stride, int64_t nb, float* out) {
    using Block = typename F::Block;
    const uint8_t* row[16];
    for (int i = 0; i < 16; ++i) row[i] = w + static_cast<size_t>(i < n_rows ? i : n_rows - 1) * w_stride;
    const block_q8_0* a[T];
    const float* fsum[T];
    const int32_t* isum[T];
    __m512 acc[T];
    for (int k = 0; k < T; ++k) {
        a[k] = reinterpret_cast<const block_q8_0*>(x + k * x_stride);
        fsum[k] = q8_0_sums(a[k], nb);
        isum[k] = reinterpret_cast<const int32_t*>(fsum[k] + nb);
        acc[k] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; ++b) {
        const size_t off = static_cast<size_t>(b) * sizeof(Block);
        __m512i op[8];
        F::operands(row, off, op);
        const __m512 d = gather_half16(row, off + offsetof(Block, d));
        __m512 m = _mm512_setzero_ps();
        if constexpr (F::kMin) m = gather_half16(row, off + offsetof(Block, m));
        for (int k = 0; k < T; ++k) {
            __m512i s = block_dot(op, a[k][b].qs);
            if constexpr (F::kOffset != 0) s = _mm512_sub_epi32(s, _mm512_set1_epi32(F::kOffset * isum[k][b]));
            __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d, _mm512_set1_ps(h2f(a[k][b].d))));
            if constexpr (F::kMin) t = _mm512_add_ps(t, _mm512_mul_ps(m, _mm512_set1_ps(fsum[k][b])));
            acc[k] = _mm512_add_ps(acc[k], t);
        }
    }
    for (int k = 0; k < T; ++k) {
        alignas(64) float v[16];
        _mm512_store_ps(v, acc[k]);
        for (int i = 0; i < n_rows; ++i) out[i * 4 + k] = v[i];
    }
}
#endif

template <typename F>
void dot_rows_32(const void* w, size_t w_stride, int n_rows, const void* x, size_t x_stride, int n_tok, int64_t n,
                 float* out) {
    const auto* wp = static_cast<const uint8_t*>(w);
    const auto* xp = static_cast<const uint8_t*>(x);
    const int64_t nb = n / QK8_0;
#if defined(__AVX512F__)
    if (n_rows > 8) {
        switch (n_tok) {
            case 1: return tile_32x16<F, 1>(wp, w_stride, n_rows, xp, x_stride, nb, out);
            case 2: return tile_32x16<F, 2>(wp, w_stride, n_rows, xp, x_stride, nb, out);
            case 3: return tile_32x16<F, 3>(wp, w_stride, n_rows, xp, x_stride, nb, out);
            default: return tile_32x16<F, 4>(wp, w_stride, n_rows, xp, x_stride, nb, out);
        }
    }
#endif
    switch (n_tok) {
        case 1: return tile_32<F, 1>(wp, w_stride, n_rows, xp, x_stride, nb, out);
        case 2: return tile_32<F, 2>(wp, w_stride, n_rows, xp, x_stride, nb, out);
        case 3: return tile_32<F, 3>(wp, w_stride, n_rows, xp, x_stride, nb, out);
        default: return tile_32<F, 4>(wp, w_stride, n_rows, xp, x_stride, nb, out);
    }
}

// One row: the tile's arithmetic with every lane on the same row.
template <typename F>
float dot_32(const void* row, const void* x, int64_t n) {
    float out;
    tile_32<F, 1>(static_cast<const uint8_t*>(row), 0, 1, static_cast<const uint8_t*>(x), 0, n / QK8_0, &out);
    return out;
}

// ---- k-quants, one SIMD lane per weight row ---------------------------------------------------
// The 32-element formats' scheme on 256-element blocks: 8 rows transposed in registers, each
// sub-block's integer dot of every row in its own lane, scaled by the row's sub-block scale in
// integers; per (row, token) the scalar reference's arithmetic, bitwise.

// 8 rows' 32 bytes at row[i] + off → 8 vectors; vector k, lane i = bytes 4k..4k+3 of row i.
inline void transpose_8x32(const uint8_t* const row[8], size_t off, __m256i y[8]) {
    transpose_8x16(row, off, y);
    transpose_8x16(row, off + 16, y + 4);
}

// Lanes holding (lo16, hi16) fp16 pairs → the 8 low halves and the 8 high halves as floats.
inline void halves_to_float(__m256i pairs, __m256* lo, __m256* hi) {
    const __m256i split = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                           0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    const __m256i v = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(pairs, split), _MM_SHUFFLE(3, 1, 2, 0));
    *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(v));
    *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(v, 1));
}

inline __m256i bcast4(const int8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(static_cast<int>(v));
}

inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, dot_u8s8(u, s));
#endif
}

// Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins. Per (row, token):
//   isum = Σ sc_j · (q_j · a_j), msum = Σ m_j · Σa_j, sum += d_a · (d · isum - dmin · msum).
template <bool kFiveBit, int T>
void tile_q45_K(const uint8_t* w, size_t w_stride, int n_rows, const uint8_t* x, size_t x_stride, int64_t nb, float* out) {
    using Block = std::conditional_t<kFiveBit, block_q5_K, block_q4_K>;
    const uint8_t* row[8];
    for (int i = 0; i < 8; ++i) row[i] = w + static_cast<size_t>(i < n_rows ? i : n_rows - 1) * w_stride;
    const block_q8_K* a[T];
    __m256 acc[T];
    for (int k = 0; k < T; ++k) {
        a[k] = reinterpret_cast<const block_q8_K*>(x + k * x_stride);
        acc[k] = _mm256_setzero_ps();
    }
    const __m256i low4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    const __m256i mask6 = _mm256_set1_epi32(0x3f3f3f3f), mask4 = _mm256_set1_epi32(0x0f0f0f0f),
                  mask2 = _mm256_set1_epi32(0x03030303), byte = _mm256_set1_epi32(0xFF);
    for (int64_t b = 0; b < nb; ++b) {
        const size_t off = static_cast<size_t>(b) * sizeof(Block);
        // d, dmin and the 12 scale bytes are the block's first 16 bytes
        __m256i head[4];
        transpose_8x16(row, off, head);
        __m256 d, dmin;
        halves_to_float(head[0], &d, &dmin);
        // unpack the 6-bit scales: sc[0-3], sc[4-7], m[0-3], m[4-7] as bytes of 4 lanes each
        const __m256i s0 = head[1], s1 = head[2], s2 = head[3];
        const __m256i sc[2] = {_mm256_and_si256(s0, mask6),
                               _mm256_or_si256(_mm256_and_si256(s2, mask4),
                                               _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(s0, 6), mask2), 4))};
        const __m256i mn[2] = {_mm256_and_si256(s1, mask6),
                               _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(s2, 4), mask4),
                                               _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(s1, 6), mask2), 4))};
        __m256i qh[8];
        if constexpr (kFiveBit) transpose_8x32(row, off + offsetof(Block, qh), qh);
        __m256i isum[T], msum[T];
        for (int k = 0; k < T; ++k) isum[k] = msum[k] = _mm256_setzero_si256();
        for (int g = 0; g < 4; ++g) {  // sub-blocks 2g (low nibbles) and 2g + 1 (high nibbles)
            __m256i q[8];
            transpose_8x32(row, off + offsetof(Block, qs) + 32 * g, q);
            __m256i dlo[T], dhi[T];
            for (int k = 0; k < T; ++k) dlo[k] = dhi[k] = _mm256_setzero_si256();
            for (int e = 0; e < 8; ++e) {
                __m256i lo = _mm256_and_si256(q[e], low4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q[e], 4), low4);
                if constexpr (kFiveBit) {
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh[e], 2 * g), one), 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh[e], 2 * g + 1), one), 4));
                }
                for (int k = 0; k < T; ++k) {
                    dlo[k] = dpbusd(dlo[k], lo, bcast4(a[k][b].qs + 64 * g + 4 * e));
                    dhi[k] = dpbusd(dhi[k], hi, bcast4(a[k][b].qs + 64 * g + 32 + 4 * e));
                }
            }
            const int sh = 16 * (g % 2);  // sub-block 2g's scale is byte (2g) % 4 of its word
            const __m256i sc_lo = _mm256_and_si256(_mm256_srli_epi32(sc[g / 2], sh), byte);
            const __m256i sc_hi = _mm256_and_si256(_mm256_srli_epi32(sc[g / 2], sh + 8), byte);
            const __m256i m_lo = _mm256_and_si256(_mm256_srli_epi32(mn[g / 2], sh), byte);
            const __m256i m_hi = _mm256_and_si256(_mm256_srli_epi32(mn[g / 2], sh + 8), byte);
            for (int k = 0; k < T; ++k) {
                const int16_t* bs = a[k][b].bsums + 4 * g;
                isum[k] = _mm256_add_epi32(isum[k], _mm256_add_epi32(_mm256_mullo_epi32(dlo[k], sc_lo), _mm256_mullo_epi32(dhi[k], sc_hi)));
                msum[k] = _mm256_add_epi32(msum[k], _mm256_add_epi32(_mm256_mullo_epi32(m_lo, _mm256_set1_epi32(bs[0] + bs[1])),
                                                                     _mm256_mullo_epi32(m_hi, _mm256_set1_epi32(bs[2] + bs[3]))));
            }
        }
        for (int k = 0; k < T; ++k) {
            const __m256 t = _mm256_sub_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(isum[k])), _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(msum[k])));
            acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(_mm256_set1_ps(a[k][b].d), t));
        }
    }
    for (int k = 0; k < T; ++k) {
        alignas(32) float v[8];
        _mm256_store_ps(v, acc[k]);
        for (int i = 0; i < n_rows; ++i) out[i * 4 + k] = v[i];
    }
}

// Q6_K: 16 sub-blocks of 16 with int8 scales, q 6 bits with offset 32. Per (row, token):
//   isum = Σ sc_j · (q_j · a_j - 32 · Σa_j), sum += d · d_a · isum.
template <int T>
void tile_q6_K(const uint8_t* w, size_t w_stride, int n_rows, const uint8_t* x, size_t x_stride, int64_t nb, float* out) {
    const uint8_t* row[8];
    for (int i = 0; i < 8; ++i) row[i] = w + static_cast<size_t>(i < n_rows ? i : n_rows - 1) * w_stride;
    const block_q8_K* a[T];
    __m256 acc[T];
    for (int k = 0; k < T; ++k) {
        a[k] = reinterpret_cast<const block_q8_K*>(x + k * x_stride);
        acc[k] = _mm256_setzero_ps();
    }
    const __m256i low4 = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(3);
    for (int64_t b = 0; b < nb; ++b) {
        const size_t off = static_cast<size_t>(b) * sizeof(block_q6_K);
        const __m256 d = gather_half(row, off + offsetof(block_q6_K, d));
        __m256i scales[4];  // lane i: row i's scales 4j..4j+3 (int8)
        transpose_8x16(row, off + offsetof(block_q6_K, scales), scales);
        __m256i isum[T];
        for (int k = 0; k < T; ++k) isum[k] = _mm256_setzero_si256();
        for (int h = 0; h < 2; ++h) {
            __m256i ql[2][8], qh[8];
            transpose_8x32(row, off + offsetof(block_q6_K, ql) + 64 * h, ql[0]);
            transpose_8x32(row, off + offsetof(block_q6_K, ql) + 64 * h + 32, ql[1]);
            transpose_8x32(row, off + offsetof(block_q6_K, qh) + 32 * h, qh);
            for (int s = 0; s < 4; ++s)
                for (int half = 0; half < 2; ++half) {  // sub-block j = h·8 + s·2 + half: elements l = 16·half .. +15
                    const int j = h * 8 + s * 2 + half;
                    __m256i dot[T];
                    for (int k = 0; k < T; ++k) dot[k] = _mm256_setzero_si256();
                    for (int e = 4 * half; e < 4 * half + 4; ++e) {
                        const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(ql[s % 2][e], 4 * (s / 2)), low4);
                        const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh[e], 2 * s), two), 4);
                        const __m256i q = _mm256_or_si256(lo, hi);
                        for (int k = 0; k < T; ++k) dot[k] = dpbusd(dot[k], q, bcast4(a[k][b].qs + h * 128 + s * 32 + 4 * e));
                    }
                    // the sub-block's int8 scale, sign-extended: byte j % 4 of scales[j / 4]
                    const __m256i sc = _mm256_srai_epi32(_mm256_slli_epi32(scales[j / 4], 24 - 8 * (j % 4)), 24);
                    for (int k = 0; k < T; ++k) {
                        const __m256i centered = _mm256_sub_epi32(dot[k], _mm256_set1_epi32(32 * a[k][b].bsums[j]));
                        isum[k] = _mm256_add_epi32(isum[k], _mm256_mullo_epi32(centered, sc));
                    }
                }
        }
        for (int k = 0; k < T; ++k)
            acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(_mm256_mul_ps(d, _mm256_set1_ps(a[k][b].d)), _mm256_cvtepi32_ps(isum[k])));
    }
    for (int k = 0; k < T; ++k) {
        alignas(32) float v[8];
        _mm256_store_ps(v, acc[k]);
        for (int i = 0; i < n_rows; ++i) out[i * 4 + k] = v[i];
    }
}

struct Q4KTile {
    template <int T>
    static void run(const uint8_t* w, size_t ws, int nr, const uint8_t* x, size_t xs, int64_t nb, float* out) {
        tile_q45_K<false, T>(w, ws, nr, x, xs, nb, out);
    }
};
struct Q5KTile {
    template <int T>
    static void run(const uint8_t* w, size_t ws, int nr, const uint8_t* x, size_t xs, int64_t nb, float* out) {
        tile_q45_K<true, T>(w, ws, nr, x, xs, nb, out);
    }
};
struct Q6KTile {
    template <int T>
    static void run(const uint8_t* w, size_t ws, int nr, const uint8_t* x, size_t xs, int64_t nb, float* out) {
        tile_q6_K<T>(w, ws, nr, x, xs, nb, out);
    }
};

template <typename K>
float dot_k(const void* row, const void* x, int64_t n) {
    float out;
    K::template run<1>(static_cast<const uint8_t*>(row), 0, 1, static_cast<const uint8_t*>(x), 0, n / QK_K, &out);
    return out;
}

template <typename K>
void dot_rows_k(const void* w, size_t w_stride, int n_rows, const void* x, size_t x_stride, int n_tok, int64_t n,
                float* out) {
    const auto* wp = static_cast<const uint8_t*>(w);
    const auto* xp = static_cast<const uint8_t*>(x);
    if (n_rows > 8) {  // the avx512 set's 16-row tiles: two 8-row halves
        dot_rows_k<K>(w, w_stride, 8, x, x_stride, n_tok, n, out);
        return dot_rows_k<K>(wp + 8 * w_stride, w_stride, n_rows - 8, x, x_stride, n_tok, n, out + 8 * 4);
    }
    switch (n_tok) {
        case 1: return K::template run<1>(wp, w_stride, n_rows, xp, x_stride, n / QK_K, out);
        case 2: return K::template run<2>(wp, w_stride, n_rows, xp, x_stride, n / QK_K, out);
        case 3: return K::template run<3>(wp, w_stride, n_rows, xp, x_stride, n / QK_K, out);
        default: return K::template run<4>(wp, w_stride, n_rows, xp, x_stride, n / QK_K, out);
    }
}

}  // namespace

float dot_q4_0(const void* row, const void* x, int64_t n) { return dot_32<Q4_0>(row, x, n); }
float dot_q4_1(const void* row, const void* x, int64_t n) { return dot_32<Q4_1>(row, x, n); }
float dot_q5_0(const void* row, const void* x, int64_t n) { return dot_32<Q5_0>(row, x, n); }
float dot_q5_1(const void* row, const void* x, int64_t n) { return dot_32<Q5_1>(row, x, n); }
float dot_q8_0(const void* row, const void* x, int64_t n) { return dot_32<Q8_0>(row, x, n); }
float dot_q4_K(const void* row, const void* x, int64_t n) { return dot_k<Q4KTile>(row, x, n); }
float dot_q5_K(const void* row, const void* x, int64_t n) { return dot_k<Q5KTile>(row, x, n); }
float dot_q6_K(const void* row, const void* x, int64_t n) { return dot_k<Q6KTile>(row, x, n); }

QuantizeFn quantize_fn(ActFormat format) { return format == ActFormat::Q8_0 ? quantize_q8_0_act : nullptr; }

DotRowsFn dot_rows_fn(TensorType type) {
    switch (type) {
        case TensorType::Q4_0: return dot_rows_32<Q4_0>;
        case TensorType::Q4_1: return dot_rows_32<Q4_1>;
        case TensorType::Q5_0: return dot_rows_32<Q5_0>;
        case TensorType::Q5_1: return dot_rows_32<Q5_1>;
        case TensorType::Q8_0: return dot_rows_32<Q8_0>;
        case TensorType::Q4_K: return dot_rows_k<Q4KTile>;
        case TensorType::Q5_K: return dot_rows_k<Q5KTile>;
        case TensorType::Q6_K: return dot_rows_k<Q6KTile>;
        default: return nullptr;
    }
}

}  // namespace edgerunner::cpu::ER_ISA
