#include "executable.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "edgerunner/half.h"
#include "edgerunner/quant_blocks.h"
#include "edgerunner/quants.h"

namespace edgerunner::cpu {
namespace {

// Rows [r0, r1) of `n` for thread ith of nth.
inline void split(int64_t n, int ith, int nth, int64_t* r0, int64_t* r1) {
    *r0 = n * ith / nth;
    *r1 = n * (ith + 1) / nth;
}

float rms_scale(const float* x, int64_t n, float eps) {
    float ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
    return 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
}

void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
    const float scale = rms_scale(x, n, eps);
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * scale) * w[i];
}

// y += rms_norm(x) · w: a post-norm joining the residual (gemma3).
void rms_norm_add(const float* x, const float* w, float* y, int64_t n, float eps) {
    const float scale = rms_scale(x, n, eps);
    for (int64_t i = 0; i < n; ++i) y[i] += (x[i] * scale) * w[i];
}

}  // namespace

Executable::Executable(const ModelConfig& config, Plan plan, KVCache& kv, ThreadPool& pool, bool precise)
    : c_(config), plan_(std::move(plan)), kv_(kv), pool_(pool), precise_(precise) {
    const int64_t q_dim = c_.n_head * c_.head_dim, kv_dim = c_.n_head_kv * c_.head_dim;
    const int64_t widths[kBufCount] = {c_.n_embd, c_.n_embd, q_dim, kv_dim, kv_dim, q_dim, c_.n_ff, c_.n_ff, c_.n_embd, 0};
    for (int b = 0; b < kBufCount; ++b) width_[b] = widths[b];
    last_logits_.assign(static_cast<size_t>(c_.n_vocab), 0.0f);

    // Fuse ops into steps (see Step), choose kernels, and place activation quantization: a
    // matmul quantizes its input unless it is already quantized in the formats it needs; an
    // RMSNorm right before does it as it writes each row.
    const std::vector<Op>& ops = plan_.ops;
    Buf quantized = Buf::Count;
    unsigned quantized_formats = 0;
    int64_t widest = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
        Step s{};
        s.op = ops[i];
        const Op& op = ops[i];
        if (op.kind == OpKind::MatMul) {
            auto add_part = [&](const Op& o) {
                MatPart& p = s.parts[s.n_parts++];
                p.weight = o.weight;
                p.bias = o.bias;
                p.out = o.out;
                p.format = precise_ ? ActFormat::Float : act_format_for(o.weight->type);
                p.dot = p.format == ActFormat::Float ? dot_float_fn(o.weight->type) : dot_quant_fn(o.weight->type);
                if (p.format != ActFormat::Float) p.dot_rows = dot_rows_fn(o.weight->type);
            };
            add_part(op);
            while (!op.accumulate && s.n_parts < 3 && i + 1 < ops.size() && ops[i + 1].kind == OpKind::MatMul &&
                   ops[i + 1].in == op.in && !ops[i + 1].accumulate && ops[i + 1].tail == op.tail)
                add_part(ops[++i]);
            if (s.n_parts == 2 && i + 1 < ops.size() && (ops[i + 1].kind == OpKind::SwiGLU || ops[i + 1].kind == OpKind::GeGLU) &&
                ops[i + 1].in == s.parts[0].out && s.parts[1].out == Buf::UP && s.parts[0].weight->rows == s.parts[1].weight->rows) {
                s.glu = true;
                s.gelu = ops[++i].kind == OpKind::GeGLU;
            }
            unsigned needed = 0;
            for (int k = 0; k < s.n_parts; ++k)
                if (s.parts[k].format != ActFormat::Float) needed |= 1u << static_cast<int>(s.parts[k].format);
            if (needed && (quantized != op.in || (needed & ~quantized_formats))) {
                Step* prev = steps_.empty() ? nullptr : &steps_.back();
                if (prev && prev->op.kind == OpKind::RmsNorm && prev->op.out == op.in && prev->op.tail == op.tail)
                    prev->norm_quantize = needed;
                else
                    s.quantize = needed;
                quantized = op.in;
                quantized_formats = needed;
                widest = std::max(widest, op.weight->cols);
            }
        } else if (op.kind == OpKind::Rope && i + 2 < ops.size() && ops[i + 1].kind == OpKind::Rope &&
                   ops[i + 2].kind == OpKind::KvStore && op.in == Buf::Q && ops[i + 1].in == Buf::K) {
            s.rope_kv = true;
            i += 2;
        }
        if ((op.kind == OpKind::Rope || op.kind == OpKind::KvStore) && !s.rope_kv)
            throw std::logic_error("the CPU backend runs rope(Q), rope(K) and kv_store as one step; the plan split them");
        // A step that writes the quantized buffer makes its quantized copy stale.
        bool writes = s.op.out == quantized;
        for (int k = 0; k < s.n_parts; ++k) writes |= s.parts[k].out == quantized;
        if (s.rope_kv) writes = quantized == Buf::Q || quantized == Buf::K;
        if (writes) quantized = Buf::Count;
        s.index = static_cast<int>(steps_.size());
        steps_.push_back(s);
    }
    // The arena holds only the buffers the fused steps touch (gate+up+SiLU needs no UP rows).
    bool used[kBufCount] = {};
    for (const Step& st : steps_) {
        used[static_cast<int>(st.op.in)] = used[static_cast<int>(st.op.out)] = true;
        for (int k = 0; k < st.n_parts; ++k) used[static_cast<int>(st.parts[k].out)] = true;
        if (st.rope_kv) used[static_cast<int>(Buf::Q)] = used[static_cast<int>(Buf::K)] = used[static_cast<int>(Buf::V)] = true;
    }
    size_t total = 0;
    for (int b = 0; b < kBufCount; ++b) {
        offset_[b] = total;
        if (used[b]) total += static_cast<size_t>(width_[b] * plan_.max_tokens);
    }
    arena_.assign(total, 0.0f);
    next_chunk_.reset(new std::atomic<int64_t>[steps_.size()]);
    for (ActFormat f : {ActFormat::Q8_0, ActFormat::Q8_K}) {
        const int k = static_cast<int>(f);
        qrow_bytes_[k] = act_bytes(f, (widest + 255) / 256 * 256);
        qbuf_[k].assign(qrow_bytes_[k] * static_cast<size_t>(plan_.max_tokens), 0);
    }
    scores_.assign(static_cast<size_t>(pool_.size() * kv_.capacity), 0.0f);
    kv_fn_ = precise_ ? kv_kernels_scalar(kv_.type) : kv_kernels(kv_.type);
    math_ = precise_ ? math_kernels_scalar() : math_kernels();
    tile_rows_ = precise_ ? 8 : tile_rows();

    // RoPE inverse frequencies (the local layers' base too, where the plan has local layers).
    for (const Op& op : plan_.ops) local_rope_ |= op.kind == OpKind::Rope && op.local_rope;
    for (int b = 0; b < (local_rope_ ? 2 : 1); ++b) {
        inv_freq_[b] = rope_inv_freq(c_, plan_, b == 1);
        rope_cos_[b].assign(static_cast<size_t>(plan_.max_tokens * (c_.rope_dim / 2)), 0.0f);
        rope_sin_[b].assign(rope_cos_[b].size(), 0.0f);
    }
}

void Executable::quantize_rows(Buf b, unsigned formats, int64_t t0, int64_t t1, int64_t width) {
    for (ActFormat f : {ActFormat::Q8_0, ActFormat::Q8_K}) {
        if (!(formats & (1u << static_cast<int>(f)))) continue;
        for (int64_t t = t0; t < t1; ++t) quantize_act(f, row(b, t), const_cast<uint8_t*>(qrow(f, t)), width);
    }
}

void Executable::run(const StepInputs& in) {
    // The step's rotation angles, once for all layers and heads.
    const int64_t half = c_.rope_dim / 2;
    for (int b = 0; b < (local_rope_ ? 2 : 1); ++b)
        for (int64_t t = 0; t < in.n_tokens; ++t) {
            const float pos = static_cast<float>(in.pos0 + t) * c_.rope_linear_scale;
            for (int64_t k = 0; k < half; ++k) {
                const float theta = pos * inv_freq_[b][k];
                rope_cos_[b][t * half + k] = std::cos(theta);
                rope_sin_[b][t * half + k] = std::sin(theta);
                if (c_.rope_attn_factor != 1.0f) {  // LongRoPE's attention factor
                    rope_cos_[b][t * half + k] *= c_.rope_attn_factor;
                    rope_sin_[b][t * half + k] *= c_.rope_attn_factor;
                }
            }
        }
    for (size_t i = 0; i < steps_.size(); ++i) next_chunk_[i].store(0, std::memory_order_relaxed);
    pool_.run([&](int ith, int nth) {
        for (const Step& s : steps_) {
            if (s.quantize) {
                const int64_t first = s.op.tail && !in.logits_out ? in.n_tokens - 1 : 0;
                int64_t t0, t1;
                split(in.n_tokens - first, ith, nth, &t0, &t1);
                quantize_rows(s.op.in, s.quantize, first + t0, first + t1, s.parts[0].weight->cols);
                pool_.barrier();
            }
            exec(s, in, ith, nth);
            pool_.barrier();
        }
    });
}

void Executable::exec(const Step& s, const StepInputs& in, int ith, int nth) {
    const Op& op = s.op;
    int64_t t0, t1;
    switch (op.kind) {
        case OpKind::Embed: {
            split(in.n_tokens, ith, nth, &t0, &t1);
            const Weight& w = *op.weight;
            for (int64_t t = t0; t < t1; ++t) {
                float* x = row(Buf::X, t);
                dequantize_row(w.type, w.data + static_cast<size_t>(in.tokens[t]) * w.row_bytes, x, w.cols);
                if (op.scale != 1.0f)
                    for (int64_t i = 0; i < w.cols; ++i) x[i] *= op.scale;
            }
            return;
        }
        case OpKind::RmsNorm: {
            const int64_t first = op.tail && !in.logits_out ? in.n_tokens - 1 : 0;
            split(in.n_tokens - first, ith, nth, &t0, &t1);
            const float* w = reinterpret_cast<const float*>(op.weight->data);
            const int64_t width = width_[static_cast<int>(op.in)];
            for (int64_t t = first + t0; t < first + t1; ++t) {
                if (op.accumulate) rms_norm_add(row(op.in, t), w, row(op.out, t), width, c_.norm_eps);
                else rms_norm(row(op.in, t), w, row(op.out, t), width, c_.norm_eps);
            }
            if (s.norm_quantize) quantize_rows(op.out, s.norm_quantize, first + t0, first + t1, width);
            return;
        }
        case OpKind::HeadRmsNorm: {
            const int64_t hd = c_.head_dim;
            split(in.n_tokens * op.heads, ith, nth, &t0, &t1);
            const float* w = reinterpret_cast<const float*>(op.weight->data);
            for (int64_t i = t0; i < t1; ++i) {
                float* x = row(op.in, i / op.heads) + (i % op.heads) * hd;
                rms_norm(x, w, x, hd, c_.norm_eps);
            }
            return;
        }
        case OpKind::MatMul: return s.glu ? glu(s, in, nth) : matmul(s, in, nth);
        case OpKind::Rope: case OpKind::KvStore:
            // The llama recipe always emits rope(Q), rope(K), kv_store together; prepare fused them.
            return rope_kv(op.layer, op.local_rope, in, ith, nth);
        case OpKind::Attention: return attention(op, in, ith, nth);
        case OpKind::SwiGLU: case OpKind::GeGLU: {
            const int64_t n = in.n_tokens * width_[static_cast<int>(op.in)];
            split(n, ith, nth, &t0, &t1);
            float* g = row(op.in, 0);
            const float* u = row(Buf::UP, 0);
            (op.kind == OpKind::GeGLU ? math_.gelu_mul : math_.silu_mul)(g + t0, u + t0, t1 - t0);
            return;
        }
    }
}

// dot(weight rows [r, r + nr) of part p, tokens [t, t + m)) into v[row * 4 + token]; nr ≤ 16, m ≤ 4.
#define ER_DOT_TILE(p, r, nr, t, m, v)                                                                      \
    do {                                                                                                    \
        const Weight& w_ = *(p).weight;                                                                     \
        const uint8_t* wrow_ = w_.data + static_cast<size_t>(r) * w_.row_bytes;                             \
        if ((p).dot_rows) {                                                                                 \
            const int fi_ = static_cast<int>((p).format);                                                   \
            (p).dot_rows(wrow_, w_.row_bytes, nr, qrow((p).format, t), qrow_bytes_[fi_], m, w_.cols, v);   \
        } else {                                                                                            \
            for (int i_ = 0; i_ < (nr); ++i_)                                                               \
                for (int k_ = 0; k_ < (m); ++k_) {                                                          \
                    const void* x_ = (p).format == ActFormat::Float ? static_cast<const void*>(row(op.in, (t) + k_)) \
                                                                     : qrow((p).format, (t) + k_);            \
                    (v)[i_ * 4 + k_] = (p).dot(wrow_ + i_ * w_.row_bytes, x_, w_.cols);                     \
                }                                                                                           \
        }                                                                                                   \
    } while (0)

// Weight rows are handed out in chunks of whole tiles from the step's counter, so a thread that
// runs slower (a busy core, a preempted vCPU) takes fewer chunks instead of holding everyone at
// the barrier. Decode takes several tiles per chunk (the work per tile is small), prefill one.
template <typename Body>
void Executable::for_row_chunks(const Step& s, int64_t rows, int64_t n_tokens, int nth, Body&& body) {
    const int64_t tiles = (rows + tile_rows_ - 1) / tile_rows_;
    const int64_t per = n_tokens > kTileTokens ? 1 : std::max<int64_t>(1, tiles / (8 * nth));
    std::atomic<int64_t>& next = next_chunk_[s.index];
    for (int64_t c = next.fetch_add(per, std::memory_order_relaxed); c < tiles; c = next.fetch_add(per, std::memory_order_relaxed))
        body(c * tile_rows_, std::min((c + per) * tile_rows_, rows));
}

void Executable::matmul(const Step& s, const StepInputs& in, int nth) {
    const Op& op = s.op;
    const int64_t first = op.tail && !in.logits_out ? in.n_tokens - 1 : 0;
    int64_t total = 0;
    for (int k = 0; k < s.n_parts; ++k) total += s.parts[k].weight->rows;
    // Rows of the fused matrices are numbered one after another; a chunk is [g0, g1) of them.
    for_row_chunks(s, total, in.n_tokens - first, nth, [&](int64_t g0, int64_t g1) {
        int64_t base = 0;
        for (int k = 0; k < s.n_parts; ++k) {
            const MatPart& p = s.parts[k];
            const Weight& w = *p.weight;
            const int64_t r0 = std::max<int64_t>(g0 - base, 0), r1 = std::min<int64_t>(g1 - base, w.rows);
            base += w.rows;
            const float* bias = p.bias ? reinterpret_cast<const float*>(p.bias->data) : nullptr;
            const bool to_logits = p.out == Buf::LOGITS;
            // Tiles of 8 or 16 rows × 4 tokens: each weight row is read from memory once per step.
            for (int64_t r = r0; r < r1; r += tile_rows_) {
                const int nr = static_cast<int>(std::min<int64_t>(tile_rows_, r1 - r));
                for (int64_t t = first; t < in.n_tokens; t += kTileTokens) {
                    const int m = static_cast<int>(std::min<int64_t>(kTileTokens, in.n_tokens - t));
                    float v[kMaxTileRows * kTileTokens];
                    ER_DOT_TILE(p, r, nr, t, m, v);
                    for (int i = 0; i < nr; ++i)
                        for (int j = 0; j < m; ++j) {
                            const float x = bias ? v[i * 4 + j] + bias[r + i] : v[i * 4 + j];
                            float* y = to_logits ? (in.logits_out ? in.logits_out + (t + j) * c_.n_vocab : last_logits_.data())
                                                 : row(p.out, t + j);
                            if (op.accumulate) y[r + i] += x;
                            else y[r + i] = x;
                        }
                }
            }
        }
    });
}

void Executable::glu(const Step& s, const StepInputs& in, int nth) {
    const Op& op = s.op;
    const MatPart& gate = s.parts[0];
    const MatPart& up = s.parts[1];
    for_row_chunks(s, gate.weight->rows, in.n_tokens, nth, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; r += tile_rows_) {
            const int nr = static_cast<int>(std::min<int64_t>(tile_rows_, r1 - r));
            for (int64_t t = 0; t < in.n_tokens; t += kTileTokens) {
                const int m = static_cast<int>(std::min<int64_t>(kTileTokens, in.n_tokens - t));
                float g[kMaxTileRows * kTileTokens] = {}, u[kMaxTileRows * kTileTokens] = {};
                ER_DOT_TILE(gate, r, nr, t, m, g);
                ER_DOT_TILE(up, r, nr, t, m, u);
                (s.gelu ? math_.gelu_mul : math_.silu_mul)(g, u, nr * 4);
                for (int i = 0; i < nr; ++i)
                    for (int j = 0; j < m; ++j) row(gate.out, t + j)[r + i] = g[i * 4 + j];
            }
        }
    });
}
#undef ER_DOT_TILE

void Executable::rope_kv(int32_t layer, bool local, const StepInputs& in, int ith, int nth) {
    const int64_t hd = c_.head_dim, half = c_.rope_dim / 2;
    const int64_t heads = c_.n_head + c_.n_head_kv;
    int64_t i0, i1;
    split(in.n_tokens * heads, ith, nth, &i0, &i1);
    for (int64_t i = i0; i < i1; ++i) {
        const int64_t t = i / heads, h = i % heads;
        float* x = h < c_.n_head ? row(Buf::Q, t) + h * hd : row(Buf::K, t) + (h - c_.n_head) * hd;
        const float* cs = rope_cos_[local ? 1 : 0].data() + t * half;
        const float* sn = rope_sin_[local ? 1 : 0].data() + t * half;
        for (int64_t k = 0; k < half; ++k) {
            // Adjacent: dimensions (2k, 2k+1) rotate together; neox: (k, k + rope_dim/2).
            const int64_t a = c_.rope_style == RopeStyle::Adjacent ? 2 * k : k;
            const int64_t b = c_.rope_style == RopeStyle::Adjacent ? 2 * k + 1 : k + half;
            const float x0 = x[a], x1 = x[b];
            x[a] = x0 * cs[k] - x1 * sn[k];
            x[b] = x0 * sn[k] + x1 * cs[k];
        }
    }
    pool_.barrier();  // every K head of a token is rotated before the token's row is stored
    split(in.n_tokens, ith, nth, &i0, &i1);
    for (int64_t t = i0; t < i1; ++t) {
        store_kv_row(kv_.type, row(Buf::K, t), kv_.k(layer, in.pos0 + t), kv_.kv_dim);
        store_kv_row(kv_.type, row(Buf::V, t), kv_.v(layer, in.pos0 + t), kv_.kv_dim);
    }
}

void Executable::attention(const Op& op, const StepInputs& in, int ith, int nth) {
    const int64_t hd = c_.head_dim, group = c_.n_head / c_.n_head_kv;
    const size_t head_bytes = kv_.row_bytes / static_cast<size_t>(c_.n_head_kv);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    float* scores = scores_.data() + static_cast<size_t>(ith) * kv_.capacity;
    const int64_t capacity = kv_.capacity_of(op.layer);
    // (token, head) pairs dealt round-robin: a causal token's cost grows with its position, so
    // contiguous ranges would leave the first thread idle at the barrier.
    for (int64_t i = ith; i < in.n_tokens * op.heads; i += nth) {
        const int64_t t = i / op.heads, h = i % op.heads;
        const size_t head_offset = static_cast<size_t>(h / group) * head_bytes;
        const int64_t pos = in.pos0 + t;
        const int64_t start = op.window > 0 ? std::max<int64_t>(0, pos - op.window + 1) : 0;
        const float* q = row(op.in, t) + h * hd;
        const int64_t n = pos + 1 - start;
        kv_fn_.scores(kv_.k(op.layer, 0) + head_offset, kv_.row_bytes, capacity, start, pos + 1, q, hd, scale, scores);
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) mx = std::max(mx, scores[j]);
        const float sum = math_.exp_sum(scores, n, mx);
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < n; ++j) scores[j] *= inv;
        float* out = row(op.out, t) + h * hd;
        std::fill(out, out + hd, 0.0f);
        kv_fn_.values(kv_.v(op.layer, 0) + head_offset, kv_.row_bytes, capacity, start, pos + 1, scores, hd, out);
    }
}

}  // namespace edgerunner::cpu
