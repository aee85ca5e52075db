// Token sampling on the device at the end of a step: the CPU sampler's contract
// (csrc/core/sampler.cpp: temperature, top-k, top-p, min-p, the counter-based uniform, the
// inverse-CDF draw over tokens ordered by logit), for parameters without logit bias or
// penalties (those need the history on the host). Only the 4-byte token comes back.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace edgerunner::cuda {

struct DeviceSampling {
    float temperature;  // <= 0: greedy
    int32_t top_k;      // 0: off
    float top_p;        // 1: off
    float min_p;        // 0: off
    uint64_t seed;
};

// logits: n_vocab floats; p and step: read from device memory (the step block, so a recorded
// step replays with new values); scratch: n_vocab doubles; out: one int32. All device pointers.
void sample(const float* logits, int32_t n_vocab, const DeviceSampling* p, const uint64_t* step, double* scratch,
            int32_t* out, cudaStream_t stream);

}  // namespace edgerunner::cuda
