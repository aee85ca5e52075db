// CUDA error checks (every runtime call's status becomes an exception naming the call) and device
// allocations (out of memory becomes OutOfMemory, naming what needed the bytes and the fix).
#pragma once

#include <cuda.h>  // (types only: the driver is reached through the runtime's entry points)
#include <cuda_runtime.h>

#include <atomic>
#include <memory>
#include <new>
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

// The device the innermost OnGpu of the calling thread made current (-1: none): current_device()
// reads it without asking the runtime (eager dispatch asks for every launch of every step).
inline int& scoped_gpu() {
    thread_local int gpu = -1;
    return gpu;
}

// A model's GPU made the calling thread's current device for the guard's lifetime (every call into
// the backend that allocates, launches or frees runs under one), then the previous one restored,
// unless no context exists on that one: restoring it would create one, and take its memory, on
// a GPU the process never used (a model on cuda:1 leaves GPU 0 alone). Where the device cannot be
// made current, the guard throws; a guard made with std::nothrow (releases, which run in
// destructors, also at exit after the runtime has gone) then does nothing.
class OnGpu {
public:
    explicit OnGpu(int gpu) : gpu_(gpu) {
        check(cudaGetDevice(&previous_), "cudaGetDevice", __FILE__, __LINE__);
        if (previous_ != gpu_) check(cudaSetDevice(gpu_), "cudaSetDevice", __FILE__, __LINE__);
        scoped_gpu() = gpu_;
    }
    OnGpu(int gpu, std::nothrow_t) noexcept : gpu_(gpu) {
        if (cudaGetDevice(&previous_) != cudaSuccess || (previous_ != gpu_ && cudaSetDevice(gpu_) != cudaSuccess))
            previous_ = gpu_;  // (nothing to restore; scoped_gpu() left as it was)
        else
            scoped_gpu() = gpu_;
    }
    ~OnGpu() {
        scoped_gpu() = outer_;
        if (previous_ != gpu_ && has_context(previous_)) cudaSetDevice(previous_);
    }
    OnGpu(const OnGpu&) = delete;
    OnGpu& operator=(const OnGpu&) = delete;

    // Whether device `gpu`'s primary context is active (the driver's cuDevicePrimaryCtxGetState;
    // where it cannot be asked, true).
    static bool has_context(int gpu) {
        using Get = CUresult (*)(CUdevice*, int);
        using GetState = CUresult (*)(CUdevice, unsigned int*, int*);
        static const auto driver = [](const char* name) -> void* {
            void* f = nullptr;
            cudaDriverEntryPointQueryResult found{};
            return cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &found) == cudaSuccess &&
                           found == cudaDriverEntryPointSuccess
                       ? f
                       : nullptr;
        };
        static const Get get = reinterpret_cast<Get>(driver("cuDeviceGet"));
        static const GetState get_state = reinterpret_cast<GetState>(driver("cuDevicePrimaryCtxGetState"));
        CUdevice device = 0;
        unsigned int flags = 0;
        int active = 1;
        return !get || !get_state || get(&device, gpu) != CUDA_SUCCESS || get_state(device, &flags, &active) != CUDA_SUCCESS || active != 0;
    }

private:
    int gpu_, previous_ = 0, outer_ = scoped_gpu();
};

// The most device indices the per-device caches (PerGpu) hold.
constexpr int kMaxGpus = 64;

// The current device's index (below kMaxGpus).
inline int current_device() {
    int device = scoped_gpu();
    if (device < 0) check(cudaGetDevice(&device), "cudaGetDevice", __FILE__, __LINE__);
    if (device < 0 || device >= kMaxGpus) throw std::runtime_error("CUDA: device " + std::to_string(device) + " is past the " +
                                                                   std::to_string(kMaxGpus) + " this build addresses");
    return device;
}

// A fact of a device (an attribute, a kernel's allowance), found once per device by f(device) for
// the current one. Threads that race find the same value, so the first store wins nothing.
template <typename T>
class PerGpu {
public:
    template <class F>
    T operator()(F f) {
        const int d = current_device();
        if (!known_[d].load(std::memory_order_acquire)) {
            value_[d].store(f(d), std::memory_order_relaxed);
            known_[d].store(true, std::memory_order_release);
        }
        return value_[d].load(std::memory_order_relaxed);
    }

private:
    std::atomic<T> value_[kMaxGpus]{};
    std::atomic<bool> known_[kMaxGpus]{};
};

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
