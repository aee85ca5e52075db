// metal_emulator: runs the Metal backend's kernels and programs on the CPU, for the Linux tests
// (tests/test_metal_emulated.py compares what it writes with the CPU backend and float64
// references). Files are raw little-endian arrays.
//
//   metal_emulator logits MODEL OUT --tokens 1,2,3 [--chunk N] [--n-ctx N] [--kv f16] [--decode-from K] [--fuse 0]
//       every position's logits (n × n_vocab float32); with --decode-from K the first K tokens
//       run as prefill and the rest one decode step each: rows for positions K-1 .. n-1
//   metal_emulator generate MODEL TOKENS_OUT LOGITS_OUT --tokens ... --steps N [SAMPLING] [--chunk N] [--n-ctx N]
//       [--kv f16] [--bias2 T:B,... --seed2 S]
//       Session::generate's loop: the prompt, its next token drawn by the CPU sampler, then N
//       decode steps that each draw the next token with the device sampler (penalize first when
//       there are bias or penalties); with --bias2, N more steps with that bias table and seed
//       instead. Writes the first token and the drawn ones (int32), each step's logits
//   metal_emulator matmul TYPE ROWS COLS N_TOKENS gemv|gemm W_FILE X_FILE OUT
//   metal_emulator sample LOGITS_FILE [SAMPLING] [--step S] [--history FILE] [--penalized OUT]
//       prints the token; the history (int32; the step's token its last) is what the penalties
//       read; --penalized: the logits after bias and penalties, as penalize wrote them
//   SAMPLING: [--temperature T] [--top-k K] [--top-p P] [--min-p M] [--seed S]
//       [--repetition-penalty R] [--presence-penalty P] [--frequency-penalty F] [--penalty-last-n N]
//       [--bias T:B,T:B,...] (a token may repeat: its entries add up)
//   metal_emulator source ROOT OUT
//       the one MSL source the development build compiles at run time (metal::library_source)
// METAL_EMULATOR_TRACE=1 prints every dispatch (step, kernel, grid, constants) as it runs.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../csrc/core/models/models.h"
#include "edgerunner/gguf.h"
#include "edgerunner/model_config.h"
#include "edgerunner/tensor_type.h"
#include "runner.h"

using namespace edgerunner;

namespace {

std::vector<uint8_t> read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot read " + path);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

void write_file(const std::string& path, const void* data, size_t bytes) {
    std::ofstream f(path, std::ios::binary);
    f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
    if (!f) throw std::runtime_error("cannot write " + path);
}

struct Args {
    std::vector<std::string> positional;
    std::map<std::string, std::string> options;
    std::string get(const std::string& k, const std::string& fallback) const {
        auto it = options.find(k);
        return it == options.end() ? fallback : it->second;
    }
};

Args parse(int argc, char** argv) {
    Args a;
    for (int i = 2; i < argc; ++i) {
        const std::string s = argv[i];
        if (s.rfind("--", 0) == 0 && i + 1 < argc) a.options[s.substr(2)] = argv[++i];
        else a.positional.push_back(s);
    }
    return a;
}

std::vector<int32_t> parse_tokens(const std::string& s) {
    std::vector<int32_t> out;
    size_t i = 0;
    while (i < s.size()) {
        size_t j = s.find(',', i);
        if (j == std::string::npos) j = s.size();
        out.push_back(static_cast<int32_t>(std::stol(s.substr(i, j - i))));
        i = j + 1;
    }
    return out;
}

// "T:B,T:B,..." (B may be inf or -inf)
std::vector<std::pair<int32_t, float>> parse_bias(const std::string& s) {
    std::vector<std::pair<int32_t, float>> out;
    size_t i = 0;
    while (i < s.size()) {
        size_t j = s.find(',', i);
        if (j == std::string::npos) j = s.size();
        const std::string entry = s.substr(i, j - i);
        const size_t colon = entry.find(':');
        out.emplace_back(static_cast<int32_t>(std::stol(entry.substr(0, colon))), std::stof(entry.substr(colon + 1)));
        i = j + 1;
    }
    return out;
}

SamplingParams sampling(const Args& a) {
    SamplingParams p;
    p.temperature = std::stof(a.get("temperature", "0"));
    p.top_k = std::stoi(a.get("top-k", "0"));
    p.top_p = std::stof(a.get("top-p", "1"));
    p.min_p = std::stof(a.get("min-p", "0"));
    p.seed = std::stoull(a.get("seed", "0"));
    p.repetition_penalty = std::stof(a.get("repetition-penalty", "1"));
    p.presence_penalty = std::stof(a.get("presence-penalty", "0"));
    p.frequency_penalty = std::stof(a.get("frequency-penalty", "0"));
    p.penalty_last_n = std::stoi(a.get("penalty-last-n", "64"));
    p.logit_bias = parse_bias(a.get("bias", ""));
    return p;
}

// A model as Model::load and Session prepare it for a device backend: plans, KV layout (per-layer
// capacities as Session::make_cache), and one emulated runner per plan sharing the KV memory.
struct Emulated {
    GGUFFile file;
    ModelConfig config;
    ModelWeights weights;
    int64_t n_ctx = 0;
    Plan decode_plan, prefill_plan;
    std::unique_ptr<KVCache> kv;
    std::unique_ptr<er_emulator::Memory> kv_memory;
    std::unique_ptr<er_emulator::Runner> decode, prefill;
    int64_t pos = 0;

    Emulated(const std::string& path, const Args& a) : file(GGUFFile::open(path)) {
        config = read_model_config(file);
        weights = bind_weights(file, config);
        const int64_t want = std::stoll(a.get("n-ctx", "0"));
        n_ctx = want ? want : std::min<int64_t>(config.n_ctx_train, 4096);
        const int64_t chunk = std::min<int64_t>(std::stoll(a.get("chunk", "16")), n_ctx);
        if (config.rope_longrope)
            weights.rope_freqs = n_ctx > config.rope_orig_ctx ? weights.rope_factors_long : weights.rope_factors_short;
        decode_plan = build_plan(config, weights, StepKind::Decode, 1);
        prefill_plan = build_plan(config, weights, StepKind::Prefill, chunk);
        std::vector<int64_t> capacities(static_cast<size_t>(config.n_layer), n_ctx);
        for (int64_t i = 0; i < config.n_layer; ++i)
            if (config.layer_is_local(i) && config.sliding_window + chunk < n_ctx) capacities[i] = config.sliding_window + chunk;
        kv = std::make_unique<KVCache>(parse_kv_type(a.get("kv", "f16")), capacities, n_ctx, config.n_head_kv, config.head_dim, false);
        kv_memory = std::make_unique<er_emulator::Memory>(metal::kv_buffer_bytes(*kv));
        const bool fuse = a.get("fuse", "1") != "0";
        decode = std::make_unique<er_emulator::Runner>(config, decode_plan, *kv, *kv_memory, fuse);
        prefill = std::make_unique<er_emulator::Runner>(config, prefill_plan, *kv, *kv_memory, fuse);
    }

    // Session::process: chunks through the prefill runner (the decode runner for a lone token
    // when only the last logits are wanted).
    const float* process(const int32_t* ids, int64_t n, float* all_logits) {
        const float* last = nullptr;
        for (int64_t done = 0; done < n;) {
            const int64_t step = std::min(n - done, prefill->max_tokens());
            er_emulator::Runner& r = step == 1 && !all_logits ? *decode : *prefill;
            StepInputs in;
            in.tokens = ids + done;
            in.n_tokens = step;
            in.pos0 = pos;
            in.logits_out = all_logits ? all_logits + done * config.n_vocab : nullptr;
            r.run(in);
            last = r.logits();
            pos += step;
            done += step;
        }
        return last;
    }
};

int cmd_logits(const Args& a) {
    Emulated m(a.positional.at(0), a);
    const std::vector<int32_t> ids = parse_tokens(a.get("tokens", ""));
    const int64_t n = static_cast<int64_t>(ids.size()), vocab = m.config.n_vocab;
    const int64_t k = std::stoll(a.get("decode-from", "0"));
    std::vector<float> out;
    if (k == 0) {
        out.resize(static_cast<size_t>(n * vocab));
        m.process(ids.data(), n, out.data());
    } else {
        const float* l = m.process(ids.data(), k, nullptr);
        out.insert(out.end(), l, l + vocab);
        for (int64_t t = k; t < n; ++t) {
            l = m.process(ids.data() + t, 1, nullptr);
            out.insert(out.end(), l, l + vocab);
        }
    }
    write_file(a.positional.at(1), out.data(), out.size() * 4);
    return 0;
}

int cmd_generate(const Args& a) {
    Emulated m(a.positional.at(0), a);
    const std::vector<int32_t> ids = parse_tokens(a.get("tokens", ""));
    const int64_t vocab = m.config.n_vocab, steps = std::stoll(a.get("steps", "8"));
    std::vector<SamplingParams> generations{sampling(a)};
    if (a.options.count("bias2")) {
        SamplingParams second = generations[0];
        second.logit_bias = parse_bias(a.get("bias2", ""));
        second.seed = std::stoull(a.get("seed2", "0"));
        generations.push_back(second);
    }
    const float* l = m.process(ids.data(), static_cast<int64_t>(ids.size()), nullptr);
    int32_t token = Sampler(static_cast<int32_t>(vocab), generations[0]).sample(l, ids.data(), ids.size(), ids.size());
    std::vector<int32_t> drawn{token};
    std::vector<float> logits;
    for (const SamplingParams& params : generations) {
        for (int64_t i = 0; i < steps; ++i) {
            int32_t next = -1;
            StepInputs in;
            in.tokens = &token;
            in.n_tokens = 1;
            in.pos0 = m.pos;
            in.sample = &params;
            in.sample_step = static_cast<uint64_t>(m.pos + 1);  // as Session::step_sampled: the history it completes
            in.sampled = &next;
            m.decode->run(in);
            m.pos += 1;
            drawn.push_back(next);
            logits.insert(logits.end(), m.decode->logits(), m.decode->logits() + vocab);
            token = next;
        }
    }
    write_file(a.positional.at(1), drawn.data(), drawn.size() * 4);
    write_file(a.positional.at(2), logits.data(), logits.size() * 4);
    return 0;
}

TensorType type_named(const std::string& name) {
    for (uint32_t id = 0; id < 64; ++id) {
        const auto info = tensor_type_info(id);
        if (info && info->name == name) return info->type;
    }
    throw std::invalid_argument("unknown tensor type " + name);
}

int cmd_matmul(const Args& a) {
    const TensorType type = type_named(a.positional.at(0));
    const int64_t rows = std::stoll(a.positional.at(1)), cols = std::stoll(a.positional.at(2)), n_tokens = std::stoll(a.positional.at(3));
    const bool gemm = a.positional.at(4) == "gemm";
    const auto info = tensor_type_info(type);
    const size_t row_bytes = static_cast<size_t>(cols / info.block_size) * info.type_size;
    const std::vector<uint8_t> w = read_file(a.positional.at(5)), x = read_file(a.positional.at(6));
    if (w.size() != row_bytes * static_cast<size_t>(rows) || x.size() != static_cast<size_t>(cols * n_tokens) * 4)
        throw std::invalid_argument("matmul: file sizes do not match the shapes");
    const metal::Program p = metal::matmul_program(type, rows, row_bytes, cols, n_tokens, gemm);
    er_emulator::Memory memory(p.memory_bytes), weights(w.size()), block(p.step_block_bytes);
    std::memcpy(weights.data(), w.data(), w.size());
    std::memcpy(memory.data(), x.data(), x.size());
    metal::Addresses at;
    at.memory = memory.address();
    at.weight = [&](const uint8_t*) { return weights.address(); };
    const std::vector<uint8_t> tables = p.tables(at);
    std::vector<int32_t> tokens(static_cast<size_t>(n_tokens), 0);
    float dummy = 0;
    StepInputs in;
    in.tokens = tokens.data();
    in.n_tokens = n_tokens;
    in.logits_out = &dummy;  // every row
    metal::write_step_block(in, 0, block.data());
    const metal::Step& s = p.steps.at(0);
    er_emulator::dispatch(s.launch(n_tokens), tables.data() + s.table, block.data());
    write_file(a.positional.at(7), memory.data() + p.logits, static_cast<size_t>(rows * n_tokens) * 4);
    return 0;
}

int cmd_sample(const Args& a) {
    const std::vector<uint8_t> l = read_file(a.positional.at(0));
    const int64_t vocab = static_cast<int64_t>(l.size() / 4);
    const std::vector<uint8_t> history = a.options.count("history") ? read_file(a.get("history", "")) : std::vector<uint8_t>{};
    const int64_t n_history = static_cast<int64_t>(history.size() / 4);
    const metal::Program p = metal::sample_program(vocab, n_history);
    er_emulator::Memory memory(p.memory_bytes), block(p.step_block_bytes);
    std::memcpy(memory.data() + p.logits, l.data(), l.size());
    std::memcpy(memory.data() + p.history, history.data(), history.size());
    metal::Addresses at;
    at.memory = memory.address();
    const std::vector<uint8_t> tables = p.tables(at);
    const SamplingParams params = sampling(a);
    const bool penalized = metal::penalized(params);
    const uint32_t n_bias = metal::write_bias_table(p, params.logit_bias, memory.data());
    int32_t token = n_history ? reinterpret_cast<const int32_t*>(history.data())[n_history - 1] : 0, next = -1;
    StepInputs in;
    in.tokens = &token;
    in.n_tokens = 1;
    in.pos0 = n_history - 1;  // the step's token is the history's last
    in.sample = &params;
    in.sample_step = std::stoull(a.get("step", "0"));
    in.sampled = &next;
    metal::write_step_block(in, 1, block.data(), n_bias);
    if (penalized) er_emulator::dispatch(p.penalize.launch(1), tables.data() + p.penalize.table, block.data());
    const metal::Step& sampler = penalized ? p.sample_penalized : p.sample;
    er_emulator::dispatch(sampler.launch(1), tables.data() + sampler.table, block.data());
    if (a.options.count("penalized")) {
        if (!penalized) throw std::invalid_argument("--penalized: these parameters have no bias or penalties, so penalize does not run");
        write_file(a.get("penalized", ""), memory.data() + p.penalized_logits, static_cast<size_t>(vocab) * 4);
    }
    for (int32_t i = 0; i < vocab; ++i)  // penalize leaves its counts zero
        if (reinterpret_cast<const int32_t*>(memory.data() + p.counts)[i] != 0) throw std::logic_error("penalize left a count non-zero");
    std::memcpy(&next, memory.data() + p.sampled + 4, 4);
    std::printf("%d\n", next);
    return 0;
}

int cmd_source(const Args& a) {
    const std::string source = metal::library_source(a.positional.at(0));
    write_file(a.positional.at(1), source.data(), source.size());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: metal_emulator logits|generate|matmul|sample ... (see main.cpp)\n");
        return 2;
    }
    try {
        const std::string cmd = argv[1];
        const Args a = parse(argc, argv);
        if (cmd == "logits") return cmd_logits(a);
        if (cmd == "generate") return cmd_generate(a);
        if (cmd == "matmul") return cmd_matmul(a);
        if (cmd == "sample") return cmd_sample(a);
        if (cmd == "source") return cmd_source(a);
        std::fprintf(stderr, "unknown command %s\n", cmd.c_str());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "metal_emulator: %s\n", e.what());
        return 1;
    }
}
