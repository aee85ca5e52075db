// Included by every .metal file: the shared layouts (quant blocks, argument structs), the
// function constants pipelines are specialized on, and threadgroup-wide reductions.
//
// Conventions every kernel follows (the host, the manifest check and the CPU emulator of the
// kernels rely on them):
//   - signature: (constant <args>& a [[buffer(ER_BUFFER_ARGS)]],
//                 constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION)
//   - threads per threadgroup: the kernel's ER_THREADS_* constant (kernel_args.h); 32-lane
//     simdgroups;
//   - `threadgroup` only declares arrays at kernel scope; helpers take them as template
//     parameters and pointers into them are `auto`;
//   - IEEE float arithmetic: the library is compiled without fast math (CMakeLists.txt), as the
//     CPU reference is.
#pragma once

#include <metal_stdlib>

#include "edgerunner/kernel_args.h"
#include "edgerunner/quant_blocks.h"

using namespace metal;

#ifndef ER_FUNCTION_CONSTANT  // the lint and the emulator define their own stand-ins
#define ER_FUNCTION_CONSTANT(type, name, index) constant type name [[function_constant(index)]]
#endif

ER_FUNCTION_CONSTANT(bool, kAccumulate, ER_FC_ACCUMULATE);
ER_FUNCTION_CONSTANT(bool, kHasBias, ER_FC_HAS_BIAS);
ER_FUNCTION_CONSTANT(bool, kNormIn, ER_FC_NORM_IN);
ER_FUNCTION_CONSTANT(uint, kGlu, ER_FC_GLU);
ER_FUNCTION_CONSTANT(uint, kKvType, ER_FC_KV_TYPE);
ER_FUNCTION_CONSTANT(bool, kNeox, ER_FC_NEOX);
ER_FUNCTION_CONSTANT(bool, kHeadNorm, ER_FC_HEAD_NORM);
ER_FUNCTION_CONSTANT(bool, kStoreKv, ER_FC_STORE_KV);

// The thread's place in the dispatch, the same four values for every kernel.
#define ER_THREAD_POSITION                                                              \
    uint3 tgid [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]], \
        uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]

#define ER_SIMD 32
#define ER_FLT_MAX 3.402823466e+38f

// The step's token ids follow the step block.
inline constant int32_t* step_tokens(constant er_step_block& step) {
    return reinterpret_cast<constant int32_t*>(&step + 1);
}

// The first token row an op computes: tail ops (final norm, LM head) only the rows whose logits
// are wanted.
inline uint first_row(constant er_step_block& step, uint tail) { return tail ? uint(step.first_row) : 0u; }

// Sum over a threadgroup of n_simdgroups simdgroups; every thread gets the total.
// partials: a threadgroup array of at least n_simdgroups floats.
template <typename Partials>
inline float threadgroup_sum(float v, Partials partials, uint n_simdgroups, uint sg, uint lane) {
    v = simd_sum(v);
    threadgroup_barrier(mem_flags::mem_threadgroup);  // the previous use of partials is over
    if (lane == 0) partials[sg] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float total = 0.0f;
    for (uint i = 0; i < n_simdgroups; ++i) total += partials[i];
    return total;
}

inline float silu(float g) { return g / (1.0f + exp(-g)); }
inline float gelu_tanh(float g) { return 0.5f * g * (1.0f + tanh(0.7978845608028654f * (g + 0.044715f * g * g * g))); }
