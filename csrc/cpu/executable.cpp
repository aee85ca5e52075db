#include "executable.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "edgerunner/quant_blocks.h"
#include "edgerunner/quants.h"

namespace edgerunner::cpu {
namespace {

// Rows [r0, r1) of `n` for thread ith of nth.
inline void split(int64_t n, int ith, int nth, int64_t* r0, int64_t* r1) {
    *r0 = n * ith / nth;
    *r1 = n * (ith + 1) / nth;
}

void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
    float ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
    const float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * scale) * w[i];
}

void store_kv_row(KvType type, const float* x, uint8_t* slot, int64_t n) {
    switch (type) {
        case KvType::F32: std::memcpy(slot, x, static_cast<size_t>(n) * sizeof(float)); return;
        case KvType::F16: {
            auto* h = reinterpret_cast<uint16_t*>(slot);
            for (int64_t i = 0; i < n; ++i) h[i] = f32_to_f16(x[i]);
            return;
        }
        case KvType::Q8_0: quantize_row_q8_0(x, slot, n); return;
    }
}

}  // namespace

Executable::Executable(const ModelConfig& config, Plan plan, KVCache& kv, ThreadPool& pool, bool precise)
    : c_(config), plan_(std::move(plan)), kv_(kv), pool_(pool), precise_(precise) {
    const int64_t q_dim = c_.n_head * c_.head_dim, kv_dim = c_.n_head_kv * c_.head_dim;
    const int64_t widths[kBufCount] = {c_.n_embd, c_.n_embd, q_dim, kv_dim, kv_dim, q_dim, c_.n_ff, c_.n_ff, 0};
    size_t total = 0;
    for (int b = 0; b < kBufCount; ++b) {
        width_[b] = widths[b];
        offset_[b] = total;
        total += static_cast<size_t>(widths[b] * plan_.max_tokens);
    }
    arena_.assign(total, 0.0f);
    last_logits_.assign(static_cast<size_t>(c_.n_vocab), 0.0f);

    // Choose kernels and place activation quantization: a matmul whose input is not already
    // quantized in its format quantizes it; later matmuls on the same input reuse it.
    Buf quantized = Buf::Count;
    ActFormat quantized_format = ActFormat::Float;
    int64_t widest = 0;
    for (const Op& op : plan_.ops) {
        Step s{op};
        if (op.kind == OpKind::MatMul) {
            s.format = precise_ ? ActFormat::Float : act_format_for(op.weight->type);
            s.dot = s.format == ActFormat::Float ? dot_float_fn(op.weight->type) : dot_quant_fn(op.weight->type);
            if (s.format != ActFormat::Float) s.dot_rows = dot_rows_fn(op.weight->type);
            if (s.format != ActFormat::Float && (quantized != op.in || quantized_format != s.format)) {
                s.quantize_input = true;
                quantized = op.in;
                quantized_format = s.format;
                widest = std::max(widest, op.weight->cols);
            }
        }
        if (op.out == quantized && op.kind != OpKind::KvStore) quantized = Buf::Count;  // input overwritten
        steps_.push_back(s);
    }
    qbuf_row_bytes_ = std::max(act_bytes(ActFormat::Q8_0, widest), act_bytes(ActFormat::Q8_K, widest));
    qbuf_.assign(qbuf_row_bytes_ * static_cast<size_t>(plan_.max_tokens), 0);
    scores_.assign(static_cast<size_t>(pool_.size() * kv_.capacity), 0.0f);
    kv_fn_ = precise_ ? kv_kernels_scalar(kv_.type) : kv_kernels(kv_.type);

    // RoPE inverse frequencies, computed as Hugging Face does (float32 pow), then divided by
    // the per-pair factors of rope_freqs when the model has them.
    inv_freq_.resize(static_cast<size_t>(c_.rope_dim / 2));
    const float* factors = nullptr;
    for (const Op& op : plan_.ops)
        if (op.kind == OpKind::Rope && op.weight) factors = reinterpret_cast<const float*>(op.weight->data);
    for (int64_t i = 0; i < c_.rope_dim / 2; ++i) {
        const float exponent = static_cast<float>(2 * i) / static_cast<float>(c_.rope_dim);
        inv_freq_[i] = 1.0f / std::pow(c_.rope_base, exponent);
        if (factors) inv_freq_[i] /= factors[i];
    }
}

size_t Executable::scratch_bytes() const {
    return arena_.size() * sizeof(float) + qbuf_.size() + scores_.size() * sizeof(float) +
           last_logits_.size() * sizeof(float);
}

void Executable::run(const StepInputs& in) {
    pool_.run([&](int ith, int nth) {
        for (const Step& s : steps_) {
            if (s.quantize_input) {
                const int64_t first = s.op.tail && !in.logits_out ? in.n_tokens - 1 : 0;
                int64_t t0, t1;
                split(in.n_tokens - first, ith, nth, &t0, &t1);
                for (int64_t t = first + t0; t < first + t1; ++t)
                    quantize_act(s.format, row(s.op.in, t), qbuf_.data() + t * qbuf_row_bytes_, s.op.weight->cols);
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
            for (int64_t t = t0; t < t1; ++t)
                dequantize_into(w.type, w.data + static_cast<size_t>(in.tokens[t]) * w.row_bytes, row(Buf::X, t), w.cols);
            return;
        }
        case OpKind::RmsNorm: {
            const int64_t first = op.tail && !in.logits_out ? in.n_tokens - 1 : 0;
            split(in.n_tokens - first, ith, nth, &t0, &t1);
            const float* w = reinterpret_cast<const float*>(op.weight->data);
            for (int64_t t = first + t0; t < first + t1; ++t)
                rms_norm(row(op.in, t), w, row(op.out, t), width_[static_cast<int>(op.in)], c_.norm_eps);
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
        case OpKind::MatMul: return matmul(s, in, ith, nth);
        case OpKind::Rope: return rope(op, in, ith, nth);
        case OpKind::KvStore: return kv_store(op, in, ith, nth);
        case OpKind::Attention: return attention(op, in, ith, nth);
        case OpKind::SwiGLU: {
            const int64_t n = in.n_tokens * width_[static_cast<int>(op.in)];
            split(n, ith, nth, &t0, &t1);
            float* g = row(op.in, 0);
            const float* u = row(Buf::UP, 0);
            for (int64_t i = t0; i < t1; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
            return;
        }
    }
}

void Executable::matmul(const Step& s, const StepInputs& in, int ith, int nth) {
    const Op& op = s.op;
    const Weight& w = *op.weight;
    const int64_t first = op.tail && !in.logits_out ? in.n_tokens - 1 : 0;
    const bool to_logits = op.out == Buf::LOGITS;
    const float* bias = op.bias ? reinterpret_cast<const float*>(op.bias->data) : nullptr;
    int64_t r0, r1;
    split(w.rows, ith, nth, &r0, &r1);
    auto store = [&](int64_t t, int64_t r, float v) {
        if (bias) v += bias[r];
        float* y;
        if (to_logits) y = in.logits_out ? in.logits_out + t * c_.n_vocab : last_logits_.data();
        else y = row(op.out, t);
        if (op.accumulate) y[r] += v;
        else y[r] = v;
    };
    // Rows outer, tokens inner: each weight row is read from memory once per step; with a
    // several-token kernel, unpacked once per 4 tokens.
    for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* wrow = w.data + static_cast<size_t>(r) * w.row_bytes;
        int64_t t = first;
        if (s.dot_rows) {
            for (; t + 1 < in.n_tokens; t += 4) {
                const int m = static_cast<int>(std::min<int64_t>(4, in.n_tokens - t));
                float v[4];
                s.dot_rows(wrow, qbuf_.data() + t * qbuf_row_bytes_, qbuf_row_bytes_, w.cols, m, v, 1);
                for (int k = 0; k < m; ++k) store(t + k, r, v[k]);
            }
        }
        for (; t < in.n_tokens; ++t) {
            const void* x = s.format == ActFormat::Float ? static_cast<const void*>(row(op.in, t))
                                                          : qbuf_.data() + t * qbuf_row_bytes_;
            store(t, r, s.dot(wrow, x, w.cols));
        }
    }
}

void Executable::rope(const Op& op, const StepInputs& in, int ith, int nth) {
    const int64_t hd = c_.head_dim, half = c_.rope_dim / 2;
    int64_t i0, i1;
    split(in.n_tokens * op.heads, ith, nth, &i0, &i1);
    for (int64_t i = i0; i < i1; ++i) {
        const int64_t t = i / op.heads;
        float* x = row(op.in, t) + (i % op.heads) * hd;
        const float pos = static_cast<float>(in.pos0 + t) * c_.rope_linear_scale;
        for (int64_t k = 0; k < half; ++k) {
            const float theta = pos * inv_freq_[k];
            const float cs = std::cos(theta), sn = std::sin(theta);
            // Adjacent: dimensions (2k, 2k+1) rotate together; neox: (k, k + rope_dim/2).
            const int64_t a = c_.rope_style == RopeStyle::Adjacent ? 2 * k : k;
            const int64_t b = c_.rope_style == RopeStyle::Adjacent ? 2 * k + 1 : k + half;
            const float x0 = x[a], x1 = x[b];
            x[a] = x0 * cs - x1 * sn;
            x[b] = x0 * sn + x1 * cs;
        }
    }
}

void Executable::kv_store(const Op& op, const StepInputs& in, int ith, int nth) {
    int64_t t0, t1;
    split(in.n_tokens, ith, nth, &t0, &t1);
    for (int64_t t = t0; t < t1; ++t) {
        store_kv_row(kv_.type, row(Buf::K, t), kv_.k(op.layer, in.pos0 + t), kv_.kv_dim);
        store_kv_row(kv_.type, row(Buf::V, t), kv_.v(op.layer, in.pos0 + t), kv_.kv_dim);
    }
}

void Executable::attention(const Op& op, const StepInputs& in, int ith, int nth) {
    const int64_t hd = c_.head_dim, group = c_.n_head / c_.n_head_kv;
    const size_t head_bytes = kv_.row_bytes / static_cast<size_t>(c_.n_head_kv);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    float* scores = scores_.data() + static_cast<size_t>(ith) * kv_.capacity;
    int64_t i0, i1;
    split(in.n_tokens * op.heads, ith, nth, &i0, &i1);
    for (int64_t i = i0; i < i1; ++i) {
        const int64_t t = i / op.heads, h = i % op.heads;
        const size_t head_offset = static_cast<size_t>(h / group) * head_bytes;
        const int64_t pos = in.pos0 + t;
        const int64_t start = c_.sliding_window > 0 ? std::max<int64_t>(0, pos - c_.sliding_window + 1) : 0;
        const float* q = row(op.in, t) + h * hd;
        const int64_t n = pos + 1 - start;
        kv_fn_.scores(kv_.k(op.layer, 0) + head_offset, kv_.row_bytes, kv_.capacity, start, pos + 1, q, hd, scale, scores);
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) mx = std::max(mx, scores[j]);
        float sum = 0;
        for (int64_t j = 0; j < n; ++j) {
            scores[j] = std::exp(scores[j] - mx);
            sum += scores[j];
        }
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < n; ++j) scores[j] *= inv;
        float* out = row(op.out, t) + h * hd;
        std::fill(out, out + hd, 0.0f);
        kv_fn_.values(kv_.v(op.layer, 0) + head_offset, kv_.row_bytes, kv_.capacity, start, pos + 1, scores, hd, out);
    }
}

}  // namespace edgerunner::cpu
