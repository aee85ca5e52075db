// A timeline of the kernels' blocks, for measurements: in a build with
// -C cmake.define.EDGERUNNER_CUDA_TRACE=ON (ER_CUDA_TRACE), EDGERUNNER_CUDA_TRACE=path records each block's
// start, the moment its wait for the input returned, its end (the device's %globaltimer, ns), its
// SM, and which kernel it was. It shows what a profiler that serialises kernels cannot: how the
// kernels of a step overlap under programmatic dependent launch. bench/trace_step.py runs a model
// with it and bench/trace_summary.py reads the file.
//
// Every entry point (launch.cuh) calls trace_begin / trace_end around the kernel's body,
// wait_inputs() notes when it returned, and a kernel may mark two points of its body (trace_mark).
// Other builds compile none of it: the kernels are those measured, register for register.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace edgerunner::cuda {

struct TraceRecord {
    uint64_t start, waited, end;  // ns (waited: 0 where the block never waited)
    uint64_t mark[2];             // trace_mark's, where the kernel sets them (else 0)
    uint32_t sm, block, blocks, kernel;  // block: linear index of `blocks`; kernel: trace_kernel's number
};

// Where kernel K's blocks write (a variable per kernel, set from the host by make_launch when
// tracing): null when off.
struct TraceSlot {
    TraceRecord* records;
    unsigned* count;
    unsigned capacity, kernel;
};
template <class K>
__device__ TraceSlot trace_slot;

// This block's times so far (thread 0's): start, waited, whether tracing is on, the two marks.
__device__ __forceinline__ uint64_t* trace_times() {
    __shared__ uint64_t times[5];
    return times;
}

__device__ __forceinline__ uint64_t trace_now() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void trace_begin(const TraceSlot& slot) {
#ifdef ER_CUDA_TRACE
    if (threadIdx.x == 0) {
        uint64_t* t = trace_times();
        t[2] = slot.records != nullptr;
        if (t[2]) t[0] = trace_now(), t[1] = t[3] = t[4] = 0;
    }
#endif
}

// (from wait_inputs)
__device__ __forceinline__ void trace_waited() {
#ifdef ER_CUDA_TRACE
    if (threadIdx.x == 0 && trace_times()[2]) trace_times()[1] = trace_now();
#endif
}

// Thread 0 reached point i (0 or 1) of the kernel's body: where a kernel marks the end of its
// input's staging and of its arithmetic, the summary splits the time after its wait in three.
__device__ __forceinline__ void trace_mark(int i) {
#ifdef ER_CUDA_TRACE
    if (threadIdx.x == 0 && trace_times()[2]) trace_times()[3 + i] = trace_now();
#else
    (void)i;
#endif
}

__device__ __forceinline__ void trace_end(const TraceSlot& slot) {
#ifdef ER_CUDA_TRACE
    if (!slot.records) return;
    __syncthreads();
    if (threadIdx.x != 0) return;
    const uint64_t end = trace_now();  // (before the atomic's round trip)
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    const unsigned i = atomicAdd(slot.count, 1u);
    if (i < slot.capacity)
        slot.records[i] = TraceRecord{trace_times()[0], trace_times()[1], end, {trace_times()[3], trace_times()[4]}, sm,
                                      blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z), gridDim.x * gridDim.y * gridDim.z,
                                      slot.kernel};
#endif
}

// Host: the process's trace buffer, allocated on first use where EDGERUNNER_CUDA_TRACE names a
// file in a trace build (else null; in other builds it says so on stderr, once); kernel K's
// number and name (trace_kernel), once per kernel.
const TraceSlot* trace_buffer();
unsigned trace_kernel(const char* name);
// Add the records so far to the file (CSV: kernel, sm, block, blocks, start, waited, end, mark0,
// mark1; the header where the file is new) and start again; nothing when off.
void trace_flush();

}  // namespace edgerunner::cuda
