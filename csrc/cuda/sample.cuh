// Token sampling on the device at the end of a step: the CPU sampler's contract
// (csrc/core/sampler.cpp: temperature, top-k, top-p, min-p, the counter-based uniform, the
// inverse-CDF draw over tokens ordered by logit), for parameters without logit bias or
// penalties (those need the history on the host). Only the 4-byte token comes back.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "launch.cuh"

namespace edgerunner::cuda {

struct DeviceSampling {
    float temperature;  // <= 0: greedy
    int32_t top_k;      // 0: off
    float top_p;        // 1: off
    float min_p;        // 0: off
    uint64_t seed;
};

struct SampleArgs {
    const float* logits;           // n_vocab floats
    int32_t n_vocab;
    const DeviceSampling* params;  // device: the step block's (a replayed step reads new values)
    const uint64_t* step;          // device: the RNG counter
    double* scratch;               // n_vocab doubles
    unsigned long long* best;      // device, zero: the blocks' merged best (one word)
    unsigned* done;                // device, zero: the blocks that have merged theirs (both reset by the last)
    int32_t* out;                  // the drawn token (device memory, or pinned host memory: out_host)
    int32_t* next = nullptr;       // or null: also written here (the next chained step's input token)
    // with next: the next chained step's header, written here from this step's (its position one
    // on, the RNG counter one on, the same parameters), so the host copies no header in between
    const int64_t* pos0 = nullptr;
    int64_t* next_pos0 = nullptr;
    uint64_t* next_step = nullptr;
    DeviceSampling* next_params = nullptr;
    bool out_host = false;  // out is pinned host memory (fenced for the host to read after the step)
};
Launch sample(const SampleArgs& a);

}  // namespace edgerunner::cuda
