// The C++ API: load a GGUF model, open sessions on it, evaluate tokens and sample.
//
//   auto model = edgerunner::Model::load("model.gguf", {});
//   edgerunner::Session session(model);
//   session.eval(prompt_ids.data(), prompt_ids.size());      // reset / extend / decode, chosen for you
//   edgerunner::Sampler sampler(model->config().n_vocab, {});
//   auto ids = session.generate(sampler, 64, {eos_id});
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "edgerunner/gguf.h"
#include "edgerunner/model_config.h"
#include "edgerunner/sampler.h"

namespace edgerunner {

struct LoadOptions {
    int64_t n_ctx = 0;            // context length; 0: the model's, capped at kDefaultMaxContext
    std::string kv_type = "f16";  // KV cache precision: f32, f16, q8_0
    bool precise = false;         // float32 activations and KV cache: the reference mode
    int n_threads = 0;            // 0: all hardware threads
    int64_t prefill_chunk = 256;  // tokens per prefill step
    std::string backend = "auto"; // cpu, cuda (its device 0), cuda:N (its device N), metal, or auto (a GPU
                                  // backend this build has, with a device present: CUDA's device 0)
    std::string dispatch = "auto";  // GPU backends: eager, argument_buffers, recorded, auto (= recorded)
};
constexpr int64_t kDefaultMaxContext = 4096;

// Memory the engine could not get (host or device): the message names what needed it, how much,
// how much was free and what to change. Python: edgerunner.OutOfMemoryError, a MemoryError.
struct OutOfMemory : std::runtime_error {
    using std::runtime_error::runtime_error;
};

class Model {
public:
    // Maps the file, reads the config, binds every weight in place and builds the step plans.
    // Throws GGUFError (malformed file), std::invalid_argument (unsupported model/options) or
    // OutOfMemory (a GPU backend's copy of the weights does not fit in the device's free memory).
    static std::shared_ptr<Model> load(const std::string& path, const LoadOptions& options);
    // What load checks before it reads the file: throws std::invalid_argument for options no model
    // loads with (a bad value; a backend this build or machine does not have, or cuda:N past its
    // devices), so a caller that fetches models first can refuse before it downloads.
    static void check_options(const LoadOptions& options);
    ~Model();

    const ModelConfig& config() const;
    const GGUFFile& file() const;
    const LoadOptions& options() const;
    const std::string& backend() const;  // the backend it runs on: "cpu", "cuda" or "metal"
    const std::string& device() const;   // and the device: "cpu", "cuda:N" (N the CUDA device index) or "metal"
    int64_t n_ctx() const;

    struct Impl;
    Impl& impl() const { return *impl_; }

private:
    Model() = default;
    std::unique_ptr<Impl> impl_;
};

// Which work an eval did (seed section "inference modes").
enum class EvalMode { Cached, Decode, Extend, Reset };
const char* eval_mode_name(EvalMode m);

// One conversation's state: a KV cache, prepared executables and the tokens the cache holds.
class Session {
public:
    // Allocates the KV cache (n_ctx slots a layer) and the backend's scratch. Throws OutOfMemory
    // where they do not fit (the message says which n_ctx would).
    explicit Session(std::shared_ptr<Model> model);
    ~Session();

    // Brings the cache to exactly `tokens` and makes logits() the next-token logits: decode
    // when one token was appended, extend when several were, rewind to the common prefix when
    // the history changed, cached when nothing changed. Throws std::length_error past n_ctx and
    // std::invalid_argument for out-of-vocabulary ids.
    EvalMode eval(const int32_t* tokens, size_t n);
    // Logits of every position of `tokens` (n × n_vocab into `out`), recomputed from scratch.
    void eval_all(const int32_t* tokens, size_t n, float* out);
    // Appends one token and decodes it (no allocation).
    void append(int32_t token);
    // append(token), then the next token drawn by `sampler` from the new logits: on a backend
    // that samples on the device only the token comes back (logits() fetches the logits when
    // asked). Same tokens as append + sample on every backend's logits. `ahead`: how many more
    // draws the caller may ask for after this one, each appending the previous draw (a streaming
    // loop); a backend that chains steps (CUDA, recorded dispatch) then keeps some in flight.
    // Steps past what the caller takes are dropped by the session's next call of any kind.
    int32_t append_sampled(int32_t token, Sampler& sampler, int64_t ahead = 0);
    // Keeps the first n tokens; the next eval recomputes from there.
    void rewind(size_t n);

    const float* logits() const;  // logits_size() (= n_vocab) values; valid after eval/append
    size_t logits_size() const;
    const std::vector<int32_t>& tokens() const;
    int64_t n_ctx() const;

    // The next token drawn by `sampler` from the current logits (the RNG step: the tokens so far):
    // on a backend that samples on the device, drawn there from the logits the last step left.
    int32_t sample(Sampler& sampler) const;
    // The native generation loop: sample, append, until max_tokens, a stop id or a full context.
    std::vector<int32_t> generate(Sampler& sampler, int64_t max_tokens, const std::vector<int32_t>& stop_ids);

private:
    std::vector<int32_t> generate_chained(const SamplingParams& params, int32_t first, int64_t max_tokens,
                                          const std::vector<int32_t>& stop_ids);
    // Draws chained on the device: open (the first step appends `first`; at most `draws` steps),
    // take the next draw, or end the chain leaving what the taken steps did (settle).
    void chain_open(const SamplingParams& params, int32_t first, int64_t draws);
    int32_t chain_next();
    void settle() const;

    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace edgerunner
