// RMSNorm, RoPE and the KV store: the per-token ops around the matmuls.
//
//   rms_norm   OpKind::RmsNorm (kAccumulate: the post-norm joins the residual, gemma3) and
//              OpKind::HeadRmsNorm (rows are heads) when they are not fused elsewhere
//   rope       OpKind::Rope, fused with what surrounds it in a layer: the per-head Q/K RMSNorm
//              before it (kHeadNorm: qwen3, gemma3) and the KV store after it (kStoreKv), so a
//              head is read once, normalized, rotated and cached from registers
//   kv_store   OpKind::KvStore on its own
#include "common.h"
#include "kv_cache.h"

// One threadgroup per row. y = (x / rms(x)) · w, or y += that.
kernel void rms_norm(constant er_rms_norm_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    threadgroup float partials[ER_THREADS_RMS_NORM / ER_SIMD];
    const uint r = first_row(step, a.tail) * a.rows_per_token + tgid.x;
    device const float* x = a.x + r * a.x_stride;
    device float* y = a.y + r * a.y_stride;
    float ss = 0.0f;
    for (uint i = tid; i < a.n; i += ER_THREADS_RMS_NORM) ss += x[i] * x[i];
    ss = threadgroup_sum(ss, partials, ER_THREADS_RMS_NORM / ER_SIMD, sg, lane);
    const float scale = 1.0f / sqrt(ss / float(a.n) + a.eps);
    for (uint i = tid; i < a.n; i += ER_THREADS_RMS_NORM) {
        const float v = (x[i] * scale) * a.w[i];
        if (kAccumulate) y[i] += v;
        else y[i] = v;
    }
}

// One simdgroup per (token, head): grid (tokens, n_head + n_head_kv), Q heads first. Lane l owns
// the rotation pairs l, l + 32, ...: adjacent dimensions (2i, 2i + 1) as llama.cpp's converter
// permutes Llama's Q/K, or (i, i + rope_dim/2) for neox-style models (kNeox). Each dimension is
// read and written by one lane only, so the rotation needs no barrier.
kernel void rope(constant er_rope_args& a [[buffer(ER_BUFFER_ARGS)]],
                 constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    const uint t = tgid.x, hh = tgid.y;
    const bool is_q = hh < a.n_head;
    const uint h = is_q ? hh : hh - a.n_head;
    device float* x = is_q ? a.q + t * a.q_stride + h * a.head_dim : a.k + t * a.k_stride + h * a.head_dim;
    device const float* norm_w = is_q ? a.q_norm_w : a.k_norm_w;

    float scale = 1.0f;
    if (kHeadNorm) {  // every lane's reads happen before the simd_sum, every write after it
        float ss = 0.0f;
        for (uint d = lane; d < a.head_dim; d += ER_SIMD) ss += x[d] * x[d];
        scale = 1.0f / sqrt(simd_sum(ss) / float(a.head_dim) + a.norm_eps);
    }
    const uint pos = uint(step.pos0) + t;
    const float angle_pos = float(pos) * a.pos_scale;
    const uint half_dim = a.rope_dim / 2;
    for (uint i = lane; i < half_dim; i += ER_SIMD) {
        const uint i0 = kNeox ? i : 2 * i, i1 = kNeox ? i + half_dim : 2 * i + 1;
        float x0 = x[i0], x1 = x[i1];
        if (kHeadNorm) {
            x0 = (x0 * scale) * norm_w[i0];
            x1 = (x1 * scale) * norm_w[i1];
        }
        const float theta = angle_pos * a.inv_freq[i];
        const float cs = precise::cos(theta) * a.attn_factor, sn = precise::sin(theta) * a.attn_factor;
        x[i0] = x0 * cs - x1 * sn;
        x[i1] = x0 * sn + x1 * cs;
    }
    if (kHeadNorm)  // the dimensions past rope_dim are normalized but not rotated
        for (uint d = a.rope_dim + lane; d < a.head_dim; d += ER_SIMD) x[d] = (x[d] * scale) * norm_w[d];

    if (kStoreKv && !is_q) {
        simdgroup_barrier(mem_flags::mem_device);  // the cache store reads dimensions other lanes wrote
        store_kv_head(x, kv_head(a.k_cache, pos, a.capacity, a.slot_bytes, h, a.n_head_kv), a.head_dim, lane);
        store_kv_head(a.v + t * a.v_stride + h * a.head_dim, kv_head(a.v_cache, pos, a.capacity, a.slot_bytes, h, a.n_head_kv),
                      a.head_dim, lane);
    }
}

// One simdgroup per (token, KV head): the step's K and V heads into their cache slots.
kernel void kv_store(constant er_kv_store_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    const uint t = tgid.x, h = tgid.y;
    const uint pos = uint(step.pos0) + t;
    store_kv_head(a.k + t * a.k_stride + h * a.head_dim, kv_head(a.k_cache, pos, a.capacity, a.slot_bytes, h, a.n_head_kv),
                  a.head_dim, lane);
    store_kv_head(a.v + t * a.v_stride + h * a.head_dim, kv_head(a.v_cache, pos, a.capacity, a.slot_bytes, h, a.n_head_kv),
                  a.head_dim, lane);
}
