// CPU token sampler. The contract (transform order, RNG, draw) is documented at the top of
// csrc/core/sampler.cpp; GPU samplers are to reproduce it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace edgerunner {

struct SamplingParams {
    float temperature = 0.0f;          // 0: greedy (argmax after bias and penalties)
    int32_t top_k = 0;                 // 0: off
    float top_p = 1.0f;                // 1: off
    float min_p = 0.0f;                // 0: off
    float repetition_penalty = 1.0f;   // 1: off
    float presence_penalty = 0.0f;
    float frequency_penalty = 0.0f;
    int32_t penalty_last_n = 64;       // how many recent tokens the penalties look at; -1: all
    std::vector<std::pair<int32_t, float>> logit_bias;  // entries for one token add up
    uint64_t seed = 0;
};

// Whether the penalties change anything (a window and a factor or term that is not neutral).
bool penalties_on(const SamplingParams& p);
// logit_bias as the sampler adds it: one entry per token, tokens rising, each token's bias the
// float sum of its entries in their order (then added to its logit once). GPU samplers read this.
std::vector<std::pair<int32_t, float>> merged_bias(const std::vector<std::pair<int32_t, float>>& logit_bias);

// Not thread-safe: one Sampler per generation stream (it owns per-call scratch).
class Sampler {
public:
    // Validates params; throws std::invalid_argument naming the bad field.
    Sampler(int32_t n_vocab, SamplingParams params);
    // Picks the next token from raw logits; `history` is every token so far (prompt included).
    // `step` indexes the counter-based RNG, so the same (seed, step, logits) gives the same token.
    // Never allocates; throws std::invalid_argument for a NaN logit, a history token outside the
    // vocabulary (only looked at when penalties are on) or when every token is banned.
    int32_t sample(const float* logits, const int32_t* history, size_t n_history, uint64_t step);
    const SamplingParams& params() const { return params_; }
    int32_t n_vocab() const { return n_vocab_; }

    // The draw's uniform number in [0, 1): 24 bits of splitmix64 over (seed, step).
    static float uniform(uint64_t seed, uint64_t step);
    // The contract's softmax weight w = e^-d, d = (l_max - l) / T >= 0 (+inf gives 0; 0 gives 1).
    static double exp_neg(double d);

private:
    const float* apply_bias_and_penalties(const float* logits, const int32_t* history, size_t n_history);
    float checked_max(const float* l) const;
    int32_t sample_top_k(const float* l, size_t k, double u);
    int32_t sample_full(const float* l, double u);
    // The no-top-k path's walks (sampler.cpp): a token's place in the contract's order, as its
    // bucket and its position among that bucket's tokens sorted.
    struct Place {
        int32_t bucket;
        size_t pos;
    };
    static constexpr size_t kMaxBuckets = 8192;  // buckets of d = (l_max - l) / T, over [0, kBucketRange)
    static constexpr double kBucketRange = 40.0;  // (past it, the last bucket: e^-40 ≈ 4e-18 a token)
    size_t sorted_bucket(const float* l, int32_t b);
    template <typename Value, typename Pass>
    Place walk(const float* l, const double* sum, int32_t last, size_t end, Value value, Pass pass);

    int32_t n_vocab_;
    SamplingParams params_;
    bool penalties_on_;
    std::vector<std::pair<int32_t, float>> bias_;  // merged_bias(params_.logit_bias)
    // Scratch sized at construction: no allocation per token.
    std::vector<float> work_;      // logits after bias and penalties
    std::vector<int32_t> order_;   // candidate token ids, best first once sorted
    std::vector<double> probs_;    // unnormalized weights exp((l - l_max) / T)
    std::vector<uint16_t> bucket_;  // no top-k: each token's bucket of d = (l_max - l) / T
    std::vector<double> all_, kept_;  // the buckets' w summed: every token's, and min-p's kept ones'
    int32_t sorted_bucket_ = -1;    // the bucket whose tokens order_ holds sorted (-1: none)
    size_t sorted_count_ = 0;
    static constexpr size_t kHeapTopK = 128;   // top-k up to this: a k-heap; larger: by histogram
    static constexpr size_t kTopKKeys = 4096;  // the histogram's keys: d = l_max - l's top 12 bits
    std::vector<uint32_t> top_k_count_;        // the tokens counted by key (top-k > kHeapTopK)
    std::vector<int32_t> counts_;  // per-token counts over the penalty window; all zero between calls
};

}  // namespace edgerunner
