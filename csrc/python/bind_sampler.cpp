// Bindings for the CPU sampler: parameters as keyword arguments, logits as a float32 NumPy array.
// std::invalid_argument from the sampler becomes ValueError. The GIL stays held: a Sampler owns
// scratch and is not thread-safe.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "edgerunner/sampler.h"

namespace nb = nanobind;
using namespace nb::literals;
using edgerunner::Sampler;
using edgerunner::SamplingParams;

namespace {

using LogitsIn = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using HistoryIn = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

void check_logits(const Sampler& s, const LogitsIn& logits) {
    if (logits.shape(0) != static_cast<size_t>(s.n_vocab()))
        throw std::invalid_argument("logits has " + std::to_string(logits.shape(0)) +
                                    " entries, but this sampler's vocabulary has " + std::to_string(s.n_vocab()));
}

Sampler make_sampler(int32_t n_vocab, float temperature, int32_t top_k, float top_p, float min_p,
                     float repetition_penalty, float presence_penalty, float frequency_penalty,
                     int32_t penalty_last_n, const nb::dict& logit_bias, uint64_t seed) {
    SamplingParams p;
    p.temperature = temperature;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.repetition_penalty = repetition_penalty;
    p.presence_penalty = presence_penalty;
    p.frequency_penalty = frequency_penalty;
    p.penalty_last_n = penalty_last_n;
    p.seed = seed;
    for (auto [key, value] : logit_bias) {
        const int64_t id = nb::cast<int64_t>(key);
        if (id < 0 || id >= n_vocab)  // also catches ids that do not fit int32
            throw std::invalid_argument("logit_bias token id " + std::to_string(id) +
                                        " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
        p.logit_bias.emplace_back(static_cast<int32_t>(id), nb::cast<float>(value));
    }
    return Sampler(n_vocab, std::move(p));
}

}  // namespace

void bind_sampler(nb::module_& m) {
    nb::class_<Sampler>(m, "Sampler",
                        "CPU token sampler: logit bias, repetition/presence/frequency penalties, then greedy or "
                        "top-k / top-p / min-p sampling with a counter-based RNG over (seed, step).")
        .def("__init__",
             [](Sampler* self, int32_t n_vocab, float temperature, int32_t top_k, float top_p, float min_p,
                float repetition_penalty, float presence_penalty, float frequency_penalty, int32_t penalty_last_n,
                const nb::dict& logit_bias, uint64_t seed) {
                 new (self) Sampler(make_sampler(n_vocab, temperature, top_k, top_p, min_p, repetition_penalty,
                                                 presence_penalty, frequency_penalty, penalty_last_n, logit_bias,
                                                 seed));
             },
             "n_vocab"_a, "temperature"_a = 0.0f, "top_k"_a = 0, "top_p"_a = 1.0f, "min_p"_a = 0.0f,
             "repetition_penalty"_a = 1.0f, "presence_penalty"_a = 0.0f, "frequency_penalty"_a = 0.0f,
             "penalty_last_n"_a = 64, "logit_bias"_a = nb::dict(), "seed"_a = 0,
             "Validates the parameters; raises ValueError naming the bad one.")
        .def(
            "sample",
            [](Sampler& s, const LogitsIn& logits, const HistoryIn& history, uint64_t step) {
                check_logits(s, logits);
                return s.sample(logits.data(), history.data(), history.shape(0), step);
            },
            "logits"_a, "history"_a, "step"_a = 0)
        .def(
            "sample",
            [](Sampler& s, const LogitsIn& logits, const std::vector<int32_t>& history, uint64_t step) {
                check_logits(s, logits);
                return s.sample(logits.data(), history.data(), history.size(), step);
            },
            "logits"_a, "history"_a = std::vector<int32_t>(), "step"_a = 0,
            "Next token id from float32 logits of length n_vocab; `history` is every token so far (int32 "
            "array or list), `step` indexes the RNG. Raises ValueError for a wrong length, a NaN logit, a "
            "history id outside the vocabulary (when penalties are on) or when every token is banned.")
        .def_prop_ro("n_vocab", &Sampler::n_vocab)
        .def_static("uniform", &Sampler::uniform, "seed"_a, "step"_a,
                    "The draw's uniform number in [0, 1) for (seed, step): 24 bits of splitmix64.")
        .def_static("exp_neg", &Sampler::exp_neg, "d"_a,
                    "The softmax weight w = e^-d the sampler uses, for d = (l_max - l) / T >= 0.");
}
