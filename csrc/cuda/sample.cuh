// Token sampling on the device at the end of a step: the CPU sampler's contract
// (csrc/core/sampler.cpp: logit bias, repetition / presence / frequency penalties over the last
// tokens, temperature, top-k, top-p, min-p, the counter-based uniform, the inverse-CDF draw over
// tokens ordered by logit). Only the 4-byte token comes back. Bias and penalties are a kernel of
// their own (penalize) that writes the adjusted logits for the sampler to read, from the token
// history the embedding keeps on the device (EmbedArgs::history) and the runner's bias table.
// A draw (a temperature) takes two more kernels that spread its search over the GPU (WideState,
// sample.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "edgerunner/sampler.h"
#include "launch.cuh"

namespace edgerunner::cuda {

struct DeviceSampling {
    float temperature = 0.0f;  // <= 0: greedy
    int32_t top_k = 0;         // 0: off
    float top_p = 1.0f;        // 1: off
    float min_p = 0.0f;        // 0: off
    uint64_t seed = 0;
    // for penalize: the penalties (penalty_last_n 0 where they change nothing: penalties_on) and
    // how many entries of the bias table apply
    float repetition_penalty = 1.0f;
    float presence_penalty = 0.0f;
    float frequency_penalty = 0.0f;
    int32_t penalty_last_n = 0;  // -1: every earlier token
    int32_t n_bias = 0;
};
// The device's copy of p, with n_bias entries in the bias table (merged_bias(p.logit_bias)).
DeviceSampling device_sampling(const SamplingParams& p, int32_t n_bias);
inline bool operator==(const DeviceSampling& a, const DeviceSampling& b) {
    return a.temperature == b.temperature && a.top_k == b.top_k && a.top_p == b.top_p && a.min_p == b.min_p && a.seed == b.seed &&
           a.repetition_penalty == b.repetition_penalty && a.presence_penalty == b.presence_penalty &&
           a.frequency_penalty == b.frequency_penalty && a.penalty_last_n == b.penalty_last_n && a.n_bias == b.n_bias;
}

// The logits after bias and penalties (the CPU contract's steps 1-3), out[i] for every token:
// the bias table's entries added, then each distinct token of the window (the penalty_last_n
// tokens up to and including the step's last, read from the history) penalized once with its
// count. Blocks of 1024 tokens (a logit a thread), each over the whole window and its range of the table.
struct PenaltyArgs {
    const float* logits;           // n_vocab floats
    float* out;                    // n_vocab floats (what the sampler then reads)
    int32_t n_vocab;
    const DeviceSampling* params;  // device: the step block's
    const int64_t* pos0;           // device: the step block's first position
    int64_t n_tokens;              // the step's tokens: its last is at *pos0 + n_tokens - 1
    const int32_t* history;        // device: the token at each position (written by the embedding)
    const int32_t* bias_tokens;    // device: the bias table, n_bias entries, tokens rising, one each
    const float* bias_values;
    int32_t* counts;               // device: n_vocab, zero (and left zero)
};
Launch penalize(const PenaltyArgs& a);

// The draw's device memory: zero at load, and each step leaves it zero. Histograms of the tokens by
// bucket (sample.cu's bucket_of_key, bucket_at: 16 bits; fine) and by its top 8 (coarse): with top-k, token counts (0);
// else fixed-point masses (sample.cu: softmax weights in units of 2^-46, coarser past 131072
// tokens; integers, so sums are the same bits in any order) of every token (0) and of those
// min-p keeps (1). Then what the sampler's three kernels pass on, and their counters.
struct WideState {
    unsigned long long fine[2][65536];
    unsigned long long coarse[2][256];
    // Sample → SampleMass, SampleWalk
    int32_t active;  // this step's draw is theirs
    float mx;        // the largest logit
    int32_t top;     // its lowest id
    // SampleMass → SampleWalk: the fine buckets the cuts fall in, the masses above them
    struct Cuts {
        int32_t cut_p;                 // top-p's (-1: top-p off)
        int32_t draw_hi, draw_lo;      // the draw's cut falls in one of [draw_lo, draw_hi] (-1: not found; with
                                       // top-k: from top-k's bucket up)
        unsigned long long need;       // top-p: the mass its prefix reaches
        unsigned long long all_above_p, kept_above_p, kept_above_d;
        unsigned long long kept_total;  // the mass the draw is over (without top-p)
    } cuts;
    unsigned done;                  // SampleMass's blocks finished
    unsigned long long walk;        // SampleWalk's candidates collected (low 32 bits) and blocks finished (high 32)
};
// Whether a step with p draws (a temperature) in the sampler's two more kernels: the runner then
// passes a WideState.
bool wide_draw(const SamplingParams& p);

struct SampleArgs {
    const float* logits;           // n_vocab floats
    int32_t n_vocab;
    const DeviceSampling* params;  // device: the step block's (a replayed step reads new values)
    const uint64_t* step;          // device: the RNG counter
    double* scratch;               // sample_scratch_words(n_vocab) 8-byte words
    unsigned long long* best;      // device, zero: the blocks' merged best (one word)
    unsigned* done;                // device, zero: the blocks that have merged theirs (both reset by the last)
    int32_t* out;                  // the drawn token, -1 where no logit is finite (device memory, or pinned host memory: out_host)
    int32_t* next = nullptr;       // or null: also written here (the next chained step's input token)
    // with next: the next chained step's header, written here from this step's (its position,
    // sequence number and RNG counter one on, the same parameters), so the host copies no header
    // in between
    const int64_t* pos0 = nullptr;
    int64_t* next_pos0 = nullptr;
    const uint64_t* seq = nullptr;
    uint64_t* next_seq = nullptr;
    uint64_t* next_step = nullptr;
    DeviceSampling* next_params = nullptr;
    bool out_host = false;  // out is pinned host memory (fenced for the host to read after the step)
    WideState* wide = nullptr;  // device: for every step whose parameters draw (a temperature); null: greedy only
};
// The sampler's launches: Sample (the greedy token), and with a.wide SampleMass and SampleWalk
// (the draw; they return at once where the step draws none).
struct SampleLaunches {
    Launch launch[3];
    int count = 0;
};
SampleLaunches sample(const SampleArgs& a);
// The scratch the sampler needs: SampleWalk's candidates (up to n_vocab order keys), then its
// one-block search's entries (two words a token), 16-byte aligned.
inline int64_t sample_scratch_words(int32_t n_vocab) { return 3 * static_cast<int64_t>(n_vocab) + 1; }

}  // namespace edgerunner::cuda
