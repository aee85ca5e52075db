// Asynchronous global → shared copies (cp.async, sm_80+), shared by the kernels that stage raw
// weight blocks through shared memory (the one-token GEMV, the tensor-core GEMM).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace edgerunner::cuda {

__device__ __forceinline__ void copy16(void* smem, const void* global) {
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(global));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;"); }
// Until at most N of this thread's copy groups are pending (the older ones have landed).
template <int N>
__device__ __forceinline__ void wait_pending() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Copy [begin, begin + bytes) into dst as 16-byte pieces from the 16-byte boundary at or below
// begin (lanes `lane` of `lanes`); returns where begin landed.
__device__ __forceinline__ const uint8_t* stage_copy(uint8_t* dst, const uint8_t* begin, size_t bytes, int lane, int lanes) {
    const uintptr_t b = reinterpret_cast<uintptr_t>(begin);
    const uintptr_t lo = b & ~uintptr_t{15}, hi = (b + bytes + 15) & ~uintptr_t{15};
    for (uintptr_t off = 16 * static_cast<uintptr_t>(lane); off < hi - lo; off += 16 * static_cast<uintptr_t>(lanes))
        copy16(dst + off, reinterpret_cast<const void*>(lo + off));
    return dst + (b - lo);
}

}  // namespace edgerunner::cuda
