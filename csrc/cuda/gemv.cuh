// The GEMV kernels' launch interface, for the backend's executable (device pointers).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "edgerunner/tensor_type.h"

namespace edgerunner::cuda {

struct GemvArgs {
    const uint8_t* w;     // rows × row_bytes raw blocks
    size_t row_bytes;
    int64_t rows, cols;
    const float* x;       // per token: cols floats, x_stride apart
    const float* bias;    // rows floats, or null
    float* y;             // per token: rows floats, y_stride apart: y = W x (+ bias), or y += that
    bool accumulate;
    int64_t n_tokens = 1, x_stride = 0, y_stride = 0;
};

void gemv_launch(TensorType type, const GemvArgs& args, cudaStream_t stream);

}  // namespace edgerunner::cuda
