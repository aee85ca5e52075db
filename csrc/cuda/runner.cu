// The CUDA backend's step runner: the plan's ops as kernel launches on one stream, weights and
// KV cache resident in device memory, scratch allocated once here. Per-step values (the first
// position, the tokens) live in a device step block that one copy from pinned memory fills, so
// the decode step can be recorded once as a CUDA graph and replayed ("recorded" dispatch);
// "eager" launches every op each step.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "check.cuh"
#include "cuda.h"
#include "gemv.cuh"
#include "ops.cuh"
#include "sample.cuh"

namespace edgerunner::cuda {
namespace {

struct Free {
    void operator()(void* p) const noexcept { cudaFree(p); }
};
template <typename T>
using DevicePtr = std::unique_ptr<T, Free>;

template <typename T>
DevicePtr<T> device_alloc(size_t count) {
    void* p = nullptr;
    ER_CUDA(cudaMalloc(&p, count * sizeof(T) + (count == 0)));
    return DevicePtr<T>(static_cast<T*>(p));
}

size_t weight_bytes(const Weight& w) { return static_cast<size_t>(w.rows) * w.row_bytes; }

}  // namespace

struct DeviceModel {
    DevicePtr<uint8_t> memory;
    std::unordered_map<const uint8_t*, const uint8_t*> at;  // host (mapped file) → device
    const uint8_t* operator()(const Weight* w) const { return w ? at.at(w->data) : nullptr; }
};

std::shared_ptr<DeviceModel> upload(const std::vector<const Plan*>& plans) {
    auto m = std::make_shared<DeviceModel>();
    std::vector<const Weight*> weights;
    size_t total = 0;
    for (const Plan* plan : plans)
        for (const Op& op : plan->ops)
            for (const Weight* w : {op.weight, op.bias})
                if (w && !m->at.count(w->data)) {
                    m->at[w->data] = nullptr;
                    weights.push_back(w);
                    total += (weight_bytes(*w) + 255) / 256 * 256;
                }
    m->memory = device_alloc<uint8_t>(total);
    size_t offset = 0;
    for (const Weight* w : weights) {
        uint8_t* dst = m->memory.get() + offset;
        ER_CUDA(cudaMemcpy(dst, w->data, weight_bytes(*w), cudaMemcpyHostToDevice));
        m->at[w->data] = dst;
        offset += (weight_bytes(*w) + 255) / 256 * 256;
    }
    return m;
}

struct DeviceKv {
    KVCache layout;  // geometry only (no host storage)
    DevicePtr<__half> memory;
    __half* k(int64_t layer) const { return memory.get() + (2 * layer) * layout.capacity * layout.kv_dim; }
    __half* v(int64_t layer) const { return memory.get() + (2 * layer + 1) * layout.capacity * layout.kv_dim; }
};

std::shared_ptr<DeviceKv> make_kv(const KVCache& layout) {
    if (!layout.uniform())
        throw std::invalid_argument("the CUDA backend keeps one KV capacity for every layer; this model mixes windowed and full layers");
    if (layout.type != KvType::F16)
        throw std::invalid_argument(std::string("KV cache type ") + kv_type_name(layout.type) +
                                    " is not available on the CUDA backend yet; use f16 (the default)");
    auto kv = std::make_shared<DeviceKv>(DeviceKv{KVCache(layout.type, layout.n_layer, layout.capacity,
                                                          layout.kv_dim / layout.head_dim, layout.head_dim, layout.circular, false),
                                                  nullptr});
    kv->memory = device_alloc<__half>(static_cast<size_t>(2 * layout.n_layer * layout.capacity * layout.kv_dim));
    ER_CUDA(cudaMemset(kv->memory.get(), 0, static_cast<size_t>(2 * layout.n_layer * layout.capacity * layout.kv_dim) * sizeof(__half)));
    return kv;
}

namespace {

// The step block: what changes from one step to the next.
struct StepBlock {
    int64_t pos0;
    uint64_t sample_step;     // the sampler's RNG counter
    DeviceSampling sampling;  // the sampler's parameters
    int32_t sampled;          // the drawn token (device → host)
    int32_t tokens[1];        // max_tokens of them (allocated past the struct)
};

size_t step_block_bytes(int64_t max_tokens) { return sizeof(StepBlock) + static_cast<size_t>(max_tokens) * sizeof(int32_t); }

class Runner final : public StepRunner {
public:
    Runner(const ModelConfig& c, const Plan& plan, std::shared_ptr<DeviceModel> weights, std::shared_ptr<DeviceKv> kv,
           Dispatch dispatch)
        : c_(c), plan_(plan), w_(std::move(weights)), kv_(std::move(kv)), dispatch_(dispatch) {
        // Which matmuls quantize their input first: the first of a run reading the same buffer
        // (Q, K, V from one normed row; gate and up), until an op writes that buffer again.
        Buf quantized = Buf::Count;
        for (const Op& op : plan_.ops) {
            bool quantize = false;
            if (op.kind == OpKind::MatMul) {
                gemv_check(op.weight->type);
                if (op.weight->cols % 32 != 0) throw std::invalid_argument("CUDA GEMV needs a multiple of 32 columns");
                if (gemv_wants_q8(op.weight->type) && op.in != quantized) {
                    quantize = true;
                    quantized = op.in;
                }
                widest_ = std::max(widest_, op.weight->cols);
            }
            if (op.kind == OpKind::Rope && op.weight) freq_factors_ = reinterpret_cast<const float*>(op.weight->data);
            const bool in_place = op.kind == OpKind::HeadRmsNorm || op.kind == OpKind::Rope || op.kind == OpKind::SwiGLU;
            const bool writes = op.kind != OpKind::KvStore && (in_place ? op.in : op.out) == quantized;
            if (writes) quantized = Buf::Count;
            quantize_before_.push_back(quantize);
        }
        const int64_t q_dim = c_.n_head * c_.head_dim, kv_dim = c_.n_head_kv * c_.head_dim;
        const int64_t widths[kBufCount] = {c_.n_embd, c_.n_embd, q_dim, kv_dim, kv_dim, q_dim, c_.n_ff, c_.n_ff, c_.n_embd, c_.n_vocab};
        size_t total = 0;
        for (int b = 0; b < kBufCount; ++b) {
            width_[b] = widths[b];
            offset_[b] = total;  // 256-byte aligned rows of every buffer
            total += (static_cast<size_t>(widths[b] * plan_.max_tokens) + 63) / 64 * 64;
        }
        arena_ = device_alloc<float>(total);
        sample_scratch_ = device_alloc<double>(static_cast<size_t>(c_.n_vocab));
        qbuf_ = device_alloc<uint8_t>(static_cast<size_t>(plan_.max_tokens * (widest_ / 32)) * qblock_bytes());
        block_ = device_alloc<uint8_t>(step_block_bytes(plan_.max_tokens));
        void* pinned = nullptr;
        ER_CUDA(cudaMallocHost(&pinned, step_block_bytes(plan_.max_tokens)));
        host_block_.reset(static_cast<StepBlock*>(pinned));
        // RoPE inverse frequencies exactly as the CPU backend computes them (float32 pow).
        std::vector<float> inv(static_cast<size_t>(c_.rope_dim / 2));
        for (int64_t i = 0; i < c_.rope_dim / 2; ++i) {
            inv[i] = 1.0f / std::pow(c_.rope_base, static_cast<float>(2 * i) / static_cast<float>(c_.rope_dim));
            if (freq_factors_) inv[i] /= freq_factors_[i];
        }
        inv_freq_ = device_alloc<float>(inv.size());
        ER_CUDA(cudaMemcpy(inv_freq_.get(), inv.data(), inv.size() * sizeof(float), cudaMemcpyHostToDevice));
        ER_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        float* host = nullptr;
        ER_CUDA(cudaMallocHost(&host, static_cast<size_t>(c_.n_vocab) * sizeof(float)));
        logits_.reset(host);
    }
    ~Runner() override {
        if (graph_) cudaGraphExecDestroy(graph_);
        if (graph_sampled_) cudaGraphExecDestroy(graph_sampled_);
        cudaStreamDestroy(stream_);
    }

    const float* logits() const override { return logits_.get(); }
    int64_t max_tokens() const override { return plan_.max_tokens; }

    bool can_sample(const SamplingParams& p) const override {
        return p.logit_bias.empty() && p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f;
    }

    void fetch_logits() override {
        ER_CUDA(cudaMemcpyAsync(logits_.get(), row(Buf::LOGITS, last_row_), static_cast<size_t>(c_.n_vocab) * sizeof(float),
                                cudaMemcpyDeviceToHost, stream_));
        ER_CUDA(cudaStreamSynchronize(stream_));
    }

    void run(const StepInputs& in) override {
        const int64_t n = in.n_tokens;
        const bool sampling = in.sample != nullptr;
        if (sampling && (!can_sample(*in.sample) || in.logits_out))
            throw std::logic_error("device sampling takes no bias or penalties, and not with every token's logits");
        host_block_->pos0 = in.pos0;
        if (sampling) {
            host_block_->sample_step = in.sample_step;
            host_block_->sampling = DeviceSampling{in.sample->temperature, in.sample->top_k, in.sample->top_p, in.sample->min_p,
                                                   in.sample->seed};
        }
        std::memcpy(host_block_->tokens, in.tokens, static_cast<size_t>(n) * sizeof(int32_t));
        last_row_ = n - 1;
        const bool replayable = dispatch_ == Dispatch::Recorded && n == 1 && !in.logits_out;
        cudaGraphExec_t& graph = sampling ? graph_sampled_ : graph_;
        if (replayable && !graph) {  // record the one-token step once (one graph per ending)
            cudaGraph_t g = nullptr;
            ER_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
            enqueue(in);
            ER_CUDA(cudaStreamEndCapture(stream_, &g));
            const cudaError_t status = cudaGraphInstantiate(&graph, g, 0);
            cudaGraphDestroy(g);
            ER_CUDA(status);
        }
        if (replayable) ER_CUDA(cudaGraphLaunch(graph, stream_));
        else enqueue(in);
        ER_CUDA(cudaStreamSynchronize(stream_));
        if (sampling) *in.sampled = host_block_->sampled;
    }

private:
    // The whole step on the stream: step block in, every op, then the logits out or the drawn
    // token (4 bytes).
    void enqueue(const StepInputs& in) {
        const int64_t n = in.n_tokens, vocab = c_.n_vocab;
        ER_CUDA(cudaMemcpyAsync(block_.get(), host_block_.get(), step_block_bytes(n), cudaMemcpyHostToDevice, stream_));
        for (size_t i = 0; i < plan_.ops.size(); ++i) exec(plan_.ops[i], in, quantize_before_[i]);
        if (in.sample) {
            StepBlock* b = reinterpret_cast<StepBlock*>(block_.get());
            sample(row(Buf::LOGITS, n - 1), static_cast<int32_t>(vocab), &b->sampling, &b->sample_step, sample_scratch_.get(),
                   &b->sampled, stream_);
            ER_CUDA(cudaMemcpyAsync(&host_block_->sampled, &b->sampled, sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
        } else if (in.logits_out) {
            ER_CUDA(cudaMemcpyAsync(in.logits_out, row(Buf::LOGITS, 0), static_cast<size_t>(n * vocab) * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream_));
        } else {
            ER_CUDA(cudaMemcpyAsync(logits_.get(), row(Buf::LOGITS, n - 1), static_cast<size_t>(vocab) * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream_));
        }
    }
    const int64_t* pos0() const { return &reinterpret_cast<const StepBlock*>(block_.get())->pos0; }
    const int32_t* tokens() const { return reinterpret_cast<const StepBlock*>(block_.get())->tokens; }

    struct FreeHost {
        void operator()(void* p) const noexcept { cudaFreeHost(p); }
    };

    static void gemv_check(TensorType type) {
        if (!gemv_supports(type)) throw std::invalid_argument("the CUDA backend has no GEMV kernel for " + std::string(tensor_type_name(type)));
    }
    float* row(Buf b, int64_t t) const { return arena_.get() + offset_[static_cast<int>(b)] + t * width_[static_cast<int>(b)]; }
    int64_t width(Buf b) const { return width_[static_cast<int>(b)]; }

    void exec(const Op& op, const StepInputs& in, bool quantize) {
        const int64_t n = in.n_tokens;
        // tail ops (final norm, LM head) only for the rows whose logits are wanted
        const int64_t first = op.tail && !in.logits_out ? n - 1 : 0;
        switch (op.kind) {
            case OpKind::Embed:
                return embed(op.weight->type, (*w_)(op.weight), op.weight->row_bytes, op.weight->cols, tokens(), n,
                             row(Buf::X, 0), stream_);
            case OpKind::RmsNorm:
                return rms_norm(row(op.in, first), reinterpret_cast<const float*>((*w_)(op.weight)), row(op.out, first), n - first,
                                width(op.in), c_.norm_eps, stream_);
            case OpKind::HeadRmsNorm:
                return rms_norm(row(op.in, 0), reinterpret_cast<const float*>((*w_)(op.weight)), row(op.in, 0), n * op.heads,
                                c_.head_dim, c_.norm_eps, stream_);
            case OpKind::MatMul: {
                GemvArgs a{(*w_)(op.weight), op.weight->row_bytes, op.weight->rows, op.weight->cols, row(op.in, first),
                           reinterpret_cast<const float*>((*w_)(op.bias)), row(op.out, first), op.accumulate};
                a.n_tokens = n - first;
                a.x_stride = width(op.in);
                a.y_stride = width(op.out);
                a.xq_stride = widest_ / 32;
                a.xq = reinterpret_cast<const QBlock*>(qbuf_.get() + static_cast<size_t>(first * a.xq_stride) * qblock_bytes());
                if (quantize)
                    quantize_activations(row(op.in, first), reinterpret_cast<QBlock*>(qbuf_.get() + static_cast<size_t>(first * a.xq_stride) * qblock_bytes()),
                                         n - first, op.weight->cols, width(op.in), a.xq_stride, stream_);
                return gemv_launch(op.weight->type, a, stream_);
            }
            case OpKind::Rope:
                if (op.in != Buf::Q) return;  // rope(Q) and rope(K) run as one launch, at rope(Q)
                return rope(RopeArgs{row(Buf::Q, 0), row(Buf::K, 0), inv_freq_.get(), n, pos0(), c_.rope_linear_scale,
                                     static_cast<int>(c_.n_head), static_cast<int>(c_.n_head_kv), static_cast<int>(c_.head_dim),
                                     static_cast<int>(c_.rope_dim), c_.rope_style == RopeStyle::Neox},
                            stream_);
            case OpKind::KvStore:
                return kv_store(row(Buf::K, 0), row(Buf::V, 0), kv_->k(op.layer), kv_->v(op.layer), n, pos0(),
                                kv_->layout.capacity, kv_->layout.kv_dim, stream_);
            case OpKind::Attention:
                return attention(AttentionArgs{row(op.in, 0), kv_->k(op.layer), kv_->v(op.layer), row(op.out, 0), n, pos0(),
                                               kv_->layout.capacity, op.window, static_cast<int>(c_.n_head),
                                               static_cast<int>(c_.n_head_kv), static_cast<int>(c_.head_dim)},
                                 stream_);
            case OpKind::SwiGLU: return swiglu(row(op.in, 0), row(Buf::UP, 0), n * width(op.in), stream_);
            case OpKind::GeGLU: throw std::logic_error("GeGLU on CUDA");  // refused by unsupported()
        }
    }

    const ModelConfig& c_;
    const Plan& plan_;
    std::shared_ptr<DeviceModel> w_;
    std::shared_ptr<DeviceKv> kv_;
    const float* freq_factors_ = nullptr;
    size_t offset_[kBufCount] = {};
    int64_t width_[kBufCount] = {};
    Dispatch dispatch_;
    std::vector<bool> quantize_before_;  // per op: quantize its input to int8 first
    int64_t widest_ = 0;                 // widest matmul input (the int8 buffer's row)
    DevicePtr<uint8_t> qbuf_;            // int8 activations of one buffer, max_tokens rows
    DevicePtr<float> arena_, inv_freq_;
    DevicePtr<uint8_t> block_;                      // the device step block
    std::unique_ptr<StepBlock, FreeHost> host_block_;  // its pinned staging copy
    std::unique_ptr<float, FreeHost> logits_;
    cudaStream_t stream_ = nullptr;
    cudaGraphExec_t graph_ = nullptr;          // the recorded one-token step, logits out
    cudaGraphExec_t graph_sampled_ = nullptr;  // the same, ending with a drawn token
    DevicePtr<double> sample_scratch_;         // the sampler's weights, n_vocab
    int64_t last_row_ = 0;                     // the last run's last token row
};

}  // namespace

Dispatch parse_dispatch(const std::string& name) {
    if (name == "eager") return Dispatch::Eager;
    if (name == "recorded" || name == "auto") return Dispatch::Recorded;
    throw std::invalid_argument("unknown dispatch mode '" + name + "'; choose eager, recorded or auto");
}

std::string unsupported(const ModelConfig& c, const Plan& plan) {
    if (c.rope_attn_factor != 1.0f) return "LongRoPE's attention factor";
    for (const Op& op : plan.ops) {
        if (op.kind == OpKind::GeGLU) return "GELU-gated feed-forward";
        if (op.kind == OpKind::RmsNorm && op.accumulate) return "post-norms into the residual";
        if (op.kind == OpKind::Embed && op.scale != 1.0f) return "scaled embeddings";
        if (op.kind == OpKind::Rope && op.local_rope) return "a second RoPE base for local layers";
    }
    return "";
}

std::unique_ptr<StepRunner> make_runner(const ModelConfig& config, const Plan& plan, std::shared_ptr<DeviceModel> weights,
                                        std::shared_ptr<DeviceKv> kv, Dispatch dispatch) {
    return std::make_unique<Runner>(config, plan, std::move(weights), std::move(kv), dispatch);
}

}  // namespace edgerunner::cuda
