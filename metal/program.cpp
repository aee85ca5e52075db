// The plan lowered to Metal kernels. Fusions, decided here once per plan:
//   - an RMSNorm whose output only feeds the matmuls right after it is not run: those matmuls
//     normalize their input on the fly (norm+QKV, final norm+LM head; kNormIn);
//   - consecutive matmuls of one type over one input (Q, K, V; phi3's row ranges) are one
//     dispatch of up to three parts;
//   - gate and up followed by SwiGLU/GeGLU are one dispatch writing act(gate)·up (kGlu);
//   - a matmul into the residual adds to it (kAccumulate): GEMV+residual;
//   - the per-head Q/K RMSNorm, RoPE of Q and K and the KV store of a layer are one dispatch
//     (kHeadNorm, kStoreKv);
// what does not match a pattern runs on its own kernel. Every matmul has a GEMV (few tokens)
// and a GEMM (simdgroup matrices, many tokens) kernel over the same argument table; attention
// a decode and a prefill kernel: the grid and kernel are chosen per step by its token count.
#include "program.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include "edgerunner/tensor_type.h"

namespace edgerunner::metal {
namespace {

static_assert(static_cast<int>(KvType::F32) == ER_KV_F32 && static_cast<int>(KvType::F16) == ER_KV_F16 &&
                  static_cast<int>(KvType::Q8_0) == ER_KV_Q8_0,
              "ER_KV_* number the KV types as KvType does");
static_assert(sizeof(void*) == 8, "argument tables hold 64-bit device addresses");

struct KernelInfo {
    const char* name;
    size_t args_bytes;
};
constexpr KernelInfo kKernels[] = {
#define ER_KERNEL(name, args, ops) {#name, sizeof(args)},
#include "kernels.def"
#undef ER_KERNEL
};

constexpr size_t kAlign = 256;  // argument tables and memory regions (constant-buffer offsets)
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
uint32_t div_up(int64_t a, int64_t b) { return static_cast<uint32_t>((a + b - 1) / b); }
uint32_t u32(int64_t v) { return static_cast<uint32_t>(v); }

// A device address in an argument struct's pointer field.
template <typename T>
T* device_ptr(uint64_t address) {
    return reinterpret_cast<T*>(static_cast<uintptr_t>(address));
}

// Which plan buffers an op reads and writes (for deciding what can be fused away).
bool reads(const Op& op, Buf b) {
    switch (op.kind) {
        case OpKind::Embed: return false;
        case OpKind::RmsNorm: case OpKind::MatMul: return op.in == b || (op.accumulate && op.out == b);
        case OpKind::HeadRmsNorm: case OpKind::Rope: case OpKind::Attention: return op.in == b;
        case OpKind::KvStore: return op.in == b || op.out == b;
        case OpKind::SwiGLU: case OpKind::GeGLU: return op.in == b || b == Buf::UP;
    }
    return true;
}
bool writes(const Op& op, Buf b) {
    switch (op.kind) {
        case OpKind::Embed: return b == Buf::X;
        case OpKind::RmsNorm: case OpKind::MatMul: case OpKind::Attention: return op.out == b;
        case OpKind::HeadRmsNorm: case OpKind::Rope: case OpKind::SwiGLU: case OpKind::GeGLU: return op.in == b;
        case OpKind::KvStore: return false;
    }
    return true;
}

std::string lower(std::string_view s) {
    std::string out(s);
    for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return out;
}

std::string layer_label(int32_t layer) { return layer >= 0 ? "layer " + std::to_string(layer) + ": " : ""; }

// The device sampler over the logits rows at memory offset `logits`, `stride` floats apart (the
// step's last token's row is read).
Step sample_step(std::string label, size_t logits, int64_t stride, size_t weights, size_t out, int64_t n_vocab) {
    Step s;
    s.label = std::move(label);
    s.tail = true;
    s.table_bytes = sizeof(er_sample_args);
    s.write_table = [=](const Addresses& at, void* table) {
        er_sample_args a;
        std::memset(&a, 0, sizeof a);
        a.logits = device_ptr<const float>(at.memory + logits);
        a.weights = device_ptr<float>(at.memory + weights);
        a.out = device_ptr<int32_t>(at.memory + out);
        a.n_vocab = u32(n_vocab);
        a.logits_stride = u32(stride);
        std::memcpy(table, &a, sizeof a);
    };
    s.launch = [](int64_t) {
        Launch l;
        l.kernel = "sample";
        l.threads = ER_THREADS_SAMPLE;
        return l;
    };
    return s;
}

// p's three sampler steps (p's memory offsets set): the sampler over the last logits row; penalize
// (that row after bias and penalties into penalized_logits, the window read from the history at
// `history`); the sampler over penalized_logits (one row: stride 0).
void add_sampler(Program& p, size_t weights, std::function<uint64_t(const Addresses&)> history) {
    p.sample = sample_step("sample", p.logits, p.n_vocab, weights, p.sampled, p.n_vocab);
    p.sample_penalized = sample_step("sample (after bias and penalties)", p.penalized_logits, 0, weights, p.sampled, p.n_vocab);
    Step& s = p.penalize;
    s.label = "penalize (logit bias, penalties)";
    s.tail = true;
    s.table_bytes = sizeof(er_penalize_args);
    const size_t logits = p.logits, out = p.penalized_logits, counts = p.counts, tokens = p.bias_tokens, values = p.bias_values;
    const int64_t n_vocab = p.n_vocab;
    s.write_table = [=](const Addresses& at, void* table) {
        er_penalize_args a;
        std::memset(&a, 0, sizeof a);
        a.logits = device_ptr<const float>(at.memory + logits);
        a.out = device_ptr<float>(at.memory + out);
        a.history = device_ptr<const int32_t>(history(at));
        a.bias_tokens = device_ptr<const int32_t>(at.memory + tokens);
        a.bias_values = device_ptr<const float>(at.memory + values);
        a.counts = device_ptr<int32_t>(at.memory + counts);
        a.n_vocab = u32(n_vocab);
        a.logits_stride = u32(n_vocab);
        std::memcpy(table, &a, sizeof a);
    };
    s.launch = [n_vocab](int64_t) {
        Launch l;
        l.kernel = "penalize";
        l.groups[0] = div_up(n_vocab, ER_PENALIZE_SLICE);
        l.threads = ER_THREADS_PENALIZE;
        return l;
    };
}

// penalize's buffers in a memory layout from `total` on; returns the new total.
size_t layout_penalize(Program& p, size_t total) {
    const size_t row = align_up(static_cast<size_t>(p.n_vocab) * 4);
    p.penalized_logits = total;
    p.counts = total + row;
    p.bias_tokens = total + 2 * row;
    p.bias_values = total + 3 * row;
    return total + 4 * row;
}

class Builder {
public:
    Builder(const ModelConfig& c, const Plan& plan, const KVCache& kv, bool fuse) : c_(c), plan_(plan), kv_(kv), fuse_(fuse) {}

    Program build() {
        p_.max_tokens = plan_.max_tokens;
        p_.n_vocab = c_.n_vocab;
        layout();
        const std::vector<Op>& ops = plan_.ops;
        std::vector<const Op*> norm_of(ops.size(), nullptr);  // per matmul: the RMSNorm fused into it
        for (size_t i = 0; i < ops.size();) {
            const Op& op = ops[i];
            switch (op.kind) {
                case OpKind::Embed: embed(op); ++i; break;
                case OpKind::RmsNorm: {
                    const size_t end = fuse_ ? norm_consumers(i) : i + 1;
                    if (end > i + 1) {
                        for (size_t j = i + 1; j < end; ++j) norm_of[j] = &op;
                    } else {
                        rms_norm(op, 1, width(op.in), width(op.out), c_.n_embd);
                    }
                    ++i;
                    break;
                }
                case OpKind::MatMul: i = matmul(i, norm_of[i]); break;
                case OpKind::HeadRmsNorm: case OpKind::Rope: case OpKind::KvStore: i = rope_group(i); break;
                case OpKind::Attention: attention(op); ++i; break;
                case OpKind::SwiGLU: case OpKind::GeGLU: glu(op); ++i; break;
            }
        }
        add_sampler(p_, sample_weights_, [history = kv_history_offset(kv_)](const Addresses& at) { return at.kv + history; });
        size_t offset = 0;
        for (Step* s : all_steps()) {
            s->table = offset;
            offset += align_up(s->table_bytes);
            // Every kernel name this program can emit is in the manifest, with this struct size.
            for (int64_t rows : {int64_t{1}, plan_.max_tokens}) {
                const Launch l = s->launch(rows);
                if (!kernel_takes(l.kernel, s->table_bytes))
                    throw std::logic_error("Metal program: step '" + s->label + "' launches '" + l.kernel +
                                           "', which metal/kernels.def does not list with a " +
                                           std::to_string(s->table_bytes) + "-byte argument struct");
            }
        }
        p_.tables_bytes = offset;
        return std::move(p_);
    }

private:
    std::vector<Step*> all_steps() {
        std::vector<Step*> out;
        for (Step& s : p_.steps) out.push_back(&s);
        for (Step* s : {&p_.sample, &p_.penalize, &p_.sample_penalized}) out.push_back(s);
        return out;
    }

    int64_t width(Buf b) const { return width_[static_cast<int>(b)]; }
    // Device address of token row t of buffer b, given the memory base.
    size_t row_offset(Buf b, int64_t t) const { return offset_[static_cast<int>(b)] + static_cast<size_t>(t * width(b)) * 4; }

    void layout() {
        const int64_t q_dim = c_.n_head * c_.head_dim, kv_dim = c_.n_head_kv * c_.head_dim;
        const int64_t widths[kBufCount] = {c_.n_embd, c_.n_embd, q_dim, kv_dim, kv_dim, q_dim, c_.n_ff, c_.n_ff, c_.n_embd, c_.n_vocab};
        size_t total = 0;
        for (int b = 0; b < kBufCount; ++b) {
            width_[b] = widths[b];
            offset_[b] = total;
            total += align_up(static_cast<size_t>(widths[b] * plan_.max_tokens) * 4);
        }
        p_.logits = offset_[static_cast<int>(Buf::LOGITS)];
        // RoPE inverse frequencies (core's rope_inv_freq): [0] rope_base, [1] the local layers'
        for (int b = 0; b < 2; ++b) {
            std::vector<float> inv = rope_inv_freq(c_, plan_, b == 1);
            if (inv.empty()) inv.push_back(0.0f);  // a constant of at least one value
            inv_freq_[b] = total;
            total += align_up(inv.size() * 4);
            p_.constants.emplace_back(inv_freq_[b], std::move(inv));
        }
        sample_weights_ = total;
        total += align_up(static_cast<size_t>(c_.n_vocab) * 4);
        total = layout_penalize(p_, total);
        p_.sampled = total;
        total += align_up(ER_STEP_SLOTS * 4);
        p_.memory_bytes = total;
        p_.step_block_bytes = align_up(sizeof(er_step_block) + static_cast<size_t>(plan_.max_tokens) * 4);
    }

    template <typename Args>
    Step& add(std::string label, bool tail, std::function<void(const Addresses&, Args&)> fill,
              std::function<Launch(int64_t)> launch) {
        Step s;
        s.label = std::move(label);
        s.tail = tail;
        s.table_bytes = sizeof(Args);
        s.write_table = [fill](const Addresses& at, void* table) {
            Args a;
            std::memset(&a, 0, sizeof a);
            fill(at, a);
            std::memcpy(table, &a, sizeof a);
        };
        s.launch = std::move(launch);
        p_.steps.push_back(std::move(s));
        return p_.steps.back();
    }

    static Launch make_launch(std::string kernel, const Constants& k, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t threads) {
        Launch l;
        l.kernel = std::move(kernel);
        l.constants = k;
        l.groups[0] = std::max(gx, 1u);
        l.groups[1] = std::max(gy, 1u);
        l.groups[2] = std::max(gz, 1u);
        l.threads = threads;
        return l;
    }

    void check_cols(const Weight& w) const {
        if (w.cols % 32 != 0)
            throw std::invalid_argument("the Metal backend reads rows in 32-element units; tensor '" + std::string(w.name) +
                                        "' has " + std::to_string(w.cols) + " columns");
    }

    void embed(const Op& op) {
        const Weight& w = *op.weight;
        check_cols(w);
        const size_t x = row_offset(Buf::X, 0);
        const uint32_t stride = u32(width(Buf::X));
        const float scale = op.scale;
        const size_t history = kv_history_offset(kv_);
        const std::string kernel = "embed_" + lower(tensor_type_name(w.type));
        add<er_embed_args>(
            "embed (" + std::string(tensor_type_name(w.type)) + ")", false,
            [&w, x, stride, scale, history](const Addresses& at, er_embed_args& a) {
                a.w = device_ptr<const uint8_t>(at.weight(w.data));
                a.x = device_ptr<float>(at.memory + x);
                a.row_bytes = u32(w.row_bytes);
                a.cols = u32(w.cols);
                a.x_stride = stride;
                a.scale = scale;
                a.history = device_ptr<int32_t>(at.kv + history);
            },
            [kernel](int64_t rows) { return make_launch(kernel, {}, u32(rows), 1, 1, ER_THREADS_EMBED); });
    }

    // Standalone RMSNorm: rows_per_token rows of n values per token (heads for HeadRmsNorm).
    void rms_norm(const Op& op, int64_t rows_per_token, int64_t x_stride, int64_t y_stride, int64_t n) {
        const size_t x = row_offset(op.in, 0), y = row_offset(op.kind == OpKind::HeadRmsNorm ? op.in : op.out, 0);
        const Weight& w = *op.weight;
        const float eps = c_.norm_eps;
        const bool tail = op.tail;
        Constants k;
        k.accumulate = op.accumulate;
        add<er_rms_norm_args>(
            layer_label(op.layer) + (op.kind == OpKind::HeadRmsNorm ? "head rms_norm" : "rms_norm"), tail,
            [=, &w](const Addresses& at, er_rms_norm_args& a) {
                a.x = device_ptr<const float>(at.memory + x);
                a.w = device_ptr<const float>(at.weight(w.data));
                a.y = device_ptr<float>(at.memory + y);
                a.n = u32(n);
                a.x_stride = u32(x_stride);
                a.y_stride = u32(y_stride);
                a.rows_per_token = u32(rows_per_token);
                a.tail = tail;
                a.eps = eps;
            },
            [k, rows_per_token](int64_t rows) { return make_launch("rms_norm", k, u32(rows * rows_per_token), 1, 1, ER_THREADS_RMS_NORM); });
    }

    // The matmuls after RMSNorm op i that read its output, if nothing after them does (before the
    // buffer is written again): returns one past the last, or i + 1 when the norm must run.
    size_t norm_consumers(size_t i) const {
        const std::vector<Op>& ops = plan_.ops;
        const Op& norm = ops[i];
        if (norm.accumulate) return i + 1;
        size_t end = i + 1;
        while (end < ops.size() && ops[end].kind == OpKind::MatMul && ops[end].in == norm.out && ops[end].tail == norm.tail &&
               !(ops[end].accumulate && ops[end].out == norm.out))
            ++end;
        for (size_t j = end; j < ops.size(); ++j) {
            if (reads(ops[j], norm.out)) return i + 1;
            if (writes(ops[j], norm.out)) break;
        }
        return end;
    }

    // Matmul op i and what fuses with it; returns the index after them.
    size_t matmul(size_t i, const Op* norm_op) {
        const std::vector<Op>& ops = plan_.ops;
        const Op& first = ops[i];
        std::vector<const Op*> parts{&first};
        size_t j = i + 1;
        while (fuse_ && !first.accumulate && parts.size() < 3 && j < ops.size() && ops[j].kind == OpKind::MatMul && ops[j].in == first.in &&
               !ops[j].accumulate && ops[j].tail == first.tail && ops[j].weight->type == first.weight->type &&
               ops[j].weight->cols == first.weight->cols && (ops[j].bias != nullptr) == (first.bias != nullptr))
            parts.push_back(&ops[j++]);
        uint32_t glu = ER_GLU_NONE;
        if (fuse_ && parts.size() == 2 && j < ops.size() && (ops[j].kind == OpKind::SwiGLU || ops[j].kind == OpKind::GeGLU) &&
            ops[j].in == parts[0]->out && parts[1]->out == Buf::UP && !first.bias &&
            parts[0]->weight->rows == parts[1]->weight->rows) {
            glu = ops[j].kind == OpKind::GeGLU ? ER_GLU_GELU : ER_GLU_SILU;
            ++j;
        }
        for (const Op* p : parts) check_cols(*p->weight);

        const Weight* norm = norm_op ? norm_op->weight : nullptr;
        const Weight& w0 = *first.weight;
        std::string label = layer_label(first.layer) + (norm ? "rms_norm + " : "") + "matmul";
        int64_t total_rows = 0;
        for (const Op* p : parts) {
            label += std::string(p == parts.front() ? " " : ",") + std::string(p->weight->name);
            total_rows += p->weight->rows;
        }
        if (glu) {
            label += glu == ER_GLU_GELU ? " + GeGLU" : " + SwiGLU";
            total_rows = w0.rows;
        }
        label += " (" + std::string(tensor_type_name(w0.type)) + ")";

        Constants k;
        k.accumulate = first.accumulate;
        k.has_bias = first.bias != nullptr;
        k.norm_in = norm != nullptr;
        k.glu = glu;
        // A fused norm's matmuls read the norm's input (its output is never written).
        const Buf in = norm_op ? norm_op->in : first.in;
        const size_t x = row_offset(in, 0);
        const int64_t x_stride = width(in);
        struct PartInfo {
            const Weight* w;
            const Weight* bias;
            size_t y;
            int64_t y_stride;
        };
        std::vector<PartInfo> info;
        for (const Op* p : parts) info.push_back({p->weight, p->bias, row_offset(p->out, 0), width(p->out)});
        const bool tail = first.tail;
        const float eps = c_.norm_eps;
        add<er_matmul_args>(
            label, tail,
            [=](const Addresses& at, er_matmul_args& a) {
                for (size_t n = 0; n < info.size(); ++n) {
                    er_matmul_part& part = a.part[n];
                    part.w = device_ptr<const uint8_t>(at.weight(info[n].w->data));
                    part.bias = info[n].bias ? device_ptr<const float>(at.weight(info[n].bias->data)) : nullptr;
                    part.y = device_ptr<float>(at.memory + info[n].y);
                    part.rows = u32(info[n].w->rows);
                    part.y_stride = u32(info[n].y_stride);
                }
                a.x = device_ptr<const float>(at.memory + x);
                a.norm_w = norm ? device_ptr<const float>(at.weight(norm->data)) : nullptr;
                a.n_parts = u32(info.size());
                a.rows = u32(total_rows);
                a.cols = u32(w0.cols);
                a.row_bytes = u32(w0.row_bytes);
                a.x_stride = u32(x_stride);
                a.tail = tail;
                a.norm_eps = eps;
            },
            matmul_launch(lower(tensor_type_name(w0.type)), k, total_rows, false));
        return j;
    }

    // GEMV below kGemmTokens tokens, GEMM from there (or always, for the ops tests).
    static std::function<Launch(int64_t)> matmul_launch(const std::string& type, const Constants& k, int64_t total_rows, bool force_gemm) {
        constexpr int64_t kGemmTokens = 4;
        return [=](int64_t rows) {
            if (force_gemm || rows >= kGemmTokens)
                return make_launch("gemm_" + type, k, div_up(total_rows, ER_GEMM_TILE), div_up(rows, ER_GEMM_TILE), 1, ER_THREADS_GEMM);
            const int64_t rows_per_group = ER_THREADS_GEMV / 32 * ER_GEMV_ROWS;
            return make_launch("gemv_" + type, k, div_up(total_rows, rows_per_group), u32(rows), 1, ER_THREADS_GEMV);
        };
    }

    // From op i: a layer's head norms, ropes and KV store, fused where they form the usual
    // sequence [head_norm(Q), head_norm(K)] rope(Q) rope(K) [kv_store]; returns the next index.
    size_t rope_group(size_t i) {
        const std::vector<Op>& ops = plan_.ops;
        size_t j = i;
        const Op *qn = nullptr, *kn = nullptr, *rq = nullptr, *rk = nullptr, *store = nullptr;
        if (fuse_ && j + 1 < ops.size() && ops[j].kind == OpKind::HeadRmsNorm && ops[j].in == Buf::Q && ops[j + 1].kind == OpKind::HeadRmsNorm &&
            ops[j + 1].in == Buf::K) {
            qn = &ops[j];
            kn = &ops[j + 1];
            j += 2;
        }
        if (fuse_ && j + 1 < ops.size() && ops[j].kind == OpKind::Rope && ops[j].in == Buf::Q && ops[j + 1].kind == OpKind::Rope &&
            ops[j + 1].in == Buf::K && ops[j].local_rope == ops[j + 1].local_rope) {
            rq = &ops[j];
            rk = &ops[j + 1];
            j += 2;
            if (j < ops.size() && ops[j].kind == OpKind::KvStore && ops[j].in == Buf::K && ops[j].out == Buf::V) store = &ops[j++];
        }
        if (!rq) {  // no pattern: the first op on its own
            const Op& op = ops[i];
            if (op.kind == OpKind::HeadRmsNorm) rms_norm(op, op.heads, c_.head_dim, c_.head_dim, c_.head_dim);
            else if (op.kind == OpKind::Rope) rope(&op, nullptr, nullptr, nullptr, nullptr);
            else kv_store(op);
            return i + 1;
        }
        rope(rq, rk, qn, kn, store);
        return j;
    }

    // RoPE over Q and/or K heads, optionally normalizing them first and storing K and V after.
    void rope(const Op* rq, const Op* rk, const Op* qn, const Op* kn, const Op* store) {
        if (rq && rq->in == Buf::K) std::swap(rq, rk);  // a lone rope of K
        const Op& any = rq ? *rq : *rk;
        const int32_t layer = any.layer;
        Constants k;
        k.neox = c_.rope_style == RopeStyle::Neox;
        k.head_norm = qn != nullptr || kn != nullptr;
        k.store_kv = store != nullptr;
        k.kv_type = static_cast<uint32_t>(kv_.type);
        std::string label = layer_label(layer) + (k.head_norm ? "head rms_norm + " : "") + "rope" + (rq ? " Q" : "") + (rk ? " K" : "") +
                            (store ? " + kv_store" : "");
        const size_t q = row_offset(Buf::Q, 0), kk = row_offset(Buf::K, 0), v = row_offset(Buf::V, 0);
        const size_t inv = inv_freq_[any.local_rope ? 1 : 0];
        const uint32_t n_head = rq ? u32(c_.n_head) : 0, n_head_kv = rk ? u32(c_.n_head_kv) : 0;
        const Weight* q_norm = qn ? qn->weight : nullptr;
        const Weight* k_norm = kn ? kn->weight : nullptr;
        const size_t k_cache = kv_.layer_offset[static_cast<size_t>(layer)];
        const size_t v_cache = k_cache + static_cast<size_t>(kv_.capacity_of(layer)) * kv_.row_bytes;
        const ModelConfig& c = c_;
        const KVCache& kv = kv_;
        const int64_t q_stride = width(Buf::Q), k_stride = width(Buf::K), v_stride = width(Buf::V);
        add<er_rope_args>(
            label, false,
            [=, &c, &kv](const Addresses& at, er_rope_args& a) {
                a.q = n_head ? device_ptr<float>(at.memory + q) : nullptr;
                a.k = n_head_kv ? device_ptr<float>(at.memory + kk) : nullptr;
                a.v = device_ptr<const float>(at.memory + v);
                a.inv_freq = device_ptr<const float>(at.memory + inv);
                a.q_norm_w = q_norm ? device_ptr<const float>(at.weight(q_norm->data)) : nullptr;
                a.k_norm_w = k_norm ? device_ptr<const float>(at.weight(k_norm->data)) : nullptr;
                a.k_cache = device_ptr<uint8_t>(at.kv + k_cache);
                a.v_cache = device_ptr<uint8_t>(at.kv + v_cache);
                a.n_head = n_head;
                a.n_head_kv = n_head_kv;
                a.head_dim = u32(c.head_dim);
                a.rope_dim = u32(c.rope_dim);
                a.q_stride = u32(q_stride);
                a.k_stride = u32(k_stride);
                a.v_stride = u32(v_stride);
                a.capacity = u32(kv.capacity_of(layer));
                a.slot_bytes = u32(kv.row_bytes);
                a.pos_scale = c.rope_linear_scale;
                a.attn_factor = c.rope_attn_factor;
                a.norm_eps = c.norm_eps;
            },
            [k, n_head, n_head_kv](int64_t rows) { return make_launch("rope", k, u32(rows), n_head + n_head_kv, 1, ER_THREADS_ROPE); });
        if (qn && !rq) throw std::logic_error("Metal program: a Q head norm without a rope of Q");
    }

    void kv_store(const Op& op) {
        const int32_t layer = op.layer;
        Constants k;
        k.kv_type = static_cast<uint32_t>(kv_.type);
        const size_t kk = row_offset(Buf::K, 0), v = row_offset(Buf::V, 0);
        const size_t k_cache = kv_.layer_offset[static_cast<size_t>(layer)];
        const size_t v_cache = k_cache + static_cast<size_t>(kv_.capacity_of(layer)) * kv_.row_bytes;
        const KVCache& kv = kv_;
        const int64_t hd = c_.head_dim, n_head_kv = c_.n_head_kv, k_stride = width(Buf::K), v_stride = width(Buf::V);
        add<er_kv_store_args>(
            layer_label(layer) + "kv_store", false,
            [=, &kv](const Addresses& at, er_kv_store_args& a) {
                a.k = device_ptr<const float>(at.memory + kk);
                a.v = device_ptr<const float>(at.memory + v);
                a.k_cache = device_ptr<uint8_t>(at.kv + k_cache);
                a.v_cache = device_ptr<uint8_t>(at.kv + v_cache);
                a.n_head_kv = u32(n_head_kv);
                a.head_dim = u32(hd);
                a.k_stride = u32(k_stride);
                a.v_stride = u32(v_stride);
                a.capacity = u32(kv.capacity_of(layer));
                a.slot_bytes = u32(kv.row_bytes);
            },
            [k, n_head_kv](int64_t rows) { return make_launch("kv_store", k, u32(rows), u32(n_head_kv), 1, ER_THREADS_ROPE); });
    }

    void attention(const Op& op) {
        const int32_t layer = op.layer;
        Constants k;
        k.kv_type = static_cast<uint32_t>(kv_.type);
        const size_t q = row_offset(op.in, 0), out = row_offset(op.out, 0);
        const size_t k_cache = kv_.layer_offset[static_cast<size_t>(layer)];
        const size_t v_cache = k_cache + static_cast<size_t>(kv_.capacity_of(layer)) * kv_.row_bytes;
        const KVCache& kv = kv_;
        const ModelConfig& c = c_;
        const int64_t window = op.window, q_stride = width(op.in), out_stride = width(op.out);
        const uint32_t n_head = u32(c_.n_head);
        add<er_attention_args>(
            layer_label(layer) + "attention" + (window ? " (window " + std::to_string(window) + ")" : ""), false,
            [=, &kv, &c](const Addresses& at, er_attention_args& a) {
                a.q = device_ptr<const float>(at.memory + q);
                a.k_cache = device_ptr<const uint8_t>(at.kv + k_cache);
                a.v_cache = device_ptr<const uint8_t>(at.kv + v_cache);
                a.out = device_ptr<float>(at.memory + out);
                a.n_head = u32(c.n_head);
                a.n_head_kv = u32(c.n_head_kv);
                a.head_dim = u32(c.head_dim);
                a.q_stride = u32(q_stride);
                a.out_stride = u32(out_stride);
                a.capacity = u32(kv.capacity_of(layer));
                a.window = u32(window);
                a.slot_bytes = u32(kv.row_bytes);
                a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
            },
            [k, n_head](int64_t rows) {
                if (rows == 1) return make_launch("attention_decode", k, 1, n_head, 1, ER_THREADS_ATTENTION);
                return make_launch("attention_prefill", k, div_up(rows, ER_ATTENTION_QUERIES), n_head, 1, ER_THREADS_ATTENTION);
            });
    }

    void glu(const Op& op) {
        const size_t g = row_offset(op.in, 0), u = row_offset(Buf::UP, 0);
        const int64_t w = width(op.in), g_stride = width(op.in), u_stride = width(Buf::UP);
        const std::string kernel = op.kind == OpKind::GeGLU ? "geglu" : "swiglu";
        add<er_glu_args>(
            layer_label(op.layer) + kernel, false,
            [=](const Addresses& at, er_glu_args& a) {
                a.g = device_ptr<float>(at.memory + g);
                a.u = device_ptr<const float>(at.memory + u);
                a.width = u32(w);
                a.g_stride = u32(g_stride);
                a.u_stride = u32(u_stride);
            },
            [kernel, w](int64_t rows) { return make_launch(kernel, {}, div_up(w, ER_THREADS_GLU), u32(rows), 1, ER_THREADS_GLU); });
    }

    const ModelConfig& c_;
    const Plan& plan_;
    const KVCache& kv_;
    const bool fuse_;
    Program p_;
    int64_t width_[kBufCount] = {};
    size_t offset_[kBufCount] = {};
    size_t inv_freq_[2] = {};
    size_t sample_weights_ = 0;
};

}  // namespace

bool Constants::operator==(const Constants& o) const {
    return accumulate == o.accumulate && has_bias == o.has_bias && norm_in == o.norm_in && neox == o.neox &&
           head_norm == o.head_norm && store_kv == o.store_kv && glu == o.glu && kv_type == o.kv_type;
}

std::string Constants::key() const {
    return "acc=" + std::to_string(accumulate) + " bias=" + std::to_string(has_bias) + " norm=" + std::to_string(norm_in) +
           " glu=" + std::to_string(glu) + " kv=" + std::to_string(kv_type) + " neox=" + std::to_string(neox) +
           " hnorm=" + std::to_string(head_norm) + " store=" + std::to_string(store_kv);
}

std::vector<uint8_t> Program::tables(const Addresses& at) const {
    std::vector<uint8_t> out(tables_bytes, 0);
    for (const Step& s : steps) s.write_table(at, out.data() + s.table);
    for (const Step* s : {&sample, &penalize, &sample_penalized})
        if (s->write_table) s->write_table(at, out.data() + s->table);  // (a matmul program has none)
    return out;
}

int64_t Program::rows(const Step& s, const StepInputs& in) {
    return s.tail && !in.logits_out ? 1 : in.n_tokens;
}

Program build_program(const ModelConfig& c, const Plan& plan, const KVCache& kv, bool fuse) {
    const std::string missing = unsupported(c, plan);
    if (!missing.empty()) throw std::invalid_argument("the Metal backend cannot run this model: " + missing);
    return Builder(c, plan, kv, fuse).build();
}

std::string unsupported(const ModelConfig& c, const Plan& plan) {
    if (c.head_dim > ER_ATTENTION_MAX_HEAD_DIM)
        return "head size " + std::to_string(c.head_dim) + " (the attention kernels take up to " +
               std::to_string(ER_ATTENTION_MAX_HEAD_DIM) + ")";
    if (c.n_head % c.n_head_kv != 0) return "a query head count that is not a multiple of the KV head count";
    for (const Op& op : plan.ops)
        if ((op.kind == OpKind::MatMul || op.kind == OpKind::Embed) && op.weight->cols % 32 != 0)
            return "tensor '" + std::string(op.weight->name) + "' with " + std::to_string(op.weight->cols) +
                   " columns (not a multiple of 32)";
    return "";
}

size_t kv_history_offset(const KVCache& kv) { return align_up(kv.bytes()); }
size_t kv_buffer_bytes(const KVCache& kv) { return kv_history_offset(kv) + static_cast<size_t>(kv.n_ctx) * sizeof(int32_t); }

bool penalized(const SamplingParams& p) { return !p.logit_bias.empty() || penalties_on(p); }

uint32_t write_bias_table(const Program& p, const std::vector<std::pair<int32_t, float>>& logit_bias, uint8_t* memory) {
    const std::vector<std::pair<int32_t, float>> m = merged_bias(logit_bias);
    auto* tokens = reinterpret_cast<int32_t*>(memory + p.bias_tokens);
    auto* values = reinterpret_cast<float*>(memory + p.bias_values);
    for (size_t i = 0; i < m.size(); ++i) {
        if (m[i].first < 0 || m[i].first >= p.n_vocab)
            throw std::invalid_argument("logit_bias token id " + std::to_string(m[i].first) + " is outside the vocabulary [0, " +
                                        std::to_string(p.n_vocab) + ")");
        tokens[i] = m[i].first;
        values[i] = m[i].second;
    }
    return static_cast<uint32_t>(m.size());
}

void write_step_block(const StepInputs& in, uint32_t slot, void* dst, uint32_t n_bias) {
    er_step_block b;
    std::memset(&b, 0, sizeof b);
    b.pos0 = static_cast<int32_t>(in.pos0);
    b.n_tokens = static_cast<int32_t>(in.n_tokens);
    b.first_row = in.logits_out ? 0 : static_cast<int32_t>(in.n_tokens - 1);
    b.slot = slot;
    if (in.sample) {
        b.temperature = in.sample->temperature;
        b.top_k = in.sample->top_k;
        b.top_p = in.sample->top_p;
        b.min_p = in.sample->min_p;
        b.seed = in.sample->seed;
        b.sample_step = in.sample_step;
        b.repetition_penalty = 1.0f;
        if (penalties_on(*in.sample)) {  // (else a window of 0: penalize adds the bias only)
            b.repetition_penalty = in.sample->repetition_penalty;
            b.presence_penalty = in.sample->presence_penalty;
            b.frequency_penalty = in.sample->frequency_penalty;
            b.penalty_last_n = in.sample->penalty_last_n;
        }
        b.n_bias = n_bias;
    }
    std::memcpy(dst, &b, sizeof b);
    std::memcpy(static_cast<uint8_t*>(dst) + sizeof b, in.tokens, static_cast<size_t>(in.n_tokens) * sizeof(int32_t));
}

Program matmul_program(TensorType type, int64_t rows, size_t row_bytes, int64_t cols, int64_t n_tokens, bool gemm) {
    if (cols % 32 != 0) throw std::invalid_argument("matmul_program: columns must be a multiple of 32");
    Program p;
    p.max_tokens = n_tokens;
    p.n_vocab = rows;
    p.logits = align_up(static_cast<size_t>(n_tokens * cols) * 4);
    p.sampled = p.logits + align_up(static_cast<size_t>(n_tokens * rows) * 4);
    p.memory_bytes = p.sampled + align_up(ER_STEP_SLOTS * 4);
    p.step_block_bytes = align_up(sizeof(er_step_block) + static_cast<size_t>(n_tokens) * 4);
    const std::string name = lower(tensor_type_name(type));
    const size_t y = p.logits;
    Step s;
    s.label = "matmul (" + std::string(tensor_type_name(type)) + ")";
    s.table_bytes = sizeof(er_matmul_args);
    s.write_table = [=](const Addresses& at, void* table) {
        er_matmul_args a;
        std::memset(&a, 0, sizeof a);
        a.part[0].w = device_ptr<const uint8_t>(at.weight(nullptr));
        a.part[0].y = device_ptr<float>(at.memory + y);
        a.part[0].rows = u32(rows);
        a.part[0].y_stride = u32(rows);
        a.x = device_ptr<const float>(at.memory);
        a.n_parts = 1;
        a.rows = u32(rows);
        a.cols = u32(cols);
        a.row_bytes = u32(row_bytes);
        a.x_stride = u32(cols);
        std::memcpy(table, &a, sizeof a);
    };
    s.launch = [=](int64_t tokens) {
        Launch l;
        l.kernel = (gemm ? "gemm_" : "gemv_") + name;
        if (gemm) {
            l.groups[0] = div_up(rows, ER_GEMM_TILE);
            l.groups[1] = div_up(tokens, ER_GEMM_TILE);
            l.threads = ER_THREADS_GEMM;
        } else {
            l.groups[0] = div_up(rows, ER_THREADS_GEMV / 32 * ER_GEMV_ROWS);
            l.groups[1] = u32(tokens);
            l.threads = ER_THREADS_GEMV;
        }
        return l;
    };
    if (!kernel_takes(s.launch(1).kernel, s.table_bytes))
        throw std::invalid_argument("the Metal backend has no matmul kernel for " + std::string(tensor_type_name(type)));
    p.steps.push_back(std::move(s));
    p.tables_bytes = align_up(sizeof(er_matmul_args));  // (no sampler steps: they have no table)
    return p;
}

Program sample_program(int64_t n_vocab, int64_t n_history) {
    Program p;
    p.max_tokens = 1;
    p.n_vocab = n_vocab;
    p.logits = 0;
    const size_t row = align_up(static_cast<size_t>(n_vocab) * 4), weights = row;
    size_t total = layout_penalize(p, 2 * row);
    p.history = total;
    total += align_up(static_cast<size_t>(std::max<int64_t>(n_history, 1)) * 4);
    p.sampled = total;
    p.memory_bytes = p.sampled + align_up(ER_STEP_SLOTS * 4);
    p.step_block_bytes = align_up(sizeof(er_step_block) + 4);
    add_sampler(p, weights, [history = p.history](const Addresses& at) { return at.memory + history; });
    p.sample.table = 0;
    p.penalize.table = align_up(sizeof(er_sample_args));
    p.sample_penalized.table = p.penalize.table + align_up(sizeof(er_penalize_args));
    p.tables_bytes = p.sample_penalized.table + align_up(sizeof(er_sample_args));
    return p;
}

namespace {

// `path` with its quoted includes expanded in place, each file once (as #pragma once would).
void expand(const std::filesystem::path& path, const std::filesystem::path& root, std::set<std::string>& seen, std::string& out) {
    if (!seen.insert(std::filesystem::weakly_canonical(path).string()).second) return;
    std::ifstream f(path);
    if (!f) throw std::runtime_error("Metal source: cannot read " + path.string());
    std::string line;
    while (std::getline(f, line)) {
        const size_t at = line.find("#include \"");
        if (line.rfind("#pragma once", 0) == 0) continue;
        if (at == 0) {
            const std::string name = line.substr(10, line.find('"', 10) - 10);
            std::filesystem::path found;
            for (const auto& dir : {path.parent_path(), root / "metal", root / "csrc" / "include"})
                if (std::filesystem::exists(dir / name)) {
                    found = dir / name;
                    break;
                }
            if (found.empty()) throw std::runtime_error("Metal source: " + path.string() + " includes \"" + name + "\", not found");
            expand(found, root, seen, out);
            continue;
        }
        out += line;
        out += '\n';
    }
}

}  // namespace

std::string library_source(const std::string& root_dir) {
    const std::filesystem::path root(root_dir);
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(root / "metal"))
        if (e.path().extension() == ".metal") files.push_back(e.path());
    if (files.empty()) throw std::runtime_error("Metal source: no .metal files in " + (root / "metal").string());
    std::sort(files.begin(), files.end());
    std::set<std::string> seen;
    std::string out;
    for (const auto& f : files) expand(f, root, seen, out);
    return out;
}

const std::vector<std::string>& kernel_names() {
    static const std::vector<std::string> names = [] {
        std::vector<std::string> v;
        for (const KernelInfo& k : kKernels) v.push_back(k.name);
        return v;
    }();
    return names;
}

bool kernel_takes(const std::string& name, size_t args_bytes) {
    for (const KernelInfo& k : kKernels)
        if (name == k.name) return k.args_bytes == args_bytes;
    return false;
}

}  // namespace edgerunner::metal
