// Sampling at the end of a step, in two parts. First the greedy token (the max logit, lowest id
// on ties): a grid of blocks, each over its slice of kSlice logits, merges its best into one
// 64-bit word (logit key << 32 | ~id, -0 as +0: an atomicMax orders by logit, then by lowest
// id), and the last block to finish (a counter) takes the merged best and resets both. That
// block alone then samples, when the temperature asks for it. Instead of sorting, every cut of
// the contract is a threshold on the logit: "the tokens at or above logit θ" is a prefix of the
// contract's order (logit descending), so top-k, top-p and the draw each become a search for the
// θ at which a count or a sum over {l ≥ θ} crosses its target: a bisection over the 2^32 ordered
// float keys, 32 block-wide reductions each. Ties between equal logits resolve to the lowest id
// (the contract walks them in id order; with continuous logits they do not occur). With top-k
// of up to 1024 (the common case) the k best are found and sorted instead, and the walk is the
// CPU's (sample_top_k): a few passes over the logits, not a hundred.
#include <cfloat>

#include "check.cuh"
#include "sample.cuh"

namespace edgerunner::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kSlice = 16 * kThreads;  // a block's logits for the greedy token: four float4s a thread, loaded at once

__device__ __forceinline__ uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Floats → uint32 keys in the same order (negative values reversed), and back.
__device__ __forceinline__ uint32_t key(float f) {
    const uint32_t b = __float_as_uint(f);
    return b & 0x80000000u ? ~b : b | 0x80000000u;
}
__device__ __forceinline__ float from_key(uint32_t k) { return __uint_as_float(k & 0x80000000u ? k & 0x7FFFFFFFu : ~k); }

template <typename T>
__device__ T block_sum(T v, T* shared) {
#pragma unroll
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    __syncthreads();
    if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
    __syncthreads();
    T total = 0;
    for (int i = 0; i < kThreads / 32; ++i) total += shared[i];
    return total;
}

// The largest key θ for which f(θ) >= target, f non-increasing in θ (f(0) is everything).
template <typename F>
__device__ uint32_t search(F f, double target) {
    uint32_t lo = 0, hi = 0xFFFFFFFFu;  // f(lo) >= target holds; find the last such key
    while (lo < hi) {
        const uint32_t mid = lo + static_cast<uint32_t>((static_cast<uint64_t>(hi) - lo + 1) / 2);  // no wrap at 2^32
        if (f(mid) >= target) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// f(value, id, valid) over the logits, each thread its ids in rising order, kLoads float4s (or
// floats) in flight at once; every lane of every warp calls f equally often (valid = false past
// the end, value -FLT_MAX), so f may use warp collectives.
template <typename F>
__device__ __forceinline__ void for_each_logit(const float* __restrict__ l, int n, F f) {
    constexpr int kLoads = 4;
    const int t = static_cast<int>(threadIdx.x);
    int from = 0;
    if (reinterpret_cast<uintptr_t>(l) % 16 == 0) {
        const float4* l4 = reinterpret_cast<const float4*>(l);
        const int n4 = n / 4;
        for (int base = 0; base < n4; base += kLoads * kThreads) {
            float4 v[kLoads];
#pragma unroll
            for (int k = 0; k < kLoads; ++k) {
                const int j = base + k * kThreads + t;
                v[k] = j < n4 ? l4[j] : make_float4(-FLT_MAX, -FLT_MAX, -FLT_MAX, -FLT_MAX);
            }
#pragma unroll
            for (int k = 0; k < kLoads; ++k) {
                const int j = base + k * kThreads + t;
                const bool in = j < n4;
                f(v[k].x, 4 * j, in), f(v[k].y, 4 * j + 1, in), f(v[k].z, 4 * j + 2, in), f(v[k].w, 4 * j + 3, in);
            }
        }
        from = 4 * n4;
    }
    for (int base = from; base < n; base += kLoads * kThreads) {
        float v[kLoads];
#pragma unroll
        for (int k = 0; k < kLoads; ++k) {
            const int i = base + k * kThreads + t;
            v[k] = i < n ? l[i] : -FLT_MAX;
        }
#pragma unroll
        for (int k = 0; k < kLoads; ++k) f(v[k], base + k * kThreads + t, base + k * kThreads + t < n);
    }
}

struct Sample {
    using Args = SampleArgs;
    static __device__ void run(const Args& a);
};

// The drawn token out (pinned host memory fenced, for the host to see once the step is done),
// and into the next chained step's input.
__device__ __forceinline__ void emit(const SampleArgs& a, int32_t token) {
    *a.out = token;
    if (a.next) *a.next = token;
    if (a.out_host) __threadfence_system();
}

// top-k with k <= kMaxCandidates: the CPU sampler's walk over its k best tokens, in its order.
// The k-th largest key θ comes from a radix search (four passes of 8 bits, integer histograms:
// exact), the tokens at or above θ are sorted in shared memory (logit descending, id ascending:
// a bitonic sort of key << 32 | ~id), and one thread walks the first k as the CPU does (softmax
// weights, top-p prefix, min-p suffix, the draw), summing in that order. Returns the token, or -1
// when ties at θ make more candidates than fit (the caller then takes the general path).
constexpr int kMaxCandidates = 1024;

__device__ int32_t sample_top_k(const float* __restrict__ l, int32_t n, const DeviceSampling& p, double u, float mx) {
    __shared__ int hist[256];
    __shared__ uint32_t s_prefix;
    __shared__ int s_above, n_cand;
    __shared__ unsigned long long cand[kMaxCandidates];
    __shared__ double wk[kMaxCandidates];
    const int k = p.top_k, lane = threadIdx.x % 32;
    uint32_t prefix = 0;
    int above = 0;  // tokens whose key is above the range the prefix leaves
    for (int level = 0; level < 4; ++level) {
        const int shift = 24 - 8 * level;
        const uint32_t mask = level == 0 ? 0u : ~0u << (shift + 8);
        if (threadIdx.x < 256) hist[threadIdx.x] = 0;
        __syncthreads();
        for_each_logit(l, n, [&](float v, int, bool valid) {  // one atomic per bucket and warp
            const uint32_t kk = key(v);
            const bool in = valid && (kk & mask) == (prefix & mask);
            const unsigned bucket = in ? kk >> shift & 255 : 256, peers = __match_any_sync(0xFFFFFFFFu, bucket);
            if (in && lane == __ffs(static_cast<int>(peers)) - 1) atomicAdd(&hist[bucket], __popc(peers));
        });
        __syncthreads();
        if (threadIdx.x < 32) {  // the largest bucket b with above + (count in buckets >= b) >= k
            int h[8], sum = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) sum += h[j] = hist[8 * lane + j];
            int suffix = sum;  // over this lane's buckets and every later lane's
            for (int o = 1; o < 32; o *= 2) {
                const int v = __shfl_down_sync(0xFFFFFFFFu, suffix, o);
                if (lane + o < 32) suffix += v;
            }
            const unsigned ok = __ballot_sync(0xFFFFFFFFu, above + suffix >= k);  // lanes 0 .. L
            if (lane == (ok ? 31 - __clz(static_cast<int>(ok)) : 0)) {
                int c = above + suffix - sum, b = 7;
                for (; b > 0 && c + h[b] < k; --b) c += h[b];
                s_prefix = prefix | static_cast<uint32_t>(8 * lane + b) << shift;
                s_above = c;
            }
        }
        __syncthreads();
        prefix = s_prefix;
        above = s_above;
    }
    const int count = above + hist[prefix & 255];  // tokens with key >= θ (= prefix)
    if (count > kMaxCandidates) return -1;
    if (threadIdx.x == 0) n_cand = 0;
    __syncthreads();
    for_each_logit(l, n, [&](float v, int i, bool valid) {
        if (valid && key(v) >= prefix) cand[atomicAdd(&n_cand, 1)] = static_cast<unsigned long long>(key(v)) << 32 | ~static_cast<uint32_t>(i);
    });
    int size = 1;
    while (size < count) size *= 2;
    for (int i = count + threadIdx.x; i < size; i += kThreads) cand[i] = 0;
    for (int width = 2; width <= size; width *= 2)  // bitonic sort, descending
        for (int stride = width / 2; stride > 0; stride /= 2) {
            __syncthreads();
            const int i = threadIdx.x, j = i ^ stride;
            if (i < size && j > i) {
                const unsigned long long x = cand[i], y = cand[j];
                if (((i & width) == 0) == (x < y)) cand[i] = y, cand[j] = x;
            }
        }
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < k) {
        const float li = l[~static_cast<uint32_t>(cand[threadIdx.x])];
        wk[threadIdx.x] = li == mx ? 1.0 : exp((static_cast<double>(li) - mx) / p.temperature);
    }
    __syncthreads();
    if (threadIdx.x != 0) return 0;
    double z = 0.0;
    for (int i = 0; i < k; ++i) z += wk[i];
    int kept = k;
    if (p.top_p < 1.0f) {
        const double target = p.top_p * z;
        double cum = 0.0;
        for (int i = 0; i < k; ++i)
            if ((cum += wk[i]) >= target) {
                kept = i + 1;
                break;
            }
    }
    const double min_w = p.min_p;
    int m = 0;  // w is non-increasing: min-p and w == 0 cut a suffix
    double s = 0.0;
    while (m < kept && wk[m] >= min_w && wk[m] > 0.0) s += wk[m++];
    const double target = u * s;
    double cum = 0.0;
    int pick = m - 1;
    for (int i = 0; i < m; ++i)
        if ((cum += wk[i]) > target) {
            pick = i;
            break;
        }
    return static_cast<int32_t>(~static_cast<uint32_t>(cand[pick]));
}

__device__ void Sample::run(const SampleArgs& a) {
    allow_next();
    // the step block's header before the wait (written before the step's first kernel started)
    const DeviceSampling p = *a.params;
    const uint64_t step = *a.step;
    const int64_t pos0 = a.next_pos0 ? *a.pos0 : 0;
    wait_inputs();
    const float* __restrict__ l = a.logits;
    const int32_t n = a.n_vocab;
    __shared__ double dsh[kThreads / 32];
    __shared__ float fsh[kThreads / 32];
    __shared__ int ish[kThreads / 32];
    __shared__ int best_id;
    __shared__ bool last;
    // this block's slice: its max logit, lowest id on ties (each thread its ids in rising order,
    // then warps and the block)
    const int32_t from = static_cast<int32_t>(blockIdx.x) * kSlice;
    float mx = -FLT_MAX;
    int arg = n;
    for_each_logit(l + from, min(kSlice, n - from), [&](float v, int i, bool) {
        if (v > mx) mx = v, arg = from + i;
    });
    auto warp_best = [&] {
        for (int o = 16; o > 0; o /= 2) {
            const float m2 = __shfl_xor_sync(0xFFFFFFFFu, mx, o);
            const int a2 = __shfl_xor_sync(0xFFFFFFFFu, arg, o);
            if (m2 > mx || (m2 == mx && a2 < arg)) mx = m2, arg = a2;
        }
    };
    warp_best();
    if (threadIdx.x % 32 == 0) {
        fsh[threadIdx.x / 32] = mx;
        ish[threadIdx.x / 32] = arg;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        mx = fsh[threadIdx.x];
        arg = ish[threadIdx.x];
        warp_best();
        if (threadIdx.x == 0) {
            bool is_last = true;
            if (gridDim.x > 1) {  // merged with the other blocks' bests; the last block goes on
                atomicMax(a.best, static_cast<unsigned long long>(key(mx + 0.0f)) << 32 | ~static_cast<uint32_t>(arg));
                __threadfence();  // the best merged before the count says so
                is_last = atomicAdd(a.done, 1u) == gridDim.x - 1;
                if (is_last) {
                    const unsigned long long best = atomicExch(a.best, 0ull);  // (and both reset for the next step)
                    *a.done = 0;
                    mx = from_key(static_cast<uint32_t>(best >> 32));
                    arg = static_cast<int>(~static_cast<uint32_t>(best));
                }
            }
            last = is_last, fsh[0] = mx, best_id = arg;
        }
    }
    __syncthreads();
    if (!last) return;
    mx = fsh[0];
    const int top = best_id;
    double* w = a.scratch;
    if (a.next_pos0 && threadIdx.x == 0) {
        *a.next_pos0 = pos0 + 1;
        *a.next_step = step + 1;
        *a.next_params = p;
    }
    if (p.temperature <= 0.0f) {
        if (threadIdx.x == 0) emit(a, top);
        return;
    }
    const uint64_t state = mix(p.seed) + (step + 1) * 0x9E3779B97F4A7C15ull;
    const double u = static_cast<double>(static_cast<float>(mix(state) >> 40) * 0x1.0p-24f);
    if (p.top_k > 0 && p.top_k < n && p.top_k <= kMaxCandidates) {
        const int32_t token = sample_top_k(l, n, p, u, mx);  // (thread 0's answer)
        if (token >= 0) {  // (uniform: every thread returns -1 or none does)
            if (threadIdx.x == 0) emit(a, token);
            return;
        }
    }
    // w = exp((l - l_max) / T) in float64: the top token weighs 1 exactly
    for (int i = threadIdx.x; i < n; i += kThreads) w[i] = exp((static_cast<double>(l[i]) - mx) / p.temperature);
    __syncthreads();
    const auto count_at = [&](uint32_t th) {
        int c = 0;
        for (int i = threadIdx.x; i < n; i += kThreads) c += key(l[i]) >= th;
        return block_sum(c, ish);
    };
    const auto mass_at = [&](uint32_t th, uint32_t floor_key, bool min_p) {
        double s = 0;
        for (int i = threadIdx.x; i < n; i += kThreads) {
            const uint32_t k = key(l[i]);
            if (k >= th && k >= floor_key && w[i] > 0.0 && (!min_p || w[i] >= p.min_p)) s += w[i];
        }
        return block_sum(s, dsh);
    };
    // top-k: the k best are the tokens at or above the k-th largest logit
    uint32_t floor_key = 0;
    if (p.top_k > 0 && p.top_k < n) floor_key = search(count_at, static_cast<double>(p.top_k));
    // top-p: the shortest prefix whose mass reaches top_p of the candidates' mass
    if (p.top_p < 1.0f) {
        const double z = mass_at(0, floor_key, false);
        floor_key = max(floor_key, search([&](uint32_t th) { return mass_at(th, floor_key, false); }, static_cast<double>(p.top_p) * z));
    }
    // min-p drops w < min_p; then the draw: the first token, in order, whose cumulative mass
    // exceeds u · S
    const bool min_p = p.min_p > 0.0f;
    const double s_total = mass_at(0, floor_key, min_p);
    // largest θ whose mass over {l ≥ θ} exceeds u·S: the drawn token has logit θ
    const uint32_t th = search([&](uint32_t t) { return mass_at(t, floor_key, min_p) > u * s_total ? 1.0 : 0.0; }, 1.0);
    __syncthreads();
    if (threadIdx.x == 0) best_id = n;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += kThreads)
        if (key(l[i]) == th && key(l[i]) >= floor_key && w[i] > 0.0 && (!min_p || w[i] >= p.min_p)) atomicMin(&best_id, i);
    __syncthreads();
    if (threadIdx.x == 0) emit(a, best_id < n ? best_id : top);
}

// The logits after bias and penalties, a slice of kSlice tokens a block: the slice copied, the
// bias table's entries in it added, then the window's tokens in it counted (the counts array,
// global: each block touches only its slice's entries) and each distinct one penalized once by
// the thread that takes its count back to zero. The float arithmetic is the CPU's, rounding for
// rounding (no fused multiply-add).
// The first index in [lo, hi) of rising `tokens` whose token is >= t (hi where none is).
__device__ __forceinline__ int32_t first_at_least(const int32_t* tokens, int32_t lo, int32_t hi, int32_t t) {
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (tokens[mid] < t) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

struct Penalize {
    using Args = PenaltyArgs;
    static __device__ void run(const Args& a);
};

__device__ void Penalize::run(const PenaltyArgs& a) {
    allow_next();
    const DeviceSampling p = *a.params;
    const int64_t last = *a.pos0 + a.n_tokens - 1;
    wait_inputs();
    const int32_t from = static_cast<int32_t>(blockIdx.x) * kSlice, to = min(a.n_vocab, from + kSlice);
    for (int32_t i = from + static_cast<int32_t>(threadIdx.x); i < to; i += kThreads) a.out[i] = a.logits[i];
    __syncthreads();
    const int32_t lo = first_at_least(a.bias_tokens, 0, p.n_bias, from), hi = first_at_least(a.bias_tokens, lo, p.n_bias, to);
    for (int32_t j = lo + static_cast<int32_t>(threadIdx.x); j < hi; j += kThreads) a.out[a.bias_tokens[j]] += a.bias_values[j];
    if (p.penalty_last_n == 0) return;
    const int64_t n_window = p.penalty_last_n < 0 ? last + 1 : min(last + 1, static_cast<int64_t>(p.penalty_last_n));
    const int64_t start = last + 1 - n_window;
    __syncthreads();  // (the bias added)
    for (int64_t i = start + threadIdx.x; i <= last; i += kThreads) {
        const int32_t t = a.history[i];
        if (t >= from && t < to) atomicAdd(&a.counts[t], 1);
    }
    __syncthreads();
    for (int64_t i = start + threadIdx.x; i <= last; i += kThreads) {
        const int32_t t = a.history[i];
        if (t < from || t >= to) continue;
        const int c = atomicExch(&a.counts[t], 0);
        if (c == 0) continue;  // already penalized: each distinct token once
        float v = a.out[t];
        v = v > 0.0f ? __fdiv_rn(v, p.repetition_penalty) : __fmul_rn(v, p.repetition_penalty);
        a.out[t] = __fsub_rn(v, __fadd_rn(p.presence_penalty, __fmul_rn(p.frequency_penalty, static_cast<float>(c))));
    }
}

}  // namespace

DeviceSampling device_sampling(const SamplingParams& p, int32_t n_bias) {
    DeviceSampling d;
    d.temperature = p.temperature;
    d.top_k = p.top_k;
    d.top_p = p.top_p;
    d.min_p = p.min_p;
    d.seed = p.seed;
    if (penalties_on(p)) {
        d.repetition_penalty = p.repetition_penalty;
        d.presence_penalty = p.presence_penalty;
        d.frequency_penalty = p.frequency_penalty;
        d.penalty_last_n = p.penalty_last_n;
    }
    d.n_bias = n_bias;
    return d;
}

Launch penalize(const PenaltyArgs& a) {
    return make_launch<Penalize>(dim3(static_cast<unsigned>((a.n_vocab + kSlice - 1) / kSlice)), dim3(kThreads), a);
}

Launch sample(const SampleArgs& a) {
    const int blocks = (a.n_vocab + kSlice - 1) / kSlice;
    if (blocks > 1 && (!a.best || !a.done)) throw std::logic_error("the device sampler of more than one block needs its scratch (best, done)");
    return make_launch<Sample>(dim3(static_cast<unsigned>(blocks)), dim3(kThreads), a);
}

}  // namespace edgerunner::cuda
