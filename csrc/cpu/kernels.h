// CPU kernels: row dot products against every weight format, and the small per-token ops.
// Scalar C++ written for the compiler to vectorize; the reference the SIMD kernels will match.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../core/kv_cache.h"
#include "edgerunner/tensor_type.h"

namespace edgerunner::cpu {

// Activation formats a weight row is multiplied with.
//   Float: float32 activations (F32/F16/BF16 weights, and every weight in precise mode).
//   Q8_0:  32-element blocks of int8 + fp16 scale, then per block a float "d * sum(q)" (for
//          the formats with a float offset: Q4_1, Q5_1), then per block the int32 sum(q)
//          (for the integer offsets: Q4_0's -8, Q5_0's -16, Q8_0's +128 bias).
//   Q8_K:  256-element blocks of int8 + float scale + 16 partial sums (the k-quants).
enum class ActFormat : uint8_t { Float, Q8_0, Q8_K };

// The activation format the fast path uses for weights of `type`.
ActFormat act_format_for(TensorType type);

// Bytes needed to hold n activations in `format` (Q8_0 includes the per-block sums).
size_t act_bytes(ActFormat format, int64_t n);

// Quantize one row of n activations (n a multiple of the format's block) into `dst`. Every
// kernel set writes the same bytes; the scalar one is the reference.
enum class Isa;
void quantize_act(ActFormat format, const float* x, void* dst, int64_t n, Isa isa);
void quantize_act(ActFormat format, const float* x, void* dst, int64_t n);  // best_isa()
using QuantizeFn = void (*)(const float* x, void* dst, int64_t n);

// dot(weight row of n elements, activations). `x` is float* for ActFormat::Float, otherwise a
// row produced by quantize_act in act_format_for(type). Types without a kernel are rejected at
// load time, never here.
using DotFn = float (*)(const void* row, const void* x, int64_t n);

// Instruction sets with kernels, in order of preference. best_isa() reads the CPU once; the
// environment variable EDGERUNNER_ISA=scalar|avx2|avxvnni|avx512 picks another one this CPU
// runs (for comparisons and benchmarks). avx512 is AVX-512 F/BW/VL/DQ + VNNI; a CPU may have
// it without AVX-VNNI (Ice Lake, Cascade Lake) or the reverse (Alder Lake).
enum class Isa { Scalar, Avx2, AvxVnni, Avx512 };
QuantizeFn quantize_fn(ActFormat format, Isa isa);  // null: the reference is used
Isa best_isa();
std::vector<Isa> available_isas();  // every set this CPU can run, scalar first
const char* isa_name(Isa isa);
Isa parse_isa(const char* name);  // throws std::invalid_argument for unknown or unsupported ones

DotFn dot_float_fn(TensorType type);                          // precise: dequantize per block, float dot
DotFn dot_quant_fn(TensorType type, Isa isa = best_isa());    // fast: the weight's activation format
DotFn dot_quant_fn_scalar(TensorType type);                   // the reference the SIMD kernels equal

// A tile: n_rows (1 to tile_rows(isa)) weight rows, w_stride bytes apart, against n_tok (1-4)
// activation rows, x_stride bytes apart: out[row * 4 + token]. Decode runs it with one token,
// prefill with four. Per (row, token) the same arithmetic, in the same order, as the
// single-token DotFn, whatever the tile's shape. Null where a type has no tile kernel (the
// caller then loops the DotFn).
constexpr int kMaxTileRows = 16, kTileTokens = 4;
int tile_rows(Isa isa = best_isa());  // 16 with 512-bit vectors, else 8
using DotRowsFn = void (*)(const void* w, size_t w_stride, int n_rows, const void* x, size_t x_stride, int n_tok,
                           int64_t n, float* out);
DotRowsFn dot_rows_fn(TensorType type, Isa isa = best_isa());

// Attention over one head of the cache, positions [start, end): slot p is at
// base + (p % capacity) * slot_bytes (base: the layer's K or V region plus the head's offset).
//   scores: out[p - start] = (q · k_p) * scale
//   values: out += Σ w[p - start] · v_p
using KvScoresFn = void (*)(const uint8_t* base, size_t slot_bytes, int64_t capacity, int64_t start, int64_t end,
                            const float* q, int64_t n, float scale, float* out);
using KvValuesFn = void (*)(const uint8_t* base, size_t slot_bytes, int64_t capacity, int64_t start, int64_t end,
                            const float* w, int64_t n, float* out);
struct KvKernels {
    KvScoresFn scores;
    KvValuesFn values;
};
KvKernels kv_kernels(KvType type, Isa isa = best_isa());
KvKernels kv_kernels_scalar(KvType type);

// Elementwise math on float rows. Each element's result depends only on its input (the SIMD
// versions run a vector's tail padded, never a scalar fallback), so a token's values do not
// depend on how rows were grouped into tiles.
//   silu_mul: g = g / (1 + e^-g) · u         exp_sum: x = e^(x - shift); returns Σ x
//   gelu_mul: g = gelu_tanh(g) · u = g/2 · (1 + tanh(√(2/π) (g + 0.044715 g³))) · u
struct MathKernels {
    void (*silu_mul)(float* g, const float* u, int64_t n);
    float (*exp_sum)(float* x, int64_t n, float shift);
    void (*gelu_mul)(float* g, const float* u, int64_t n);
};
MathKernels math_kernels(Isa isa = best_isa());
MathKernels math_kernels_scalar();  // std::exp: the precise path

// One token's K or V row (n values) into a cache slot, in the cache precision.
void store_kv_row(KvType type, const float* x, uint8_t* slot, int64_t n);

// The position loops around a per-slot dot / axpy (instantiated per backend file).
template <float (*Dot)(const void*, const float*, int64_t)>
void kv_scores_loop(const uint8_t* base, size_t slot_bytes, int64_t capacity, int64_t start, int64_t end,
                    const float* q, int64_t n, float scale, float* out) {
    int64_t slot = start % capacity;
    for (int64_t p = start; p < end; ++p) {
        out[p - start] = Dot(base + static_cast<size_t>(slot) * slot_bytes, q, n) * scale;
        if (++slot == capacity) slot = 0;
    }
}
template <void (*Axpy)(float, const void*, float*, int64_t)>
void kv_values_loop(const uint8_t* base, size_t slot_bytes, int64_t capacity, int64_t start, int64_t end,
                    const float* w, int64_t n, float* out) {
    int64_t slot = start % capacity;
    for (int64_t p = start; p < end; ++p) {
        Axpy(w[p - start], base + static_cast<size_t>(slot) * slot_bytes, out, n);
        if (++slot == capacity) slot = 0;
    }
}

}  // namespace edgerunner::cpu
