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
    const float* x;       // cols floats
    const float* bias;    // rows floats, or null
    float* y;             // rows floats: y = W x (+ bias), or y += that with accumulate
    bool accumulate;
};

void gemv_launch(TensorType type, const GemvArgs& args, cudaStream_t stream);

}  // namespace edgerunner::cuda
