// Scalar reference (de)quantization: the definition of each format's arithmetic that every
// optimized kernel is tested against. Block layouts live in quant_blocks.h.
#pragma once

#include <cstdint>

#include "edgerunner/tensor_type.h"

namespace edgerunner {

// Decode n elements (a whole number of blocks) of `type` from `src` into float32 `dst`.
// Throws std::invalid_argument when the type has no dequantizer or n is not a block multiple.
void dequantize_row(TensorType type, const void* src, float* dst, int64_t n);

// Activation formats for the CPU's integer dot products. n must be a multiple of 32 (Q8_0)
// or 256 (Q8_K); throws std::invalid_argument otherwise.
void quantize_row_q8_0(const float* src, void* dst, int64_t n);
void quantize_row_q8_K(const float* src, void* dst, int64_t n);

}  // namespace edgerunner
