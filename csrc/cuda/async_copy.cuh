// Asynchronous global → shared copies (cp.async, sm_80+), shared by the kernels that stage raw
// weight blocks through shared memory (the one-token GEMV, the tensor-core GEMM); Hopper's bulk
// copies, and the L2 policies the streamed GEMV reads and writes with.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace edgerunner::cuda {

// A shared-memory pointer as the 32-bit address the copy instructions take.
__device__ __forceinline__ unsigned smem_address(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

#ifndef ER_CUDA_EMULATOR
__device__ __forceinline__ void copy16(void* smem, const void* global) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_address(smem)), "l"(global));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;"); }
// Until at most N of this thread's copy groups are pending (the older ones have landed).
template <int N>
__device__ __forceinline__ void wait_pending() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
#else  // (the CPU emulator, tests/cuda_emulator: a copy lands at once)
__device__ __forceinline__ void copy16(void* smem, const void* global) { std::memcpy(smem, global, 16); }
__device__ __forceinline__ void commit() {}
template <int N>
__device__ __forceinline__ void wait_pending() {}
#endif

// Bulk copies by the TMA unit (sm_90+): one lane asks for a whole chunk of a row in one
// instruction (cp.async.bulk: 16-byte aligned ends, a multiple of 16 bytes), and the chunk's
// mbarrier counts its bytes in; the warp then waits on that barrier's phase. Against cp.async,
// whose lanes each issue a 16-byte piece with its address arithmetic, the warp issues a few
// instructions a chunk (bench/NOTES.md, twenty-ninth CUDA session). ER_BULK_COPY says whether
// this device pass has them.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define ER_BULK_COPY 1
#endif
#if defined(ER_BULK_COPY)
// A barrier of one arrival (the lane that asks for the bytes); then fence_barrier_init.
__device__ __forceinline__ void barrier_init(uint64_t* bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_address(bar)) : "memory");
}
__device__ __forceinline__ void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// The lane's arrival for the barrier's current phase, which then also waits for `bytes` bytes.
__device__ __forceinline__ void barrier_expect(uint64_t* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes) : "memory");
}
// An L2 policy whose lines go first when L2 needs room: for weights streamed once a step, so that
// they do not push out what the step reads again.
__device__ __forceinline__ uint64_t evict_first_policy() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}
// [global, global + bytes) into shared memory, counted in by `bar`; the L2 lines it reads get
// `policy`'s eviction priority (createpolicy: evict_first_policy).
__device__ __forceinline__ void bulk_copy(void* smem, const void* global, unsigned bytes, uint64_t* bar, uint64_t policy) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
                     smem_address(smem)),
                 "l"(global), "r"(bytes), "r"(smem_address(bar)), "l"(policy)
                 : "memory");
}
// Until the barrier's phase of this parity has completed.
__device__ __forceinline__ void barrier_wait(uint64_t* bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(smem_address(bar)), "r"(parity)
                     : "memory");
    } while (!done);
}
#endif

// An L2 policy whose lines stay while others can go (sm_80+): for a streamed GEMV's outputs,
// written while its weights pass through L2, and read by the next kernel (the same buffers every
// step: gate·up's output, the logits, at most a few hundred KB). store_kept stores with it.
#ifndef ER_CUDA_EMULATOR
__device__ __forceinline__ uint64_t evict_last_policy() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
    return p;
}
__device__ __forceinline__ void store_kept(float* p, float v, uint64_t policy) {
    asm volatile("st.global.L2::cache_hint.f32 [%0], %1, %2;" ::"l"(p), "f"(v), "l"(policy) : "memory");
}
#else
__device__ __forceinline__ uint64_t evict_last_policy() { return 0; }
__device__ __forceinline__ void store_kept(float* p, float v, uint64_t) { *p = v; }
#endif

// A tagged value (GemvTagged, gemv.cuh): `v`'s bits beside `tag` in one 8-byte word, stored and
// loaded whole and relaxed at GPU scope (another SM's kernel reads it while this one still runs,
// through L2: no L1 copy in between). The store keeps `policy`'s priority, as store_kept.
#ifndef ER_CUDA_EMULATOR
__device__ __forceinline__ void store_tagged(uint64_t* p, uint32_t tag, float v, uint64_t policy) {
    const uint64_t word = static_cast<uint64_t>(tag) << 32 | __float_as_uint(v);
    asm volatile("st.relaxed.gpu.global.L2::cache_hint.b64 [%0], %1, %2;" ::"l"(p), "l"(word), "l"(policy) : "memory");
}
__device__ __forceinline__ uint64_t load_tagged(const uint64_t* p) {
    uint64_t word;
    asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(word) : "l"(p) : "memory");
    return word;
}
#else
__device__ __forceinline__ void store_tagged(uint64_t* p, uint32_t tag, float v, uint64_t) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    *p = static_cast<uint64_t>(tag) << 32 | bits;
}
__device__ __forceinline__ uint64_t load_tagged(const uint64_t* p) { return *p; }
#endif

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
