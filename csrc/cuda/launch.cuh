// How every kernel of the backend is written and launched.
//
// A kernel is a struct with its argument struct and a device body:
//
//     struct RmsNorm {
//         using Args = NormArgs;
//         static __device__ void run(const Args& a);
//     };
//
// and gets two entry points from that one body: `by_value<K>` takes the Args as a kernel
// parameter (eager dispatch; also what a recorded CUDA graph bakes in), `by_table<K>` reads them
// from a device-resident table written once at prepare time (argument-buffer dispatch). A
// `Launch` is one such kernel with its grid and its Args bytes: the runner turns the step plan
// into a list of them and dispatches the list in one of three ways.
//
// Programmatic dependent launch (sm_90): kernels are launched so that the next one may start
// while this one drains. Every body therefore calls `wait_inputs()` before it writes anything,
// and before it reads activations or this step's KV-cache slots. Before it, a body may read
// what no kernel of the running step writes: weights and tables written at load, the step
// block's header (copied in before the step's first kernel starts), and the KV-cache slots of
// earlier steps' positions (below the step's first position) — and it should: whatever does not
// wait is off the step's critical path (bench/NOTES.md, sixth CUDA session). `allow_next()` lets
// the next kernel start launching.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "check.cuh"

#include "trace.cuh"

// A device function kept out of line (a kernel's rare path, whose registers would crowd its
// common one); the emulator's compiler decides for itself.
#ifndef ER_CUDA_EMULATOR
#define ER_NOINLINE __noinline__
#else
#define ER_NOINLINE
#endif

namespace edgerunner::cuda {

__device__ __forceinline__ void wait_inputs() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    trace_waited();
}

__device__ __forceinline__ void allow_next() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// Pull [p, p + bytes) towards L2 without waiting for it (one 128-byte line per lane and step).
__device__ __forceinline__ void prefetch_l2(const void* p, size_t bytes, int lane, int lanes) {
    const char* c = static_cast<const char*>(p);
#ifndef ER_CUDA_EMULATOR
    for (size_t off = static_cast<size_t>(lane) * 128; off < bytes; off += static_cast<size_t>(lanes) * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(c + off));
#else
    (void)c, (void)bytes, (void)lane, (void)lanes;
#endif
}

template <class K>
__global__ void by_value(const typename K::Args a) {
    trace_begin(trace_slot<K>);
    K::run(a);
    trace_end(trace_slot<K>);
}

template <class K>
__global__ void by_table(const typename K::Args* __restrict__ a) {
    trace_begin(trace_slot<K>);
    K::run(*a);
    trace_end(trace_slot<K>);
}

// A kernel that declares `kBlockThreads` and `kMinBlocks` gets entry points with launch bounds:
// the compiler fits its registers so that kMinBlocks blocks of kBlockThreads share an SM.
template <class K, class = void>
constexpr bool kBounded = false;
template <class K>
constexpr bool kBounded<K, std::void_t<decltype(K::kMinBlocks)>> = true;

template <class K>
__global__ void __launch_bounds__(K::kBlockThreads, K::kMinBlocks) by_value_bounded(const typename K::Args a) {
    trace_begin(trace_slot<K>);
    K::run(a);
    trace_end(trace_slot<K>);
}

template <class K>
__global__ void __launch_bounds__(K::kBlockThreads, K::kMinBlocks) by_table_bounded(const typename K::Args* __restrict__ a) {
    trace_begin(trace_slot<K>);
    K::run(*a);
    trace_end(trace_slot<K>);
}

// Kernel K's two entry points (arguments by value, or from a device table).
#ifndef ER_CUDA_EMULATOR
template <class K>
const void* value_entry() {
    if constexpr (kBounded<K>) return reinterpret_cast<const void*>(&by_value_bounded<K>);
    else return reinterpret_cast<const void*>(&by_value<K>);
}
template <class K>
const void* table_entry() {
    if constexpr (kBounded<K>) return reinterpret_cast<const void*>(&by_table_bounded<K>);
    else return reinterpret_cast<const void*>(&by_table<K>);
}
#else
// (the CPU emulator, tests/cuda_emulator: both take what cudaLaunchKernelExC's first parameter
// pointer points at, the Args themselves or the table pointer, and say which they are)
template <class K>
void emulated_by_value(const void* args) {
    K::run(*static_cast<const typename K::Args*>(args));
}
template <class K>
void emulated_by_table(const void* table) {
    K::run(**static_cast<const typename K::Args* const*>(table));
}
template <class K>
const void* value_entry() {
    static const void* entry = er_cuda_emulator::entry(&emulated_by_value<K>, sizeof(typename K::Args));
    return entry;
}
template <class K>
const void* table_entry() {
    static const void* entry = er_cuda_emulator::entry(&emulated_by_table<K>, sizeof(const void*));
    return entry;
}
#endif

// Steps of this many tokens or more take the prefill kernels (the tensor-core GEMM, the tiled
// attention); smaller ones share the decode kernels' arithmetic token for token.
constexpr int64_t kPrefillKernelTokens = 16;

// One kernel launch: which kernel, its shape, its arguments (copied in, no allocation).
struct Launch {
    static constexpr size_t kMaxArgs = 824;  // (two GemvArgs and a count: StagedPair)
    const void* by_value = nullptr;
    const void* by_table = nullptr;
    dim3 grid, block;
    size_t smem = 0;  // dynamic shared memory, bytes
    size_t args_size = 0;
    // bytes the launch reads once and no launch after it in the step (a one-token GEMV's
    // weights, at most the device's window size): enqueue marks them streaming in L2 (an
    // access-policy window)
    const void* once = nullptr;
    size_t once_bytes = 0;
    alignas(16) unsigned char args[kMaxArgs];
};

// (its name, for the trace)
template <class K>
const char* kernel_name() {
    return __PRETTY_FUNCTION__;
}

template <class K>
Launch make_launch(dim3 grid, dim3 block, const typename K::Args& a, size_t smem = 0) {
    using A = typename K::Args;
    static_assert(sizeof(A) <= Launch::kMaxArgs && alignof(A) <= 16 && std::is_trivially_copyable_v<A>, "kernel arguments");
#ifdef ER_CUDA_TRACE
    static const bool traced = [] {  // (EDGERUNNER_CUDA_TRACE: K's blocks write to the trace buffer)
        const TraceSlot* buffer = trace_buffer();
        if (!buffer) return false;
        TraceSlot slot = *buffer;
        slot.kernel = trace_kernel(kernel_name<K>());
        return cudaMemcpyToSymbol(trace_slot<K>, &slot, sizeof slot) == cudaSuccess;
    }();
    (void)traced;
#endif
    Launch l;
    l.by_value = value_entry<K>();
    l.by_table = table_entry<K>();
    l.grid = grid;
    l.block = block;
    l.smem = smem;
    l.args_size = sizeof(A);
    std::memcpy(l.args, &a, sizeof(A));
    return l;
}

// The dynamic shared memory kernel K may be allowed: a block's opt-in limit (per_block) less the
// kernel's static shared memory (asking for more fails, and leaves the default 48 KiB).
template <class K>
size_t max_dynamic_smem(size_t per_block) {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, value_entry<K>()) != cudaSuccess) return per_block;
    return per_block - std::min(per_block, attr.sharedSizeBytes);
}

// Let kernel K use `bytes` of dynamic shared memory (past the default 48 KiB), both entry points,
// once per device (a function's attributes are the device's: every GPU a model runs on sets its
// own). Each kernel asks one size, whoever asks.
template <class K>
void allow_smem(size_t bytes) {
    static PerGpu<bool> allowed;
    allowed([&](int) {
        cudaFuncSetAttribute(value_entry<K>(), cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
        cudaFuncSetAttribute(table_entry<K>(), cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
        return true;
    });
}

// Enqueue `l` on `stream`: its arguments by value, or (table != null) the device copy of them
// at `table`. `overlap`: may start while the previous kernel drains (sm_90 and later).
void enqueue(const Launch& l, cudaStream_t stream, const void* table, bool overlap);

// Whether the device supports programmatic dependent launch (compute capability 9.0+) and the
// environment does not turn it off (EDGERUNNER_CUDA_OVERLAP=0, for measurements).
bool overlap_supported();

}  // namespace edgerunner::cuda
