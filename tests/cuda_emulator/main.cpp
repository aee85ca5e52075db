// cuda_emulator: the CUDA backend on the CPU, for the tests on machines without a GPU
// (tests/test_cuda_emulated.py compares what it prints and writes with the CPU backend, the CPU
// sampler, float64 references and NumPy). csrc/cuda is compiled as C++ against this folder's
// <cuda_runtime.h> and runs on the coroutine scheduler (tests/lanes); the session, the runner,
// its fusion decisions, step blocks, graphs and chains are the backend's own
// (tests/cpp/CMakeLists.txt). Files are raw little-endian arrays.
//
//   cuda_emulator sample LOGITS_FILE [--temperature T] [--top-k K] [--top-p P] [--min-p M] [--seed S] [--step S]
//       [--history FILE] [--repetition-penalty R] [--presence-penalty P] [--frequency-penalty F]
//       [--penalty-last-n N] [--bias T:B,...] [--penalized OUT]
//       the device sampler (sample.cu) over n_vocab float32 logits, after the penalize kernel where
//       bias or penalties are on: prints the token. The history (int32) is the tokens at positions
//       0 … H-1, the step's token last; --penalized writes the logits penalize made. A draw (a
//       temperature) takes the sampler's three kernels, as the runner's steps do; -1: no finite logit.
//   cuda_emulator logits MODEL OUT --tokens 1,2,3 [--chunk 8] [--n-ctx 256] [--kv f16] [--dispatch recorded] [--decode-from K]
//       every position's logits (n × n_vocab float32) from one eval_all; with --decode-from K the
//       first K tokens are one eval and the rest one append each: rows for positions K-1 … n-1
//   cuda_emulator matmul TYPE ROWS COLS N_TOKENS W_FILE X_FILE OUT
//       the backend's matmul (cuda::matmul: the runner's kernel choice, one token or several) of
//       ROWS raw rows of TYPE (the file's blocks) with N_TOKENS float32 rows of COLS: OUT, N_TOKENS × ROWS
//   cuda_emulator half f16|bf16 N_TOKENS COLS X_FILE OUT [SCALES]
//       the tensor-core GEMM's 16-bit copy of N_TOKENS float32 rows of COLS (cuda::half_copy): OUT
//       the values (uint16), SCALES (f16) each token's scale (float32)
//   cuda_emulator devices MODEL --tokens ... [--steps N] [sampling options]   (EDGERUNNER_CUDA_EMULATOR_DEVICES=2)
//       models on cuda:1 and cuda:0 while the thread's device is another: what each makes and runs
//       is its device's, the thread's device is as it was after every call, sessions on both
//       stepped in turn give each its tokens alone, cuda:2 is refused: prints its refusal, then
//       "ok", or the first thing that is not so
//   cuda_emulator generate MODEL OUT --tokens ... --steps N [--stop T,...] [--loop 1] [--dispatch D] [--chunk N]
//       [--n-ctx N] [sampling options as sample's] [--bias2 T:B,... [--seed2 S]]
//       the prompt, then up to N tokens from Session::generate (recorded dispatch: chained steps
//       drawn on the device), or with --loop 1 from the Python layer's loop (append_sampled told
//       how many draws may follow); then each checked against the CPU sampler on the logits of a
//       second session of the same model (eager, a step at a time) with the whole history, and
//       the session's cache and last logits against that session's (bit for bit); with --bias2, a
//       second generation on the same sessions with that bias and seed: writes the tokens (int32),
//       prints "ok" or what differs
//   cuda_emulator broken MODEL --tokens ... [--dispatch D] [sampling options]
//       a model whose logits are all NaN or -inf: a draw on the device, one step and chained (where
//       the steps after it read the drawn -1 as their input), raises the runner's error, printed;
//       then the session evaluates on: prints "ok", or what is not so
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../csrc/cuda/cuda.h"
#include "../../csrc/cuda/sample.cuh"
#include "edgerunner/engine.h"
#include "cuda_runtime.h"
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

// A launch as the backend enqueues it (here it runs at once).
void run(const cuda::Launch& l) { cuda::enqueue(l, nullptr, nullptr, false); }

// "a,b,c" → {a, b, c} ("" → {})
std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> out;
    for (size_t i = 0; i < s.size();) {
        size_t j = s.find(',', i);
        if (j == std::string::npos) j = s.size();
        out.push_back(s.substr(i, j - i));
        i = j + 1;
    }
    return out;
}

std::vector<int32_t> parse_tokens(const std::string& s) {
    std::vector<int32_t> out;
    for (const std::string& item : split(s)) out.push_back(static_cast<int32_t>(std::stol(item)));
    return out;
}

std::vector<std::pair<int32_t, float>> parse_bias(const std::string& s) {  // TOKEN:BIAS,...
    std::vector<std::pair<int32_t, float>> out;
    for (const std::string& item : split(s)) {
        const size_t colon = item.find(':');
        if (colon == std::string::npos) throw std::invalid_argument("--bias takes TOKEN:BIAS,..., got " + item);
        out.emplace_back(std::stoi(item.substr(0, colon)), std::strtof(item.c_str() + colon + 1, nullptr));
    }
    return out;
}

using Options = std::map<std::string, std::string>;

std::string get(const Options& o, const char* k, const char* fallback) {
    auto it = o.find(k);
    return it == o.end() ? std::string(fallback) : it->second;
}

SamplingParams sampling(const Options& o) {
    auto get = [&](const char* k, const char* fallback) { return ::get(o, k, fallback); };
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
    return p;
}

int cmd_sample(const std::string& logits_path, const Options& o) {
    auto get = [&](const char* k, const char* fallback) { return ::get(o, k, fallback); };
    std::vector<float> logits = read_array<float>(logits_path);
    const int32_t n = static_cast<int32_t>(logits.size());
    const SamplingParams p = sampling(o);
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
    std::vector<double> scratch(static_cast<size_t>(cuda::sample_scratch_words(n)));
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
    auto wide = std::make_unique<cuda::WideState>();  // (zero)
    if (cuda::wide_draw(p)) a.wide = wide.get();
    const cuda::SampleLaunches launches = cuda::sample(a);
    for (int i = 0; i < launches.count; ++i) run(launches.launch[i]);
    if (best[0] != 0 || best[1] != 0) throw std::logic_error("the sampler left its merge words set");
    const auto* bytes = reinterpret_cast<const unsigned char*>(wide.get());
    if (std::any_of(bytes, bytes + offsetof(cuda::WideState, active), [](unsigned char b) { return b != 0; }) || wide->active != 0 ||
        wide->done != 0 || wide->walk != 0)
        throw std::logic_error("the draw's kernels left their histograms or counters set");
    std::printf("%d\n", h.sampled);
    return 0;
}

TensorType type_named(const std::string& name) {
    for (uint32_t id = 0; id < 64; ++id)
        if (const auto info = tensor_type_info(id); info && info->name == name) return info->type;
    throw std::invalid_argument("no tensor type " + name);
}

int cmd_matmul(char** p) {
    const TensorType type = type_named(p[0]);
    const int64_t rows = std::stoll(p[1]), cols = std::stoll(p[2]), n_tokens = std::stoll(p[3]);
    const std::vector<uint8_t> w = read_array<uint8_t>(p[4]);
    const std::vector<float> x = read_array<float>(p[5]);
    const std::vector<float> y = cuda::matmul(type, w.data(), rows, w.size() / static_cast<size_t>(rows), x.data(), n_tokens, cols, cuda::GemmKernel::Auto);
    write_file(p[6], y.data(), y.size() * sizeof(float));
    return 0;
}

int cmd_half(int argc, char** p) {
    const std::string kind = p[0];
    if (kind != "f16" && kind != "bf16") throw std::invalid_argument("half takes f16 or bf16, not " + kind);
    const int64_t n_tokens = std::stoll(p[1]), cols = std::stoll(p[2]);
    const std::vector<float> x = read_array<float>(p[3]);
    if (x.size() != static_cast<size_t>(n_tokens * cols)) throw std::invalid_argument("X_FILE does not hold N_TOKENS × COLS floats");
    std::vector<float> scales;
    const std::vector<uint16_t> y = cuda::half_copy(x.data(), n_tokens, cols, kind == "f16", &scales);
    write_file(p[4], y.data(), y.size() * sizeof(uint16_t));
    if (argc > 5) write_file(p[5], scales.data(), scales.size() * sizeof(float));
    return 0;
}

std::shared_ptr<Model> load(const std::string& path, const Options& o, const char* dispatch, const char* backend = "cuda") {
    LoadOptions lo;
    lo.backend = backend;
    lo.dispatch = get(o, "dispatch", dispatch);
    lo.kv_type = get(o, "kv", "f16");
    lo.prefill_chunk = std::stoll(get(o, "chunk", "8"));
    lo.n_ctx = std::stoll(get(o, "n-ctx", "256"));
    return Model::load(path, lo);
}

int cmd_logits(const std::string& path, const std::string& out_path, const Options& o) {
    const auto model = load(path, o, "recorded");
    Session s(model);
    const std::vector<int32_t> ids = parse_tokens(get(o, "tokens", ""));
    const size_t n = ids.size(), vocab = static_cast<size_t>(model->config().n_vocab);
    const size_t k = std::stoull(get(o, "decode-from", "0"));
    std::vector<float> out;
    if (k == 0) {
        out.resize(n * vocab);
        s.eval_all(ids.data(), n, out.data());
    } else {
        s.eval(ids.data(), k);
        out.insert(out.end(), s.logits(), s.logits() + vocab);
        for (size_t t = k; t < n; ++t) {
            s.append(ids[t]);
            out.insert(out.end(), s.logits(), s.logits() + vocab);
        }
    }
    write_file(out_path, out.data(), out.size() * sizeof(float));
    return 0;
}

int cmd_generate(const std::string& path, const std::string& out_path, const Options& o) {
    const auto model = load(path, o, "recorded");
    const auto reference = load(path, o, "eager");
    const std::vector<int32_t> ids = parse_tokens(get(o, "tokens", ""));
    const std::vector<int32_t> stops = parse_tokens(get(o, "stop", ""));
    const int32_t vocab = model->config().n_vocab;
    const int64_t steps = std::stoll(get(o, "steps", "8"));
    const bool loop = get(o, "loop", "0") != "0";
    std::vector<SamplingParams> rounds{sampling(o)};
    if (o.count("bias2")) {  // a second generation on the same session: another bias table and seed
        if (loop) throw std::invalid_argument("--bias2 goes with Session::generate, not --loop");
        rounds.push_back(rounds[0]);
        rounds[1].logit_bias = parse_bias(o.at("bias2"));
        rounds[1].seed = std::stoull(get(o, "seed2", "0"));
    }
    Session s(model), r(reference);
    s.eval(ids.data(), ids.size());
    r.eval(ids.data(), ids.size());
    std::vector<int32_t> all;
    for (const SamplingParams& p : rounds) {
        Sampler drawing(vocab, p);
        std::vector<int32_t> out;
        if (!loop) {
            out = s.generate(drawing, steps, stops);
        } else {  // the Python layer's loop: a host draw, then append_sampled told how many may follow
            for (int64_t i = 0; i < steps && static_cast<int64_t>(s.tokens().size()) < s.n_ctx(); ++i) {
                out.push_back(i == 0 ? s.sample(drawing) : s.append_sampled(out.back(), drawing, steps - 1 - i));
                if (std::find(stops.begin(), stops.end(), out.back()) != stops.end()) break;
            }
        }
        all.insert(all.end(), out.begin(), out.end());
        Sampler checking(vocab, p);
        for (size_t i = 0; i < out.size(); ++i) {
            const std::vector<int32_t>& h = r.tokens();
            const int32_t want = checking.sample(r.logits(), h.data(), h.size(), h.size());
            if (out[i] != want) {
                std::printf("step %zu: drew %d, the CPU sampler %d\n", all.size() - out.size() + i, out[i], want);
                return 0;
            }
            if (i + 1 < out.size()) r.append(out[i]);
        }
        // the session holds the prompt and the draws (generate appends the last one too, unless
        // it stopped on it or the context is full), and the logits that follow them
        if (!out.empty() && s.tokens().size() == r.tokens().size() + 1) r.append(out.back());
        if (s.tokens() != r.tokens()) {
            std::printf("the session holds %zu tokens, the reference %zu\n", s.tokens().size(), r.tokens().size());
            return 0;
        }
        if (std::memcmp(s.logits(), r.logits(), static_cast<size_t>(vocab) * sizeof(float)) != 0) {
            std::printf("the session's last logits differ from the reference's\n");
            return 0;
        }
    }
    write_file(out_path, all.data(), all.size() * sizeof(int32_t));
    std::printf("ok\n");
    return 0;
}

// What the devices command checks, a line each; the first failure ends the run.
#define CHECK(cond, ...)                   \
    if (!(cond)) {                         \
        std::printf("not so: " __VA_ARGS__); \
        std::printf("\n");                \
        return 0;                          \
    }

int cmd_devices(const std::string& path, const Options& o) {
    const auto& use = er_cuda_emulator::use;
    auto device = [] {
        int d = -1;
        cudaGetDevice(&d);
        return d;
    };
    const std::vector<int32_t> ids = parse_tokens(get(o, "tokens", ""));
    const int64_t steps = std::stoll(get(o, "steps", "8"));
    SamplingParams p = sampling(o);
    auto draw_alone = [&](const char* backend) {  // a model alone on `backend`: its tokens
        const auto m = load(path, o, "recorded", backend);
        Session s(m);
        s.eval(ids.data(), ids.size());
        Sampler sampler(m->config().n_vocab, p);
        return s.generate(sampler, steps, {});
    };
    CHECK(cudaSetDevice(0) == cudaSuccess, "device 0");
    const std::vector<int32_t> alone1 = draw_alone("cuda:1"), alone0 = draw_alone("cuda:0");
    CHECK(use(0).bytes == 0 && use(1).bytes == 0, "every byte freed with the models (devices 0 and 1 hold %zu and %zu)", use(0).bytes,
          use(1).bytes);
    // a model on cuda:1 while the thread's device is 0: everything it makes and runs is device 1's,
    // and the thread's device is 0 after every call
    const uint64_t launches0 = use(0).launches;
    auto m1 = load(path, o, "recorded", "cuda:1");
    CHECK(device() == 0, "the thread's device after load: %d", device());
    CHECK(use(1).bytes > 0 && use(0).bytes == 0, "the weights on device 1 (devices hold %zu and %zu bytes)", use(0).bytes, use(1).bytes);
    auto s1 = std::make_unique<Session>(m1);
    s1->eval(ids.data(), ids.size());
    CHECK(device() == 0, "the thread's device after eval: %d", device());
    Sampler sampler1(m1->config().n_vocab, p);
    const std::vector<int32_t> got1 = s1->generate(sampler1, steps, {});
    CHECK(device() == 0, "the thread's device after generate: %d", device());
    CHECK(use(0).bytes == 0 && use(0).launches == launches0, "device 0 untouched (%zu bytes, %llu launches more)", use(0).bytes,
          static_cast<unsigned long long>(use(0).launches - launches0));
    CHECK(got1 == alone1, "cuda:1's tokens as when it ran alone");
    // a second model on cuda:0: the two sessions stepped in turn from this thread, whose device
    // another part of the program sets to 1 between the calls; each gives its tokens alone
    auto m0 = load(path, o, "recorded", "cuda:0");
    Session a(m0), b(m1);
    a.eval(ids.data(), ids.size());
    b.eval(ids.data(), ids.size());
    Sampler sa(m0->config().n_vocab, p), sb(m1->config().n_vocab, p);
    std::vector<int32_t> ta, tb;
    for (int64_t i = 0; i < steps; ++i) {
        cudaSetDevice(static_cast<int>(i % 2));
        ta.push_back(i == 0 ? a.sample(sa) : a.append_sampled(ta.back(), sa, steps - 1 - i));
        CHECK(device() == static_cast<int>(i % 2), "the thread's device after a cuda:0 step: %d", device());
        tb.push_back(i == 0 ? b.sample(sb) : b.append_sampled(tb.back(), sb, steps - 1 - i));
        CHECK(device() == static_cast<int>(i % 2), "the thread's device after a cuda:1 step: %d", device());
    }
    CHECK(ta == alone0 && tb == alone1, "the interleaved sessions' tokens as each alone");
    // an index past the devices: refused, naming the ones there are
    try {
        load(path, o, "recorded", "cuda:2");
        CHECK(false, "cuda:2 loaded on two devices");
    } catch (const std::invalid_argument& e) {
        std::printf("%s\n", e.what());
    }
    std::printf("ok\n");
    return 0;
}

int cmd_broken(const std::string& path, const Options& o) {
    const std::vector<int32_t> ids = parse_tokens(get(o, "tokens", ""));
    CHECK(ids.size() >= 2, "two tokens or more");
    const auto m = load(path, o, "recorded");
    Sampler sampler(m->config().n_vocab, sampling(o));
    Session s(m);
    s.eval(ids.data(), ids.size());
    for (const int64_t ahead : {0, 6}) {
        try {
            const int32_t t = s.append_sampled(7, sampler, ahead);
            CHECK(false, "a draw without a finite logit gave token %d (ahead %lld)", t, static_cast<long long>(ahead));
        } catch (const std::invalid_argument& e) {
            std::printf("%s\n", e.what());
        }
    }
    std::vector<int32_t> more(ids);
    more.push_back(4);
    s.eval(more.data(), more.size());
    CHECK(s.tokens() == more && std::isnan(s.logits()[0]), "the session evaluates on (%zu tokens)", s.tokens().size());
    std::printf("ok\n");
    return 0;
}
#undef CHECK

}  // namespace

int main(int argc, char** argv) {
    try {
        const std::string cmd = argc > 1 ? argv[1] : "";
        if (cmd == "matmul" && argc == 9) return cmd_matmul(argv + 2);
        if (cmd == "half" && (argc == 7 || argc == 8)) return cmd_half(argc - 2, argv + 2);
        const int positional = cmd == "sample" || cmd == "devices" || cmd == "broken" ? 1 : 2;
        if ((cmd != "sample" && cmd != "logits" && cmd != "generate" && cmd != "devices" && cmd != "broken") || argc < 2 + positional) {
            std::fprintf(stderr, "usage: cuda_emulator sample|logits|matmul|half|generate|devices|broken ... (see main.cpp)\n");
            return 2;
        }
        Options options;
        for (int i = 2 + positional; i < argc; ++i) {
            const std::string a = argv[i];
            if (a.rfind("--", 0) != 0 || i + 1 >= argc) throw std::invalid_argument("bad argument " + a);
            options[a.substr(2)] = argv[++i];
        }
        if (cmd == "sample") return cmd_sample(argv[2], options);
        if (cmd == "devices") return cmd_devices(argv[2], options);
        if (cmd == "broken") return cmd_broken(argv[2], options);
        if (cmd == "logits") return cmd_logits(argv[2], argv[3], options);
        return cmd_generate(argv[2], argv[3], options);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "cuda_emulator: %s\n", e.what());
        return 1;
    }
}
