// <cuda_runtime.h> for running csrc/cuda kernels on the CPU (tests/cuda_emulator): the kernels
// are compiled as ordinary C++ and every thread of a block runs as a coroutine (tests/lanes), so
// __syncthreads and the warp functions really synchronize. `__shared__` variables become
// function statics shared by the coroutines of the one block that runs at a time; atomics are
// plain read-modify-writes (one thread runs at a time, and switches only at a barrier or a warp
// function); fences do nothing. Host calls are stand-ins over host memory, enough for
// csrc/cuda/check.cuh and launch.cuh to compile and for the emulator to allocate. The subset is
// what the emulated kernel files use (csrc/cuda/sample.cu); a kernel that needs more fails to
// compile here, which is the cue to add it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "lanes.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) float4 {
    float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

namespace er_cuda_emulator {
inline uint3 thread_idx() { return uint3{er_emulator::current_thread(), 0, 0}; }
inline uint3 block_idx() { return uint3{er_emulator::current_group(0), er_emulator::current_group(1), er_emulator::current_group(2)}; }
inline uint3 grid_dim() { return uint3{er_emulator::grid_groups(0), er_emulator::grid_groups(1), er_emulator::grid_groups(2)}; }
inline uint3 block_dim() { return uint3{er_emulator::group_threads(), 1, 1}; }

template <typename T>
uint64_t bits_of(T v) {
    static_assert(sizeof(T) <= 8, "a warp function's value is at most 8 bytes");
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof(T));
    return b;
}
template <typename T>
T of_bits(uint64_t b) {
    T v;
    std::memcpy(&v, &b, sizeof(T));
    return v;
}
}  // namespace er_cuda_emulator

#define threadIdx (::er_cuda_emulator::thread_idx())
#define blockIdx (::er_cuda_emulator::block_idx())
#define gridDim (::er_cuda_emulator::grid_dim())
#define blockDim (::er_cuda_emulator::block_dim())

inline void __syncthreads() { er_emulator::threadgroup_barrier(); }
inline void __threadfence() {}
inline void __threadfence_system() {}

// Warp functions (one block's warps are its 32-lane SIMD groups; the mask is taken as full).
template <typename T>
T __shfl_xor_sync(unsigned, T v, int lane_mask) {
    return er_cuda_emulator::of_bits<T>(er_emulator::simd_exchange(er_cuda_emulator::bits_of(v), er_emulator::kXor, static_cast<uint32_t>(lane_mask)));
}
template <typename T>
T __shfl_down_sync(unsigned, T v, unsigned delta) {
    return er_cuda_emulator::of_bits<T>(er_emulator::simd_exchange(er_cuda_emulator::bits_of(v), er_emulator::kDown, delta));
}
inline unsigned __ballot_sync(unsigned, int predicate) {
    return static_cast<unsigned>(er_emulator::simd_exchange(predicate != 0, er_emulator::kBallot, 0));
}
inline unsigned __match_any_sync(unsigned, unsigned v) { return static_cast<unsigned>(er_emulator::simd_exchange(v, er_emulator::kMatchAny, 0)); }

inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline unsigned __float_as_uint(float f) { return er_cuda_emulator::of_bits<unsigned>(er_cuda_emulator::bits_of(f)); }
inline float __uint_as_float(unsigned u) { return er_cuda_emulator::of_bits<float>(u); }
// (the host compiles these with -ffp-contract=off: each rounds once, as the intrinsics do)
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }

template <typename T>
T atomicAdd(T* p, T v) {
    const T old = *p;
    *p = old + v;
    return old;
}
template <typename T>
T atomicExch(T* p, T v) {
    const T old = *p;
    *p = v;
    return old;
}
template <typename T>
T atomicMax(T* p, T v) {
    const T old = *p;
    *p = std::max(old, v);
    return old;
}
template <typename T>
T atomicMin(T* p, T v) {
    const T old = *p;
    *p = std::min(old, v);
    return old;
}

// CUDA's global min and max (a kernel's unqualified calls)
using std::max;
using std::min;

// ---- host API stand-ins --------------------------------------------------------------------
enum cudaError_t { cudaSuccess = 0, cudaErrorMemoryAllocation = 2, cudaErrorNotSupported = 801 };
typedef cudaError_t cudaError;
typedef struct CUstream_st* cudaStream_t;
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDriverEntryPointQueryResult { cudaDriverEntryPointSuccess = 0, cudaDriverEntryPointSymbolNotFound = 1 };
enum { cudaEnableDefault = 0 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3 };
struct cudaDeviceProp {
    char name[256] = "CPU emulator";
};
struct cudaFuncAttributes {
    size_t sharedSizeBytes = 0;
};

inline const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "not supported by the emulator"; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaGetDevice(int* d) { return *d = 0, cudaSuccess; }
inline cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorNotSupported; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) { return *p = cudaDeviceProp{}, cudaSuccess; }
inline cudaError_t cudaMemGetInfo(size_t* free, size_t* total) { return *free = *total = 0, cudaErrorNotSupported; }
inline cudaError_t cudaMalloc(void** p, size_t bytes) { return (*p = std::calloc(1, bytes)) ? cudaSuccess : cudaErrorMemoryAllocation; }
inline cudaError_t cudaFree(void* p) { return std::free(p), cudaSuccess; }
inline cudaError_t cudaMemcpy(void* to, const void* from, size_t bytes, cudaMemcpyKind) { return std::memcpy(to, from, bytes), cudaSuccess; }
inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, const void*) { return *a = cudaFuncAttributes{}, cudaSuccess; }
inline cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int) { return cudaSuccess; }
inline cudaError_t cudaGetDriverEntryPointByVersion(const char*, void** f, unsigned, int, cudaDriverEntryPointQueryResult* r) {
    *f = nullptr;
    *r = cudaDriverEntryPointSymbolNotFound;
    return cudaErrorNotSupported;
}
