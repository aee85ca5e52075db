// The CUDA backend's step runner. At prepare time the plan's ops are fused into steps (RMSNorm
// that also quantizes its row for the next matmuls; Q, K and V as one GEMV (in a one-token step
// also where V has another format than Q and K: pairs_with_next); RoPE + KV write
// (in a one-token step of llama-style RoPE, done by the Q, K and V GEMVs as they store their
// rows: rope_folds); attention that quantizes its output; gate + up + activation as one GEMV
// (in a small one-token step also writing the down projection's int8 input:
// quantizes_for_next); the residual added by the GEMV that produces it, which in a one-token step
// also writes the next RMSNorm's int8 copy unit by unit, so no norm kernel runs: norm_by_producer;
// elsewhere in small one-token steps the norm folded into the GEMVs that read it: norm_folds; the
// first layer's norm written by the embedding: norm_by_embed), and each step becomes one or two
// kernel launches (launch.cuh).
// Per-step values (first position, tokens, sampling parameters) live in a device step block
// that one copy from pinned memory fills, so the one-token step can be replayed unchanged:
//   eager             the launches' arguments encoded and launched every step;
//   argument_buffers  every launch's arguments written once into a device table; each step
//                     launches the same kernels pointing at their table entries;
//   recorded          the whole one-token step captured once as a CUDA graph and replayed;
//                     generation chains three sampled steps in flight (chain_push / chain_pop).
// Prefill steps (several tokens) run eagerly in every mode; from 16 tokens on their quantized
// matmuls take the tensor-core GEMM (gemm.cu), which reads a bf16 copy of its input.
#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "attention.cuh"
#include "check.cuh"
#include "cuda.h"
#include "gemv.cuh"
#include "ops.cuh"
#include "sample.cuh"

namespace edgerunner::cuda {
namespace {

struct FreeHost {
    void operator()(void* p) const noexcept { cudaFreeHost(p); }
};
template <typename T>
std::unique_ptr<T, FreeHost> pinned_alloc(size_t bytes) {
    void* p = nullptr;
    ER_CUDA(cudaMallocHost(&p, bytes));
    return std::unique_ptr<T, FreeHost>(static_cast<T*>(p));
}

size_t weight_bytes(const Weight& w) { return static_cast<size_t>(w.rows) * w.row_bytes; }  // in the file
size_t device_bytes(const Weight& w) { return static_cast<size_t>(w.rows) * device_row_bytes(w.type, w.cols); }
size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// A new T whose construction and release run on `gpu` (OnGpu): its device memory, streams and
// graphs belong there, and freeing them there touches no other GPU.
template <class T, class... A>
std::shared_ptr<T> make_on(int gpu, A&&... args) {
    const OnGpu on(gpu);
    return std::shared_ptr<T>(new T(std::forward<A>(args)...), [gpu](T* p) {
        const OnGpu on(gpu, std::nothrow);
        delete p;
    });
}

}  // namespace

struct DeviceModel {
    int gpu = 0;  // the CUDA device it lives on
    DevicePtr<uint8_t> memory;
    std::unordered_map<const uint8_t*, const uint8_t*> at;  // host (mapped file) → device
    const uint8_t* operator()(const Weight* w) const { return w ? at.at(w->data) : nullptr; }
};

// Every weight the plans use, into one allocation, through two pinned staging buffers: the CPU
// copies chunk i+1 out of the mapped file while the GPU pulls chunk i; each weight then put into
// the layout the kernels read (to_device_layout: Q4_0's, Q5_0's, Q8_0's and IQ4_NL's blocks
// grouped, Q4_K's and Q6_K's rearranged), in place, or from a landing buffer where its rows grow
// (the grouped formats' padded to whole groups).
std::shared_ptr<DeviceModel> upload(const std::vector<const Plan*>& plans, int gpu) {
    if (const std::string why = unusable(gpu); !why.empty()) throw std::invalid_argument(why);
    auto m = make_on<DeviceModel>(gpu);
    const OnGpu on(gpu);
    m->gpu = gpu;
    std::vector<const Weight*> weights;
    size_t total = 0, landing = 0;
    for (const Plan* plan : plans)
        for (const Op& op : plan->ops)
            for (const Weight* w : {op.weight, op.bias})
                if (w && !m->at.count(w->data)) {
                    m->at[w->data] = nullptr;
                    weights.push_back(w);
                    total += round_up(device_bytes(*w), 256);
                    if (device_bytes(*w) != weight_bytes(*w)) landing = std::max(landing, weight_bytes(*w));
                }
    // (kernels may read a few bytes past a row: four-byte loads of 2-byte aligned blocks)
    constexpr const char* kSmaller = "Use a smaller quantization of the model, or backend='cpu'";
    m->memory = device_alloc<uint8_t>(total + 256, "the model's weights", kSmaller);
    auto land = device_alloc<uint8_t>(landing, "the weights' landing buffer", kSmaller);
    constexpr size_t kChunk = 32u << 20;
    auto staging = pinned_alloc<uint8_t>(2 * kChunk);
    cudaStream_t stream = nullptr;
    cudaEvent_t done[2] = {};
    ER_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (cudaEvent_t& e : done) ER_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    int buffer = 0;
    bool used[2] = {};
    size_t offset = 0;
    for (const Weight* w : weights) {
        uint8_t* dst = m->memory.get() + offset;
        m->at[w->data] = dst;
        // (the landing buffer is free: the stream runs the previous weight's layout kernel first)
        uint8_t* to = device_bytes(*w) == weight_bytes(*w) ? dst : land.get();
        for (size_t pos = 0; pos < weight_bytes(*w); pos += kChunk) {
            const size_t n = std::min(kChunk, weight_bytes(*w) - pos);
            uint8_t* stage = staging.get() + buffer * kChunk;
            if (used[buffer]) ER_CUDA(cudaEventSynchronize(done[buffer]));  // its previous copy is done
            std::memcpy(stage, w->data + pos, n);
            ER_CUDA(cudaMemcpyAsync(to + pos, stage, n, cudaMemcpyHostToDevice, stream));
            ER_CUDA(cudaEventRecord(done[buffer], stream));
            used[buffer] = true;
            buffer ^= 1;
        }
        to_device_layout(w->type, to, dst, w->rows, w->cols, stream);
        offset += round_up(device_bytes(*w), 256);
    }
    ER_CUDA(cudaStreamSynchronize(stream));
    for (cudaEvent_t e : done) cudaEventDestroy(e);
    cudaStreamDestroy(stream);
    return m;
}

// K and V slots per layer in the cache precision, each layer with its own capacity: KVCache's
// layout, byte for byte, in device memory.
struct DeviceKv {
    KvType type = KvType::F16;
    size_t slot_bytes = 0;          // one slot's K (or V)
    std::vector<int64_t> capacity;  // per layer
    std::vector<size_t> offset;     // per layer: K slots, then V slots
    DevicePtr<uint8_t> memory;
    DevicePtr<int32_t> history;     // n_ctx: the token at each position (the embedding writes it; penalize reads it)
    uint8_t* k(int64_t layer) const { return memory.get() + offset[static_cast<size_t>(layer)]; }
    uint8_t* v(int64_t layer) const { return k(layer) + static_cast<size_t>(capacity[static_cast<size_t>(layer)]) * slot_bytes; }
};

std::shared_ptr<DeviceKv> make_kv(const KVCache& layout, const DeviceModel& weights) {
    if (layout.type == KvType::Q8_0 && layout.head_dim % 32 != 0)
        throw std::invalid_argument("a q8_0 KV cache needs head sizes that are multiples of 32; use f16");
    auto kv = make_on<DeviceKv>(weights.gpu);
    const OnGpu on(weights.gpu);
    kv->type = layout.type;
    kv->slot_bytes = layout.row_bytes;
    for (int64_t l = 0; l < layout.n_layer; ++l) {
        kv->capacity.push_back(layout.capacity_of(l));
        kv->offset.push_back(layout.layer_offset[static_cast<size_t>(l)]);
    }
    if (const size_t free = gpu_free_bytes(); free && layout.bytes() > free) throw OutOfMemory(layout.too_big(free, current_gpu()));
    kv->memory = device_alloc<uint8_t>(layout.bytes(), "the KV cache", "Load the model with a smaller n_ctx or kv_type='q8_0'");
    ER_CUDA(cudaMemset(kv->memory.get(), 0, layout.bytes()));
    kv->history = device_alloc<int32_t>(static_cast<size_t>(layout.n_ctx));
    return kv;
}

namespace {

// The step block: what changes from one step to the next.
struct StepBlock {
    int64_t pos0;
    uint64_t seq;             // one more each one-token step (GemvTagged's tags)
    uint64_t sample_step;     // the sampler's RNG counter
    DeviceSampling sampling;  // the sampler's parameters
    int32_t sampled;          // the drawn token (device → host)
    int32_t tokens[1];        // max_tokens of them (allocated past the struct)
};

size_t step_block_bytes(int64_t max_tokens) { return sizeof(StepBlock) + static_cast<size_t>(max_tokens) * sizeof(int32_t); }

// What each launch of a step does, for measurements that leave some out (EDGERUNNER_CUDA_SKIP).
enum class Part { Embed, Norm, Quantize, Qkv, Rope, Attention, Out, GateUp, Act, Down, Head, Sample, Count };
constexpr const char* kPartNames[] = {"embed", "norm", "quantize", "qkv", "rope", "attention", "out", "gate_up", "act", "down", "head", "sample"};
static_assert(sizeof(kPartNames) / sizeof(kPartNames[0]) == static_cast<size_t>(Part::Count), "a name per part");

// EDGERUNNER_CUDA_SKIP=norm,attention,...: the parts every step leaves out, read at load (for
// measurements only: the step's results are then wrong; the time it saves is what those parts
// cost the step with everything else in place, which a profiler that serialises kernels cannot
// tell). Unknown names are refused.
uint32_t parts_to_skip() {
    const char* env = std::getenv("EDGERUNNER_CUDA_SKIP");
    uint32_t mask = 0;
    std::string list = env ? env : "";
    for (size_t start = 0; start < list.size();) {
        const size_t end = std::min(list.find(',', start), list.size());
        const std::string name = list.substr(start, end - start);
        start = end + 1;
        if (name.empty()) continue;
        int p = 0;
        while (p < static_cast<int>(Part::Count) && name != kPartNames[p]) ++p;
        if (p == static_cast<int>(Part::Count)) {
            std::string known;
            for (const char* n : kPartNames) known += std::string(known.empty() ? "" : ", ") + n;
            throw std::invalid_argument("EDGERUNNER_CUDA_SKIP: unknown part '" + name + "'; the parts are " + known);
        }
        mask |= 1u << p;
    }
    return mask;
}

// One fused unit of the plan: one kernel (two where a GEMV's input must be quantized first).
struct Step {
    enum Kind { Embed, Norm, HeadNorm, Gemv, RopeKv, Attention, Glu } kind;
    Op op;                     // the first op it covers
    const Op* parts[3] = {};   // Gemv: the matrices (same type, same input)
    int n_parts = 0;
    cuda::Glu glu = cuda::Glu::None;  // Gemv: parts are gate and up; Glu: the activation
    bool quantize = false;     // Gemv: quantize op.in first
    bool input_ready = false;  // Gemv: an earlier matmul's int8 (or, in prefill, bf16) copy of op.in is still valid (copy_ready)
    bool q_out = false;        // Norm, Attention: also write the quantized copy of the output
    bool local_rope = false;   // RopeKv
    int32_t layer = -1;        // RopeKv
    // decided once (fuse), for one-token steps:
    bool rope_by_gemv = false;  // RopeKv: done by the Q/K/V GEMVs before it (rope_folds)
    int32_t rope_step = -1;     // Gemv: the index of that RopeKv step, whose work it does
    bool q8_for_next = false;   // gated Gemv: writes the int8 copy the next GEMV reads (quantizes_for_next)
    int32_t tag_ordinal = -1;   // gated Gemv: stores its values tagged for the quantize kernel after it (tags_for_next), this
                                //   ordinal among the step's tagged launches
    bool pair_next = false;     // Gemv: one launch with the next step's GEMV (pairs_with_next, gemv_pairs)
    int32_t readers[3] = {};    // Norm: the GEMV steps that read its output (all of int8 formats, taking its int8 copy, or all
                                //   of float formats, taking the floats) ...
    int32_t n_readers = 0;      // ... and how many: none where the norm cannot be folded into them
    bool readers_q8 = false;    // ... and which: int8
    bool folded = false;        // Norm: folded into those GEMVs in one-token steps (norm_folds, decided at load)
    bool by_producer = false;   // Norm: its int8 copy written by the GEMV before it in one-token steps (norm_by_producer, at load)
    bool by_embed = false;      // Norm: its int8 copy written by the embedding before it in one-token steps (norm_by_embed, at load)
    int32_t norm_step = -1;     // Gemv: the Norm step whose output it reads, where that may fold in (norm_folds) or come
                                //   from the GEMV before the norm (norm_by_producer)
    size_t row_bytes = 0;       // Gemv, Embed: the weight's rows on the device (device_row_bytes), worked out here once
};

class Runner final : public StepRunner {
public:
    Runner(const ModelConfig& c, const Plan& plan, std::shared_ptr<DeviceModel> weights, std::shared_ptr<DeviceKv> kv,
           Dispatch dispatch)
        : c_(c), plan_(plan), w_(std::move(weights)), kv_(std::move(kv)), dispatch_(dispatch), overlap_(overlap_supported()), skip_(parts_to_skip()) {
        fuse();
        const int64_t q_dim = c_.n_head * c_.head_dim, kv_dim = c_.n_head_kv * c_.head_dim;
        const int64_t widths[kBufCount] = {c_.n_embd, c_.n_embd, q_dim, kv_dim, kv_dim, q_dim, c_.n_ff, c_.n_ff, c_.n_embd, c_.n_vocab};
        size_t total = 0;
        for (int b = 0; b < kBufCount; ++b) {
            width_[b] = widths[b];
            offset_[b] = total;  // 256-byte aligned rows of every buffer
            total += round_up(static_cast<size_t>(widths[b] * plan_.max_tokens), 64);
        }
        arena_ = device_alloc<float>(total);
        sample_scratch_ = device_alloc<double>(static_cast<size_t>(sample_scratch_words(static_cast<int32_t>(c_.n_vocab))));
        sample_best_ = device_alloc<unsigned long long>(2);
        ER_CUDA(cudaMemset(sample_best_.get(), 0, 2 * sizeof(unsigned long long)));
        sample_wide_ = device_alloc<WideState>(1);
        ER_CUDA(cudaMemset(sample_wide_.get(), 0, sizeof(WideState)));
        qbuf_ = device_alloc<uint8_t>(static_cast<size_t>(plan_.max_tokens * q_stride()) * qblock_bytes() + 256);  // GEMV reads whole 16 bytes
        qglu_ = device_alloc<uint8_t>(static_cast<size_t>(q_stride()) * qblock_bytes() + 256);
        if (plan_.max_tokens >= kPrefillKernelTokens) {
            hbuf_ = device_alloc<uint16_t>(static_cast<size_t>(plan_.max_tokens * h_stride()));
            hscale_ = device_alloc<float>(static_cast<size_t>(plan_.max_tokens));
        }
        const AttentionScratch scratch = attention_scratch(plan_.max_tokens, static_cast<int32_t>(c_.n_head),
                                                           static_cast<int32_t>(c_.n_head_kv), static_cast<int32_t>(c_.head_dim));
        attn_partial_ = device_alloc<float>(static_cast<size_t>(scratch.partial));
        attn_done_ = device_alloc<int32_t>(static_cast<size_t>(scratch.counters));
        ER_CUDA(cudaMemset(attn_done_.get(), 0, static_cast<size_t>(scratch.counters) * sizeof(int32_t)));
        block_ = device_alloc<uint8_t>(step_block_bytes(plan_.max_tokens));
        host_block_ = pinned_alloc<StepBlock>(step_block_bytes(plan_.max_tokens));
        // RoPE inverse frequencies: the global base's, then the local layers' base's
        std::vector<float> inv = rope_inv_freq(c_, plan_, false);
        const std::vector<float> local = rope_inv_freq(c_, plan_, true);
        inv.insert(inv.end(), local.begin(), local.end());
        inv_freq_ = device_alloc<float>(inv.size());
        ER_CUDA(cudaMemcpy(inv_freq_.get(), inv.data(), inv.size() * sizeof(float), cudaMemcpyHostToDevice));
        ER_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        if (chain_depth() > 0) {
            chain_blocks_ = device_alloc<uint8_t>(kChain * round_up(step_block_bytes(1), 256));
            ER_CUDA(cudaMemset(chain_blocks_.get(), 0, kChain * round_up(step_block_bytes(1), 256)));
            chain_host_ = pinned_alloc<StepBlock>(kChain * sizeof(StepBlock));  // (the samplers write their draws here)
            for (cudaEvent_t& e : chain_done_) ER_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        }
        logits_ = pinned_alloc<float>(static_cast<size_t>(c_.n_vocab) * sizeof(float));
        launches_.reserve(steps_.size() * 2 + 4);
        // (once the buffers' widths and the step block exist: one-token steps have one shape)
        qnorm_ = device_alloc<uint8_t>(static_cast<size_t>(c_.n_embd / 32) * qblock_bytes() + 256);
        qnorm_ss_ = device_alloc<float>(static_cast<size_t>(c_.n_embd / 32));
        for (size_t k = 0; k < steps_.size(); ++k) {
            steps_[k].by_embed = norm_by_embed(k);
            steps_[k].by_producer = !steps_[k].by_embed && norm_by_producer(k, reinterpret_cast<StepBlock*>(block_.get()));
            steps_[k].folded = !steps_[k].by_embed && !steps_[k].by_producer && norm_folds(k, reinterpret_cast<StepBlock*>(block_.get()));
        }
        uint32_t n_tagged = 0;
        int64_t tagged_rows = 0;
        for (size_t k = 0; k < steps_.size() && n_tagged < kTagOrdinals; ++k)
            if (tags_for_next(k, reinterpret_cast<StepBlock*>(block_.get()))) {
                steps_[k].tag_ordinal = static_cast<int32_t>(n_tagged++);
                tagged_rows = std::max(tagged_rows, steps_[k].parts[0]->weight->rows);
            }
        if (n_tagged > 0) {  // (zero: no tag, as every tag has a sequence number from 1 on)
            tagged_ = device_alloc<uint64_t>(static_cast<size_t>(tagged_rows));
            ER_CUDA(cudaMemset(tagged_.get(), 0, static_cast<size_t>(tagged_rows) * sizeof(uint64_t)));
        }
    }
    ~Runner() override {
        try {
            trace_flush();  // (EDGERUNNER_CUDA_TRACE: the kernels' timeline so far, trace.cuh)
        } catch (const std::exception&) {
        }
        for (cudaGraphExec_t g : graph_)
            if (g) cudaGraphExecDestroy(g);
        for (auto& graphs : chain_graph_)
            for (cudaGraphExec_t g : graphs)
                if (g) cudaGraphExecDestroy(g);
        for (cudaEvent_t e : chain_done_)
            if (e) cudaEventDestroy(e);
        cudaStreamDestroy(stream_);
    }

    const float* logits() const override { return logits_.get(); }
    int64_t max_tokens() const override { return plan_.max_tokens; }

    bool can_sample(const SamplingParams&) const override { return true; }

    void fetch_logits() override {
        ER_CUDA(cudaMemcpyAsync(logits_.get(), row(Buf::LOGITS, last_row_), static_cast<size_t>(c_.n_vocab) * sizeof(float),
                                cudaMemcpyDeviceToHost, stream_));
        ER_CUDA(cudaStreamSynchronize(stream_));
    }

    // The sampler alone over the last run's last-token logits, launch by launch (a generation's
    // first token, drawn from its prompt's logits): 4 bytes back, not the logits.
    bool draw(const SamplingParams& p, uint64_t sample_step, int64_t last_pos, int32_t* token) override {
        host_block_->pos0 = last_pos;
        host_block_->sample_step = sample_step;
        host_block_->sampling = device_sampling(p);
        draw_launches_.clear();
        push_sampler(p, row(Buf::LOGITS, last_row_), 1, device_block(), nullptr, nullptr, &draw_launches_);
        ER_CUDA(cudaMemcpyAsync(block_.get(), host_block_.get(), sizeof(StepBlock), cudaMemcpyHostToDevice, stream_));
        for (const Launch& l : draw_launches_) enqueue(l, stream_, nullptr, overlap_);
        ER_CUDA(cudaMemcpyAsync(&host_block_->sampled, &device_block()->sampled, sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
        ER_CUDA(cudaStreamSynchronize(stream_));
        *token = checked_token(host_block_->sampled);
        return true;
    }

    void run(const StepInputs& in) override {
        const int64_t n = in.n_tokens;
        const bool sampling = in.sample != nullptr;
        if (sampling && in.logits_out) throw std::logic_error("device sampling is not with every token's logits");
        host_block_->pos0 = in.pos0;
        if (n == 1) host_block_->seq = ++seq_;
        if (sampling) {
            host_block_->sample_step = in.sample_step;
            host_block_->sampling = device_sampling(*in.sample);
        }
        std::memcpy(host_block_->tokens, in.tokens, static_cast<size_t>(n) * sizeof(int32_t));
        last_row_ = n - 1;
        const int ending = sampling ? 1 + variant(*in.sample) : 0;
        const bool replayable = n == 1 && !in.logits_out;
        if (replayable && dispatch_ == Dispatch::Recorded) {
            if (!graph_[ending]) record(in, &graph_[ending]);
            ER_CUDA(cudaGraphLaunch(graph_[ending], stream_));
        } else if (replayable && dispatch_ == Dispatch::ArgumentBuffers) {
            if (!table_[ending].memory) write_table(in, &table_[ending]);
            begin(n);
            const Table& t = table_[ending];
            for (size_t i = 0; i < t.launches.size(); ++i) enqueue(t.launches[i], stream_, t.memory.get() + t.offset[i], overlap_);
            end(in);
        } else {
            compile(in, &launches_, device_block());
            begin(n);
            for (const Launch& l : launches_) enqueue(l, stream_, nullptr, overlap_);
            end(in);
        }
        ER_CUDA(cudaStreamSynchronize(stream_));
        if (sampling) *in.sampled = checked_token(host_block_->sampled);
    }

    // Chained decode (recorded dispatch): kChain step blocks in a ring, each with its own graph
    // of the one-token sampled step whose draw is also the next block's input token, and whose
    // sampler writes the next block's header (position and RNG step one on, the same parameters)
    // and its draw into pinned host memory. A push replays its block's graph, after copying in
    // the header only where the previous step's did not write it (the chain's first step, or
    // other values); a pop waits for the oldest push. The stream thus holds nothing but the
    // graphs between two chained steps (no copies on the device's critical path).
    int chain_depth() const override { return dispatch_ == Dispatch::Recorded && plan_.max_tokens == 1 ? kChain : 0; }

    void chain_push(int64_t pos, const SamplingParams& p, uint64_t sample_step, const int32_t* first_token) override {
        const int k = static_cast<int>(pushed_ % kChain), v = variant(p);
        StepBlock* dev = chain_block(k);
        StepBlock& host = chain_host_.get()[k];
        host.pos0 = pos;
        host.seq = ++seq_;
        host.sample_step = sample_step;
        host.sampling = device_sampling(p);
        host.tokens[0] = first_token ? *first_token : 0;
        if (!chain_graph_[v][0]) record_chain(p, v);
        // the header, and the input token only for the chain's first step (the others' is the
        // previous step's draw, written on the device), unless the previous step wrote this one
        const StepBlock& prev = chain_host_.get()[(k + kChain - 1) % kChain];
        const bool written = pushed_ > 0 && !first_token && pos == prev.pos0 + 1 && host.seq == prev.seq + 1 &&
                             sample_step == prev.sample_step + 1 && prev.sampling == host.sampling;
        if (!written) {
            const size_t bytes = first_token ? sizeof(StepBlock) : offsetof(StepBlock, sampled);
            ER_CUDA(cudaMemcpyAsync(dev, &host, bytes, cudaMemcpyHostToDevice, stream_));
        }
        ER_CUDA(cudaGraphLaunch(chain_graph_[v][k], stream_));  // (its sampler writes host.sampled)
        ER_CUDA(cudaEventRecord(chain_done_[k], stream_));
        ++pushed_;
        last_row_ = 0;
    }

    int32_t chain_pop() override {
        if (popped_ == pushed_) throw std::logic_error("no chained step is pending");
        const int k = static_cast<int>(popped_ % kChain);
        ER_CUDA(cudaEventSynchronize(chain_done_[k]));
        ++popped_;
        return checked_token(chain_host_.get()[k].sampled);
    }

    void chain_end() override {
        ER_CUDA(cudaStreamSynchronize(stream_));
        popped_ = pushed_ = 0;
    }

private:
    static constexpr int kChain = 3;  // step blocks in flight

    // The kChain graphs of variant v, before any of them runs (what they read comes from their
    // blocks).
    void record_chain(const SamplingParams& p, int v) {
        ER_CUDA(cudaStreamSynchronize(stream_));
        for (int k = 0; k < kChain; ++k) {
            std::vector<Launch> launches;
            StepInputs in;
            in.n_tokens = 1;
            in.sample = &p;
            compile(in, &launches, chain_block(k), chain_block((k + 1) % kChain), &chain_host_.get()[k].sampled);
            capture(launches, &chain_graph_[v][k], [] {}, [] {});
        }
    }

    // A token the device drew, or the error where it found no finite logit (-1).
    static int32_t checked_token(int32_t token) {
        if (token < 0)
            throw std::invalid_argument("no finite logit to sample from: every logit is -inf or NaN after bias and penalties "
                                        "(the model's output is broken, or the bias bans every token)");
        return token;
    }

    // Whether a sampled step with p runs penalize before the sampler (bias or penalties).
    static bool penalized(const SamplingParams& p) { return !p.logit_bias.empty() || penalties_on(p); }
    // A sampled step's launches, by p: penalize before the sampler (1), the draw's two kernels
    // after it (2: a temperature), both, or neither.
    static int variant(const SamplingParams& p) { return penalized(p) + 2 * wide_draw(p); }

    // p's header for the step block; with bias or penalties, their buffers made (the first time)
    // and the bias table brought up to date (when p's bias differs from the last one sent: a copy
    // ordered on the stream, after the steps before it).
    DeviceSampling device_sampling(const SamplingParams& p) {
        if (!penalized(p)) return cuda::device_sampling(p, 0);
        if (!penalized_) {
            const size_t n = static_cast<size_t>(c_.n_vocab);
            penalized_ = device_alloc<float>(n);
            counts_ = device_alloc<int32_t>(n);
            ER_CUDA(cudaMemset(counts_.get(), 0, n * sizeof(int32_t)));
            bias_tokens_ = device_alloc<int32_t>(n);
            bias_values_ = device_alloc<float>(n);
        }
        if (p.logit_bias != bias_sent_) {
            const std::vector<std::pair<int32_t, float>> m = merged_bias(p.logit_bias);
            bias_host_tokens_.resize(m.size());
            bias_host_values_.resize(m.size());
            for (size_t i = 0; i < m.size(); ++i) {  // (token ids checked by the Sampler the session samples with)
                bias_host_tokens_[i] = m[i].first;
                bias_host_values_[i] = m[i].second;
            }
            if (!m.empty()) {
                ER_CUDA(cudaMemcpyAsync(bias_tokens_.get(), bias_host_tokens_.data(), m.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
                ER_CUDA(cudaMemcpyAsync(bias_values_.get(), bias_host_values_.data(), m.size() * sizeof(float), cudaMemcpyHostToDevice, stream_));
            }
            bias_sent_ = p.logit_bias;
        }
        return cuda::device_sampling(p, static_cast<int32_t>(bias_host_tokens_.size()));
    }
    StepBlock* chain_block(int k) const { return reinterpret_cast<StepBlock*>(chain_blocks_.get() + k * round_up(step_block_bytes(1), 256)); }

    // The launches' arguments in device memory, written once (argument_buffers dispatch).
    struct Table {
        std::vector<Launch> launches;
        std::vector<size_t> offset;
        DevicePtr<uint8_t> memory;
    };

    void fuse();
    // Whether the RoPE + KV write step k can be done by the one-token GEMVs right before it (they
    // compute all of Q, K and V): llama-style adjacent pairs, a cache of f16 or f32.
    bool rope_folds(size_t k) const;
    // Whether the gated GEMV step k can write the int8 copy of its output that the GEMV after it
    // reads (one token; gemv_quantizes_out), so no quantize kernel runs between them.
    bool quantizes_for_next(size_t k) const;
    // Whether step k, a one-token gate·up whose GEMV streams, stores its values tagged for the
    // quantize kernel before the next step's GEMV, which then reads them as they land (GemvTagged)
    // and writes its int8 copy to qglu_: where nothing else reads those values (decided at load).
    bool tags_for_next(size_t k, StepBlock* b) const;
    cuda::GemvTagged tagged_args(StepBlock* b) const { return cuda::GemvTagged{tagged_.get(), &b->seq}; }
    // Whether Gemv step k and the one after it run as one launch in one-token steps.
    bool pairs_with_next(size_t k) const;
    // The GEMV steps that read Norm step k's output, where every one of them (and nothing else)
    // does, as int8: Step::readers.
    void find_readers(size_t k);
    // Whether, in a one-token step, Norm step k is folded into the GEMVs that read it (each
    // normalizes its input itself, gemv_folds_norm: no norm kernel runs; Step::folded, asked at
    // load), and what they are given.
    bool norm_folds(size_t k, StepBlock* b) const;
    // Whether, in a one-token step, Norm step k's int8 copy is written by the GEMV step before it,
    // which adds the residual the norm reads (gemv_norms_out: no norm kernel runs; Step::by_producer,
    // asked at load), and read by the GEMVs after it from qnorm_.
    bool norm_by_producer(size_t k, StepBlock* b) const;
    // Whether, in a one-token step, Norm step k's int8 copy is written by the embedding before it
    // (EmbedArgs::q: no norm kernel runs, and the GEMVs after it read the copy as the norm kernel's;
    // Step::by_embed, asked at load). Taken before the two above: it leaves no work to its readers.
    bool norm_by_embed(size_t k) const;
    GemvNormOut norm_out(size_t k) const {
        return GemvNormOut{reinterpret_cast<const float*>((*w_)(steps_[k].op.weight)), reinterpret_cast<QBlock*>(qnorm_.get()), qnorm_ss_.get()};
    }
    GemvNorm folded_norm(size_t k) const {
        return GemvNorm{row(steps_[k].op.in, 0), reinterpret_cast<const float*>((*w_)(steps_[k].op.weight)), c_.norm_eps};
    }
    GemvArgs gemv_args(size_t k, int64_t n, int64_t first, StepBlock* b) const;
    // The fewest keys a token of this step sees in attention op `op`, where the step's launches
    // run once (several tokens: never recorded, never tabled); 0 for one-token steps.
    static int64_t fewest_keys(const Op& op, const StepInputs& in) {
        if (in.n_tokens == 1) return 0;
        return op.window > 0 ? std::min<int64_t>(in.pos0 + 1, op.window) : in.pos0 + 1;
    }
    // The step's launches against step block `b` (a chained step's draw also goes to `next`'s
    // input token, its header advanced into `next`'s, and the draw to `drawn`, pinned host memory).
    void compile(const StepInputs& in, std::vector<Launch>* out, StepBlock* b, StepBlock* next = nullptr, int32_t* drawn = nullptr) const;
    // The sampler's launches at the end of a step against block b (penalize first with bias or
    // penalties; the history's last token at b->pos0 + n - 1), over `logits`: the draw into
    // `drawn` (pinned host memory) or b->sampled, and with `next` that block's header too.
    void push_sampler(const SamplingParams& p, const float* logits, int64_t n, StepBlock* b, StepBlock* next, int32_t* drawn,
                      std::vector<Launch>* out) const;

    // The step block in, and the result out: the drawn token (4 bytes) or logits.
    void begin(int64_t n) {
        ER_CUDA(cudaMemcpyAsync(block_.get(), host_block_.get(), step_block_bytes(n), cudaMemcpyHostToDevice, stream_));
    }
    void end(const StepInputs& in) {
        const int64_t n = in.n_tokens, vocab = c_.n_vocab;
        if (in.sample) {
            ER_CUDA(cudaMemcpyAsync(&host_block_->sampled, &device_block()->sampled, sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
        } else if (in.logits_out) {
            ER_CUDA(cudaMemcpyAsync(in.logits_out, row(Buf::LOGITS, 0), static_cast<size_t>(n * vocab) * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream_));
        } else {
            ER_CUDA(cudaMemcpyAsync(logits_.get(), row(Buf::LOGITS, n - 1), static_cast<size_t>(vocab) * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream_));
        }
    }

    void record(const StepInputs& in, cudaGraphExec_t* graph) {
        std::vector<Launch> launches;
        compile(in, &launches, device_block());
        capture(launches, graph, [&] { begin(in.n_tokens); }, [&] { end(in); });
    }

    // `launches` (between what `before` and `after` enqueue) captured as one CUDA graph.
    template <typename Before, typename After>
    void capture(const std::vector<Launch>& launches, cudaGraphExec_t* graph, Before before, After after) {
        cudaGraph_t g = nullptr;
        ER_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
        before();
        for (const Launch& l : launches) enqueue(l, stream_, nullptr, overlap_);
        after();
        ER_CUDA(cudaStreamEndCapture(stream_, &g));
        const cudaError_t status = cudaGraphInstantiate(graph, g, 0);
        cudaGraphDestroy(g);
        ER_CUDA(status);
    }

    void write_table(const StepInputs& in, Table* t) {
        compile(in, &t->launches, device_block());
        size_t total = 0;
        for (const Launch& l : t->launches) {
            t->offset.push_back(total);
            total += round_up(l.args_size, 16);
        }
        std::vector<uint8_t> host(total);
        for (size_t i = 0; i < t->launches.size(); ++i)
            std::memcpy(host.data() + t->offset[i], t->launches[i].args, t->launches[i].args_size);
        t->memory = device_alloc<uint8_t>(total);
        ER_CUDA(cudaMemcpy(t->memory.get(), host.data(), total, cudaMemcpyHostToDevice));
    }

    StepBlock* device_block() const { return reinterpret_cast<StepBlock*>(block_.get()); }
    float* row(Buf b, int64_t t) const { return arena_.get() + offset_[static_cast<int>(b)] + t * width_[static_cast<int>(b)]; }
    int64_t width(Buf b) const { return width_[static_cast<int>(b)]; }
    // QBlocks per row of the int8 buffer: the widest input's, rounded up so that rows start on
    // 16-byte boundaries
    int64_t q_stride() const { return (widest_ / 32 + 3) / 4 * 4; }
    QBlock* qrow(int64_t t) const {
        return reinterpret_cast<QBlock*>(qbuf_.get() + static_cast<size_t>(t * q_stride()) * qblock_bytes());
    }
    // 16-bit values per row of the prefill GEMM's input buffer: rows on 16-byte boundaries
    int64_t h_stride() const { return (widest_ + 7) / 8 * 8; }
    uint16_t* hrow(int64_t t) const { return hbuf_.get() + t * h_stride(); }
    // Whether step k, over n tokens, is a matmul the tensor-core GEMM runs (its input then is
    // the bf16 copy, and no int8 one is needed).
    bool takes_gemm(size_t k, int64_t n) const {
        return k < steps_.size() && steps_[k].kind == Step::Gemv && gemm_takes(steps_[k].op.weight->type, n);
    }
    // Whether Gemv step k (input_ready), over n tokens, reads the copy of its input that step k − 1
    // left: an int8 format's GEMV or GEMM as this one (the int8 copy, or the GEMM's bf16 one). Not
    // where one takes the GEMM and the other the GEMV (a format whose stages do not fit the
    // device's blocks: Q6_K's on sm_89), or a float format's matmul came between.
    bool copy_ready(size_t k, int64_t n) const {
        if (!steps_[k].input_ready || k == 0) return false;
        const Step& p = steps_[k - 1];
        return p.kind == Step::Gemv && p.op.in == steps_[k].op.in && gemv_wants_q8(p.op.weight->type) && takes_gemm(k - 1, n) == takes_gemm(k, n);
    }

    const ModelConfig& c_;
    const Plan& plan_;
    std::shared_ptr<DeviceModel> w_;
    std::shared_ptr<DeviceKv> kv_;
    Dispatch dispatch_;
    bool overlap_;  // programmatic dependent launch between kernels
    uint32_t skip_;  // 1 << Part: what every step leaves out (parts_to_skip; measurements only)
    std::vector<Step> steps_;
    size_t offset_[kBufCount] = {};
    int64_t width_[kBufCount] = {};
    int64_t widest_ = 32;                // widest matmul input (the int8 and bf16 buffers' rows)
    DevicePtr<uint8_t> qbuf_;            // int8 activations of one buffer, max_tokens rows
    DevicePtr<uint8_t> qglu_;            // one row: gate·up's int8 copy from its GEMV (quantizes_for_next; its
                                         // blocks finish while others still read their input from qbuf_), or
                                         // from the quantize kernel reading its tagged values (tags_for_next)
    DevicePtr<uint64_t> tagged_;         // one row: a streamed gate·up's tagged values (tags_for_next)
    uint64_t seq_ = 0;                   // the last one-token step's sequence number (StepBlock::seq)
    DevicePtr<uint8_t> qnorm_;           // one row: a norm's int8 copy from the GEMV before it (by_producer; a buffer of
    DevicePtr<float> qnorm_ss_;          // its own, as that GEMV reads qbuf_), and its units' sums of squares
    DevicePtr<uint16_t> hbuf_;           // 16-bit activations of one buffer for the prefill GEMM, max_tokens rows (HalfArgs)
    DevicePtr<float> hscale_;            // and their per-token scales where they are f16
    DevicePtr<float> attn_partial_;      // the decode attention's partial results
    DevicePtr<int32_t> attn_done_;       // and its counters
    DevicePtr<float> arena_, inv_freq_;  // inv_freq_: the global base's, then the local base's
    DevicePtr<uint8_t> block_;                         // the device step block
    std::unique_ptr<StepBlock, FreeHost> host_block_;  // its pinned staging copy
    std::unique_ptr<float, FreeHost> logits_;
    DevicePtr<double> sample_scratch_;  // the sampler's candidates and search entries: sample_scratch_words
    DevicePtr<unsigned long long> sample_best_;  // the sampler's blocks' merged best, then their count
    DevicePtr<WideState> sample_wide_;           // the draw's histograms and counters
    // bias and penalties (made at the first step that has them): the logits after them, the
    // window's counts (zero between steps), the bias table (merged_bias: tokens rising) and the
    // bias last sent to it, as given, and as sent
    DevicePtr<float> penalized_;
    DevicePtr<int32_t> counts_;
    DevicePtr<int32_t> bias_tokens_;
    DevicePtr<float> bias_values_;
    std::vector<std::pair<int32_t, float>> bias_sent_;
    std::vector<int32_t> bias_host_tokens_;
    std::vector<float> bias_host_values_;
    cudaStream_t stream_ = nullptr;
    std::vector<Launch> launches_;       // eager: this step's launches (capacity kept)
    std::vector<Launch> draw_launches_;  // draw(): the sampler's (capacity kept)
    cudaGraphExec_t graph_[5] = {};      // recorded: the one-token step ending in logits, or in a drawn token (1 + its
                                         // sampling variant)
    DevicePtr<uint8_t> chain_blocks_;                  // chained decode: kChain step blocks
    std::unique_ptr<StepBlock, FreeHost> chain_host_;  // their pinned staging copies
    cudaGraphExec_t chain_graph_[4][kChain] = {};  // by sampling variant
    cudaEvent_t chain_done_[kChain] = {};
    uint64_t pushed_ = 0, popped_ = 0;
    Table table_[5];                     // argument_buffers: the same five
    int64_t last_row_ = 0;               // the last run's last token row
};

// Ops → steps, mirroring the CPU backend's prepare (cpu/executable.cpp), and where each
// matmul's int8 input comes from: the RMSNorm or attention right before writes it as it
// writes its output, else a quantize kernel runs first; a run of matmuls reading the same
// buffer quantizes it once.
void Runner::fuse() {
    const std::vector<Op>& ops = plan_.ops;
    Buf quantized = Buf::Count;
    for (size_t i = 0; i < ops.size(); ++i) {
        const Op& op = ops[i];
        Step s{};
        s.op = op;
        switch (op.kind) {
            case OpKind::Embed:
                s.kind = Step::Embed;
                s.row_bytes = device_row_bytes(op.weight->type, op.weight->cols);
                break;
            case OpKind::RmsNorm: s.kind = Step::Norm; break;
            case OpKind::HeadRmsNorm: s.kind = Step::HeadNorm; break;
            case OpKind::Attention:
                s.kind = Step::Attention;
                if (c_.head_dim > 256) throw std::invalid_argument("the CUDA attention kernel takes head sizes up to 256");
                break;
            case OpKind::SwiGLU: case OpKind::GeGLU:
                s.kind = Step::Glu;
                s.glu = op.kind == OpKind::GeGLU ? cuda::Glu::GELU : cuda::Glu::SiLU;
                break;
            case OpKind::Rope: case OpKind::KvStore:
                if (!(op.kind == OpKind::Rope && op.in == Buf::Q && i + 2 < ops.size() && ops[i + 1].kind == OpKind::Rope &&
                      ops[i + 1].in == Buf::K && ops[i + 2].kind == OpKind::KvStore))
                    throw std::logic_error("the CUDA backend runs rope(Q), rope(K) and kv_store as one step; the plan split them");
                s.kind = Step::RopeKv;
                s.local_rope = op.local_rope;
                s.layer = ops[i + 2].layer;
                i += 2;
                break;
            case OpKind::MatMul: {
                s.kind = Step::Gemv;
                const TensorType type = op.weight->type;
                s.row_bytes = device_row_bytes(type, op.weight->cols);
                if (!gemv_supports(type)) throw std::invalid_argument("the CUDA backend has no GEMV kernel for " + std::string(tensor_type_name(type)));
                if (op.weight->cols % 32 != 0) throw std::invalid_argument("CUDA GEMV needs a multiple of 32 columns");
                s.parts[s.n_parts++] = &op;
                auto joins = [&](const Op& o) {
                    return o.kind == OpKind::MatMul && o.in == op.in && !o.accumulate && o.tail == op.tail && o.weight->type == type &&
                           o.weight->cols == op.weight->cols && o.weight->row_bytes == op.weight->row_bytes;
                };
                while (!op.accumulate && s.n_parts < 3 && i + 1 < ops.size() && joins(ops[i + 1])) s.parts[s.n_parts++] = &ops[++i];
                if (s.n_parts == 2 && i + 1 < ops.size() && (ops[i + 1].kind == OpKind::SwiGLU || ops[i + 1].kind == OpKind::GeGLU) &&
                    ops[i + 1].in == s.parts[0]->out && s.parts[1]->out == Buf::UP && s.parts[0]->weight->rows == s.parts[1]->weight->rows) {
                    s.glu = ops[++i].kind == OpKind::GeGLU ? cuda::Glu::GELU : cuda::Glu::SiLU;
                }
                s.input_ready = gemv_wants_q8(type) && quantized == op.in;
                if (gemv_wants_q8(type) && quantized != op.in) {
                    Step* prev = steps_.empty() ? nullptr : &steps_.back();
                    const bool prev_writes = prev && prev->op.out == op.in && prev->op.tail == op.tail &&
                                             ((prev->kind == Step::Norm && !prev->op.accumulate) || (prev->kind == Step::Attention && c_.head_dim % 32 == 0));
                    if (prev_writes) prev->q_out = true;
                    else s.quantize = true;
                    quantized = op.in;
                }
                widest_ = std::max(widest_, op.weight->cols);  // (the float formats' GEMM reads the bf16 buffer too)
                break;
            }
        }
        // A step that writes the quantized buffer makes its int8 copy stale.
        bool writes = s.kind != Step::HeadNorm && s.kind != Step::Glu && s.kind != Step::RopeKv && s.op.out == quantized;
        for (int k = 0; k < s.n_parts; ++k) writes |= s.parts[k]->out == quantized;
        if (s.kind == Step::HeadNorm || s.kind == Step::Glu) writes = s.op.in == quantized;
        if (s.kind == Step::RopeKv) writes = quantized == Buf::Q || quantized == Buf::K;
        if (writes) quantized = Buf::Count;
        steps_.push_back(s);
    }
    // what one-token steps do differently, decided here rather than per step
    for (size_t k = 0; k < steps_.size(); ++k) {
        if (rope_folds(k)) {
            steps_[k].rope_by_gemv = true;
            for (size_t j = k; j-- > 0 && steps_[j].kind == Step::Gemv;) steps_[j].rope_step = static_cast<int32_t>(k);
        }
        steps_[k].q8_for_next = quantizes_for_next(k);
    }
    for (size_t k = 0; k < steps_.size(); ++k) steps_[k].pair_next = pairs_with_next(k);
    for (size_t k = 0; k < steps_.size(); ++k)
        if (steps_[k].kind == Step::Norm) find_readers(k);
}

void Runner::find_readers(size_t k) {
    Step& s = steps_[k];
    if (s.op.accumulate) return;  // (a norm into the residual)
    const Buf out = s.op.out;
    int32_t readers[3], n = 0;
    for (size_t j = k + 1; j < steps_.size(); ++j) {
        const Step& t = steps_[j];
        if (t.kind == Step::Gemv && t.op.in == out) {
            // all int8 readers of its int8 copy, or all float-format readers of the floats (one that
            // quantizes the float row itself, the copy made stale by a step between, reads the row)
            const TensorType type = t.op.weight->type;
            const bool q8 = gemv_wants_q8(type);
            if (!(q8 ? s.q_out && !t.quantize : float_weights(type) && !s.q_out) || (n > 0 && q8 != s.readers_q8) || n == 3) return;
            s.readers_q8 = q8;
            readers[n++] = static_cast<int32_t>(j);
            continue;
        }
        // anything else that reads it (or may: the RoPE step's Q, K and V, the gate's UP) ...
        if (t.op.in == out || (t.kind == Step::Glu && out == Buf::UP) ||
            (t.kind == Step::RopeKv && (out == Buf::Q || out == Buf::K || out == Buf::V)))
            return;
        // ... before the buffer is written again
        bool writes = t.op.out == out;
        for (int p = 0; p < t.n_parts; ++p) writes |= t.parts[p]->out == out;
        if (writes) break;
    }
    for (int i = 0; i < n; ++i) {
        s.readers[i] = readers[i];
        steps_[static_cast<size_t>(readers[i])].norm_step = static_cast<int32_t>(k);
    }
    s.n_readers = n;
}

bool Runner::norm_folds(size_t k, StepBlock* b) const {
    const Step& s = steps_[k];
    if (s.n_readers == 0) return false;
    for (int i = 0; i < s.n_readers; ++i) {
        const size_t j = static_cast<size_t>(s.readers[i]);
        if (steps_[j].op.weight->cols != width(s.op.in) || !gemv_folds_norm(steps_[j].op.weight->type, gemv_args(j, 1, 0, b))) return false;
    }
    return true;
}

bool Runner::norm_by_producer(size_t k, StepBlock* b) const {
    const Step& s = steps_[k];
    if (s.kind != Step::Norm || s.n_readers == 0 || !s.readers_q8 || k == 0) return false;
    const Step& p = steps_[k - 1];
    if (p.kind != Step::Gemv || !p.op.accumulate || p.n_parts != 1 || p.glu != cuda::Glu::None || p.parts[0]->out != s.op.in ||
        p.op.weight->rows != width(s.op.in) || width(s.op.in) != c_.n_embd)
        return false;
    for (int i = 0; i < s.n_readers; ++i)
        if (steps_[static_cast<size_t>(s.readers[i])].op.weight->cols != width(s.op.in)) return false;
    GemvArgs a = gemv_args(k - 1, 1, 0, b);
    a.norm_out = norm_out(k);
    return gemv_norms_out(p.op.weight->type, a);
}

bool Runner::norm_by_embed(size_t k) const {
    static const bool enabled = [] {  // (EDGERUNNER_CUDA_EMBED_NORM=0: never, for measurements)
        const char* env = std::getenv("EDGERUNNER_CUDA_EMBED_NORM");
        return !(env && std::string(env) == "0");
    }();
    const Step& s = steps_[k];
    return enabled && s.kind == Step::Norm && k == 1 && steps_[0].kind == Step::Embed && s.op.in == Buf::X && s.n_readers > 0 && s.readers_q8 &&
           width(Buf::X) % 32 == 0 && width(Buf::X) <= kEmbedNormMaxCols;
}

// Two GEMV steps in a row on the same input in two formats (Q·K, then a V of another type): one
// launch in a one-token step (where gemv_pairs takes their arguments).
bool Runner::pairs_with_next(size_t k) const {
    if (k + 1 >= steps_.size() || (k > 0 && steps_[k - 1].pair_next)) return false;
    const Step& s = steps_[k];
    const Step& t = steps_[k + 1];
    auto plain = [](const Step& g) {
        return g.kind == Step::Gemv && g.glu == cuda::Glu::None && !g.op.accumulate && !g.q8_for_next && !g.op.tail && gemv_wants_q8(g.op.weight->type);
    };
    return plain(s) && plain(t) && t.op.in == s.op.in && t.input_ready && t.op.weight->type != s.op.weight->type &&
           (s.rope_step < 0) == (t.rope_step < 0);
}

bool Runner::rope_folds(size_t k) const {
    const Step& r = steps_[k];
    if (r.kind != Step::RopeKv || c_.rope_style == RopeStyle::Neox || c_.head_dim % 2 != 0 ||
        (kv_->type != KvType::F16 && kv_->type != KvType::F32) || !kv_->k(r.layer) || !kv_->v(r.layer))
        return false;
    bool q = false, kk = false, v = false;
    for (size_t j = k; j-- > 0 && steps_[j].kind == Step::Gemv;) {
        const Step& g = steps_[j];  // (one token: the staged GEMV of an int8 format, gemv_ropes)
        if (g.glu != cuda::Glu::None || g.op.accumulate || !gemv_wants_q8(g.op.weight->type)) return false;
        for (int p = 0; p < g.n_parts; ++p) {
            q |= g.parts[p]->out == Buf::Q, kk |= g.parts[p]->out == Buf::K, v |= g.parts[p]->out == Buf::V;
            if (g.parts[p]->weight->rows % 2 != 0) return false;
        }
    }
    return q && kk && v;
}

bool Runner::quantizes_for_next(size_t k) const {
    if (k + 1 >= steps_.size()) return false;
    const Step& s = steps_[k];
    const Step& next = steps_[k + 1];
    if (s.kind != Step::Gemv || s.glu == cuda::Glu::None || next.kind != Step::Gemv || !next.quantize || next.op.in != s.parts[0]->out ||
        next.op.tail)
        return false;
    // (the copy goes to qglu_, not qbuf_: no later step may count on finding it in qbuf_)
    if (k + 2 < steps_.size() && steps_[k + 2].kind == Step::Gemv && steps_[k + 2].op.in == next.op.in && !steps_[k + 2].quantize) return false;
    GemvArgs a;
    a.glu = s.glu;
    a.part[0].rows = s.parts[0]->weight->rows;
    a.cols = s.op.weight->cols;
    return a.part[0].rows == next.op.weight->cols && gemv_quantizes_out(s.op.weight->type, a);
}

bool Runner::tags_for_next(size_t k, StepBlock* b) const {
    const Step& s = steps_[k];
    if (k + 1 >= steps_.size() || s.kind != Step::Gemv || s.glu == cuda::Glu::None || s.q8_for_next || (skip_ >> static_cast<int>(Part::GateUp) & 1u))
        return false;
    const Step& next = steps_[k + 1];
    const Buf out = s.parts[0]->out;
    if (next.kind != Step::Gemv || !next.quantize || next.op.in != out || next.op.tail) return false;
    // nothing after it reads the float values (or the int8 copy in qbuf_), up to their next writer
    for (size_t j = k + 2; j < steps_.size(); ++j) {
        const Step& t = steps_[j];
        if (t.op.in == out || (t.kind == Step::Glu && out == Buf::UP)) return false;
        bool writes = t.op.out == out;
        for (int p = 0; p < t.n_parts; ++p) writes |= t.parts[p]->out == out;
        if (writes) break;
    }
    GemvArgs a = gemv_args(k, 1, 0, b);
    if (s.norm_step >= 0 && steps_[static_cast<size_t>(s.norm_step)].folded) a.norm = folded_norm(static_cast<size_t>(s.norm_step));
    return gemv_tags_out(s.op.weight->type, a);
}

// Step k's GEMV arguments for a step of n tokens whose first row is `first`.
GemvArgs Runner::gemv_args(size_t k, int64_t n, int64_t first, StepBlock* b) const {
    const Step& s = steps_[k];
    const Op& op = s.op;
    const Weight& w = *op.weight;
    // the int8 input is in qglu_
    const bool from_glu = n == 1 && k > 0 && (steps_[k - 1].q8_for_next || steps_[k - 1].tag_ordinal >= 0);
    GemvArgs a;
    for (int i = 0; i < s.n_parts; ++i) {
        const Op& p = *s.parts[i];
        a.part[i] = GemvPart{(*w_)(p.weight), reinterpret_cast<const float*>((*w_)(p.bias)), row(p.out, first), p.weight->rows,
                             width(p.out)};
    }
    a.n_parts = s.n_parts;
    a.glu = s.glu;
    a.row_bytes = s.row_bytes;
    a.cols = w.cols;
    a.n_tokens = n - first;
    a.x = row(op.in, first);
    a.x_stride = width(op.in);
    a.xq = from_glu ? reinterpret_cast<QBlock*>(qglu_.get()) : qrow(first);
    a.xq_stride = q_stride();
    a.xh = hbuf_ ? hrow(first) : nullptr;
    a.xh_stride = h_stride();
    if (hbuf_ && gemm_f16_input(op.weight->type)) a.xh_scale = hscale_.get() + first;
    a.accumulate = op.accumulate;
    if (n == 1 && s.rope_step >= 0) {
        const Step& r = steps_[static_cast<size_t>(s.rope_step)];
        const int64_t l = r.layer;
        a.rope = GemvRope{&b->pos0, inv_freq_.get() + (r.local_rope ? c_.rope_dim / 2 : 0), c_.rope_linear_scale,
                          c_.rope_attn_factor, static_cast<int32_t>(c_.head_dim), static_cast<int32_t>(c_.rope_dim),
                          kv_->capacity[static_cast<size_t>(l)], kv_->slot_bytes, kv_->type == KvType::F16};
        for (int p = 0; p < s.n_parts; ++p) {
            const Buf o = s.parts[p]->out;
            a.part[p].rope = o == Buf::Q || o == Buf::K;
            a.part[p].cache = o == Buf::K ? kv_->k(l) : o == Buf::V ? kv_->v(l) : nullptr;
        }
    }
    if (n == 1 && s.q8_for_next) a.xq_out = reinterpret_cast<QBlock*>(qglu_.get());
    if (n == 1 && s.tag_ordinal >= 0) a.tagged = tagged_args(b), a.tag_ordinal = static_cast<uint32_t>(s.tag_ordinal);
    if (n == 1 && k + 1 < steps_.size() && steps_[k + 1].by_producer) a.norm_out = norm_out(k + 1);
    if (n == 1 && s.norm_step >= 0 && steps_[static_cast<size_t>(s.norm_step)].by_producer) {
        a.xq = reinterpret_cast<QBlock*>(qnorm_.get());
        a.xq_ss = qnorm_ss_.get();
        a.xq_eps = c_.norm_eps;
    }
    return a;
}

// The step's launches, arguments resolved against this step's size.
void Runner::compile(const StepInputs& in, std::vector<Launch>* out, StepBlock* b, StepBlock* next, int32_t* drawn) const {
    out->clear();
    const int64_t n = in.n_tokens;
    auto push = [&](Part part, const Launch& l) {
        if (!(skip_ >> static_cast<int>(part) & 1u)) out->push_back(l);
    };
    for (size_t k = 0; k < steps_.size(); ++k) {
        const Step& s = steps_[k];
        const Op& op = s.op;
        // tail ops (final norm, LM head) only for the rows whose logits are wanted
        const int64_t first = op.tail && !in.logits_out ? n - 1 : 0;
        switch (s.kind) {
            case Step::Embed: {
                EmbedArgs e{(*w_)(op.weight), s.row_bytes, op.weight->rows, op.weight->cols, b->tokens, n, row(Buf::X, 0), op.scale};
                e.history = kv_->history.get();
                e.pos0 = &b->pos0;
                if (n == 1 && k + 1 < steps_.size() && steps_[k + 1].by_embed) {  // with the norm's int8 copy
                    e.norm_w = reinterpret_cast<const float*>((*w_)(steps_[k + 1].op.weight));
                    e.eps = c_.norm_eps;
                    e.q = qrow(0);
                    e.q_stride = q_stride();
                }
                push(Part::Embed, embed(op.weight->type, e));
                break;
            }
            case Step::Norm: {
                if (n == 1 && (s.folded || s.by_producer || s.by_embed)) break;  // the kernels around it do its work
                const bool q_out = s.q_out && !takes_gemm(k + 1, n - first);
                // a one-token norm whose readers all take its int8 copy (find_readers) writes only that
                float* out = n == 1 && q_out && s.n_readers > 0 ? nullptr : row(op.out, first);
                push(Part::Norm, rms_norm(NormArgs{row(op.in, first), reinterpret_cast<const float*>((*w_)(op.weight)), out,
                                                   n - first, width(op.in), c_.norm_eps, op.accumulate, q_out ? qrow(first) : nullptr,
                                                   q_stride()}));
                break;
            }
            case Step::HeadNorm:
                push(Part::Norm, rms_norm(NormArgs{row(op.in, 0), reinterpret_cast<const float*>((*w_)(op.weight)), row(op.in, 0),
                                                   n * op.heads, c_.head_dim, c_.norm_eps, false, nullptr, 0}));
                break;
            case Step::Gemv: {
                const Weight& w = *op.weight;
                const bool from_glu = n == 1 && k > 0 && steps_[k - 1].q8_for_next;  // the int8 input is in qglu_ already
                const bool ready = copy_ready(k, n - first);
                GemvArgs a = gemv_args(k, n, first, b);
                if (takes_gemm(k, n - first)) {
                    // (F32 weights on Hopper's kernel multiply the float activations themselves)
                    if (!ready && gemm_operands(w.type, a) != GemmOperands::Tf32) {
                        const bool f16 = gemm_f16_input(w.type);
                        push(Part::Quantize, half_activations(HalfArgs{row(op.in, first), hrow(first), n - first, w.cols, width(op.in), h_stride(),
                                                                       f16, f16 ? hscale_.get() + first : nullptr}));
                    }
                } else if ((s.quantize || (s.input_ready && !ready)) && !from_glu) {
                    QuantizeArgs q{row(op.in, first), qrow(first), n - first, w.cols, width(op.in), q_stride()};
                    if (n == 1 && k > 0 && steps_[k - 1].tag_ordinal >= 0)  // (from gate·up's tagged values, into qglu_)
                        q.out = reinterpret_cast<QBlock*>(qglu_.get()), q.tagged = tagged_args(b),
                        q.tag_ordinal = static_cast<uint32_t>(steps_[k - 1].tag_ordinal);
                    push(Part::Quantize, quantize_activations(q));
                }
                if (n == 1 && s.norm_step >= 0 && steps_[static_cast<size_t>(s.norm_step)].folded) a.norm = folded_norm(static_cast<size_t>(s.norm_step));
                const Part part = op.tail ? Part::Head : s.glu != cuda::Glu::None ? Part::GateUp : !op.accumulate ? Part::Qkv
                                : op.in == Buf::ATT ? Part::Out : Part::Down;
                if (n == 1 && s.pair_next) {  // with the next step's GEMV as one launch
                    GemvArgs a2 = gemv_args(k + 1, n, first, b);
                    if (a.norm.x) a2.norm = a.norm;  // (both read the norm's output)
                    if (gemv_pairs(w.type, a, steps_[k + 1].op.weight->type, a2)) {
                        push(part, gemv_pair(w.type, a, steps_[k + 1].op.weight->type, a2));
                        ++k;
                        break;
                    }
                }
                push(part, gemv(w.type, a));
                break;
            }
            case Step::RopeKv: {
                if (n == 1 && s.rope_by_gemv) break;  // the GEMVs before it did it
                const int64_t l = s.layer;
                push(Part::Rope, rope_kv(kv_->type, RopeKvArgs{row(Buf::Q, 0), row(Buf::K, 0), row(Buf::V, 0), kv_->k(l), kv_->v(l),
                                                    inv_freq_.get() + (s.local_rope ? c_.rope_dim / 2 : 0), n, &b->pos0,
                                                    kv_->capacity[static_cast<size_t>(l)], kv_->slot_bytes, c_.rope_linear_scale, c_.rope_attn_factor,
                                                    static_cast<int32_t>(c_.n_head), static_cast<int32_t>(c_.n_head_kv),
                                                    static_cast<int32_t>(c_.head_dim), static_cast<int32_t>(c_.rope_dim),
                                                    c_.rope_style == RopeStyle::Neox}));
                break;
            }
            case Step::Attention: {
                const int64_t l = op.layer;
                const bool q_out = s.q_out && !takes_gemm(k + 1, n);
                push(Part::Attention, attention(kv_->type, AttentionArgs{row(op.in, 0), kv_->k(l), kv_->v(l), row(op.out, 0), q_out ? qrow(0) : nullptr,
                                                              q_stride(), n, &b->pos0, kv_->capacity[static_cast<size_t>(l)], op.window, kv_->slot_bytes,
                                                              static_cast<int32_t>(c_.n_head), static_cast<int32_t>(c_.n_head_kv),
                                                              static_cast<int32_t>(c_.head_dim), attn_partial_.get(), attn_done_.get()},
                                                       fewest_keys(op, in)));
                break;
            }
            case Step::Glu: push(Part::Act, glu(GluArgs{row(op.in, 0), row(Buf::UP, 0), n * width(op.in), s.glu})); break;
        }
    }
    if (in.sample) push_sampler(*in.sample, row(Buf::LOGITS, n - 1), n, b, next, drawn, out);
}

void Runner::push_sampler(const SamplingParams& p, const float* logits, int64_t n, StepBlock* b, StepBlock* next, int32_t* drawn,
                          std::vector<Launch>* out) const {
    if (skip_ >> static_cast<int>(Part::Sample) & 1u) return;
    if (penalized(p)) {  // the sampler reads the logits after bias and penalties
        out->push_back(penalize(PenaltyArgs{logits, penalized_.get(), static_cast<int32_t>(c_.n_vocab), &b->sampling, &b->pos0, n,
                                            kv_->history.get(), bias_tokens_.get(), bias_values_.get(), counts_.get()}));
        logits = penalized_.get();
    }
    SampleArgs a{logits, static_cast<int32_t>(c_.n_vocab), &b->sampling, &b->sample_step, sample_scratch_.get(),
                 sample_best_.get(), reinterpret_cast<unsigned*>(sample_best_.get() + 1), drawn ? drawn : &b->sampled};
    a.out_host = drawn != nullptr;
    if (wide_draw(p)) a.wide = sample_wide_.get();
    if (next) {
        a.next = next->tokens;
        a.pos0 = &b->pos0;
        a.next_pos0 = &next->pos0;
        a.seq = &b->seq;
        a.next_seq = &next->seq;
        a.next_step = &next->sample_step;
        a.next_params = &next->sampling;
    }
    const SampleLaunches s = sample(a);
    out->insert(out->end(), s.launch, s.launch + s.count);
}

}  // namespace

Dispatch parse_dispatch(const std::string& name) {
    if (name == "eager") return Dispatch::Eager;
    if (name == "argument_buffers") return Dispatch::ArgumentBuffers;
    if (name == "recorded" || name == "auto") return Dispatch::Recorded;
    throw std::invalid_argument("unknown dispatch mode '" + name + "'; choose eager, argument_buffers, recorded or auto");
}

std::string unsupported(const ModelConfig& c, const Plan& plan) {
    if (c.head_dim > 256) return "head sizes above 256";
    for (const Op& op : plan.ops)
        if (op.weight && (op.kind == OpKind::MatMul || op.kind == OpKind::Embed) && !gemv_supports(op.weight->type))
            return "weights of type " + std::string(tensor_type_name(op.weight->type));
    return "";
}

namespace {

// A Runner made, called and released with its GPU current (OnGpu), whichever device the calling
// thread has: one cudaGetDevice a call, and a switch only where it differs.
class OnGpuRunner final : public StepRunner {
public:
    OnGpuRunner(int gpu, std::unique_ptr<Runner> runner) : gpu_(gpu), runner_(std::move(runner)) {}
    ~OnGpuRunner() override {
        const OnGpu on(gpu_, std::nothrow);
        runner_.reset();
    }
    void run(const StepInputs& in) override {
        const OnGpu on(gpu_);
        runner_->run(in);
    }
    const float* logits() const override { return runner_->logits(); }
    int64_t max_tokens() const override { return runner_->max_tokens(); }
    bool can_sample(const SamplingParams& p) const override { return runner_->can_sample(p); }
    void fetch_logits() override {
        const OnGpu on(gpu_);
        runner_->fetch_logits();
    }
    bool draw(const SamplingParams& p, uint64_t sample_step, int64_t last_pos, int32_t* token) override {
        const OnGpu on(gpu_);
        return runner_->draw(p, sample_step, last_pos, token);
    }
    int chain_depth() const override { return runner_->chain_depth(); }
    void chain_push(int64_t pos, const SamplingParams& p, uint64_t sample_step, const int32_t* first_token) override {
        const OnGpu on(gpu_);
        runner_->chain_push(pos, p, sample_step, first_token);
    }
    int32_t chain_pop() override {
        const OnGpu on(gpu_);
        return runner_->chain_pop();
    }
    void chain_end() override {
        const OnGpu on(gpu_);
        runner_->chain_end();
    }

private:
    int gpu_;
    std::unique_ptr<Runner> runner_;
};

}  // namespace

std::unique_ptr<StepRunner> make_runner(const ModelConfig& config, const Plan& plan, std::shared_ptr<DeviceModel> weights,
                                        std::shared_ptr<DeviceKv> kv, Dispatch dispatch) {
    const int gpu = weights->gpu;
    const OnGpu on(gpu);
    auto runner = std::make_unique<Runner>(config, plan, std::move(weights), std::move(kv), dispatch);
    return std::make_unique<OnGpuRunner>(gpu, std::move(runner));
}

}  // namespace edgerunner::cuda
