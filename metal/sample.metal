// Token sampling on the GPU at the end of a decode step: the CPU sampler's contract
// (csrc/core/sampler.cpp: greedy, temperature, top-k, top-p, min-p, the counter-based uniform,
// the inverse-CDF draw over tokens ordered by logit, ties to the lower id), for parameters
// without logit bias or penalties (those need the token history on the host). The token is
// written to out[slot]: 4 bytes come back instead of the logits.
//
// The method is csrc/cuda/sample.cu's, in one threadgroup of 1024 threads: no sort; every cut
// of the contract is a threshold θ on the logit, because "the tokens with logit >= θ" is a
// prefix of the contract's order. top-k, top-p and the draw each bisect the 2^32 order-
// preserving keys of the floats for the θ where a count or a mass over {logit >= θ} crosses its
// target (32 threadgroup reductions each).
//
// MSL has no double. The CPU weighs tokens in float64; here w = exp((l - l_max) / T) is a
// float32 (relative error about |l - l_max| / T · 2^-24) and every sum of weights is carried as
// a double-float (hi + lo, ~48 bits, exact two-sum additions), so the masses the cuts compare
// are as exact as the weights. A draw can differ from the CPU's only where u · S falls within
// that float32 rounding of a cumulative boundary.
#include "common.h"

// ---- double-float arithmetic (needs IEEE float semantics: the library is built without fast math)
// A df64 is the unevaluated sum x + y of a float2, |y| <= ulp(x) / 2.
typedef float2 df64;
inline df64 df_make(float hi, float lo) {
    df64 r;
    r.x = hi;
    r.y = lo;
    return r;
}
inline df64 df_quick_sum(float a, float b) {  // |a| >= |b|
    const float s = a + b;
    return df_make(s, b - (s - a));
}
inline df64 df_add(df64 a, df64 b) {
    const float s = a.x + b.x;
    const float bb = s - a.x;
    const float e = (a.x - (s - bb)) + (b.x - bb);  // s + e == a.x + b.x exactly
    return df_quick_sum(s, e + a.y + b.y);
}
inline df64 df_scale(df64 a, float b) {
    const float p = a.x * b;
    return df_quick_sum(p, fma(a.x, b, -p) + a.y * b);
}
inline bool df_greater(df64 a, df64 b) { return a.x > b.x || (a.x == b.x && a.y > b.y); }
inline bool df_at_least(df64 a, df64 b) { return a.x > b.x || (a.x == b.x && a.y >= b.y); }

// ---- the counter-based uniform: splitmix64 over (seed, step), 24 bits
inline uint64_t splitmix64_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ul;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBul;
    return z ^ (z >> 31);
}
inline float sample_uniform(uint64_t seed, uint64_t step) {
    const uint64_t state = splitmix64_mix(seed) + (step + 1) * 0x9E3779B97F4A7C15ul;
    return float(uint(splitmix64_mix(state) >> 40)) * 5.9604644775390625e-8f;  // × 2^-24
}

// Floats to uint keys in the same order (negative values reversed).
inline uint order_key(float f) {
    const uint b = as_type<uint>(f);
    return (b & 0x80000000u) != 0 ? ~b : b | 0x80000000u;
}

#define ER_SAMPLE_SIMDGROUPS (ER_THREADS_SAMPLE / ER_SIMD)

template <typename Partials>
inline uint threadgroup_count(uint c, Partials partials, uint sg, uint lane) {
    c = simd_sum(c);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (lane == 0) partials[sg] = c;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    uint total = 0;
    for (uint i = 0; i < ER_SAMPLE_SIMDGROUPS; ++i) total += partials[i];
    return total;
}

template <typename Partials>
inline uint threadgroup_min(uint v, Partials partials, uint sg, uint lane) {
    v = simd_min(v);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (lane == 0) partials[sg] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    uint best = v;
    for (uint i = 0; i < ER_SAMPLE_SIMDGROUPS; ++i) best = min(best, partials[i]);
    return best;
}

// Lane 0's butterfly result stands for its simdgroup (every thread then adds the partials in
// the same order, so all get the same total).
template <typename Partials>
inline df64 threadgroup_mass(df64 v, Partials hi, Partials lo, uint sg, uint lane) {
    for (ushort o = ER_SIMD / 2; o > 0; o /= 2) v = df_add(v, df_make(simd_shuffle_xor(v.x, o), simd_shuffle_xor(v.y, o)));
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (lane == 0) {
        hi[sg] = v.x;
        lo[sg] = v.y;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    df64 total = df_make(0.0f, 0.0f);
    for (uint i = 0; i < ER_SAMPLE_SIMDGROUPS; ++i) total = df_add(total, df_make(hi[i], lo[i]));
    return total;
}

// Σ w over the tokens still candidates at threshold key th: logit key >= th and >= floor_key,
// w > 0, and (with min-p) w >= min_p.
template <typename Partials>
inline df64 mass_at(constant er_sample_args& a, device const float* l, uint th, uint floor_key, bool use_min_p, float min_p,
                    Partials hi, Partials lo, uint tid, uint sg, uint lane) {
    df64 s = df_make(0.0f, 0.0f);
    for (uint i = tid; i < a.n_vocab; i += ER_THREADS_SAMPLE) {
        const uint k = order_key(l[i]);
        const float w = a.weights[i];
        if (k >= th && k >= floor_key && w > 0.0f && (!use_min_p || w >= min_p)) s = df_add(s, df_make(w, 0.0f));
    }
    return threadgroup_mass(s, hi, lo, sg, lane);
}

kernel void sample(constant er_sample_args& a [[buffer(ER_BUFFER_ARGS)]],
                   constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    threadgroup float part_hi[ER_SAMPLE_SIMDGROUPS], part_lo[ER_SAMPLE_SIMDGROUPS];
    threadgroup uint part_u[ER_SAMPLE_SIMDGROUPS];
    const uint n = a.n_vocab;
    device const float* l = a.logits + uint(step.n_tokens - 1) * a.logits_stride;

    // The max logit and the lowest id holding it: the greedy token, and the softmax's shift.
    float mx = -ER_FLT_MAX;
    uint arg = n;
    for (uint i = tid; i < n; i += ER_THREADS_SAMPLE)
        if (l[i] > mx) {
            mx = l[i];
            arg = i;
        }
    for (ushort o = ER_SIMD / 2; o > 0; o /= 2) {
        const float m2 = simd_shuffle_xor(mx, o);
        const uint a2 = simd_shuffle_xor(arg, o);
        if (m2 > mx || (m2 == mx && a2 < arg)) {
            mx = m2;
            arg = a2;
        }
    }
    if (lane == 0) {
        part_hi[sg] = mx;
        part_u[sg] = arg;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint i = 0; i < ER_SAMPLE_SIMDGROUPS; ++i)
        if (part_hi[i] > mx || (part_hi[i] == mx && part_u[i] < arg)) {
            mx = part_hi[i];
            arg = part_u[i];
        }
    const uint top = arg;
    if (step.temperature <= 0.0f) {
        if (tid == 0) a.out[step.slot] = int32_t(top);
        return;
    }

    // w = exp((l - l_max) / T): the top token weighs exactly 1. Each thread later reads only the
    // weights it wrote.
    for (uint i = tid; i < n; i += ER_THREADS_SAMPLE) a.weights[i] = precise::exp((l[i] - mx) / step.temperature);

    // top-k: the k best are the tokens at or above the k-th largest logit.
    uint floor_key = 0;
    if (step.top_k > 0 && uint(step.top_k) < n) {
        uint lo = 0, hi = 0xFFFFFFFFu;  // count(lo) >= k holds; find the last such key
        while (lo < hi) {
            const uint mid = lo + uint((uint64_t(hi) - lo + 1) / 2);
            uint c = 0;
            for (uint i = tid; i < n; i += ER_THREADS_SAMPLE) c += order_key(l[i]) >= mid ? 1u : 0u;
            if (threadgroup_count(c, part_u, sg, lane) >= uint(step.top_k)) lo = mid;
            else hi = mid - 1;
        }
        floor_key = lo;
    }
    // top-p: the shortest prefix whose mass reaches top_p of the candidates' mass.
    if (step.top_p < 1.0f) {
        const df64 target = df_scale(mass_at(a, l, 0, floor_key, false, 0.0f, part_hi, part_lo, tid, sg, lane), step.top_p);
        uint lo = 0, hi = 0xFFFFFFFFu;
        while (lo < hi) {
            const uint mid = lo + uint((uint64_t(hi) - lo + 1) / 2);
            if (df_at_least(mass_at(a, l, mid, floor_key, false, 0.0f, part_hi, part_lo, tid, sg, lane), target)) lo = mid;
            else hi = mid - 1;
        }
        floor_key = max(floor_key, lo);
    }
    // min-p drops w < min_p; then the draw: the first candidate, in order, whose cumulative mass
    // exceeds u · S, i.e. the largest θ whose mass over {l >= θ} still exceeds u · S.
    const bool use_min_p = step.min_p > 0.0f;
    const df64 total = mass_at(a, l, 0, floor_key, use_min_p, step.min_p, part_hi, part_lo, tid, sg, lane);
    const df64 target = df_scale(total, sample_uniform(step.seed, step.sample_step));
    uint lo = 0, hi = 0xFFFFFFFFu;
    while (lo < hi) {
        const uint mid = lo + uint((uint64_t(hi) - lo + 1) / 2);
        if (df_greater(mass_at(a, l, mid, floor_key, use_min_p, step.min_p, part_hi, part_lo, tid, sg, lane), target)) lo = mid;
        else hi = mid - 1;
    }
    // The drawn token has logit key lo: the lowest such id among the candidates.
    uint best = n;
    for (uint i = tid; i < n; i += ER_THREADS_SAMPLE) {
        const uint k = order_key(l[i]);
        const float w = a.weights[i];
        if (k == lo && k >= floor_key && w > 0.0f && (!use_min_p || w >= step.min_p)) best = min(best, i);
    }
    best = threadgroup_min(best, part_u, sg, lane);
    if (tid == 0) a.out[step.slot] = int32_t(best < n ? best : top);
}
