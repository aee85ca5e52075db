// Generates tokens with the static core library alone (no Python): load a model on a backend,
// evaluate a prompt of token ids, sample a continuation, report the speed.
//   cmake -S . -B build -DEDGERUNNER_EXAMPLES=ON && cmake --build build --target generate
//   build/examples/generate model.gguf --tokens 1,2,3 -n 32 [--backend cuda:1] [--temperature 0.8 --seed 7]
// The core works on token ids: turning text into them (and back) is the tokenizer's job, which
// the Python package does (edgerunner.Model.tokenize); here each id is shown with its vocabulary
// piece from the file.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "edgerunner/engine.h"

namespace {

const char* kUsage =
    "usage: %s MODEL.gguf --tokens ID,ID,... [-n N] [--backend auto|cpu|cuda|cuda:N|metal] [--n-ctx N]\n"
    "                [--temperature T] [--top-k K] [--top-p P] [--seed S]\n";

// `value` as a number for `flag` (all of it), or an error naming both.
template <typename T>
T number(const std::string& flag, const std::string& value) {
    size_t used = 0;
    try {
        if constexpr (std::is_unsigned_v<T>) {
            const unsigned long long v = std::stoull(value, &used);
            if (used == value.size() && value[0] != '-' && v <= std::numeric_limits<T>::max()) return static_cast<T>(v);
        } else if constexpr (std::is_integral_v<T>) {
            const long long v = std::stoll(value, &used);
            if (used == value.size() && v >= std::numeric_limits<T>::min() && v <= std::numeric_limits<T>::max()) return static_cast<T>(v);
        } else {
            const double v = std::stod(value, &used);
            if (used == value.size()) return static_cast<T>(v);
        }
    } catch (const std::exception&) {
    }
    throw std::invalid_argument(flag + ": '" + value + "' is not " + (std::is_integral_v<T> ? "a whole number" : "a number"));
}

std::vector<int32_t> parse_ids(const std::string& text) {
    std::vector<int32_t> ids;
    size_t at = 0;
    while (true) {
        const size_t comma = text.find(',', at);
        const std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
        int32_t id = -1;
        try {
            id = number<int32_t>("--tokens", item);
        } catch (const std::invalid_argument&) {
        }
        if (id < 0) throw std::invalid_argument("--tokens: '" + item + "' is not a token id (give ids like 1,2,3)");
        ids.push_back(id);
        if (comma == std::string::npos) return ids;
        at = comma + 1;
    }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
    using namespace edgerunner;
    if (argc < 2) {
        std::fprintf(stderr, kUsage, argv[0]);
        return 2;
    }
    const std::string path = argv[1];
    LoadOptions load;
    SamplingParams sampling;
    std::vector<int32_t> prompt;
    long long n_new = 32;
    try {
        for (int i = 2; i < argc; ++i) {
            const std::string flag = argv[i];
            if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
            const std::string value = argv[++i];
            if (flag == "--tokens") prompt = parse_ids(value);
            else if (flag == "-n") n_new = number<long long>(flag, value);
            else if (flag == "--backend") load.backend = value;
            else if (flag == "--n-ctx") load.n_ctx = number<long long>(flag, value);
            else if (flag == "--temperature") sampling.temperature = number<float>(flag, value);
            else if (flag == "--top-k") sampling.top_k = number<int32_t>(flag, value);
            else if (flag == "--top-p") sampling.top_p = number<float>(flag, value);
            else if (flag == "--seed") sampling.seed = number<unsigned long long>(flag, value);
            else throw std::invalid_argument("unknown option " + flag);
        }
        if (prompt.empty()) throw std::invalid_argument("give the prompt's token ids with --tokens ID,ID,...");
        if (n_new < 1) throw std::invalid_argument("-n must be at least 1");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        std::fprintf(stderr, kUsage, argv[0]);
        return 2;
    }
    try {
        auto t0 = std::chrono::steady_clock::now();
        auto model = Model::load(path, load);
        const ModelConfig& c = model->config();
        Sampler sampler(static_cast<int32_t>(c.n_vocab), sampling);  // (its parameters checked before the cache is made)
        Session session(model);
        const double load_s = seconds_since(t0);
        std::printf("model: %s, %lld layers; device: %s; loaded in %.2f s\n", c.arch.c_str(), static_cast<long long>(c.n_layer),
                    model->device().c_str(), load_s);

        t0 = std::chrono::steady_clock::now();
        session.eval(prompt.data(), prompt.size());
        const double prompt_s = seconds_since(t0);
        t0 = std::chrono::steady_clock::now();
        const std::vector<int32_t> out = session.generate(sampler, n_new, {});
        const double gen_s = seconds_since(t0);

        const auto* vocab = model->file().find("tokenizer.ggml.tokens");
        std::printf("generated:");
        for (int32_t id : out) std::printf(" %d", id);
        std::printf("\n");
        if (vocab && !vocab->strings.empty()) {
            std::printf("pieces:");
            for (int32_t id : out)
                std::printf(" [%s]", static_cast<size_t>(id) < vocab->strings.size() ? std::string(vocab->strings[static_cast<size_t>(id)]).c_str() : "?");
            std::printf("\n");
        }
        std::printf("prompt: %zu tokens in %.3f s (%.1f tok/s); generation: %zu tokens in %.3f s (%.1f tok/s)\n", prompt.size(),
                    prompt_s, static_cast<double>(prompt.size()) / prompt_s, out.size(), gen_s,
                    static_cast<double>(out.size()) / gen_s);
        return 0;
    } catch (const OutOfMemory& e) {
        std::fprintf(stderr, "out of memory: %s\n", e.what());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
    }
    return 1;
}
