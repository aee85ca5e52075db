// The GEMV kernels' launch interface, for the backend's executable (device pointers).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "edgerunner/tensor_type.h"

namespace edgerunner::cuda {

struct QBlock;  // int8 activations (quant_quarter.cuh)

struct GemvArgs {
    const uint8_t* w;     // rows × row_bytes raw blocks
    size_t row_bytes;
    int64_t rows, cols;
    const float* x;       // per token: cols floats, x_stride apart
    const float* bias;    // rows floats, or null
    float* y;             // per token: rows floats, y_stride apart: y = W x (+ bias), or y += that
    bool accumulate;
    int64_t n_tokens = 1, x_stride = 0, y_stride = 0;
    const QBlock* xq = nullptr;  // x quantized by quantize_activations, for types where gemv_wants_q8
    int64_t xq_stride = 0;       // blocks between tokens
};

void gemv_launch(TensorType type, const GemvArgs& args, cudaStream_t stream);

// Whether the type's GEMV reads int8 activations (GemvArgs::xq) rather than floats.
bool gemv_wants_q8(TensorType type);
// x (n_tokens rows of cols floats, x_stride apart) → cols/32 blocks per token, out_stride apart:
// d = max|x| / 127, q = round(x / d).
void quantize_activations(const float* x, QBlock* out, int64_t n_tokens, int64_t cols, int64_t x_stride, int64_t out_stride,
                          cudaStream_t stream);
size_t qblock_bytes();

}  // namespace edgerunner::cuda
