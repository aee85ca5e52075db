// The scheduler the CPU emulators of the GPU kernels share (tests/metal_emulator,
// tests/cuda_emulator): every thread of a threadgroup (CUDA: block) runs as a coroutine, so
// barriers and SIMD-group (warp) collectives really synchronize. Plain C++.
#pragma once

#include <cstdint>

namespace er_emulator {

// A kernel called for one thread: its arguments, a second pointer the emulator passes through
// (Metal: the step block; CUDA: the kernel's entry), the threadgroup's position in the grid and
// the thread's index in the threadgroup.
using Invoke = void (*)(const void* args, const void* extra, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t tid);

// Runs fn over groups[0] × groups[1] × groups[2] threadgroups of `threads` threads, one
// threadgroup after another.
void run_grid(Invoke fn, const void* args, const void* extra, const uint32_t groups[3], uint32_t threads);

// Called each time the scheduler runs a thread, with its index in the threadgroup, the
// threadgroup's position, the grid's size in threadgroups and a threadgroup's size (null:
// nothing; the CUDA emulator keeps threadIdx, blockIdx, gridDim and blockDim there).
using SwitchHook = void (*)(uint32_t thread, const uint32_t group[3], const uint32_t groups[3], uint32_t threads);
void set_switch_hook(SwitchHook hook);

// Synchronization for the kernels' barriers and SIMD-group functions (called from kernel code).
void threadgroup_barrier();
void simdgroup_barrier();
// A collective over the live lanes of the caller's SIMD group (32 lanes), each giving `bits`:
// reductions (kSum … kSumI, over 32-bit values; kSumIn: unsigned, over the lanes in the mask
// arg only), a lane's value (kXor: lane ^ arg; kBroadcast:
// lane arg; kDown: lane + arg, or the caller's own past the group), and masks of lanes (kBallot:
// those whose bits are not zero; kMatchAny: those whose bits equal the caller's).
enum SimdOp { kSum, kMax, kMin, kXor, kBroadcast, kSumU, kMaxU, kMinU, kSumI, kDown, kBallot, kMatchAny, kSumIn };
uint64_t simd_exchange(uint64_t bits, int op, uint32_t arg);

}  // namespace er_emulator
