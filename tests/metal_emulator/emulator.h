// The CPU emulator of the Metal kernels (tests/metal_emulator): the pieces the kernels' stand-in
// <metal_stdlib>, the scheduler (lanes.cpp), the kernel table (registry.cpp) and the step runner
// (runner.cpp) share. Plain C++: no Metal and no MSL macros here.
#pragma once

#include <cstdint>

namespace er_emulator {

// A kernel of metal/kernels.def called for one thread: its argument struct, the step block, the
// threadgroup's position in the grid and the thread's index in the threadgroup.
using Invoke = void (*)(const void* args, const void* step, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t tid);
Invoke find_kernel(const char* name);  // null when the manifest has no such kernel
void set_bool_constant(int index, bool value);
void set_uint_constant(int index, uint32_t value);

// Runs fn over groups[0] × groups[1] × groups[2] threadgroups of `threads` threads.
void run_grid(Invoke fn, const void* args, const void* step, const uint32_t groups[3], uint32_t threads);

// Synchronization for the kernels' SIMD-group and barrier functions (called from kernel code).
void threadgroup_barrier();
void simdgroup_barrier();
enum SimdOp { kSum, kMax, kMin, kXor, kBroadcast, kSumU, kMaxU, kMinU, kSumI };
uint64_t simd_exchange(uint64_t bits, int op, uint32_t arg);

}  // namespace er_emulator
