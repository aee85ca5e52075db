// Sampling at the end of a step, in two parts. First the greedy token (the max logit, lowest id
// on ties): a grid of blocks, each over its slice of kSlice logits, merges its best into one
// 64-bit word (logit key << 32 | ~id, -0 as +0: an atomicMax orders by logit, then by lowest
// id), and the last block to finish (a counter) takes the merged best and resets both (-1 where
// no logit is finite: the runner reports it). Then the draw, when the temperature asks for one.
// Instead of sorting the vocabulary, every cut of the contract is a threshold: "the tokens at or
// above logit θ" is a prefix of the contract's order (logit descending, then id ascending), so
// top-k, top-p and the draw each become a search for where a count or a sum over that prefix
// crosses its target, in two more kernels that spread the search over the GPU:
//  - SampleMass sums every token into histograms of 65536 buckets (with top-k by the top 16
//    bits of its logit's key, and token counts; else by its distance below
//    the largest logit, and its softmax weight in fixed point: every token's, and min-p's kept
//    ones'). Its last block finds the buckets the cuts fall in.
//  - SampleWalk collects the tokens of those buckets (with top-k: every token from top-k's bucket
//    up, cut to the k best where a crowded bucket would pad the sort: trim_top_k), and its last
//    block sorts them (top-k's up to 4096, else 1024; few, up to 64 with top-k and 128
//    without, by its first warp alone, in registers: sort_few) and walks them: top-p's and the
//    draw's ends come from prefix sums of fixed-point masses, over top-k's k best (walk_top_k)
//    or, without top-k, over the cuts' buckets (walk_cuts).
//  - Otherwise (top-k over 4096; more candidates than a block sorts, as with many equal logits)
//    SampleWalk's last block searches alone, each cut by bisection over the logit keys and, among
//    tokens tied at the key found, by rank in id order (draw_by_bisection): with top-k over its
//    candidates (every token from top-k's bucket up), else over the whole vocabulary.
// Equal logits are walked in id order, as the CPU sampler walks them.
#include <cfloat>

#include "check.cuh"
#include "edgerunner/softmax_weight.h"
#include "sample.cuh"

namespace edgerunner::cuda {
namespace {

constexpr int kThreads = 1024;  // every kernel's block (launch bounds: 64 registers a thread, or they would not launch)
constexpr int kSlice = 16 * kThreads;  // a block's logits for the greedy token: four float4s a thread, loaded at once
constexpr unsigned kFull = 0xFFFFFFFFu;  // (a warp)

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
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(kFull, v, o);
    __syncthreads();
    if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
    __syncthreads();
    T total = 0;
    for (int i = 0; i < kThreads / 32; ++i) total += shared[i];
    return total;
}

// f(value, id, valid) over the logits, each thread its ids in rising order, kLoads float4s (or
// floats: unaligned, or kVector false) in flight at once; every lane of every warp calls f
// equally often (valid = false past the end, value -FLT_MAX), so f may use warp collectives.
template <int kLoads = 4, bool kVector = true, typename F>
__device__ __forceinline__ void for_each_logit(const float* __restrict__ l, int n, F f) {
    const int t = static_cast<int>(threadIdx.x);
    int from = 0;
    if (kVector && reinterpret_cast<uintptr_t>(l) % 16 == 0) {
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
    static constexpr int kBlockThreads = kThreads, kMinBlocks = 1;
    static __device__ void run(const Args& a);
};

// The drawn token out (pinned host memory fenced, for the host to see once the step is done),
// and into the next chained step's input. (The host reads it after the step's event, which orders
// it too; without the fence chained steps ran no faster: bench/NOTES.md, forty-fourth session.)
__device__ __forceinline__ void emit(const SampleArgs& a, int32_t token) {
    *a.out = token;
    if (a.next) *a.next = token;
    if (a.out_host) __threadfence_system();
}

constexpr int kMaxCandidates = 1024;  // the tokens a block walks one a thread (walk_cuts)
constexpr int kMaxTopK = 4096;        // top-k's candidates a block sorts and walks (SampleWalk)
constexpr int kWarpTopK = 64;         // top-k's candidates SampleWalk's first warp sorts and walks alone
constexpr int kWarpCuts = 128;        // without top-k (four a lane: top-p on a flat 128k vocabulary has up to ~80)

// SampleWalk's last block walks its candidates on a team: the whole block (kTeam = kThreads), or
// its first warp alone (kTeam = 32) where they are few: a warp's steps need no barrier of the
// block's 32 warps (SampleWalk took 1.2–3.0 µs less a token on an H100: bench/NOTES.md). Every
// thread of the team calls; its ranks are threadIdx.x < kTeam.
template <int kTeam>
__device__ __forceinline__ void team_sync() {
    static_assert(kTeam == kThreads || kTeam == 32, "a team is the block or its first warp");
    if constexpr (kTeam == 32) __syncwarp();
    else __syncthreads();
}

// One stage of a bitonic sort of `size` keys in shared memory: pair t is i with i + stride, its
// run of `width` descending where i's bit `width` is clear, else ascending.
__device__ __forceinline__ void bitonic_stage(unsigned long long* cand, int size, int width, int stride) {
    for (int t = threadIdx.x; t < size / 2; t += kThreads) {
        const int i = 2 * t - (t & (stride - 1)), j = i + stride;
        const unsigned long long x = cand[i], y = cand[j];
        if (((i & width) == 0) == (x < y)) cand[i] = y, cand[j] = x;
    }
}

// Sorts cand[0, count) (in shared memory with room for the next power of two) into descending
// order: a bitonic sort, block-wide (each thread its pairs), the tail padded with zeros.
__device__ void sort_descending(unsigned long long* cand, int count) {
    int size = 1;
    while (size < count) size *= 2;
    __syncthreads();  // (cand written)
    for (int i = count + threadIdx.x; i < size; i += kThreads) cand[i] = 0;
    for (int width = 2; width <= size; width *= 2)
        for (int stride = width / 2; stride > 0; stride /= 2) {
            __syncthreads();
            bitonic_stage(cand, size, width, stride);
        }
    __syncthreads();
}

// The bitonic stages of run width `width` with strides from `top` down, on a warp's 32 E keys in
// registers (E a lane, at positions base + r): strides under E within a lane, the others by
// shuffles. Keys p and p ^ stride: the lower one keeps the larger where p's run of `width` descends.
template <int E>
__device__ __forceinline__ void warp_merge(unsigned long long (&v)[E], int base, int width, int top) {
    for (int stride = top; stride >= E; stride /= 2)
#pragma unroll
        for (int r = 0; r < E; ++r) {
            const int p = base + r;
            const unsigned long long y = __shfl_xor_sync(kFull, v[r], stride / E), hi = max(v[r], y), lo = min(v[r], y);
            v[r] = ((p & width) == 0) == ((p & stride) == 0) ? hi : lo;
        }
#pragma unroll
    for (int stride = E / 2; stride > 0; stride /= 2)
#pragma unroll
        for (int r = 0; r < E; ++r)
            if (!(r & stride) && stride <= top) {
                const unsigned long long hi = max(v[r], v[r | stride]), lo = min(v[r], v[r | stride]);
                const bool descending = ((base + r) & width) == 0;
                v[r] = descending ? hi : lo;
                v[r | stride] = descending ? lo : hi;
            }
}

// A warp alone (SampleWalk's first, with few candidates): cand[0, count) (count <= 32 E, global)
// sorted descending in its registers into sorted[0, count) (shared), no barrier of the block.
template <int E>
__device__ void sort_few(const unsigned long long* cand, int count, unsigned long long* sorted) {
    const int base = static_cast<int>(threadIdx.x % 32) * E;
    unsigned long long v[E];
#pragma unroll
    for (int r = 0; r < E; ++r) v[r] = base + r < count ? __ldcg(cand + base + r) : 0ull;
    for (int width = 2; width <= 32 * E; width *= 2) warp_merge<E>(v, base, width, width / 2);
#pragma unroll
    for (int r = 0; r < E; ++r)
        if (base + r < count) sorted[base + r] = v[r];
    __syncwarp();
}

// sort_descending for count > kThreads (up to kThreads · E), in fewer barriers: E keys a thread in
// registers (a warp's 32 E in a row), strides under 32 E between lanes by shuffles, the longer
// ones in shared memory (at 4096 keys, 15 barrier stages where sort_descending has 78).
template <int E>
__device__ void sort_descending_wide(unsigned long long* cand, int count) {
    const int lane = static_cast<int>(threadIdx.x % 32), base = static_cast<int>(threadIdx.x / 32) * 32 * E + lane * E;
    unsigned long long v[E];
    __syncthreads();  // (cand written)
#pragma unroll
    for (int r = 0; r < E; ++r) v[r] = base + r < count ? cand[base + r] : 0ull;
    const auto in_warp = [&](int width, int top) { warp_merge<E>(v, base, width, top); };
    for (int width = 2; width <= 32 * E; width *= 2) in_warp(width, width / 2);
    for (int width = 64 * E; width <= kThreads * E; width *= 2) {
#pragma unroll
        for (int r = 0; r < E; ++r) cand[base + r] = v[r];
        for (int stride = width / 2; stride >= 32 * E; stride /= 2) {
            __syncthreads();
            bitonic_stage(cand, kThreads * E, width, stride);
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < E; ++r) v[r] = cand[base + r];
        in_warp(width, 16 * E);
    }
#pragma unroll
    for (int r = 0; r < E; ++r) cand[base + r] = v[r];
    __syncthreads();
}

// A token's order key: its logit's key, then its id reversed (the contract's order, descending).
__device__ __forceinline__ unsigned long long order_key(uint32_t k, int32_t id) {
    return static_cast<unsigned long long>(k) << 32 | ~static_cast<uint32_t>(id);
}
__device__ __forceinline__ int32_t order_id(unsigned long long o) { return static_cast<int32_t>(~static_cast<uint32_t>(o)); }
// Its logit, the same bits (the walks read it here, not from the logits again: one round trip less).
__device__ __forceinline__ float order_logit(unsigned long long o) { return from_key(static_cast<uint32_t>(o >> 32)); }

// The contract's uniform: 24 random bits U, u = U · 2^-24.
__device__ __forceinline__ uint32_t uniform_bits(uint64_t seed, uint64_t step) {
    const uint64_t state = mix(seed) + (step + 1) * 0x9E3779B97F4A7C15ull;
    return static_cast<uint32_t>(mix(state) >> 40);
}

// The contract's softmax weight, float64: exp((l - mx) / T), the largest logit weighing 1 exactly;
// from a token's distance below the largest logit in units of T, d = (mx - l) / T (the same
// bits negated).
__device__ __forceinline__ double distance(float l, float mx, double t) {  // (0, not NaN, for +inf at a +inf max)
    return l == mx ? 0.0 : __ddiv_rn(__dsub_rn(static_cast<double>(mx), static_cast<double>(l)), t);
}
// e^-d, the CPU sampler's bits (edgerunner/softmax_weight.h: one definition for both).
__device__ __forceinline__ double weight_at(double d) { return softmax::weight(d); }
__device__ __forceinline__ double weight(float l, float mx, double t) { return weight_at(distance(l, mx, t)); }

// A token's mass is its weight w in fixed point, w · 2^shift rounded (0 where w is 0 or NaN), with
// shift = 46 or less so that the whole vocabulary's sums stay below 2^63 (2^-46 ≈ 1.4e-14: a draw
// can differ from the CPU's float64 walk only where u · S falls within about n · 2^-47 of a
// token's edge). Integer sums are the same bits in any order: every run and every split over
// blocks gives the same draw.
struct Mass {
    unsigned long long all = 0, kept = 0;
    __device__ Mass operator+(const Mass& o) const { return {all + o.all, kept + o.kept}; }
};

__device__ __forceinline__ double mass_scale(int32_t n) {
    const int ceil_log2 = n > 1 ? 32 - __clz(n - 1) : 0;
    return static_cast<double>(1ull << min(46, 63 - ceil_log2));
}
__device__ __forceinline__ unsigned long long fixed_mass(double w, double scale) {
    return w > 0.0 ? static_cast<unsigned long long>(w * scale + 0.5) : 0ull;  // (w · scale exact, below 2^52)
}
// A token's histogram bucket (16 bits, higher logits in higher buckets). With top-k (counts):
// its logit key's top 16 bits (bucket_of_key). With masses: its distance d below the largest
// logit in steps of 33 / 65536 (bucket_at; tokens 33 T or more below it weigh under 2^-47, mass
// 0: all in bucket 0). Key bits gave flat logits too few buckets: a random-weight 1B's (mean 4.3,
// std 0.93) put up to 1805 tokens in one, past the walk's 1024, so every draw fell back to the
// one-block bisection (~0.4 ms a token at 128k); by d the most is 43. Monotone in the logit.
__device__ __forceinline__ int32_t bucket_of_key(uint32_t k) { return static_cast<int32_t>(k >> 16); }
__device__ __forceinline__ int32_t bucket_at(double d) {
    const double s = d * (65536.0 / 33.0);
    return s < 65535.0 ? 65535 - static_cast<int32_t>(s) : 0;
}

// The draw's target: the cut is at the first token whose cumulative mass c has c > u · S, which
// for integers is c > floor(U · S / 2^24) (exact: no overflow below S = 2^63).
__device__ __forceinline__ unsigned long long draw_target(uint32_t u_bits, unsigned long long s) {
    return u_bits * (s >> 24) + ((u_bits * (s & 0xFFFFFFull)) >> 24);
}
// Team-wide (one value a thread): the inclusive prefix sum.
template <int kTeam = kThreads>
__device__ unsigned long long block_scan(unsigned long long v, unsigned long long* warp_sums) {
    const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
    for (int o = 1; o < 32; o *= 2) {
        const unsigned long long x = __shfl_sync(kFull, v, lane - o);
        if (lane >= o) v += x;
    }
    if constexpr (kTeam == 32) return v;
    __syncthreads();
    if (lane == 31) warp_sums[warp] = v;
    __syncthreads();
    for (int w = 0; w < warp; ++w) v += warp_sums[w];
    return v;
}
// The least of the threads' `mine` (none where none is less; every thread's answer).
template <int kTeam = kThreads>
__device__ int block_min(int mine, int none, int* first) {
    if constexpr (kTeam == 32) {
        for (int o = 16; o > 0; o /= 2) mine = min(mine, __shfl_xor_sync(kFull, mine, o));
        return min(mine, none);
    }
    __syncthreads();
    if (threadIdx.x == 0) *first = none;
    __syncthreads();
    if (mine < none) atomicMin(first, mine);
    __syncthreads();
    return *first;
}

static_assert(kMaxTopK <= 4 * kThreads, "SampleWalk sorts up to 4 keys a thread");
__device__ __forceinline__ int pow2_at_least(int x) { return x <= 1 ? 1 : 1 << (32 - __clz(x - 1)); }

// Team-wide over E values a thread (positions threadIdx.x · E + r): their inclusive prefix sums in
// place, and the first position where a test holds (kTeam · E where none does).
template <int kTeam, int E>
__device__ void team_scan(unsigned long long (&v)[E], unsigned long long* warp_sums) {
#pragma unroll
    for (int r = 1; r < E; ++r) v[r] += v[r - 1];
    const unsigned long long mine = v[E - 1], before = block_scan<kTeam>(mine, warp_sums) - mine;
#pragma unroll
    for (int r = 0; r < E; ++r) v[r] += before;
}
template <int kTeam, int E, typename F>
__device__ int team_first(F test, int* first) {
    int mine = kTeam * E;
#pragma unroll
    for (int r = E - 1; r >= 0; --r)
        if (test(r)) mine = static_cast<int>(threadIdx.x) * E + r;
    return block_min<kTeam>(mine, kTeam * E, first);
}

// The CPU sampler's walk over the k best tokens, cand[0, k) in the contract's order (k = p.top_k <=
// kMaxTopK, or kWarpTopK on a warp; shared memory), E a thread of the team: min-p ends it at the
// first weight under min_p (weights fall along the order), top-p at the first token whose running
// sum reaches top_p · Z, and the draw is the first token whose running sum passes u · S. The sums
// are of fixed-point masses, as walk_cuts's (units of 2^-46 here): integers, the same in any order,
// so the team adds them at once, where the CPU adds float64 weights one after another (one thread
// doing that took ~13 µs at k = 2000); a draw can differ from the CPU's only where u · S falls
// within about k · 2^-47 of a token's edge. Every thread gets the token.
template <int kTeam = kThreads, int E = 1>
__device__ int32_t walk_top_k(const unsigned long long* cand, const DeviceSampling& p, uint32_t u_bits, float mx) {
    __shared__ unsigned long long sums[kThreads / 32], sum_i;
    __shared__ int first_at;
    const int k = p.top_k, base = static_cast<int>(threadIdx.x) * E;
    const double scale = mass_scale(k);
    unsigned long long c[E];
    bool kept[E];
#pragma unroll
    for (int r = 0; r < E; ++r) {
        const double w = base + r < k ? weight(order_logit(cand[base + r]), mx, p.temperature) : 0.0;
        c[r] = fixed_mass(w, scale);
        kept[r] = w >= p.min_p && w > 0.0;
    }
    team_scan<kTeam>(c, sums);  // c[r]: the running sum at position base + r
    const auto sum_at = [&](int i) {  // (every thread's)
        team_sync<kTeam>();           // (the last one read)
#pragma unroll
        for (int r = 0; r < E; ++r)
            if (base + r == i) sum_i = c[r];
        team_sync<kTeam>();
        return sum_i;
    };
    int m = team_first<kTeam, E>([&](int r) { return base + r < k && !kept[r]; }, &first_at);  // (k where min-p keeps all)
    if (p.top_p < 1.0f) {
        const unsigned long long z = sum_at(k - 1);
        const unsigned long long need = min(z, max(1ull, static_cast<unsigned long long>(ceil(static_cast<double>(p.top_p) * static_cast<double>(z)))));
        m = min(m, team_first<kTeam, E>([&](int r) { return base + r < k && c[r] >= need; }, &first_at) + 1);
    }
    m = max(m, 1);  // (the first token weighs 1)
    const unsigned long long target = draw_target(u_bits, sum_at(m - 1));
    const int pick = team_first<kTeam, E>([&](int r) { return base + r < m && c[r] > target; }, &first_at);
    return order_id(cand[min(pick, m - 1)]);
}

// The k-th largest of the keys `each` visits (each(f) calls f(key, valid) on every lane of the
// block equally often, as for_each_logit does), by a radix search: passes of 8 bits, integer
// histograms (exact), four, or from `level` where θ's top 8 · level bits are known to be
// prefix's (its passes then also count the keys above that range). Returns θ; *at_least gets how
// many keys are >= θ (k, or more where keys tie at θ).
template <typename Each>
__device__ uint32_t kth_largest_key(int k, Each each, int* at_least, uint32_t prefix = 0, int level = 0) {
    __shared__ int hist[256];
    __shared__ uint32_t s_prefix;
    __shared__ int s_above;
    const int lane = threadIdx.x % 32;
    int above = 0;  // keys above the range the prefix leaves
    __syncthreads();  // (the last call's answer read)
    if (threadIdx.x == 0) s_above = 0;
    for (const int from = level; level < 4; ++level) {
        const int shift = 24 - 8 * level;
        const uint32_t mask = level == 0 ? 0u : ~0u << (shift + 8);
        if (threadIdx.x < 256) hist[threadIdx.x] = 0;
        __syncthreads();
        each([&](uint32_t kk, bool valid) {  // one atomic per bucket and warp
            const bool in = valid && (kk & mask) == (prefix & mask);
            const unsigned bucket = in ? kk >> shift & 255 : 256, peers = __match_any_sync(kFull, bucket);
            if (in && lane == __ffs(static_cast<int>(peers)) - 1) atomicAdd(&hist[bucket], __popc(peers));
            if (level == from && from > 0) {  // the keys above the known prefix's range
                const unsigned n_above = __popc(__ballot_sync(kFull, valid && (kk & mask) > (prefix & mask)));
                if (lane == 0 && n_above) atomicAdd(&s_above, static_cast<int>(n_above));
            }
        });
        __syncthreads();
        if (threadIdx.x < 32) {  // the largest bucket b with above + (count in buckets >= b) >= k
            if (level == from) above = s_above;  // (read before any lane's write below: the ballot)
            int h[8], sum = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) sum += h[j] = hist[8 * lane + j];
            int suffix = sum;  // over this lane's buckets and every later lane's
            for (int o = 1; o < 32; o *= 2) {
                const int v = __shfl_down_sync(kFull, suffix, o);
                if (lane + o < 32) suffix += v;
            }
            const unsigned ok = __ballot_sync(kFull, above + suffix >= k);  // lanes 0 .. L
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
    *at_least = above + hist[prefix & 255];
    return prefix;
}

// The one-block search (SampleWalk's last block, where the histograms' buckets leave it more
// candidates than it sorts): each token an entry, written once into the scratch and read back in
// one 16-byte load.
struct alignas(16) Entry {
    unsigned long long order;  // its order key
    unsigned long long mass;   // its fixed-point mass, bit 63 set where min-p keeps it
};
constexpr unsigned long long kKept = 1ull << 63;

// The largest key θ in [lo, hi] for which ok(θ) holds (ok non-increasing in θ, ok(lo) true).
template <typename F>
__device__ uint32_t search(uint32_t lo, uint32_t hi, F ok) {
    while (lo < hi) {
        const uint32_t mid = lo + static_cast<uint32_t>((static_cast<uint64_t>(hi) - lo + 1) / 2);  // no wrap at 2^32
        if (ok(mid)) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// Where the walk over the entries at or above order key `floor`, in the contract's order, first
// passes `pass` (a test on the running total of value(mass word), true of the whole walk's): the
// order key of the token it passes at. One block; every thread gets it. A bisection between the
// floor's key (or the lowest, bottom) and the largest, top, finds that token's logit key θ (the
// last key whose tokens at or above it pass); tokens tied at θ (equal logits: equal values) are
// walked by count, and the one reached is found by its rank in id order (kth_largest_key of their
// reversed ids).
template <typename Value, typename Pass>
__device__ unsigned long long cut_by_bisection(const Entry* e, int count, uint32_t bottom, uint32_t top, unsigned long long floor,
                                               Value value, Pass pass) {
    __shared__ unsigned long long sums[kThreads / 32];
    const auto total = [&](uint32_t th) {  // over the entries at or above floor with key >= th
        unsigned long long s = 0;
        for (int i = threadIdx.x; i < count; i += kThreads) {
            const Entry t = e[i];
            if (static_cast<uint32_t>(t.order >> 32) >= th && t.order >= floor) s += value(t.mass);
        }
        return block_sum(s, sums);
    };
    const uint32_t th = search(max(bottom, static_cast<uint32_t>(floor >> 32)), top, [&](uint32_t t) { return pass(total(t)); });
    unsigned long long above = 0, tied = 0, tied_value = 0;
    for (int i = threadIdx.x; i < count; i += kThreads) {
        const Entry t = e[i];
        const uint32_t k = static_cast<uint32_t>(t.order >> 32);
        if (k < th || t.order < floor) continue;
        if (k > th) above += value(t.mass);
        else ++tied, tied_value += value(t.mass);
    }
    above = block_sum(above, sums);
    tied = block_sum(tied, sums);
    const unsigned long long v = block_sum(tied_value, sums) / max(tied, 1ull);
    unsigned long long lo = 1, hi = tied;  // the tied tokens the walk takes: the fewest j that pass
    while (lo < hi) {
        const unsigned long long mid = (lo + hi) / 2;
        if (pass(above + mid * v)) hi = mid;
        else lo = mid + 1;
    }
    // the lo-th tied token in id order: the lo-th largest of their reversed ids (order keys' low halves)
    int at_least;
    const uint32_t reversed_id = kth_largest_key(static_cast<int>(lo), [&](auto f) {
        for (int base = 0; base < count; base += kThreads) {
            const int i = base + static_cast<int>(threadIdx.x);
            const Entry t = i < count ? e[i] : Entry{0ull, 0ull};
            f(static_cast<uint32_t>(t.order), i < count && static_cast<uint32_t>(t.order >> 32) == th && t.order >= floor);
        }
    }, &at_least);
    return static_cast<unsigned long long>(th) << 32 | reversed_id;
}

// The general draw in one block over `count` tokens: SampleWalk's candidates (cand: order keys of
// every token from top-k's bucket up, the k best among them), or else the vocabulary's logits
// (l). Each token's entry into e (count of them, 16-byte aligned scratch), then every cut by
// cut_by_bisection (masses in fixed point as SampleMass's). Thread 0's answer; top (the greedy
// token) where nothing has mass (no finite logit). Out of line, its arguments plain values: the
// rare path's registers and stack stay out of SampleWalk's common ones.
__device__ ER_NOINLINE int32_t draw_by_bisection(const unsigned long long* cand, const float* l, int count, DeviceSampling p,
                                                 uint32_t u_bits, float mx, int32_t top, Entry* e) {
    __shared__ unsigned long long sums[kThreads / 32];
    __shared__ unsigned top_key, bottom_key;
    const double scale = mass_scale(count);
    if (threadIdx.x == 0) top_key = 0, bottom_key = 0xFFFFFFFFu;
    __syncthreads();
    unsigned highest = 0, lowest = 0xFFFFFFFFu;
    for (int i = threadIdx.x; i < count; i += kThreads) {
        const unsigned long long o = cand ? __ldcg(cand + i) : order_key(key(l[i]), i);
        const double w = weight(order_logit(o), mx, p.temperature);
        e[i] = Entry{o, fixed_mass(w, scale) | (w >= p.min_p && w > 0.0 ? kKept : 0ull)};
        highest = max(highest, static_cast<unsigned>(o >> 32));
        lowest = min(lowest, static_cast<unsigned>(o >> 32));
    }
    atomicMax(&top_key, highest);
    atomicMin(&bottom_key, lowest);
    __syncthreads();
    const uint32_t lo_key = bottom_key, hi_key = top_key;  // (every cut between them)
    const auto total = [&](unsigned long long floor, auto value) {
        unsigned long long s = 0;
        for (int i = threadIdx.x; i < count; i += kThreads)
            if (e[i].order >= floor) s += value(e[i].mass);
        return block_sum(s, sums);
    };
    unsigned long long floor = 0;  // the order key the kept prefix ends at
    if (p.top_k > 0 && p.top_k < count)
        floor = cut_by_bisection(e, count, lo_key, hi_key, floor, [](unsigned long long) { return 1ull; },
                                 [&](unsigned long long c) { return c >= static_cast<unsigned long long>(p.top_k); });
    const auto mass = [](unsigned long long y) { return y & ~kKept; };
    if (p.top_p < 1.0f) {
        const unsigned long long z = total(floor, mass);
        if (z == 0) return top;
        const unsigned long long need = min(z, max(1ull, static_cast<unsigned long long>(ceil(static_cast<double>(p.top_p) * static_cast<double>(z)))));
        floor = cut_by_bisection(e, count, lo_key, hi_key, floor, mass, [&](unsigned long long c) { return c >= need; });
    }
    const auto kept = [](unsigned long long y) { return y & kKept ? y & ~kKept : 0ull; };
    const unsigned long long s = total(floor, kept);
    if (s == 0) return top;
    const unsigned long long target = draw_target(u_bits, s);
    return order_id(cut_by_bisection(e, count, lo_key, hi_key, floor, kept, [&](unsigned long long c) { return c > target; }));
}

// top-k's candidates (src(i), i < count: order keys of every token from the cut's bucket up)
// cut to those whose logit key is at or above the k-th largest, θ, into sorted[0, returned count)
// in any order: the sort then pads k, not every token of a crowded bucket, to a power of two, and
// more candidates than a block sorts need not fall back to the one-block search. Ties at θ stay
// (the walk takes them in id order); -1 where they make more than kMaxTopK. src may read sorted itself
// (count <= kMaxTopK: each thread reads its four before any is written).
template <typename Load>
__device__ int trim_top_k(Load src, int count, int k, int32_t bucket, unsigned long long* sorted) {
    __shared__ int kept;
    const auto each = [&](auto f) {
        for (int base = 0; base < count; base += kThreads) {
            const int i = base + static_cast<int>(threadIdx.x);
            f(i < count ? static_cast<uint32_t>(src(i) >> 32) : 0u, i < count);
        }
    };
    int at_least;
    const uint32_t theta = kth_largest_key(k, each, &at_least, static_cast<uint32_t>(bucket) << 16, 2);  // (θ's top 16 bits: bucket's)
    if (at_least > kMaxTopK) return -1;
    if (threadIdx.x == 0) kept = 0;
    for (int base = 0; base < count; base += 4 * kThreads) {
        unsigned long long v[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int i = base + r * kThreads + static_cast<int>(threadIdx.x);
            v[r] = i < count ? src(i) : 0ull;
        }
        __syncthreads();  // (every read done before a write; kept zeroed)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const bool in = base + r * kThreads + static_cast<int>(threadIdx.x) < count;
            if (in && static_cast<uint32_t>(v[r] >> 32) >= theta) sorted[atomicAdd(&kept, 1)] = v[r];
        }
    }
    __syncthreads();
    return kept;
}

__device__ void Sample::run(const SampleArgs& a) {
    allow_next();
    // the step block's header before the wait (written before the step's first kernel started)
    const DeviceSampling p = *a.params;
    const uint64_t step = *a.step;
    const int64_t pos0 = a.next_pos0 ? *a.pos0 : 0;
    const uint64_t seq = a.next_pos0 ? *a.seq : 0;
    wait_inputs();
    const float* __restrict__ l = a.logits;
    const int32_t n = a.n_vocab;
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
            const float m2 = __shfl_xor_sync(kFull, mx, o);
            const int a2 = __shfl_xor_sync(kFull, arg, o);
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
    if (!last || threadIdx.x != 0) return;
    const int top = best_id < n ? best_id : -1;  // (-1: no logit above -FLT_MAX, every one -inf or NaN)
    if (a.next_pos0) {
        *a.next_pos0 = pos0 + 1;
        *a.next_seq = seq + 1;
        *a.next_step = step + 1;
        *a.next_params = p;
    }
    if (p.temperature > 0.0f && a.wide && top >= 0) {  // SampleMass and SampleWalk draw
        a.wide->mx = fsh[0], a.wide->top = top, a.wide->active = 1;
        return;
    }
    emit(a, top);  // (the runner passes a WideState for every step whose parameters draw)
}

// ---- the draw over the GPU: SampleMass, then SampleWalk ---------------------------------------
// Their tokens a block: a float a thread. Their per-token work (float64 weights, scattered adds)
// is bound by instructions, so it is spread over a block per 1024 tokens (126 SMs at 128k); at
// 4096 a block, 32 SMs did it and a draw cost ~25 us more a token (H100, 8B with min-p).
constexpr int kSpan = kThreads;
static_assert(kSpan == kThreads, "count_top_k takes a token a thread");

// A block's coarse histogram in shared memory: each mass (< 2^47) in three parts, bits 0-21, 22-43
// and 44-46, each part's buckets 32-bit counters, so every add is the SM's own 32-bit atomic (a
// 64-bit add to shared memory is a compare-and-swap loop, retried while lanes of the block contend
// for a bucket: with every token's mass, tens of them a bucket). A part's sum over kSpan tokens
// stays below 2^32.
static_assert(kSpan <= 1024, "a block's 22-bit parts sum below 2^32");
struct CoarseParts {
    unsigned part[3][256];
    __device__ void zero() {
        for (int i = threadIdx.x; i < 3 * 256; i += kThreads) part[i / 256][i % 256] = 0;
    }
    __device__ void add(unsigned bucket, unsigned long long q) {
        atomicAdd(&part[0][bucket], static_cast<unsigned>(q & 0x3FFFFFu));
        atomicAdd(&part[1][bucket], static_cast<unsigned>(q >> 22 & 0x3FFFFFu));
        if (q >> 44) atomicAdd(&part[2][bucket], static_cast<unsigned>(q >> 44));
    }
    __device__ unsigned long long at(int bucket) const {
        return part[0][bucket] + (static_cast<unsigned long long>(part[1][bucket]) << 22) + (static_cast<unsigned long long>(part[2][bucket]) << 44);
    }
};

// What the histograms hold for a step: with top-k, token counts (histogram 0); else masses, every
// token's (0: top-p's) and the kept tokens' (1: the draw's; histogram 0 serves where min-p is off,
// as tokens with w = 0 weigh 0).
struct MassUse {
    bool top_k, all, kept;
    __device__ MassUse(const DeviceSampling& p, int32_t n)
        : top_k(p.top_k > 0 && p.top_k < n),
          all(top_k || p.top_p < 1.0f || p.min_p <= 0.0f),
          kept(!top_k && p.min_p > 0.0f) {}
};

// 256 buckets of a histogram level (the coarse one, or the fine ones inside a coarse bucket) as a
// warp holds them: each lane 8, from the top (the contract's order), lane L's j-th bucket 255 - 8 L - j.
struct Level {
    Mass m[8], sum;  // this lane's, and their sum
    __device__ Level(const WideState& st, const MassUse& use, int32_t coarse_bucket) {  // -1: the coarse level
        const int lane = static_cast<int>(threadIdx.x % 32);
        const unsigned long long* all = coarse_bucket < 0 ? st.coarse[0] : st.fine[0] + coarse_bucket * 256;
        const unsigned long long* kept = coarse_bucket < 0 ? st.coarse[1] : st.fine[1] + coarse_bucket * 256;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int b = 255 - 8 * lane - j;
            m[j].all = __ldcg(all + b);
            m[j].kept = use.kept ? __ldcg(kept + b) : m[j].all;  // (without min-p the draw's mass is every token's)
            sum = sum + m[j];
        }
    }
};

// Where the walk over the buckets from the top first passes `pass`, a test on the mass walked so
// far: over the 256 coarse buckets (given: SampleMass's last block reads them once for its every
// search), then the 256 fine ones inside the coarse one found. Warp-wide; bucket -1 where it never
// passes.
struct Cut {
    int32_t bucket;
    Mass above;  // the buckets' before it
    Mass own;    // its own
};
// One level's part of it: the index (from the top, 8 L + j) of the first of lv's buckets where
// pass(base + the mass walked) holds, -1 where none does; base then has the mass before it, own its.
template <typename Pass>
__device__ int level_cut(const Level& lv, Mass& base, Mass& own, Pass pass) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    Mass upto = lv.sum;  // over this lane's buckets and every earlier lane's
    for (int o = 1; o < 32; o *= 2) {
        const Mass v{__shfl_sync(kFull, upto.all, lane - o), __shfl_sync(kFull, upto.kept, lane - o)};
        if (lane >= o) upto = upto + v;
    }
    const unsigned ok = __ballot_sync(kFull, pass(base + upto));
    if (!ok) return -1;
    const int first = __ffs(static_cast<int>(ok)) - 1;
    Mass above = base + Mass{upto.all - lv.sum.all, upto.kept - lv.sum.kept};
    int j = 8;  // (lane first: its first bucket that passes; the last one does)
#pragma unroll
    for (int r = 0; r < 8; ++r)
        if (j == 8) {
            if (r == 7 || pass(above + lv.m[r])) j = r, own = lv.m[r];
            else above = above + lv.m[r];
        }
    j = __shfl_sync(kFull, j, first);
    base = Mass{__shfl_sync(kFull, above.all, first), __shfl_sync(kFull, above.kept, first)};
    own = Mass{__shfl_sync(kFull, own.all, first), __shfl_sync(kFull, own.kept, first)};
    return 8 * first + j;
}
template <typename Pass>
__device__ Cut find_cut(const WideState& st, const MassUse& use, const Level& coarse, Pass pass) {
    Mass base, own;
    const int c = level_cut(coarse, base, own, pass);
    if (c < 0) return Cut{-1, base, own};
    const int32_t coarse_bucket = 255 - c;
    const int f = level_cut(Level(st, use, coarse_bucket), base, own, pass);
    return Cut{f < 0 ? -1 : coarse_bucket * 256 + 255 - f, base, own};
}

// top-k's counts, a token a thread (count <= kThreads, of the vocabulary's n): each of the block's
// tokens at or above its floor counted into its bucket, fine (global) and coarse (the block's). The
// floor is the block's m-th largest key bucket, m = min(k, count, 2 k · count / n + 32): the block's
// k best where k is small, else twice its share of the vocabulary's k best and a margin. The
// tokens below the floors are left out: flat logits crowd a few buckets (a random-weight 1B's, up
// to 1805 tokens in one), and their adds were one atomic queue a bucket; top-k 2000 counted every
// token. The counts still reach k (every block counts at least m, and the m's add up to at least
// k). Where a block holds more than m of the k best (logits rising with the id), some of them go
// uncounted: the walk from the top then first reaches k at a lower bucket, and SampleWalk collects
// more candidates (every token from that bucket up) for the same draw. So the draw tests guard the
// tokens, not the floors' tightness; bench/sampling_speed.py shows that.
__device__ void count_top_k(const float* __restrict__ l, int count, int32_t n, int k, unsigned long long* fine, CoarseParts& coarse) {
    const int t = static_cast<int>(threadIdx.x), lane = t % 32;
    const int32_t f = t < count ? bucket_of_key(key(l[t])) : -1;
    const int m = static_cast<int>(min(static_cast<int64_t>(min(k, count)), 2 * static_cast<int64_t>(k) * count / n + 32));
    int32_t floor = 0;  // the largest bucket with m of the block's tokens at or above it
    for (int32_t hi = 65535; floor < hi;) {
        const int32_t mid = (floor + hi + 1) / 2;
        if (__syncthreads_count(f >= mid) >= m) floor = mid;
        else hi = mid - 1;
    }
    const bool counted = f >= floor;  // (f = -1 past the end: never)
    const unsigned same = __match_any_sync(kFull, counted ? f : -1);  // a warp's tokens of one bucket added at once
    if (counted && lane == __ffs(static_cast<int>(same)) - 1) atomicAdd(&fine[f], static_cast<unsigned long long>(__popc(same)));
    const unsigned peers = __match_any_sync(kFull, counted ? f >> 8 : -1);
    if (counted && lane == __ffs(static_cast<int>(peers)) - 1) atomicAdd(&coarse.part[0][f >> 8], static_cast<unsigned>(__popc(peers)));  // (< 2^22)
}

struct SampleMass {
    using Args = SampleArgs;
    static constexpr int kBlockThreads = kThreads, kMinBlocks = 1;
    static __device__ void run(const Args& a);
};

// Every token into the histograms, its mass or (top-k, from its block's floor up: count_top_k) a
// count of 1 (fine: global atomics; coarse: the block's, warp by warp, then global), then in the
// last block the buckets of the cuts: top-k's (where the count reaches k), or top-p's (its target
// top_p · Z, Z the mass of every token) and the draw's (U · S / 2^24, S the kept mass: exact
// without top-p; with it, S is known only to lie between the kept mass above top-p's bucket and
// that plus the bucket's, so the draw's cut is given as the range of buckets those two bound).
__device__ void SampleMass::run(const SampleArgs& a) {
    allow_next();
    const DeviceSampling p = *a.params;
    const uint64_t step = *a.step;
    wait_inputs();
    WideState& st = *a.wide;
    if (!st.active) return;
    const int32_t n = a.n_vocab, from = static_cast<int32_t>(blockIdx.x) * kSpan;
    const float mx = st.mx;
    const double scale = mass_scale(n), t = p.temperature, min_w = p.min_p;
    const MassUse use(p, n);
    const int lane = static_cast<int>(threadIdx.x % 32);
    __shared__ CoarseParts coarse[2];
    __shared__ bool last;
    coarse[0].zero(), coarse[1].zero();
    __syncthreads();
    if (use.top_k) count_top_k(a.logits + from, min(kSpan, n - from), n, p.top_k, st.fine[0], coarse[0]);
    else for_each_logit<1, false>(a.logits + from, min(kSpan, n - from), [&](float v, int, bool valid) {
        if (!valid) return;
        const double d = distance(v, mx, t), w = weight_at(d);
        const int32_t f = bucket_at(d);
        const unsigned long long q = fixed_mass(w, scale), q_kept = w >= min_w ? q : 0;
        if (q != 0 && use.all) atomicAdd(&st.fine[0][f], q), coarse[0].add(f >> 8, q);
        if (q_kept != 0 && use.kept) atomicAdd(&st.fine[1][f], q_kept), coarse[1].add(f >> 8, q_kept);
    });
    __syncthreads();
    for (int i = threadIdx.x; i < 2 * 256; i += kThreads)
        if (const unsigned long long c = coarse[i / 256].at(i % 256)) atomicAdd(&st.coarse[i / 256][i % 256], c);
    __threadfence();  // (the block's sums in before the count says so)
    __syncthreads();
    trace_mark(0);  // (the block's tokens added)
    if (threadIdx.x == 0) last = gridDim.x == 1 || atomicAdd(&st.done, 1u) == gridDim.x - 1;
    __syncthreads();
    // the last block's first two warps: the cuts (SampleWalk zeroes the coarse histograms)
    if (!last || threadIdx.x >= 64) return;
    const bool second = threadIdx.x >= 32;
    const Level coarse_level(st, use, -1);  // (every search's first level)
    Mass total = coarse_level.sum;
    for (int o = 16; o > 0; o /= 2)
        total = total + Mass{__shfl_xor_sync(kFull, total.all, o), __shfl_xor_sync(kFull, total.kept, o)};
    trace_mark(1);  // (the last block: the totals read; then the cuts)
    if (use.top_k) {  // top-k: the first bucket where the count walked reaches k; every token from it up
        if (second) return;
        const Cut c = find_cut(st, use, coarse_level, [&](const Mass& m) { return m.all >= static_cast<unsigned long long>(p.top_k); });
        if (lane == 0) st.cuts.cut_p = -1, st.cuts.draw_hi = c.bucket >= 0 ? 65535 : -1, st.cuts.draw_lo = c.bucket, st.done = 0;
        return;
    }
    const uint32_t u_bits = uniform_bits(p.seed, step);
    int32_t cut_p = -1;
    unsigned long long need = 0, s_lo = total.kept, s_hi = total.kept;
    Mass above_p;
    if (p.top_p < 1.0f) {  // the first bucket where the mass walked reaches top_p · Z (both warps)
        need = min(total.all, max(1ull, static_cast<unsigned long long>(ceil(static_cast<double>(p.top_p) * static_cast<double>(total.all)))));
        const Cut c = find_cut(st, use, coarse_level, [&](const Mass& m) { return m.all >= need; });
        cut_p = c.bucket;
        above_p = c.above;
        s_lo = c.above.kept;
        s_hi = s_lo + c.own.kept;
    }
    // The draw's cut lies between those for S = s_lo (the first warp's search: the higher bucket)
    // and S = s_hi (the second's, where S is not known: with top-p).
    if (second && s_lo == s_hi) return;
    const unsigned long long s = second ? s_hi : s_lo;
    const Cut d = find_cut(st, use, coarse_level, [&](const Mass& m) { return m.kept > draw_target(u_bits, s); });
    const int32_t bucket = (p.top_p >= 1.0f || cut_p >= 0) && d.bucket >= 0 ? d.bucket : -1;  // (found always, but for a bug)
    if (lane != 0) return;
    if (second) {
        st.cuts.draw_lo = bucket;
        return;
    }
    st.cuts.cut_p = cut_p;
    st.cuts.need = need;
    st.cuts.all_above_p = above_p.all;
    st.cuts.kept_above_p = above_p.kept;
    st.cuts.draw_hi = bucket;  // (-1 here or in draw_lo: SampleWalk collects nothing, and bisects)
    if (s_lo == s_hi) st.cuts.draw_lo = bucket;
    st.cuts.kept_above_d = d.above.kept;
    st.cuts.kept_total = total.kept;
    st.done = 0;
}

struct SampleWalk {
    using Args = SampleArgs;
    static constexpr int kBlockThreads = kThreads, kMinBlocks = 1;
    static __device__ void run(const Args& a);
};

// SampleWalk's last block, without top-k: the sorted candidates (count of them, at most E a thread
// of the team) walked with team-wide prefix sums; -1 (every thread) where a cut is not among them.
template <int kTeam = kThreads, int E = 1>
__device__ int32_t walk_cuts(int32_t n, const unsigned long long* sorted, int count, const WideState::Cuts& cuts, const DeviceSampling& p,
                             uint32_t u_bits, float mx) {
    static_assert(E == 1 || kTeam == 32, "several candidates a thread: on a warp");
    __shared__ unsigned long long sums[kThreads / 32], s_total;
    __shared__ int first_at;
    const int base = static_cast<int>(threadIdx.x) * E;
    unsigned long long o[E], q[E], c[E];
    int32_t f[E];
    bool kept[E];
#pragma unroll
    for (int r = 0; r < E; ++r) {
        const bool valid = base + r < count;
        o[r] = valid ? sorted[base + r] : 0;
        const double d = valid ? distance(order_logit(o[r]), mx, p.temperature) : 0.0, w = valid ? weight_at(d) : 0.0;
        f[r] = valid ? bucket_at(d) : -1;
        q[r] = fixed_mass(w, mass_scale(n));
        kept[r] = w >= p.min_p && w > 0.0;
    }
    unsigned long long theta = 0, s = cuts.kept_total;
    if (cuts.cut_p >= 0) {  // top-p's end: the first of its bucket whose mass walked reaches need
#pragma unroll
        for (int r = 0; r < E; ++r) c[r] = f[r] == cuts.cut_p ? q[r] : 0;
        team_scan<kTeam>(c, sums);
        const int end = team_first<kTeam, E>([&](int r) { return f[r] == cuts.cut_p && cuts.all_above_p + c[r] >= cuts.need; }, &first_at);
        if (end >= count) return -1;
        theta = sorted[end];
#pragma unroll
        for (int r = 0; r < E; ++r) c[r] = f[r] == cuts.cut_p && o[r] >= theta && kept[r] ? q[r] : 0;
        team_scan<kTeam>(c, sums);
        if (threadIdx.x == kTeam - 1) s_total = cuts.kept_above_p + c[E - 1];  // (the last thread's: the whole team's)
        team_sync<kTeam>();
        s = s_total;
    }
    const auto in = [&](int r) { return f[r] >= cuts.draw_lo && f[r] <= cuts.draw_hi && kept[r] && o[r] >= theta; };
#pragma unroll
    for (int r = 0; r < E; ++r) c[r] = in(r) ? q[r] : 0;
    team_scan<kTeam>(c, sums);
    const unsigned long long target = draw_target(u_bits, s);
    const int at = team_first<kTeam, E>([&](int r) { return in(r) && cuts.kept_above_d + c[r] > target; }, &first_at);
    return at < count ? order_id(sorted[at]) : -1;
}

// A histogram's entries zeroed, this block's 1/gridDim share of them, in coalesced 16-byte stores
// (rather than a store per token to its scattered bucket).
__device__ void zero_share(unsigned long long* h) {
    constexpr int kPairs = 65536 / 2;
    const int per = (kPairs + static_cast<int>(gridDim.x) - 1) / static_cast<int>(gridDim.x);
    const int from = static_cast<int>(blockIdx.x) * per, to = min(kPairs, from + per);
    uint4* h2 = reinterpret_cast<uint4*>(h);
    for (int i = from + static_cast<int>(threadIdx.x); i < to; i += kThreads) h2[i] = make_uint4(0u, 0u, 0u, 0u);
}

// The tokens of the cuts' buckets collected (their order keys, into the scratch), then in the
// last block sorted and walked (walk_top_k, walk_cuts; top-k's first cut to the k best where they
// would pad the sort past k's power of two, or overflow it). More candidates than one block sorts:
// with top-k (k over 4096, or many equal logits) the last block bisects the candidates, whose k
// best it draws from; without (many equal logits in the cuts' buckets), the whole vocabulary
// (draw_by_bisection).
__device__ void SampleWalk::run(const SampleArgs& a) {
    allow_next();
    const DeviceSampling p = *a.params;
    const uint64_t step = *a.step;
    wait_inputs();
    WideState& st = *a.wide;
    if (!st.active) return;
    const int32_t n = a.n_vocab, from = static_cast<int32_t>(blockIdx.x) * kSpan;
    const MassUse use(p, n);
    const int32_t cut_p = st.cuts.cut_p, lo = st.cuts.draw_lo, hi = lo < 0 ? -1 : st.cuts.draw_hi;
    const float mx = st.mx;
    unsigned long long* cand = reinterpret_cast<unsigned long long*>(a.scratch);
    __shared__ bool last;
    __shared__ unsigned n_cand;
    // the histograms zeroed for the next step (SampleMass read them): the block's share
    if (use.all) zero_share(st.fine[0]);
    if (use.kept) zero_share(st.fine[1]);
    if (blockIdx.x == 0)
        for (int i = threadIdx.x; i < 2 * 256; i += kThreads) st.coarse[i / 256][i % 256] = 0;
    for_each_logit<1, false>(a.logits + from, min(kSpan, n - from), [&](float v, int i, bool valid) {
        if (!valid) return;
        const uint32_t k = key(v);
        const int32_t f = use.top_k ? bucket_of_key(k) : bucket_at(distance(v, mx, p.temperature));
        if (hi >= 0 && (f == cut_p || (f <= hi && f >= lo))) cand[static_cast<uint32_t>(atomicAdd(&st.walk, 1ull))] = order_key(k, from + i);
    });
    __threadfence();
    __syncthreads();
    trace_mark(0);  // (the block's candidates collected)
    if (threadIdx.x == 0) {  // (the last block's own add returns the candidates' count)
        const unsigned long long w = atomicAdd(&st.walk, 1ull << 32);
        last = w >> 32 == gridDim.x - 1;
        if (last) {
            n_cand = static_cast<unsigned>(w);
            st.walk = 0;
        }
    }
    __syncthreads();
    if (!last) return;
    const WideState::Cuts cuts = st.cuts;  // (read before the sort: the walk's, after it)
    const int32_t top = st.top;
    const uint32_t u_bits = uniform_bits(p.seed, step);
    int count = static_cast<int>(n_cand);
    int32_t token = -1;
    __shared__ unsigned long long sorted[kMaxTopK];
    // top-k: candidates that would pad the sort past k's power of two cut to the k best (and ties)
    const int most = use.top_k ? kMaxTopK : kMaxCandidates;  // (the candidates a sort here takes)
    const bool trim = use.top_k && p.top_k <= kMaxTopK && hi >= 0 && count > kThreads && pow2_at_least(count) > pow2_at_least(p.top_k);
    if (hi >= 0 && count <= (use.top_k ? kWarpTopK : kWarpCuts)) {  // few: the first warp alone sorts and walks them
        __shared__ int32_t drawn;
        if (threadIdx.x < 32) {
            const int each = count <= 32 ? 1 : count <= 64 ? 2 : 4;  // (a lane's)
            if (each == 1) sort_few<1>(cand, count, sorted);
            else if (each == 2) sort_few<2>(cand, count, sorted);
            else sort_few<4>(cand, count, sorted);
            trace_mark(1);  // (the last block: the candidates sorted; then the walk)
            int32_t t;
            if (use.top_k && each == 1) t = walk_top_k<32, 1>(sorted, p, u_bits, mx);
            else if (use.top_k) t = walk_top_k<32, 2>(sorted, p, u_bits, mx);
            else if (each == 1) t = walk_cuts<32, 1>(n, sorted, count, cuts, p, u_bits, mx);
            else if (each == 2) t = walk_cuts<32, 2>(n, sorted, count, cuts, p, u_bits, mx);
            else t = walk_cuts<32, 4>(n, sorted, count, cuts, p, u_bits, mx);
            if (threadIdx.x == 0) drawn = t;
        }
        __syncthreads();
        token = drawn;
    } else {
        if (count <= most && hi >= 0)
            for (int i = threadIdx.x; i < count; i += kThreads) sorted[i] = __ldcg(cand + i);
        if (trim && count <= kMaxTopK) count = trim_top_k([&](int i) { return sorted[i]; }, count, p.top_k, lo, sorted);
        else if (trim) count = trim_top_k([&](int i) { return __ldcg(cand + i); }, count, p.top_k, lo, sorted);  // (-1: too many ties)
        if (count >= 0 && count <= most && hi >= 0) {
            if (count <= kThreads) sort_descending(sorted, count);
            else if (count <= 2 * kThreads) sort_descending_wide<2>(sorted, count);
            else sort_descending_wide<4>(sorted, count);
            trace_mark(1);  // (the last block: the candidates trimmed and sorted; then the walk)
            if (!use.top_k) token = walk_cuts(n, sorted, count, cuts, p, u_bits, mx);
            else if (p.top_k <= kThreads) token = walk_top_k<kThreads, 1>(sorted, p, u_bits, mx);  // (count >= k: from its bucket up, or trimmed)
            else if (p.top_k <= 2 * kThreads) token = walk_top_k<kThreads, 2>(sorted, p, u_bits, mx);
            else token = walk_top_k<kThreads, 4>(sorted, p, u_bits, mx);
        }
    }
    // the one-block search: over top-k's candidates (their entries after them), else every token
    // (16-byte aligned entries: the scratch holds sample_scratch_words(n))
    Entry* entries = reinterpret_cast<Entry*>(a.scratch + (use.top_k ? n + (n & 1) : 0));
    if (token < 0 && use.top_k && hi >= 0) token = draw_by_bisection(cand, nullptr, static_cast<int>(n_cand), p, u_bits, mx, top, entries);
    if (token < 0) token = draw_by_bisection(nullptr, a.logits, n, p, u_bits, mx, top, entries);
    if (threadIdx.x == 0) {
        st.active = 0;
        emit(a, token);
    }
}

// The logits after bias and penalties, a slice of kPenaltySlice tokens a block (a logit a thread:
// the copy one round trip; slices of 16384 made it sixteen after one another, 3.4 of the kernel's
// 5.8 µs on the 1B: bench/NOTES.md): the slice copied, the bias table's entries in it added,
// then the window's tokens in it counted (the counts array, global: each block touches only its
// slice's entries) and each distinct one penalized once by the thread that takes its count back
// to zero. The float arithmetic is the CPU's, rounding for rounding (no fused multiply-add).
// The first index in [lo, hi) of rising `tokens` whose token is >= t (hi where none is).
__device__ __forceinline__ int32_t first_at_least(const int32_t* tokens, int32_t lo, int32_t hi, int32_t t) {
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (tokens[mid] < t) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

constexpr int kPenaltySlice = kThreads;

struct Penalize {
    using Args = PenaltyArgs;
    static constexpr int kBlockThreads = kThreads, kMinBlocks = 1;
    static __device__ void run(const Args& a);
};

__device__ void Penalize::run(const PenaltyArgs& a) {
    allow_next();
    const DeviceSampling p = *a.params;
    const int64_t last = *a.pos0 + a.n_tokens - 1;
    wait_inputs();
    const int32_t from = static_cast<int32_t>(blockIdx.x) * kPenaltySlice, to = min(a.n_vocab, from + kPenaltySlice);
    for (int32_t i = from + static_cast<int32_t>(threadIdx.x); i < to; i += kThreads) a.out[i] = a.logits[i];
    __syncthreads();
    trace_mark(0);  // (the slice copied)
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
    trace_mark(1);  // (the window counted)
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
    return make_launch<Penalize>(dim3(static_cast<unsigned>((a.n_vocab + kPenaltySlice - 1) / kPenaltySlice)), dim3(kThreads), a);
}

bool wide_draw(const SamplingParams& p) { return p.temperature > 0.0f; }

SampleLaunches sample(const SampleArgs& a) {
    const int blocks = (a.n_vocab + kSlice - 1) / kSlice;
    if (blocks > 1 && (!a.best || !a.done)) throw std::logic_error("the device sampler of more than one block needs its scratch (best, done)");
    SampleLaunches s;
    s.launch[s.count++] = make_launch<Sample>(dim3(static_cast<unsigned>(blocks)), dim3(kThreads), a);
    if (a.wide) {
        const dim3 grid(static_cast<unsigned>((a.n_vocab + kSpan - 1) / kSpan));
        s.launch[s.count++] = make_launch<SampleMass>(grid, dim3(kThreads), a);
        s.launch[s.count++] = make_launch<SampleWalk>(grid, dim3(kThreads), a);
    }
    return s;
}

}  // namespace edgerunner::cuda
