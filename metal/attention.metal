// Causal attention over the KV cache (OpKind::Attention), with an online softmax: running max m,
// running sum l and a running output, rescaled by exp(m_old - m_new) when the max grows, so no
// score matrix is ever stored. Grouped-query: query head h reads KV head h / (n_head / n_head_kv).
// Sliding window and ring cache as the CPU: token t at pos = pos0 + t sees positions
// [max(0, pos - window + 1), pos] (window 0: from 0), position p in slot p % capacity.
//
//   attention_decode   one token (decode): one threadgroup per (token, head); its 4 simdgroups
//                      walk every 4th position, lane l holding dimensions l, l + 32, ...; the
//                      four partial softmaxes are merged at the end (as csrc/cuda/ops.cu)
//   attention_prefill  many tokens: one threadgroup per (8 tokens, head); K and V tiles of 16
//                      positions pass through threadgroup memory once for the 8 queries, so the
//                      cache is read once per 8 tokens instead of once per token
#include "common.h"
#include "kv_cache.h"

#define ER_HEAD_REGS (ER_ATTENTION_MAX_HEAD_DIM / ER_SIMD)  // dimensions per lane
#define ER_DECODE_SIMDGROUPS (ER_THREADS_ATTENTION / ER_SIMD)

inline int window_start(constant er_attention_args& a, int pos) {
    return a.window > 0 ? max(0, pos - int(a.window) + 1) : 0;
}

kernel void attention_decode(constant er_attention_args& a [[buffer(ER_BUFFER_ARGS)]],
                             constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    threadgroup float part_m[ER_DECODE_SIMDGROUPS], part_l[ER_DECODE_SIMDGROUPS];
    threadgroup float part_out[ER_DECODE_SIMDGROUPS * ER_ATTENTION_MAX_HEAD_DIM];
    const uint t = tgid.x, h = tgid.y, hd = a.head_dim;
    const uint kv_h = h / (a.n_head / a.n_head_kv);
    const int pos = step.pos0 + int(t);
    device const float* q = a.q + t * a.q_stride + h * hd;

    float qr[ER_HEAD_REGS], acc[ER_HEAD_REGS];
    for (uint i = 0; i < ER_HEAD_REGS; ++i) {
        const uint d = lane + ER_SIMD * i;
        qr[i] = d < hd ? q[d] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -ER_FLT_MAX, l = 0.0f;
    for (int p = window_start(a, pos) + int(sg); p <= pos; p += ER_DECODE_SIMDGROUPS) {
        device const uint8_t* k = kv_head(a.k_cache, uint(p), a.capacity, a.slot_bytes, kv_h, a.n_head_kv);
        device const uint8_t* v = kv_head(a.v_cache, uint(p), a.capacity, a.slot_bytes, kv_h, a.n_head_kv);
        float s = 0.0f;
        for (uint i = 0; i < ER_HEAD_REGS; ++i) {
            const uint d = lane + ER_SIMD * i;
            if (d < hd) s += qr[i] * load_kv(k, d);
        }
        s = simd_sum(s) * a.scale;
        const float m_new = max(m, s);
        const float corr = exp(m - m_new), e = exp(s - m_new);
        l = l * corr + e;
        for (uint i = 0; i < ER_HEAD_REGS; ++i) {
            const uint d = lane + ER_SIMD * i;
            if (d < hd) acc[i] = acc[i] * corr + e * load_kv(v, d);
        }
        m = m_new;
    }
    if (lane == 0) {
        part_m[sg] = m;
        part_l[sg] = l;
    }
    for (uint i = 0; i < ER_HEAD_REGS; ++i) part_out[sg * ER_ATTENTION_MAX_HEAD_DIM + lane + ER_SIMD * i] = acc[i];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float mx = -ER_FLT_MAX;
    for (uint w = 0; w < ER_DECODE_SIMDGROUPS; ++w) mx = max(mx, part_m[w]);
    float denom = 0.0f;
    for (uint w = 0; w < ER_DECODE_SIMDGROUPS; ++w) denom += part_l[w] > 0.0f ? part_l[w] * exp(part_m[w] - mx) : 0.0f;
    device float* out = a.out + t * a.out_stride + h * hd;
    for (uint d = tid; d < hd; d += ER_THREADS_ATTENTION) {
        float v = 0.0f;
        for (uint w = 0; w < ER_DECODE_SIMDGROUPS; ++w)
            if (part_l[w] > 0.0f) v += part_out[w * ER_ATTENTION_MAX_HEAD_DIM + d] * exp(part_m[w] - mx);
        out[d] = v / denom;
    }
}

#define ER_KEY_TILE 16
#define ER_QUERIES_PER_SIMDGROUP (ER_ATTENTION_QUERIES / (ER_THREADS_ATTENTION / ER_SIMD))  // 2

// Grid (ceil(n_tokens / 8), n_head). Simdgroup sg owns queries 2 sg, 2 sg + 1 of the tile. Every
// simdgroup walks the same key tiles (uniform control flow around the barriers); a key a query
// may not see contributes exactly 0.
kernel void attention_prefill(constant er_attention_args& a [[buffer(ER_BUFFER_ARGS)]],
                              constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    constexpr uint QN = ER_QUERIES_PER_SIMDGROUP, MAXD = ER_ATTENTION_MAX_HEAD_DIM;
    threadgroup float q_tile[ER_ATTENTION_QUERIES * ER_ATTENTION_MAX_HEAD_DIM];
    threadgroup float kv_tile[ER_KEY_TILE * ER_ATTENTION_MAX_HEAD_DIM];  // K, then V, of the same positions
    const uint h = tgid.y, hd = a.head_dim, t0 = tgid.x * ER_ATTENTION_QUERIES;
    const uint kv_h = h / (a.n_head / a.n_head_kv);
    const uint n = uint(step.n_tokens);
    const int pos_last = step.pos0 + int(min(t0 + ER_ATTENTION_QUERIES, n) - 1);

    for (uint e = tid; e < ER_ATTENTION_QUERIES * hd; e += ER_THREADS_ATTENTION) {
        const uint tq = e / hd, d = e % hd;
        q_tile[tq * MAXD + d] = t0 + tq < n ? a.q[(t0 + tq) * a.q_stride + h * hd + d] : 0.0f;
    }
    float m[QN], l[QN], acc[QN][ER_HEAD_REGS];
    int start[QN], pos[QN];
    for (uint j = 0; j < QN; ++j) {
        const uint t = t0 + QN * sg + j;
        pos[j] = t < n ? step.pos0 + int(t) : -1;  // a query past the step sees nothing
        start[j] = window_start(a, step.pos0 + int(t));
        m[j] = -ER_FLT_MAX;
        l[j] = 0.0f;
        for (uint i = 0; i < ER_HEAD_REGS; ++i) acc[j][i] = 0.0f;
    }

    for (int k0 = window_start(a, step.pos0 + int(t0)); k0 <= pos_last; k0 += ER_KEY_TILE) {
        threadgroup_barrier(mem_flags::mem_threadgroup);  // the previous V tile is consumed
        for (uint e = tid; e < ER_KEY_TILE * hd; e += ER_THREADS_ATTENTION) {
            const uint jj = e / hd, d = e % hd;
            const int p = k0 + int(jj);
            kv_tile[jj * MAXD + d] =
                p <= pos_last ? load_kv(kv_head(a.k_cache, uint(p), a.capacity, a.slot_bytes, kv_h, a.n_head_kv), d) : 0.0f;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        float prob[QN][ER_KEY_TILE];
        for (uint j = 0; j < QN; ++j) {
            const uint tq = QN * sg + j;
            float s[ER_KEY_TILE];
            float tile_max = -ER_FLT_MAX;
            bool any = false;
            for (uint jj = 0; jj < ER_KEY_TILE; ++jj) {
                float dot = 0.0f;
                for (uint i = 0; i < ER_HEAD_REGS; ++i) {
                    const uint d = lane + ER_SIMD * i;
                    if (d < hd) dot += q_tile[tq * MAXD + d] * kv_tile[jj * MAXD + d];
                }
                s[jj] = simd_sum(dot) * a.scale;
                const int p = k0 + int(jj);
                if (p >= start[j] && p <= pos[j]) {
                    tile_max = max(tile_max, s[jj]);
                    any = true;
                }
            }
            const float m_new = max(m[j], tile_max);
            const float corr = any ? exp(m[j] - m_new) : 1.0f;
            float sum = 0.0f;
            for (uint jj = 0; jj < ER_KEY_TILE; ++jj) {
                const int p = k0 + int(jj);
                prob[j][jj] = p >= start[j] && p <= pos[j] ? exp(s[jj] - m_new) : 0.0f;
                sum += prob[j][jj];
            }
            l[j] = l[j] * corr + sum;
            for (uint i = 0; i < ER_HEAD_REGS; ++i) acc[j][i] *= corr;
            m[j] = m_new;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);  // every simdgroup is done with K
        for (uint e = tid; e < ER_KEY_TILE * hd; e += ER_THREADS_ATTENTION) {
            const uint jj = e / hd, d = e % hd;
            const int p = k0 + int(jj);
            kv_tile[jj * MAXD + d] =
                p <= pos_last ? load_kv(kv_head(a.v_cache, uint(p), a.capacity, a.slot_bytes, kv_h, a.n_head_kv), d) : 0.0f;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint j = 0; j < QN; ++j)
            for (uint i = 0; i < ER_HEAD_REGS; ++i) {
                const uint d = lane + ER_SIMD * i;
                if (d >= hd) continue;
                for (uint jj = 0; jj < ER_KEY_TILE; ++jj) acc[j][i] += prob[j][jj] * kv_tile[jj * MAXD + d];
            }
    }
    for (uint j = 0; j < QN; ++j) {
        const uint t = t0 + QN * sg + j;
        if (t >= n) continue;
        device float* out = a.out + t * a.out_stride + h * hd;
        for (uint i = 0; i < ER_HEAD_REGS; ++i) {
            const uint d = lane + ER_SIMD * i;
            if (d < hd) out[d] = acc[j][i] / l[j];
        }
    }
}
