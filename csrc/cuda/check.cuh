// CUDA error checks (every runtime call's status becomes an exception naming the call) and device
// allocations (out of memory becomes OutOfMemory, naming what needed the bytes and the fix).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "../core/kv_cache.h"
#include "edgerunner/engine.h"

namespace edgerunner::cuda {

inline void check(cudaError_t status, const char* call, const char* file, int line) {
    if (status != cudaSuccess)
        throw std::runtime_error(std::string("CUDA: ") + call + " failed: " + cudaGetErrorString(status) + " (" + file +
                                 ":" + std::to_string(line) + ")");
}

// "GPU 0 (NVIDIA H200)": the current device, for messages.
inline std::string current_gpu() {
    int device = 0;
    cudaDeviceProp p{};
    if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&p, device) != cudaSuccess) return "the GPU";
    return "GPU " + std::to_string(device) + " (" + p.name + ")";
}

// The current device's free bytes (0 where it cannot say).
inline size_t gpu_free_bytes() {
    size_t free = 0, total = 0;
    return cudaMemGetInfo(&free, &total) == cudaSuccess ? free : 0;
}

struct Free {
    void operator()(void* p) const noexcept { cudaFree(p); }
};
template <typename T>
using DevicePtr = std::unique_ptr<T, Free>;

// `count` T in device memory for `what`; where they do not fit, OutOfMemory says so with `fix`.
template <typename T>
DevicePtr<T> device_alloc(size_t count, const char* what = "a session's scratch buffers",
                          const char* fix = "Load the model with a smaller prefill_chunk or n_ctx, or free GPU memory") {
    void* p = nullptr;
    const size_t bytes = count * sizeof(T) + (count == 0);
    const cudaError_t status = cudaMalloc(&p, bytes);
    if (status == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();  // (not sticky: the context stays usable)
        throw OutOfMemory(std::string("CUDA: out of GPU memory for ") + what + " (" + size_text(bytes) + "); " + current_gpu() +
                          ": " + size_text(gpu_free_bytes()) + " free. " + fix + ".");
    }
    check(status, "cudaMalloc", __FILE__, __LINE__);
    return DevicePtr<T>(static_cast<T*>(p));
}

}  // namespace edgerunner::cuda

#define ER_CUDA(call) ::edgerunner::cuda::check((call), #call, __FILE__, __LINE__)
