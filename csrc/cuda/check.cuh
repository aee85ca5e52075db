// CUDA error checks: every runtime call's status becomes an exception naming the call.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace edgerunner::cuda {

inline void check(cudaError_t status, const char* call, const char* file, int line) {
    if (status != cudaSuccess)
        throw std::runtime_error(std::string("CUDA: ") + call + " failed: " + cudaGetErrorString(status) + " (" + file +
                                 ":" + std::to_string(line) + ")");
}

}  // namespace edgerunner::cuda

#define ER_CUDA(call) ::edgerunner::cuda::check((call), #call, __FILE__, __LINE__)
