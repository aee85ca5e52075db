// CPU token sampler: the reference every GPU sampler reproduces.
//
// Contract. l = the logits (float32, n_vocab); steps 1-3 work on a float32 copy.
//  1. logit bias      l[t] += bias[t], bias[t] the float sum of t's entries in their order
//                     (merged_bias); -inf bans t.
//  2. repetition      W = the last penalty_last_n tokens of history (-1: all, 0: none). Each
//                     distinct t in W once: l[t] = l[t] > 0 ? l[t] / p : l[t] * p.
//  3. presence/freq.  l[t] -= presence + frequency * c, c = count of t in W (> 0), in float32:
//                     the product rounded, then the sum, then the difference (no fused multiply-add).
//  4. temperature <= 0: argmax of l, ties to the lowest id. Done (top-k/p, min-p unused).
//  5. order           tokens by l descending, ties by id ascending. exp is monotone, so this is
//                     "prob descending, ties by id". top-k (0 < k < n_vocab): keep the first k.
//  6. softmax         float64: w = exp((l - l_max) / T) (Sampler::exp_neg: within 1 ulp), so the
//                     top token has w = 1 exactly;
//                     Z = sum of w over the tokens left by step 5. (Probabilities are w / Z.)
//  7. top-p (< 1)     keep the shortest prefix whose cumulative w >= top_p * Z (>= 1 token).
//  8. min-p (> 0)     drop tokens with w < min_p, i.e. prob < min_p * max_prob. Tokens with
//                     w == 0 (banned, or exp underflow) are dropped too: they cannot be drawn.
//  9. renormalize     S = sum of the kept w.
// 10. draw            u = uniform(seed, step); the token is the first kept one, in order, whose
//                     cumulative w exceeds u * S (the last kept one if rounding leaves none).
// RNG: splitmix64, counter-based. state = mix(seed) + (step + 1) * 0x9E3779B97F4A7C15,
// u = (mix(state) >> 40) * 2^-24, mix being splitmix64's output function. 24 bits, so u is
// exact in float32 and a float32 GPU sampler derives the same u from 64-bit integer math.
//
// Cost (n = n_vocab). No allocation in sample(): all scratch is sized in the constructor, and
// sort / nth_element / heap operations work in place (only error paths allocate, for messages).
//  - Bias and penalties: a copy of the logits plus O(|bias| + |W|); no copy when both are off.
//  - Greedy: the max pass (vectorized, as every path's), then a search for the first block of 64
//    holding the max.
//  - top-k: k <= 128, a pass offering tokens to a k-heap, skipping whole blocks of 64 with none
//    above the kept worst; larger k, a histogram of the distance below the max, nth_element over
//    the tokens of its buckets that reach k. Then sort k (sample_top_k).
//  - No top-k: the max pass, then an exp pass (vectorized) that puts each token in a bucket of
//    its distance below the largest logit, d = (l_max - l) / T (up to 8192 buckets over d < 40,
//    the rest in the last), summing each bucket's w (every token's, and min-p's kept ones').
//    Equal logits share a bucket and higher logits never come in a later one, so the walks of
//    steps 7 and 10 step over whole buckets by their sums and sort (by step 5's order) only the
//    bucket where each ends: top-p's end, then the draw. Sums are float64 as the contract's,
//    summed bucket by bucket rather than token by token, so a draw can differ from a strictly
//    sequential sum only where u * S falls within a few float64 roundings of a token's edge.
//    Was: the tokens sorted as far as each walk went (8-16 ms at 128k tokens, 2-core VM; now
//    ~1 ms, bench/NOTES.md).
#include "edgerunner/sampler.h"
#include "edgerunner/half.h"
#include "edgerunner/softmax_weight.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace edgerunner {

namespace {

uint64_t splitmix64_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Candidate order: higher logit first, ties by lower id.
struct Better {
    const float* l;
    bool operator()(int32_t a, int32_t b) const { return l[a] > l[b] || (l[a] == l[b] && a < b); }
};

[[noreturn]] void throw_nan(int32_t t) {
    throw std::invalid_argument("logit of token " + std::to_string(t) +
                                " is NaN (after bias and penalties); the model output is broken");
}

[[noreturn]] void throw_all_banned() {
    throw std::invalid_argument("every token has logit -inf after bias and penalties: nothing to sample");
}

// The loops the compiler vectorizes (the file is built with -fno-trapping-math, without which
// GCC turns their selects into branches) get an AVX2 clone where the CPU has it, picked at load
// (an ifunc: glibc's; elsewhere, musl for one, the baseline's vectors alone). Every clone gives
// the same bits: the same IEEE operations, none fused (-ffp-contract=off).
#if defined(__x86_64__) && defined(__ELF__) && defined(__GLIBC__) && (defined(__GNUC__) || defined(__clang__))
#define ER_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define ER_VECTOR_CLONES
#endif

// The contract's e^-d (edgerunner/softmax_weight.h, shared with the CUDA sampler).
using softmax::weight;

// An integer that orders like the float (negatives' magnitude bits flipped), for maxima the
// compiler vectorizes: a float maximum is not a reduction it may reorder, an integer one is.
inline int32_t order_key(float v) {
    const int32_t b = static_cast<int32_t>(fp32_to_bits(v));
    return b ^ ((b >> 31) & 0x7fffffff);
}

// The largest logit, and whether there was a NaN (then the largest is meaningless).
ER_VECTOR_CLONES float max_logit(const float* l, size_t n, bool* nan) {
    int32_t best = std::numeric_limits<int32_t>::min();
    int32_t any = 0;
    for (size_t i = 0; i < n; ++i) {
        best = std::max(best, order_key(l[i]));
        any |= l[i] != l[i];
    }
    *nan = any != 0;
    return fp32_from_bits(static_cast<uint32_t>(best ^ ((best >> 31) & 0x7fffffff)));
}

// The first block of kBlock logits from l[i] (i a multiple of kBlock) with one above t (perhaps
// only equal to it, as +0 to -0), or the last whole block's end. No NaN: max_logit looked.
constexpr size_t kBlock = 64;
ER_VECTOR_CLONES size_t next_block_above(const float* l, size_t i, size_t n, float t) {
    const int32_t above = order_key(t);
    for (; i + kBlock <= n; i += kBlock) {
        int32_t best = std::numeric_limits<int32_t>::min();
        for (size_t j = 0; j < kBlock; ++j) best = std::max(best, order_key(l[i + j]));
        if (best > above) break;
    }
    return i;
}

// The no-top-k path's exp pass: w[i] = e^-d and of[i] = the bucket of d (at per_b buckets a unit,
// the rest in bucket `last`), for d = (l_max - l[i]) / T.
ER_VECTOR_CLONES void exp_pass(const float* l, size_t n, double l_max, double t, double per_b, int32_t last,
                               double* w, uint16_t* of) {
    for (size_t i = 0; i < n; ++i) {
        const double d = l[i] == l_max ? 0.0 : (l_max - l[i]) / t;  // (0, not NaN, where l_max is +inf)
        w[i] = weight(d);
        of[i] = static_cast<uint16_t>(static_cast<int32_t>(std::min(d * per_b, static_cast<double>(last))));
    }
}

// The top-k selection's key of each token: the top 12 bits of its distance below the largest
// logit, d = l_max - l[i] (float32, >= 0, so the bits order like d).
ER_VECTOR_CLONES void distance_keys(const float* l, size_t n, float l_max, uint16_t* key) {
    for (size_t i = 0; i < n; ++i) {
        const float d = l[i] == l_max ? 0.0f : l_max - l[i];  // (0, not NaN, where l_max is +inf)
        key[i] = static_cast<uint16_t>(fp32_to_bits(d) >> 19);
    }
}

std::string num(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

}  // namespace

bool penalties_on(const SamplingParams& p) {
    return p.penalty_last_n != 0 && (p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f);
}

std::vector<std::pair<int32_t, float>> merged_bias(const std::vector<std::pair<int32_t, float>>& logit_bias) {
    std::vector<std::pair<int32_t, float>> m(logit_bias);
    std::stable_sort(m.begin(), m.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    size_t n = 0;
    for (size_t i = 0; i < m.size(); ++i) {
        if (n > 0 && m[n - 1].first == m[i].first) m[n - 1].second += m[i].second;
        else m[n++] = m[i];
    }
    m.resize(n);
    return m;
}

double Sampler::exp_neg(double d) { return weight(d); }

float Sampler::uniform(uint64_t seed, uint64_t step) {
    const uint64_t state = splitmix64_mix(seed) + (step + 1) * 0x9E3779B97F4A7C15ull;
    return static_cast<float>(splitmix64_mix(state) >> 40) * 0x1.0p-24f;
}

Sampler::Sampler(int32_t n_vocab, SamplingParams params) : n_vocab_(n_vocab), params_(std::move(params)) {
    const SamplingParams& p = params_;
    if (n_vocab <= 0) throw std::invalid_argument("n_vocab must be > 0, got " + std::to_string(n_vocab));
    if (!(p.temperature >= 0.0f) || std::isinf(p.temperature))
        throw std::invalid_argument("temperature must be finite and >= 0 (0 = greedy), got " + num(p.temperature));
    if (p.top_k < 0) throw std::invalid_argument("top_k must be >= 0 (0 = off), got " + std::to_string(p.top_k));
    if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
        throw std::invalid_argument("top_p must be in (0, 1] (1 = off), got " + num(p.top_p));
    if (!(p.min_p >= 0.0f && p.min_p <= 1.0f))
        throw std::invalid_argument("min_p must be in [0, 1] (0 = off), got " + num(p.min_p));
    if (!(p.repetition_penalty > 0.0f) || std::isinf(p.repetition_penalty))
        throw std::invalid_argument("repetition_penalty must be finite and > 0 (1 = off), got " +
                                    num(p.repetition_penalty));
    if (!std::isfinite(p.presence_penalty))
        throw std::invalid_argument("presence_penalty must be finite, got " + num(p.presence_penalty));
    if (!std::isfinite(p.frequency_penalty))
        throw std::invalid_argument("frequency_penalty must be finite, got " + num(p.frequency_penalty));
    if (p.penalty_last_n < -1)
        throw std::invalid_argument("penalty_last_n must be >= -1 (-1 = whole history, 0 = off), got " +
                                    std::to_string(p.penalty_last_n));
    for (const auto& [t, b] : p.logit_bias) {
        if (t < 0 || t >= n_vocab)
            throw std::invalid_argument("logit_bias token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                                        std::to_string(n_vocab) + ")");
        if (std::isnan(b)) throw std::invalid_argument("logit_bias for token " + std::to_string(t) + " is NaN");
    }
    penalties_on_ = penalties_on(p);
    bias_ = merged_bias(p.logit_bias);
    const size_t n = static_cast<size_t>(n_vocab);
    work_.resize(n);
    order_.resize(n);
    probs_.resize(n);
    bucket_.resize(n);
    const size_t n_buckets = std::clamp<size_t>(n / 16, 64, kMaxBuckets);
    all_.resize(n_buckets);
    kept_.resize(n_buckets);
    counts_.assign(penalties_on_ ? n : 0, 0);
    top_k_count_.assign(static_cast<size_t>(p.top_k) > kHeapTopK ? kTopKKeys : 0, 0u);
}

const float* Sampler::apply_bias_and_penalties(const float* logits, const int32_t* history, size_t n_history) {
    const SamplingParams& p = params_;
    size_t n_window = 0;
    if (penalties_on_)
        n_window = p.penalty_last_n < 0 ? n_history : std::min(n_history, static_cast<size_t>(p.penalty_last_n));
    if (bias_.empty() && n_window == 0) return logits;

    const int32_t* window = history + (n_history - n_window);
    for (size_t i = 0; i < n_window; ++i)  // validate first: counts_ must stay all-zero on error
        if (window[i] < 0 || window[i] >= n_vocab_)
            throw std::invalid_argument("history token " + std::to_string(window[i]) + " (position " +
                                        std::to_string(n_history - n_window + i) + ") is outside the vocabulary [0, " +
                                        std::to_string(n_vocab_) + ")");

    float* l = work_.data();
    std::memcpy(l, logits, work_.size() * sizeof(float));
    for (const auto& [t, b] : bias_) l[t] += b;
    for (size_t i = 0; i < n_window; ++i) ++counts_[window[i]];
    for (size_t i = 0; i < n_window; ++i) {
        const int32_t t = window[i];
        const int32_t c = counts_[t];
        if (c == 0) continue;  // already penalized: each distinct token once
        counts_[t] = 0;
        float v = l[t];
        v = v > 0.0f ? v / p.repetition_penalty : v * p.repetition_penalty;
        v -= p.presence_penalty + p.frequency_penalty * static_cast<float>(c);  // (-ffp-contract=off)
        l[t] = v;
    }
    return l;
}

int32_t Sampler::sample(const float* logits, const int32_t* history, size_t n_history, uint64_t step) {
    const float* l = apply_bias_and_penalties(logits, history, n_history);
    const int32_t n = n_vocab_;

    if (params_.temperature <= 0.0f) {  // greedy: the first token with the largest logit
        const float l_max = checked_max(l);
        const float below = std::nextafter(l_max, -std::numeric_limits<float>::infinity());
        size_t best = next_block_above(l, 0, static_cast<size_t>(n), below);  // the first block holding it
        while (l[best] != l_max) ++best;
        return static_cast<int32_t>(best);
    }

    const double u = uniform(params_.seed, step);
    if (params_.top_k > 0 && params_.top_k < n) return sample_top_k(l, static_cast<size_t>(params_.top_k), u);
    return sample_full(l, u);
}

// The largest logit; throws for a NaN (naming the first) or where every logit is -inf.
float Sampler::checked_max(const float* l) const {
    const size_t n = static_cast<size_t>(n_vocab_);
    bool nan;
    const float l_max = max_logit(l, n, &nan);
    if (nan) throw_nan(static_cast<int32_t>(std::find_if(l, l + n, [](float v) { return std::isnan(v); }) - l));
    if (l_max == -std::numeric_limits<float>::infinity()) throw_all_banned();
    return l_max;
}

// top-k is on: order_[0, k) becomes the k best ids, sorted; every later step works on those.
//  - k <= 128: one pass offering each token to a k-heap whose top is the worst kept id, but for
//    blocks of 64 none of which is above that worst (their maximum, vectorized: most blocks).
//  - Larger k: a histogram of each token's distance below the largest logit, d = l_max - l in
//    float32 (rounding is monotone: a higher logit never gets a larger d), in buckets of d's top
//    bits (16 a binade; the banned, d = +inf, in the last). The buckets up to the one where the
//    count reaches k hold the k best; only their tokens are gathered, for nth_element.
int32_t Sampler::sample_top_k(const float* l, size_t k, double u) {
    const size_t n = order_.size();
    const float top = checked_max(l);
    const Better better{l};
    int32_t* ids = order_.data();
    if (k <= kHeapTopK) {
        for (size_t i = 0; i < k; ++i) ids[i] = static_cast<int32_t>(i);
        std::make_heap(ids, ids + k, better);
        float worst = l[ids[0]];
        const auto offer = [&](size_t i) {
            if (l[i] > worst) {  // ids ascend, so an equal logit never displaces a kept id
                std::pop_heap(ids, ids + k, better);
                ids[k - 1] = static_cast<int32_t>(i);
                std::push_heap(ids, ids + k, better);
                worst = l[ids[0]];
            }
        };
        size_t i = k;
        for (; i < n && i % kBlock != 0; ++i) offer(i);
        while ((i = next_block_above(l, i, n, worst)) + kBlock <= n)
            for (const size_t end = i + kBlock; i < end; ++i) offer(i);
        for (; i < n; ++i) offer(i);
    } else {
        uint16_t* key = bucket_.data();
        distance_keys(l, n, top, key);
        uint32_t* count = top_k_count_.data();
        std::fill(top_k_count_.begin(), top_k_count_.end(), 0u);
        for (size_t i = 0; i < n; ++i) ++count[key[i]];
        uint32_t last = 0;
        for (size_t reached = count[0]; reached < k; reached += count[++last]) {
        }
        size_t gathered = 0;
        for (size_t i = 0; i < n; ++i) ids[gathered] = static_cast<int32_t>(i), gathered += key[i] <= last;
        std::nth_element(ids, ids + k, ids + gathered, better);
    }
    std::sort(ids, ids + k, better);

    const double l_max = top;
    const double t = params_.temperature;
    double* w = probs_.data();  // indexed by position here
    double z = 0.0;
    for (size_t i = 0; i < k; ++i) {
        w[i] = weight(l[ids[i]] == l_max ? 0.0 : (l_max - l[ids[i]]) / t);
        z += w[i];
    }
    size_t kept = k;
    if (params_.top_p < 1.0f) {
        const double target = params_.top_p * z;
        double cum = 0.0;
        for (size_t i = 0; i < k; ++i) {
            cum += w[i];
            if (cum >= target) {
                kept = i + 1;
                break;
            }
        }
    }
    const double min_w = params_.min_p;
    size_t m = 0;  // w is non-increasing, so min-p and w == 0 cut a suffix
    double s = 0.0;
    while (m < kept && w[m] >= min_w && w[m] > 0.0) s += w[m++];
    const double target = u * s;
    double cum = 0.0;
    for (size_t i = 0; i < m; ++i) {
        cum += w[i];
        if (cum > target) return ids[i];
    }
    return ids[m - 1];
}

// The tokens of bucket b, sorted into the contract's order, in order_[0, count) (kept from the
// last call where it was the same bucket).
size_t Sampler::sorted_bucket(const float* l, int32_t b) {
    if (b == sorted_bucket_) return sorted_count_;
    const size_t n = bucket_.size();
    const uint16_t* of = bucket_.data();
    int32_t* ids = order_.data();
    size_t m = 0;
    for (size_t i = 0; i < n; ++i) ids[m] = static_cast<int32_t>(i), m += of[i] == b;
    std::sort(ids, ids + m, Better{l});
    sorted_bucket_ = b;
    return sorted_count_ = m;
}

// The walk over the tokens in the contract's order, adding value(id) to a running total from 0
// until pass(total) holds, up to position `end` of bucket `last` (the whole bucket where end is
// SIZE_MAX). Whole buckets are stepped over by their sums (sum[b]: value over the bucket's tokens)
// where passing is not within them; only the bucket where it is gets sorted and walked token by
// token. The place of the token it passes at, or bucket -1 where rounding left it short.
template <typename Value, typename Pass>
Sampler::Place Sampler::walk(const float* l, const double* sum, int32_t last, size_t end, Value value, Pass pass) {
    double cum = 0.0;
    for (int32_t b = 0; b <= last; ++b) {
        if (sum[b] == 0.0) continue;
        const bool part = b == last && end != SIZE_MAX;  // (a prefix of the bucket: its mass does not tell)
        if (!part && !pass(cum + sum[b])) {
            cum += sum[b];
            continue;
        }
        const size_t m = std::min(sorted_bucket(l, b), part ? end + 1 : SIZE_MAX);
        for (size_t i = 0; i < m; ++i)
            if (pass(cum += value(order_[i]))) return Place{b, i};
    }
    return Place{-1, 0};
}

// No top-k: softmax over the whole vocabulary into buckets of the distance below the largest
// logit, then walks that sort only the buckets where they end (see the header comment).
int32_t Sampler::sample_full(const float* l, double u) {
    const size_t n = probs_.size();
    const float l_max = checked_max(l);
    const double t = params_.temperature, min_w = params_.min_p;
    const int32_t n_buckets = static_cast<int32_t>(all_.size());
    double* w = probs_.data();  // indexed by token id here
    uint16_t* of = bucket_.data();
    // (l - l_max) / T is -d, bit for bit, and weight(0) is 1: the top token's w is 1
    exp_pass(l, n, l_max, t, n_buckets / kBucketRange, n_buckets - 1, w, of);
    std::fill(all_.begin(), all_.end(), 0.0);
    if (min_w > 0.0) {
        std::fill(kept_.begin(), kept_.end(), 0.0);
        for (size_t i = 0; i < n; ++i) {
            all_[of[i]] += w[i];
            if (w[i] >= min_w) kept_[of[i]] += w[i];
        }
    } else {
        for (size_t i = 0; i < n; ++i) all_[of[i]] += w[i];
    }
    const double* kept_sum = min_w > 0.0 ? kept_.data() : all_.data();  // (no min-p: w == 0 adds nothing)
    sorted_bucket_ = -1;
    const auto all = [&](int32_t id) { return w[id]; };
    const auto kept = [&](int32_t id) { return w[id] >= min_w && w[id] > 0.0 ? w[id] : 0.0; };

    // top-p: the nucleus ends at the first token whose cumulative w reaches top_p · Z
    int32_t last = n_buckets - 1;
    size_t end = SIZE_MAX;
    double s = 0.0;  // the kept mass of the nucleus (S)
    if (params_.top_p < 1.0f) {
        double z = 0.0;
        for (double m : all_) z += m;
        const double need = params_.top_p * z;
        const Place e = walk(l, all_.data(), n_buckets - 1, SIZE_MAX, all, [&](double c) { return c >= need; });
        if (e.bucket >= 0) last = e.bucket, end = e.pos;  // (else rounding: every token)
        for (int32_t b = 0; b < last; ++b) s += kept_sum[b];
        if (end == SIZE_MAX) {
            s += kept_sum[last];
        } else {
            sorted_bucket(l, last);  // (the walk's last: order_ holds it)
            for (size_t i = 0; i <= end; ++i) s += kept(order_[i]);
        }
    } else {
        for (int32_t b = 0; b < n_buckets; ++b) s += kept_sum[b];
    }
    // the draw: the first kept token of the nucleus whose cumulative w exceeds u · S
    const double target = u * s;
    const Place d = walk(l, kept_sum, last, end, kept, [&](double c) { return c > target; });
    if (d.bucket >= 0) return order_[d.pos];
    // rounding left none: the nucleus's last kept token (kept tokens are a prefix of the order)
    int32_t b = last;
    while (b > 0 && kept_sum[b] == 0.0) --b;
    const size_t m = std::min(sorted_bucket(l, b), b == last && end != SIZE_MAX ? end + 1 : SIZE_MAX);
    size_t i = 0;
    while (i + 1 < m && kept(order_[i + 1]) > 0.0) ++i;
    return order_[i];
}

}  // namespace edgerunner
