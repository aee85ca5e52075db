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
//  6. softmax         float64: w = exp((l - l_max) / T), so the top token has w = 1 exactly;
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
//  - Greedy: one pass over the logits.
//  - top-k: one pass keeping a k-heap (k <= n/8) or nth_element over all ids; then sort k.
//  - No top-k: a max pass and an exp pass (Z, and the mass that min-p keeps). The walk needs
//    mass R out of available mass A (top-p: R = top_p * Z of A = Z; otherwise the draw:
//    R = u * S of A = S), so only tokens with w >= (A - R) / (2n) are collected: the others
//    together weigh less than (A - R) / 2. Those are sorted lazily, in doubling chunks
//    (nth_element, then sort of the chunk), only as far as the walk goes. If rounding ever
//    exhausts the collected set first, the walk is redone over every token with w > 0.
#include "edgerunner/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
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
    counts_.assign(penalties_on_ ? n : 0, 0);
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

    if (params_.temperature <= 0.0f) {  // greedy: one pass
        int32_t best = -1;
        float best_l = -std::numeric_limits<float>::infinity();
        for (int32_t i = 0; i < n; ++i) {
            const float v = l[i];
            if (v > best_l) {
                best_l = v;
                best = i;
            } else if (std::isnan(v)) {
                throw_nan(i);
            }
        }
        if (best < 0) throw_all_banned();
        return best;
    }

    const double u = uniform(params_.seed, step);
    if (params_.top_k > 0 && params_.top_k < n) return sample_top_k(l, static_cast<size_t>(params_.top_k), u);
    return sample_full(l, u);
}

// top-k is on: order_[0, k) becomes the k best ids, sorted; every later step works on those.
int32_t Sampler::sample_top_k(const float* l, size_t k, double u) {
    const size_t n = order_.size();
    const Better better{l};
    int32_t* ids = order_.data();
    if (k * 8 <= n) {  // one pass with a k-heap whose top is the worst kept id
        for (size_t i = 0; i < k; ++i) {
            if (std::isnan(l[i])) throw_nan(static_cast<int32_t>(i));
            ids[i] = static_cast<int32_t>(i);
        }
        std::make_heap(ids, ids + k, better);
        for (size_t i = k; i < n; ++i) {
            const float v = l[i];
            if (v > l[ids[0]]) {  // ids ascend, so an equal logit never displaces a kept id
                std::pop_heap(ids, ids + k, better);
                ids[k - 1] = static_cast<int32_t>(i);
                std::push_heap(ids, ids + k, better);
            } else if (std::isnan(v)) {
                throw_nan(static_cast<int32_t>(i));
            }
        }
    } else {
        for (size_t i = 0; i < n; ++i) {
            if (std::isnan(l[i])) throw_nan(static_cast<int32_t>(i));
            ids[i] = static_cast<int32_t>(i);
        }
        std::nth_element(ids, ids + k, ids + n, better);
    }
    std::sort(ids, ids + k, better);

    const double l_max = l[ids[0]];
    if (l_max == -std::numeric_limits<double>::infinity()) throw_all_banned();
    const double t = params_.temperature;
    double* w = probs_.data();  // indexed by position here
    double z = 0.0;
    for (size_t i = 0; i < k; ++i) {
        w[i] = l[ids[i]] == l_max ? 1.0 : std::exp((l[ids[i]] - l_max) / t);
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

// Collects into order_ the ids with w >= threshold and w > 0 (probs_ holds w by id); returns
// how many.
size_t Sampler::collect(double threshold) {
    const size_t n = probs_.size();
    const double* w = probs_.data();
    int32_t* ids = order_.data();
    size_t m = 0;
    for (size_t i = 0; i < n; ++i)
        if (w[i] >= threshold && w[i] > 0.0) ids[m++] = static_cast<int32_t>(i);
    return m;
}

// order_[0, sorted) holds the best `sorted` of the n candidates, in order; extends it to `want`.
void Sampler::extend_sorted(const float* l, size_t& sorted, size_t want, size_t n) {
    want = std::min(want, n);
    int32_t* ids = order_.data();
    const Better better{l};
    if (want < n) std::nth_element(ids + sorted, ids + want, ids + n, better);
    std::sort(ids + sorted, ids + want, better);
    sorted = want;
}

// No top-k: softmax over the whole vocabulary, then a lazily sorted walk (see the header comment).
int32_t Sampler::sample_full(const float* l, double u) {
    const size_t n = probs_.size();
    float l_max = -std::numeric_limits<float>::infinity();
    for (size_t i = 0; i < n; ++i) {
        if (l[i] > l_max) l_max = l[i];
        else if (std::isnan(l[i])) throw_nan(static_cast<int32_t>(i));
    }
    if (l_max == -std::numeric_limits<float>::infinity()) throw_all_banned();

    const double t = params_.temperature, min_w = params_.min_p, lm = l_max;
    double* w = probs_.data();  // indexed by token id here
    double z = 0.0, z_min_p = 0.0;
    for (size_t i = 0; i < n; ++i) {
        const double wi = l[i] == l_max ? 1.0 : std::exp((l[i] - lm) / t);
        w[i] = wi;
        z += wi;
        if (wi >= min_w) z_min_p += wi;
    }

    const bool top_p = params_.top_p < 1.0f;
    // Mass the walk must reach, out of the mass available to it.
    const double available = top_p ? z : z_min_p;
    const double need = top_p ? params_.top_p * z : u * z_min_p;
    double threshold = std::max(0.5 * (available - need) / static_cast<double>(n), min_w);
    for (;;) {
        const size_t m = collect(threshold);
        size_t sorted = 0, i = 0;
        double cum = 0.0;
        for (; i < m; ++i) {
            if (i == sorted) extend_sorted(l, sorted, std::max<size_t>(2 * sorted, 64), m);
            cum += w[order_[i]];
            if (top_p ? cum >= need : cum > need) break;
        }
        if (i == m && threshold > min_w) {  // rounding exhausted the collected set: take every token
            threshold = min_w;
            continue;
        }
        if (!top_p) return order_[std::min(i, m - 1)];
        // top-p: order_[0, kept) is the nucleus after min-p, already sorted; draw from it.
        const size_t kept = std::min(i + 1, m);
        double s = 0.0;
        for (size_t j = 0; j < kept; ++j) s += w[order_[j]];
        const double target = u * s;
        double c = 0.0;
        for (size_t j = 0; j < kept; ++j) {
            c += w[order_[j]];
            if (c > target) return order_[j];
        }
        return order_[kept - 1];
    }
}

}  // namespace edgerunner
