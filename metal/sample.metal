// Token sampling on the GPU at the end of a decode step: the CPU sampler's contract
// (csrc/core/sampler.cpp), all of it. `penalize` (steps 1-3: logit bias, repetition, presence and
// frequency penalties over the penalty window) runs first when a step has bias or penalties and
// writes the logits after them to a second buffer; `sample` (steps 4-10: greedy, temperature,
// top-k, top-p, min-p, the counter RNG, the inverse-CDF draw over tokens ordered by logit, ties
// to the lower id) then reads that buffer, or the raw logits. The token is written to out[slot]:
// 4 bytes come back instead of the logits (-1 when no logit is finite).
//
// penalize is csrc/cuda/sample.cu's Penalize: threadgroups of ER_PENALIZE_SLICE tokens, each
// copying its slice, adding the bias table's entries in it (the table's tokens rise: two
// bisections find them) and counting the window's tokens that fall in it (read from the device's
// token history, which the embedding writes at each position) into a counts array that is zero
// before and after; the thread that takes a token's count back to zero penalizes it, so each
// distinct token once. Its float arithmetic is the CPU's, rounding for rounding: each product
// rounded on its own before the addition after it (no FMA), the division precise.
//
// sample is csrc/cuda/sample.cu's method, in one threadgroup of 1024 threads: no sort. Give
// every token its rank in the contract's order as a 64-bit number (logit key high, id reversed
// low: no two tokens tie); "the candidates of rank >= θ" is then a prefix of the order, so top-k,
// top-p and the draw are each a bisection for the θ where a count or a mass over that prefix
// crosses its target. The bisection first halves the logit keys (32 threadgroup reductions) and
// goes on into the ids only when several candidates share the crossing logit, so tied logits are
// resolved exactly as the CPU walks them (CUDA's one-block fallback finds the tied token by its
// rank; its draws spread over the GPU in two more kernels, not mirrored here yet).
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

// The contract's order as one 64-bit rank per token: the logit's key high, the id reversed low,
// so "larger rank" means "earlier in the order" and no two tokens tie.
inline uint64_t rank_of(float l, uint i) { return uint64_t(order_key(l)) << 32 | uint64_t(0xFFFFFFFFu - i); }

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

// The three cuts, each a search for the largest rank θ at which a count or mass over the
// tokens of rank >= θ still meets its target.
enum Cut : uint {
    kTopK,  // count of all tokens >= top_k
    kTopP,  // mass of the candidates (rank >= floor, w > 0) >= target
    kDraw,  // mass of the candidates (also w >= min_p with min-p on) > target
};

struct SampleState {
    uint n;
    uint64_t floor;  // candidates have rank >= floor
    bool use_min_p;
    float min_p;
    df64 target;
    uint top_k;
};

inline bool candidate(device const float* w, uint i, uint64_t rank, thread const SampleState& st, uint cut) {
    if (cut == kTopK) return true;
    return rank >= st.floor && w[i] > 0.0f && (cut != kDraw || !st.use_min_p || w[i] >= st.min_p);
}

// Whether the cut's target is met by the candidates of rank >= th.
template <typename Partials, typename Counts>
inline bool meets(constant er_sample_args& a, device const float* l, uint64_t th, thread const SampleState& st, uint cut,
                  Partials hi, Partials lo, Counts counts, uint tid, uint sg, uint lane) {
    uint c = 0;
    df64 m = df_make(0.0f, 0.0f);
    for (uint i = tid; i < st.n; i += ER_THREADS_SAMPLE) {
        const uint64_t r = rank_of(l[i], i);
        if (r < th || !candidate(a.weights, i, r, st, cut)) continue;
        if (cut == kTopK) ++c;
        else m = df_add(m, df_make(a.weights[i], 0.0f));
    }
    if (cut == kTopK) return threadgroup_count(c, counts, sg, lane) >= st.top_k;
    m = threadgroup_mass(m, hi, lo, sg, lane);
    return cut == kDraw ? df_greater(m, st.target) : df_at_least(m, st.target);
}

// The largest rank meeting the cut (rank 0 always does): first the logit key (32 halvings),
// then, only when several candidates share that logit, the id within it (log2 n halvings).
template <typename Partials, typename Counts>
inline uint64_t search(constant er_sample_args& a, device const float* l, thread const SampleState& st, uint cut,
                       Partials hi, Partials lo, Counts counts, uint tid, uint sg, uint lane) {
    uint klo = 0, khi = 0xFFFFFFFFu;
    while (klo < khi) {
        const uint mid = klo + uint((uint64_t(khi) - klo + 1) / 2);  // no wrap at 2^32
        if (meets(a, l, uint64_t(mid) << 32, st, cut, hi, lo, counts, tid, sg, lane)) klo = mid;
        else khi = mid - 1;
    }
    // The candidates with logit key klo: how many, and the first (lowest id).
    uint c = 0, first = st.n;
    for (uint i = tid; i < st.n; i += ER_THREADS_SAMPLE) {
        const uint64_t r = rank_of(l[i], i);
        if (uint(r >> 32) == klo && candidate(a.weights, i, r, st, cut)) {
            ++c;
            first = min(first, i);
        }
    }
    c = threadgroup_count(c, counts, sg, lane);
    first = threadgroup_min(first, counts, sg, lane);
    if (c <= 1) return c == 1 ? rank_of(l[first], first) : uint64_t(klo) << 32;
    uint64_t rlo = uint64_t(klo) << 32 | uint64_t(0xFFFFFFFFu - (st.n - 1)), rhi = uint64_t(klo) << 32 | 0xFFFFFFFFu;
    while (rlo < rhi) {
        const uint64_t mid = rlo + (rhi - rlo + 1) / 2;
        if (meets(a, l, mid, st, cut, hi, lo, counts, tid, sg, lane)) rlo = mid;
        else rhi = mid - 1;
    }
    return rlo;
}

// Σ w over the candidates (rank >= floor, w > 0, and w >= min_p when asked).
template <typename Partials>
inline df64 mass(constant er_sample_args& a, device const float* l, thread const SampleState& st, Partials hi, Partials lo,
                 uint tid, uint sg, uint lane, bool with_min_p) {
    df64 m = df_make(0.0f, 0.0f);
    for (uint i = tid; i < st.n; i += ER_THREADS_SAMPLE) {
        const float w = a.weights[i];
        if (rank_of(l[i], i) >= st.floor && w > 0.0f && (!with_min_p || w >= st.min_p)) m = df_add(m, df_make(w, 0.0f));
    }
    return threadgroup_mass(m, hi, lo, sg, lane);
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
    if (top == n || step.temperature <= 0.0f) {  // no logit above -FLT_MAX (all -inf or NaN): -1
        if (tid == 0) a.out[step.slot] = top < n ? int32_t(top) : -1;
        return;
    }

    // w = exp((l - l_max) / T): the top token weighs exactly 1. Each thread later reads only the
    // weights it wrote.
    for (uint i = tid; i < n; i += ER_THREADS_SAMPLE)  // (l == mx: 1, not NaN, for +inf at a +inf max)
        a.weights[i] = l[i] == mx ? 1.0f : precise::exp((l[i] - mx) / step.temperature);

    SampleState st;
    st.n = n;
    st.floor = 0;
    st.use_min_p = step.min_p > 0.0f;
    st.min_p = step.min_p;
    st.target = df_make(0.0f, 0.0f);
    st.top_k = uint(max(step.top_k, 0));
    // top-k: the k best are the tokens of rank >= the k-th largest rank.
    if (step.top_k > 0 && uint(step.top_k) < n) st.floor = search(a, l, st, kTopK, part_hi, part_lo, part_u, tid, sg, lane);
    // top-p: the shortest prefix whose mass reaches top_p of the candidates' mass.
    if (step.top_p < 1.0f) {
        st.target = df_scale(mass(a, l, st, part_hi, part_lo, tid, sg, lane, false), step.top_p);
        const uint64_t nucleus = search(a, l, st, kTopP, part_hi, part_lo, part_u, tid, sg, lane);
        if (nucleus > st.floor) st.floor = nucleus;
    }
    // min-p drops w < min_p; the draw is the first candidate, in order, whose cumulative mass
    // exceeds u · S: the largest rank whose mass over ranks >= it still exceeds u · S.
    st.target = df_scale(mass(a, l, st, part_hi, part_lo, tid, sg, lane, st.use_min_p), sample_uniform(step.seed, step.sample_step));
    const uint64_t drawn = search(a, l, st, kDraw, part_hi, part_lo, part_u, tid, sg, lane);
    if (tid == 0) a.out[step.slot] = int32_t(0xFFFFFFFFu - uint(drawn & 0xFFFFFFFFu));
}

// ---- bias and penalties -------------------------------------------------------------------

// The first index in [lo, hi) of the rising `tokens` whose token is >= t (hi where none is).
inline uint first_at_least(device const int32_t* tokens, uint lo, uint hi, uint t) {
    while (lo < hi) {
        const uint mid = lo + (hi - lo) / 2;
        if (uint(tokens[mid]) < t) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

kernel void penalize(constant er_penalize_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    const uint from = tgid.x * ER_PENALIZE_SLICE, to = min(a.n_vocab, from + ER_PENALIZE_SLICE);
    device const float* l = a.logits + uint(step.n_tokens - 1) * a.logits_stride;
    for (uint i = from + tid; i < to; i += ER_THREADS_PENALIZE) a.out[i] = l[i];
    threadgroup_barrier(mem_flags::mem_device);  // (the slice copied)
    const uint lo = first_at_least(a.bias_tokens, 0, step.n_bias, from), hi = first_at_least(a.bias_tokens, lo, step.n_bias, to);
    for (uint j = lo + tid; j < hi; j += ER_THREADS_PENALIZE) a.out[a.bias_tokens[j]] += a.bias_values[j];
    if (step.penalty_last_n == 0) return;
    const int last = step.pos0 + step.n_tokens - 1;  // the step's last token's position
    const int n_window = step.penalty_last_n < 0 ? last + 1 : min(last + 1, step.penalty_last_n);
    const int start = last + 1 - n_window;
    threadgroup_barrier(mem_flags::mem_device);  // (the bias added)
    device atomic_int* counts = reinterpret_cast<device atomic_int*>(a.counts);
    for (int i = start + int(tid); i <= last; i += ER_THREADS_PENALIZE) {
        const uint t = uint(a.history[i]);
        if (t >= from && t < to) atomic_fetch_add_explicit(&counts[t], 1, memory_order_relaxed);
    }
    threadgroup_barrier(mem_flags::mem_device);  // (the slice's counts complete)
    for (int i = start + int(tid); i <= last; i += ER_THREADS_PENALIZE) {
        const uint t = uint(a.history[i]);
        if (t < from || t >= to) continue;
        const int c = atomic_exchange_explicit(&counts[t], 0, memory_order_relaxed);
        if (c == 0) continue;  // already penalized: each distinct token once
        const float l_t = a.out[t];
        // (the products go through volatiles: no compiler setting can fuse them into the
        // addition after them)
        volatile float v = l_t > 0.0f ? precise::divide(l_t, step.repetition_penalty) : l_t * step.repetition_penalty;
        volatile float per_count = step.frequency_penalty * float(c);
        const float penalty = step.presence_penalty + per_count;
        a.out[t] = v - penalty;
    }
}
