// cuda_emulator: runs csrc/cuda kernels on the CPU, for the tests on machines without a GPU
// (tests/test_cuda_emulated.py compares what it prints and writes with the CPU backend and NumPy).
// The kernel files are compiled as C++ against this folder's <cuda_runtime.h>; the Launch each
// host function of the backend builds (its grid, its block, its argument bytes) runs here on the
// coroutine scheduler (tests/lanes), so what runs is the backend's own launch as well as its body.
// Files are raw little-endian arrays.
//
//   cuda_emulator sample LOGITS_FILE [--temperature T] [--top-k K] [--top-p P] [--min-p M] [--seed S] [--step S]
//       [--history FILE] [--repetition-penalty R] [--presence-penalty P] [--frequency-penalty F]
//       [--penalty-last-n N] [--bias T:B,...] [--penalized OUT]
//       the device sampler (sample.cu) over n_vocab float32 logits, after the penalize kernel where
//       bias or penalties are on: prints the token. The history (int32) is the tokens at positions
//       0 … H-1, the step's token last; --penalized writes the logits penalize made.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../csrc/cuda/sample.cuh"
#include "lanes.h"

using namespace edgerunner;

namespace {

template <typename T>
std::vector<T> read_array(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot read " + path);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(f)), {});
    std::vector<T> v(bytes.size() / sizeof(T));
    std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
    return v;
}

void write_file(const std::string& path, const void* data, size_t bytes) {
    std::ofstream f(path, std::ios::binary);
    f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
    if (!f) throw std::runtime_error("cannot write " + path);
}

// A thread of a launch: its kernel's entry (by_table<K>, which reads the Args from a pointer).
void invoke(const void* args, const void* entry, uint32_t, uint32_t, uint32_t, uint32_t) {
    reinterpret_cast<void (*)(const void*)>(const_cast<void*>(entry))(args);
}

void run(const cuda::Launch& l) {
    if (l.block.y != 1 || l.block.z != 1) throw std::logic_error("the emulator runs one-dimensional blocks");
    const uint32_t groups[3] = {l.grid.x, l.grid.y, l.grid.z};
    er_emulator::run_grid(invoke, l.args, l.by_table, groups, l.block.x);
}

std::vector<std::pair<int32_t, float>> parse_bias(const std::string& s) {
    std::vector<std::pair<int32_t, float>> out;
    size_t at = 0;
    while (at < s.size()) {
        size_t end = s.find(',', at);
        if (end == std::string::npos) end = s.size();
        const std::string item = s.substr(at, end - at);
        const size_t colon = item.find(':');
        if (colon == std::string::npos) throw std::invalid_argument("--bias takes TOKEN:BIAS,..., got " + item);
        out.emplace_back(std::stoi(item.substr(0, colon)), std::strtof(item.c_str() + colon + 1, nullptr));
        at = end + 1;
    }
    return out;
}

int sample(const std::string& logits_path, const std::map<std::string, std::string>& o) {
    auto get = [&](const char* k, const char* fallback) {
        auto it = o.find(k);
        return it == o.end() ? std::string(fallback) : it->second;
    };
    std::vector<float> logits = read_array<float>(logits_path);
    const int32_t n = static_cast<int32_t>(logits.size());
    SamplingParams p;
    p.temperature = std::stof(get("temperature", "0"));
    p.top_k = std::stoi(get("top-k", "0"));
    p.top_p = std::stof(get("top-p", "1"));
    p.min_p = std::stof(get("min-p", "0"));
    p.seed = std::stoull(get("seed", "0"));
    p.repetition_penalty = std::stof(get("repetition-penalty", "1"));
    p.presence_penalty = std::stof(get("presence-penalty", "0"));
    p.frequency_penalty = std::stof(get("frequency-penalty", "0"));
    p.penalty_last_n = std::stoi(get("penalty-last-n", "64"));
    p.logit_bias = parse_bias(get("bias", ""));
    Sampler check(n, p);  // (the parameters' checks)
    std::vector<int32_t> history = o.count("history") ? read_array<int32_t>(o.at("history")) : std::vector<int32_t>{0};
    const std::vector<std::pair<int32_t, float>> bias = merged_bias(p.logit_bias);
    std::vector<int32_t> bias_tokens;
    std::vector<float> bias_values;
    for (const auto& [t, b] : bias) bias_tokens.push_back(t), bias_values.push_back(b);

    // device memory is host memory here; the step block's header as the runner writes it
    struct Header {
        int64_t pos0;
        uint64_t step;
        cuda::DeviceSampling sampling;
        int32_t sampled;
    } h{static_cast<int64_t>(history.size()) - 1, std::stoull(get("step", "0")),
        cuda::device_sampling(p, static_cast<int32_t>(bias.size())), -1};
    std::vector<float> penalized(static_cast<size_t>(n), std::nanf(""));
    std::vector<int32_t> counts(static_cast<size_t>(n), 0);
    std::vector<double> scratch(static_cast<size_t>(n));
    unsigned long long best[2] = {0, 0};
    const float* l = logits.data();
    if (!bias.empty() || penalties_on(p)) {
        run(cuda::penalize(cuda::PenaltyArgs{l, penalized.data(), n, &h.sampling, &h.pos0, 1, history.data(), bias_tokens.data(),
                                             bias_values.data(), counts.data()}));
        for (size_t i = 0; i < counts.size(); ++i)
            if (counts[i] != 0) throw std::logic_error("penalize left count " + std::to_string(counts[i]) + " for token " + std::to_string(i));
        l = penalized.data();
        if (o.count("penalized")) write_file(o.at("penalized"), penalized.data(), penalized.size() * sizeof(float));
    }
    cuda::SampleArgs a{l, n, &h.sampling, &h.step, scratch.data(), best, reinterpret_cast<unsigned*>(best + 1), &h.sampled};
    run(cuda::sample(a));
    if (best[0] != 0 || best[1] != 0) throw std::logic_error("the sampler left its merge words set");
    std::printf("%d\n", h.sampled);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        if (argc < 3 || std::string(argv[1]) != "sample") {
            std::fprintf(stderr, "usage: cuda_emulator sample LOGITS_FILE [options] (see main.cpp)\n");
            return 2;
        }
        std::map<std::string, std::string> options;
        for (int i = 3; i < argc; ++i) {
            const std::string a = argv[i];
            if (a.rfind("--", 0) != 0 || i + 1 >= argc) throw std::invalid_argument("bad argument " + a);
            options[a.substr(2)] = argv[++i];
        }
        return sample(argv[2], options);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "cuda_emulator: %s\n", e.what());
        return 1;
    }
}
