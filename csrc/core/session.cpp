// Model loading and the session: which tokens the KV cache holds and which inference mode
// (cached / decode / extend / reset) a new token list needs.
#include <algorithm>
#include <limits>
#include <optional>
#include <stdexcept>
#include <thread>

#include "../cpu/executable.h"
#if defined(ER_HAVE_CUDA)
#include "../cuda/cuda.h"
#endif
#if defined(ER_HAVE_METAL)
#include "../../metal/metal.h"
#endif
#include "edgerunner/engine.h"
#include "kv_cache.h"
#include "models/models.h"

namespace edgerunner {

struct Model::Impl {
    Impl(GGUFFile f, const LoadOptions& o, std::string b) : file(std::move(f)), options(o), backend(std::move(b)) {}
    GGUFFile file;
    ModelConfig config;
    ModelWeights weights;
    LoadOptions options;
    int64_t n_ctx = 0;
    Plan decode_plan, prefill_plan;
    std::unique_ptr<cpu::ThreadPool> pool;
    std::string backend;  // "cpu", "cuda" or "metal"
    int gpu = 0;          // CUDA: the device index
    std::string device;   // "cpu", "cuda:N" or "metal"
#if defined(ER_HAVE_CUDA)
    std::shared_ptr<cuda::DeviceModel> cuda_weights;  // the weights in device memory
#endif
#if defined(ER_HAVE_METAL)
    std::shared_ptr<metal::DeviceModel> metal_weights;  // the mapped file as Metal buffers
#endif
};

namespace {

// "cuda:N" → N (digits only), else -1.
int cuda_index(const std::string& b) {
    if (b.rfind("cuda:", 0) != 0 || b.size() == 5 || b.size() > 5 + 6) return -1;
    for (size_t i = 5; i < b.size(); ++i)
        if (b[i] < '0' || b[i] > '9') return -1;
    return std::stoi(b.substr(5));
}

// "auto" → a GPU backend where this build has one and a device is present (CUDA, else Metal),
// else cpu; "cuda:N" → cuda, on device N (`gpu`).
std::string resolve_backend(const LoadOptions& o, int* gpu) {
    const int index = cuda_index(o.backend);
    *gpu = std::max(index, 0);
    const std::string& b = index >= 0 ? std::string("cuda") : o.backend;
#if defined(ER_HAVE_CUDA)
    const bool cuda_ok = cuda::available();
#else
    const bool cuda_ok = false;
#endif
#if defined(ER_HAVE_METAL)
    const bool metal_ok = metal::available();
#else
    const bool metal_ok = false;
#endif
    if (b == "cpu") return b;
    if (b == "auto") return o.precise ? "cpu" : cuda_ok ? "cuda" : metal_ok ? "metal" : "cpu";
    if (b != "cuda" && b != "metal")
        throw std::invalid_argument("unknown backend '" + b + "'; choose cpu, cuda, cuda:N (CUDA device N), metal or auto");
    [[maybe_unused]] const char* cpu_only = "precise mode runs on the CPU backend only; drop precise or use backend='cpu'";
    if (b == "cuda") {
#if defined(ER_HAVE_CUDA)
        if (!cuda_ok) throw std::invalid_argument("backend '" + o.backend + "': " + cuda::describe() + "; use backend='cpu' (or 'auto')");
        if (const std::string why = cuda::unusable(*gpu); !why.empty()) throw std::invalid_argument("backend '" + o.backend + "': " + why);
        if (o.precise) throw std::invalid_argument(cpu_only);
        return b;
#else
        throw std::invalid_argument("backend '" + o.backend + "': this build has no CUDA backend (rebuild with -C cmake.define.EDGERUNNER_CUDA=ON)");
#endif
    }
#if defined(ER_HAVE_METAL)
    if (!metal_ok) throw std::invalid_argument("backend 'metal': " + metal::describe());
    if (o.precise) throw std::invalid_argument(cpu_only);
    return b;
#else
    throw std::invalid_argument("backend 'metal': this build has no Metal backend (it is built by default on macOS arm64; "
                                "elsewhere Metal does not exist)");
#endif
}

}  // namespace

Model::~Model() = default;
const ModelConfig& Model::config() const { return impl_->config; }
const GGUFFile& Model::file() const { return impl_->file; }
const LoadOptions& Model::options() const { return impl_->options; }
const std::string& Model::backend() const { return impl_->backend; }
const std::string& Model::device() const { return impl_->device; }
int64_t Model::n_ctx() const { return impl_->n_ctx; }

namespace {

// load's checks that need no file; returns the backend the options resolve to (and its GPU).
std::string checked_backend(const LoadOptions& options, int* gpu) {
    if (options.n_ctx < 0) throw std::invalid_argument("n_ctx must be positive (or 0 for the model's default)");
    if (options.n_ctx > std::numeric_limits<int32_t>::max())
        throw std::invalid_argument("n_ctx=" + std::to_string(options.n_ctx) + " is more positions than the engine addresses (at most " +
                                    std::to_string(std::numeric_limits<int32_t>::max()) + ")");
    if (options.prefill_chunk < 1) throw std::invalid_argument("prefill_chunk must be at least 1");
    if (options.n_threads < 0) throw std::invalid_argument("n_threads must be positive (or 0 for all cores)");
    if (options.dispatch != "auto" && options.dispatch != "eager" && options.dispatch != "argument_buffers" && options.dispatch != "recorded")
        throw std::invalid_argument("unknown dispatch mode '" + options.dispatch + "'; choose eager, argument_buffers, recorded or auto");
    parse_kv_type(options.kv_type);
    return resolve_backend(options, gpu);
}

}  // namespace

void Model::check_options(const LoadOptions& options) {
    int gpu = 0;
    checked_backend(options, &gpu);
}

std::shared_ptr<Model> Model::load(const std::string& path, const LoadOptions& options) {
    int gpu = 0;
    std::string backend = checked_backend(options, &gpu);
    std::shared_ptr<Model> model(new Model());
    model->impl_ = std::make_unique<Impl>(GGUFFile::open(path), options, std::move(backend));
    Impl& m = *model->impl_;
    m.gpu = gpu;
    m.config = read_model_config(m.file);
    if (!options.precise && parse_kv_type(options.kv_type) == KvType::Q8_0 && m.config.head_dim % 32 != 0)
        throw std::invalid_argument("KV cache type q8_0 needs a head size that is a multiple of 32 (this model's is " +
                                    std::to_string(m.config.head_dim) + "); use f16");
    m.weights = bind_weights(m.file, m.config);
    m.n_ctx = options.n_ctx ? options.n_ctx : std::min(m.config.n_ctx_train, kDefaultMaxContext);
    const int64_t chunk = std::min(options.prefill_chunk, m.n_ctx);
    if (m.config.rope_longrope)  // LongRoPE: the long factors only when the context outgrows the original
        m.weights.rope_freqs = m.n_ctx > m.config.rope_orig_ctx ? m.weights.rope_factors_long : m.weights.rope_factors_short;
    m.decode_plan = build_plan(m.config, m.weights, StepKind::Decode, 1);
    m.prefill_plan = build_plan(m.config, m.weights, StepKind::Prefill, chunk);
#if defined(ER_HAVE_CUDA)
    if (m.backend == "cuda") {
        const std::string missing = cuda::unsupported(m.config, m.prefill_plan);
        if (missing.empty()) {
            m.device = "cuda:" + std::to_string(m.gpu);
            m.cuda_weights = cuda::upload({&m.decode_plan, &m.prefill_plan}, m.gpu);
            return model;
        }
        if (options.backend != "auto")
            throw std::invalid_argument("backend '" + options.backend + "' cannot run " + m.config.arch + " yet (" + missing + "); use backend='cpu'");
        m.backend = "cpu";  // auto: the CPU runs what the GPU backend cannot yet
    }
#endif
#if defined(ER_HAVE_METAL)
    if (m.backend == "metal") {
        std::string missing = metal::unsupported(m.config, m.prefill_plan);
        if (missing.empty()) missing = metal::unsupported(m.config, m.decode_plan);
        if (missing.empty()) {
            m.device = "metal";
            m.metal_weights = metal::wrap_weights(m.file, {&m.decode_plan, &m.prefill_plan});
            return model;
        }
        if (options.backend == "metal")
            throw std::invalid_argument("backend 'metal' cannot run " + m.config.arch + " (" + missing + "); use backend='cpu'");
        m.backend = "cpu";
    }
#endif
    m.device = "cpu";
    int threads = options.n_threads ? options.n_threads : static_cast<int>(std::thread::hardware_concurrency());
    m.pool = std::make_unique<cpu::ThreadPool>(std::max(1, threads));
    return model;
}

const char* eval_mode_name(EvalMode m) {
    switch (m) {
        case EvalMode::Cached: return "cached";
        case EvalMode::Decode: return "decode";
        case EvalMode::Extend: return "extend";
        case EvalMode::Reset: return "reset";
    }
    return "?";
}

struct Session::Impl {
    std::shared_ptr<Model> model;
    KVCache kv;  // on the CPU backend the slots themselves; on a device backend the layout
#if defined(ER_HAVE_CUDA)
    std::shared_ptr<cuda::DeviceKv> device_kv;
#endif
#if defined(ER_HAVE_METAL)
    std::shared_ptr<metal::DeviceKv> metal_kv;
#endif
    std::unique_ptr<StepRunner> decode, prefill;
    std::vector<int32_t> tokens;  // what the cache holds, position = index
    const float* logits = nullptr;  // next-token logits of `tokens`, or null
    bool logits_on_device = false;  // null logits still on the device (after a sampled step)
    StepRunner* logits_from = nullptr;  // the runner whose last run made them (where they also stay)

    // An open chain of steps drawn on the device: step k (1 … limit) appends the draw of step
    // k − 1 (the first: `first`) at position base + k − 1; `pushed` of them are running or done,
    // `popped` taken (their tokens in `tokens`), `next` the last taken draw (what the next step
    // appends).
    struct Chain {
        SamplingParams params;
        int32_t first = 0, next = 0;
        int64_t base = 0, limit = 0, pushed = 0, popped = 0;
    };
    std::optional<Chain> chain;

    // A run of r is about to write its logits: where they backed the session's, they no longer do.
    void running(const StepRunner& r) {
        if (logits_from == &r) logits_from = nullptr;
    }

    void push() {
        running(*decode);
        Chain& c = *chain;
        decode->chain_push(c.base + c.pushed, c.params, static_cast<uint64_t>(c.base + c.pushed + 1), c.pushed == 0 ? &c.first : nullptr);
        ++c.pushed;
    }

    // One decode step for `token` that ends with the next token drawn on the device.
    int32_t step_sampled(int32_t token, const SamplingParams& params) {
        int32_t next = 0;
        StepInputs in;
        in.tokens = &token;
        in.n_tokens = 1;
        in.pos0 = static_cast<int64_t>(tokens.size());
        in.sample = &params;
        in.sample_step = tokens.size() + 1;  // the history the CPU sampler would see: every token so far
        in.sampled = &next;
        running(*decode);
        decode->run(in);
        tokens.push_back(token);
        logits = nullptr;
        logits_on_device = true;
        logits_from = decode.get();
        return next;
    }

    static KVCache make_cache(const Model& model) {
        const auto& c = model.config();
        const auto& o = model.options();
        const KvType type = o.precise ? KvType::F32 : parse_kv_type(o.kv_type);
        // A sliding window bounds what a windowed layer reads: a circular cache of window + one
        // prefill chunk holds every slot a step can touch; the other layers keep the context.
        const int64_t chunk = model.impl().prefill_plan.max_tokens;
        std::vector<int64_t> capacities(static_cast<size_t>(c.n_layer), model.n_ctx());
        for (int64_t i = 0; i < c.n_layer; ++i)
            if (c.layer_is_local(i) && c.sliding_window + chunk < model.n_ctx()) capacities[i] = c.sliding_window + chunk;
        return KVCache(type, capacities, model.n_ctx(), c.n_head_kv, c.head_dim, model.backend() == "cpu");
    }

    explicit Impl(std::shared_ptr<Model> m) : model(std::move(m)), kv(make_cache(*model)) {
        const Model::Impl& mi = model->impl();
#if defined(ER_HAVE_CUDA)
        if (mi.backend == "cuda") {
            device_kv = cuda::make_kv(kv, *mi.cuda_weights);
            const cuda::Dispatch dispatch = cuda::parse_dispatch(model->options().dispatch);
            decode = cuda::make_runner(model->config(), mi.decode_plan, mi.cuda_weights, device_kv, dispatch);
            prefill = cuda::make_runner(model->config(), mi.prefill_plan, mi.cuda_weights, device_kv, dispatch);
        }
#endif
#if defined(ER_HAVE_METAL)
        if (mi.backend == "metal") {
            metal_kv = metal::make_kv(kv);
            const metal::Dispatch dispatch = metal::parse_dispatch(model->options().dispatch);
            decode = metal::make_runner(model->config(), mi.decode_plan, mi.metal_weights, metal_kv, dispatch);
            prefill = metal::make_runner(model->config(), mi.prefill_plan, mi.metal_weights, metal_kv, dispatch);
        }
#endif
        if (mi.backend == "cpu") {
            const bool precise = model->options().precise;
            decode = std::make_unique<cpu::Executable>(model->config(), mi.decode_plan, kv, *mi.pool, precise);
            prefill = std::make_unique<cpu::Executable>(model->config(), mi.prefill_plan, kv, *mi.pool, precise);
        }
        tokens.reserve(static_cast<size_t>(model->n_ctx()));
    }

    void check(const int32_t* ids, size_t n) const {
        if (n == 0) throw std::invalid_argument("the token list is empty: give at least one token");
        if (static_cast<int64_t>(n) > model->n_ctx())
            throw std::length_error("the input has " + std::to_string(n) + " tokens but the context holds " +
                                    std::to_string(model->n_ctx()) + "; load the model with a larger n_ctx or shorten the input");
        const int64_t vocab = model->config().n_vocab;
        for (size_t i = 0; i < n; ++i)
            if (ids[i] < 0 || ids[i] >= vocab)
                throw std::invalid_argument("token id " + std::to_string(ids[i]) + " at index " + std::to_string(i) +
                                            " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }

    // Positions [tokens.size(), tokens.size() + n) ← ids; logits of the last (or all into out).
    void process(const int32_t* ids, size_t n, float* all_logits_out) {
        const int64_t vocab = model->config().n_vocab;
        size_t done = 0;
        while (done < n) {
            const size_t step = std::min<size_t>(n - done, static_cast<size_t>(prefill->max_tokens()));
            StepRunner& exe = step == 1 && !all_logits_out ? *decode : *prefill;
            StepInputs in;
            in.tokens = ids + done;
            in.n_tokens = static_cast<int64_t>(step);
            in.pos0 = static_cast<int64_t>(tokens.size());
            in.logits_out = all_logits_out ? all_logits_out + done * vocab : nullptr;
            running(exe);
            exe.run(in);
            tokens.insert(tokens.end(), ids + done, ids + done + step);
            logits = all_logits_out ? nullptr : exe.logits();
            logits_on_device = false;
            logits_from = &exe;
            done += step;
        }
    }

    // Longest prefix of the cache still usable for `ids` (a wrapped circular cache cannot rewind).
    size_t reusable_prefix(const int32_t* ids, size_t n) const {
        size_t common = 0;
        const size_t limit = std::min(n, tokens.size());
        while (common < limit && tokens[common] == ids[common]) ++common;
        if (common < tokens.size() && kv.circular && static_cast<int64_t>(tokens.size()) > kv.ring) return 0;
        return common;
    }
};

Session::Session(std::shared_ptr<Model> model) : impl_(std::make_unique<Impl>(std::move(model))) {}
Session::~Session() {
    if (impl_->chain) {
        try {
            impl_->decode->chain_end();  // steps still in flight use the session's buffers
        } catch (...) {
        }
    }
}

EvalMode Session::eval(const int32_t* ids, size_t n) {
    Impl& s = *impl_;
    settle();
    s.check(ids, n);
    size_t common = s.reusable_prefix(ids, n);
    if (common == n && n == s.tokens.size() && s.logits) return EvalMode::Cached;
    if (common == n) common = n - 1;  // the last token's logits must be recomputed
    const bool had_prefix = common > 0;
    rewind(common);
    s.process(ids + common, n - common, nullptr);
    if (!had_prefix) return EvalMode::Reset;
    return n - common == 1 ? EvalMode::Decode : EvalMode::Extend;
}

void Session::eval_all(const int32_t* ids, size_t n, float* out) {
    Impl& s = *impl_;
    settle();
    s.check(ids, n);
    rewind(0);
    s.process(ids, n, out);
}

void Session::append(int32_t token) {
    Impl& s = *impl_;
    settle();
    if (static_cast<int64_t>(s.tokens.size()) >= s.model->n_ctx())
        throw std::length_error("the context is full (" + std::to_string(s.model->n_ctx()) + " tokens)");
    if (token < 0 || token >= s.model->config().n_vocab)
        throw std::invalid_argument("token id " + std::to_string(token) + " is outside the vocabulary");
    s.process(&token, 1, nullptr);
}

namespace {
// Whether two parameter sets draw alike (an open chain of device draws goes on only with its own).
bool same_draws(const SamplingParams& a, const SamplingParams& b) {
    return a.temperature == b.temperature && a.top_k == b.top_k && a.top_p == b.top_p && a.min_p == b.min_p && a.seed == b.seed &&
           a.repetition_penalty == b.repetition_penalty && a.presence_penalty == b.presence_penalty &&
           a.frequency_penalty == b.frequency_penalty && a.penalty_last_n == b.penalty_last_n && a.logit_bias == b.logit_bias;
}
}  // namespace

int32_t Session::append_sampled(int32_t token, Sampler& sampler, int64_t ahead) {
    Impl& s = *impl_;
    const SamplingParams& p = sampler.params();
    if (s.chain && token == s.chain->next && s.chain->popped > 0 && s.chain->popped < s.chain->pushed && same_draws(p, s.chain->params))
        return chain_next();  // the open chain goes on
    settle();
    if (!s.decode->can_sample(p) || sampler.n_vocab() != s.model->config().n_vocab) {
        append(token);
        return sample(sampler);
    }
    if (static_cast<int64_t>(s.tokens.size()) >= s.model->n_ctx())
        throw std::length_error("the context is full (" + std::to_string(s.model->n_ctx()) + " tokens)");
    if (token < 0 || token >= s.model->config().n_vocab)
        throw std::invalid_argument("token id " + std::to_string(token) + " is outside the vocabulary");
    if (ahead > 0 && s.decode->chain_depth() > 0) {
        chain_open(p, token, ahead + 1);
        return chain_next();
    }
    return s.step_sampled(token, p);
}

void Session::rewind(size_t n) {
    Impl& s = *impl_;
    settle();
    if (n >= s.tokens.size()) return;
    s.tokens.resize(n);  // cache slots past n are simply overwritten later
    s.logits = nullptr;
    s.logits_on_device = false;
}

const float* Session::logits() const {
    settle();
    if (!impl_->logits && impl_->logits_on_device) {
        impl_->decode->fetch_logits();
        impl_->logits = impl_->decode->logits();
        impl_->logits_on_device = false;
    }
    if (!impl_->logits) throw std::logic_error("no logits: evaluate some tokens first");
    return impl_->logits;
}
size_t Session::logits_size() const { return static_cast<size_t>(impl_->model->config().n_vocab); }
const std::vector<int32_t>& Session::tokens() const { return impl_->tokens; }
int64_t Session::n_ctx() const { return impl_->model->n_ctx(); }

int32_t Session::sample(Sampler& sampler) const {
    Impl& s = *impl_;
    settle();
    const auto& t = s.tokens;
    // on a GPU, drawn there from the logits the last step left (a generation's first token: its
    // prompt's), as a sampled step draws; else on the host
    int32_t token = 0;
    if ((s.logits || s.logits_on_device) && s.logits_from && sampler.n_vocab() == s.model->config().n_vocab &&
        s.logits_from->can_sample(sampler.params()) &&
        s.logits_from->draw(sampler.params(), t.size(), static_cast<int64_t>(t.size()) - 1, &token))
        return token;
    return sampler.sample(logits(), t.data(), t.size(), t.size());
}

std::vector<int32_t> Session::generate(Sampler& sampler, int64_t max_tokens, const std::vector<int32_t>& stop_ids) {
    std::vector<int32_t> out;
    out.reserve(static_cast<size_t>(std::max<int64_t>(0, max_tokens)));
    int32_t tok = max_tokens > 0 ? sample(sampler) : 0;
    Impl& s = *impl_;
    if (max_tokens > 1 && s.decode->chain_depth() > 0 && s.decode->can_sample(sampler.params()) &&
        sampler.n_vocab() == s.model->config().n_vocab)
        return generate_chained(sampler.params(), tok, max_tokens, stop_ids);
    for (int64_t i = 0; i < max_tokens; ++i) {
        out.push_back(tok);
        if (std::find(stop_ids.begin(), stop_ids.end(), tok) != stop_ids.end()) break;
        if (static_cast<int64_t>(impl_->tokens.size()) >= n_ctx()) break;
        if (i + 1 == max_tokens) append(tok);
        else tok = append_sampled(tok, sampler);  // on a GPU: the next token drawn on the device
    }
    return out;
}

// generate()'s loop with the draws chained on the device: the same tokens, steps and final state
// (tokens appended, logits of the last appended token), but the runner keeps several steps in
// flight, each fed its input by the previous one's draw, while the host checks the oldest's.
std::vector<int32_t> Session::generate_chained(const SamplingParams& params, int32_t first, int64_t max_tokens,
                                               const std::vector<int32_t>& stop_ids) {
    Impl& s = *impl_;
    auto stops = [&](int32_t t) { return std::find(stop_ids.begin(), stop_ids.end(), t) != stop_ids.end(); };
    std::vector<int32_t> out{first};
    if (stops(first) || static_cast<int64_t>(s.tokens.size()) >= n_ctx()) return out;
    chain_open(params, first, max_tokens - 1);
    bool stopped = false;
    while (!stopped && s.chain->popped < s.chain->limit) {
        out.push_back(chain_next());
        stopped = stops(out.back());
    }
    settle();
    if (!stopped && static_cast<int64_t>(out.size()) == max_tokens && static_cast<int64_t>(s.tokens.size()) < n_ctx())
        append(out.back());
    return out;
}

void Session::chain_open(const SamplingParams& params, int32_t first, int64_t draws) {
    Impl& s = *impl_;
    Impl::Chain c;
    c.params = params;
    c.first = c.next = first;
    c.base = static_cast<int64_t>(s.tokens.size());
    c.limit = std::min<int64_t>(draws, n_ctx() - c.base);
    s.chain = c;
    try {
        while (s.chain->pushed < std::min<int64_t>(c.limit, s.decode->chain_depth())) s.push();
    } catch (...) {
        s.decode->chain_end();
        s.chain.reset();
        throw;
    }
}

// The oldest step in flight: its token joins the session, its draw comes back, and another step
// goes in flight if the chain has more.
int32_t Session::chain_next() {
    Impl& s = *impl_;
    Impl::Chain& c = *s.chain;
    try {
        const int32_t drawn = s.decode->chain_pop();
        s.tokens.push_back(c.next);
        ++c.popped;
        c.next = drawn;
        s.logits = nullptr;
        s.logits_on_device = true;  // (the last taken step's, once the steps past it are settled)
        s.logits_from = s.decode.get();
        if (c.pushed < c.limit) s.push();
        return drawn;
    } catch (...) {
        s.decode->chain_end();
        s.chain.reset();
        throw;
    }
}

// Ends an open chain: steps past the taken ones ran too (their cache slots are past the session's
// tokens, overwritten later), so the last taken token is decoded again for its logits.
void Session::settle() const {
    Impl& s = *impl_;
    if (!s.chain) return;
    const Impl::Chain c = *s.chain;
    s.chain.reset();
    s.decode->chain_end();
    if (c.pushed > c.popped) {
        s.logits = nullptr;
        s.logits_on_device = false;
        if (s.tokens.empty()) return;
        const int32_t last = s.tokens.back();
        s.tokens.pop_back();
        s.process(&last, 1, nullptr);
    }
}

}  // namespace edgerunner
