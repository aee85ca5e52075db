// CPU kernels: row dot products against every weight format, and the small per-token ops.
// Scalar C++ written for the compiler to vectorize; the reference the SIMD kernels will match.
#pragma once

#include <cstddef>
#include <cstdint>

#include "edgerunner/tensor_type.h"

namespace edgerunner::cpu {

// Activation formats a weight row is multiplied with.
//   Float: float32 activations (F32/F16/BF16 weights, and every weight in precise mode).
//   Q8_0:  32-element blocks of int8 + fp16 scale, with a float "d * sum(q)" per block
//          (for the formats with an offset term: Q4_1, Q5_1).
//   Q8_K:  256-element blocks of int8 + float scale + 16 partial sums (the k-quants).
enum class ActFormat : uint8_t { Float, Q8_0, Q8_K };

// The activation format the fast path uses for weights of `type`.
ActFormat act_format_for(TensorType type);

// Bytes needed to hold n activations in `format` (Q8_0 includes the per-block sums).
size_t act_bytes(ActFormat format, int64_t n);

// Quantize one row of n activations (n a multiple of the format's block) into `dst`.
void quantize_act(ActFormat format, const float* x, void* dst, int64_t n);

// dot(weight row of n elements, activations). `x` is float* for ActFormat::Float, otherwise a
// row produced by quantize_act in act_format_for(type). Types without a kernel are rejected at
// load time, never here.
using DotFn = float (*)(const void* row, const void* x, int64_t n);
DotFn dot_float_fn(TensorType type);  // weight dequantized block by block, float activations
DotFn dot_quant_fn(TensorType type);  // integer dot against quantized activations

// Decode one row of n elements (embedding look-ups).
void dequantize_into(TensorType type, const void* row, float* y, int64_t n);

// fp16 <-> fp32 for the KV cache (table-driven decode).
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

}  // namespace edgerunner::cpu
