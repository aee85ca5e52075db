// The CUDA backend's host interface: plain C++, no CUDA types, so the core and the bindings
// include it without nvcc. Built only with EDGERUNNER_CUDA=ON (ER_HAVE_CUDA is then defined).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "edgerunner/tensor_type.h"

namespace edgerunner::cuda {

// Whether a CUDA device is present and usable (false, never an error, when there is none).
bool available();
// "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)", or the reason there is no device.
std::string describe();

// Weight types the GEMV kernels read in their raw blocks.
bool gemv_supports(TensorType type);

// y = W · x on the device, for the backend-ops tests and the kernel benchmarks: W is n_rows
// rows of row_bytes raw blocks (n columns), x has n floats. Uploads, runs, reads back.
std::vector<float> gemv(TensorType type, const uint8_t* rows, int64_t n_rows, size_t row_bytes, const float* x, int64_t n);

}  // namespace edgerunner::cuda
