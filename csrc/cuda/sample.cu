// One block over the vocabulary. Instead of sorting, every cut of the contract is a threshold
// on the logit: "the tokens at or above logit θ" is a prefix of the contract's order (logit
// descending), so top-k, top-p and the draw each become a search for the θ at which a count or
// a sum over {l ≥ θ} crosses its target: a bisection over the 2^32 ordered float keys, 32
// block-wide reductions each. Ties between equal logits resolve to the lowest id (the contract
// walks them in id order; with continuous logits they do not occur).
#include <cfloat>

#include "check.cuh"
#include "sample.cuh"

namespace edgerunner::cuda {
namespace {

constexpr int kThreads = 1024;

__device__ __forceinline__ uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Floats → uint32 keys in the same order (negative values reversed).
__device__ __forceinline__ uint32_t key(float f) {
    const uint32_t b = __float_as_uint(f);
    return b & 0x80000000u ? ~b : b | 0x80000000u;
}

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

struct Sample {
    using Args = SampleArgs;
    static __device__ void run(const Args& a);
};

__device__ void Sample::run(const SampleArgs& a) {
    allow_next();
    wait_inputs();
    const float* __restrict__ l = a.logits;
    const int32_t n = a.n_vocab;
    double* w = a.scratch;
    int32_t* out = a.out;
    const DeviceSampling p = *a.params;
    const uint64_t step = *a.step;
    __shared__ double dsh[kThreads / 32];
    __shared__ float fsh[kThreads / 32];
    __shared__ int ish[kThreads / 32];
    __shared__ int best_id;
    // max logit, lowest id on ties: each thread takes its logits in rising id order, kLoads
    // float4s (or floats) in flight at once, then warps and the block reduce
    float mx = -FLT_MAX;
    int arg = n;
    auto take = [&](float v, int i) {
        if (v > mx) mx = v, arg = i;
    };
    constexpr int kLoads = 4;
    int scalar_from = 0;
    if (reinterpret_cast<uintptr_t>(l) % 16 == 0) {
        const float4* l4 = reinterpret_cast<const float4*>(l);
        const int n4 = n / 4;
        for (int base = 0; base < n4; base += kLoads * kThreads) {
            float4 v[kLoads];
#pragma unroll
            for (int k = 0; k < kLoads; ++k) {
                const int j = base + k * kThreads + static_cast<int>(threadIdx.x);
                v[k] = j < n4 ? l4[j] : make_float4(-FLT_MAX, -FLT_MAX, -FLT_MAX, -FLT_MAX);
            }
#pragma unroll
            for (int k = 0; k < kLoads; ++k) {
                const int i = 4 * (base + k * kThreads + static_cast<int>(threadIdx.x));
                take(v[k].x, i), take(v[k].y, i + 1), take(v[k].z, i + 2), take(v[k].w, i + 3);
            }
        }
        scalar_from = 4 * n4;
    }
    for (int base = scalar_from; base < n; base += kLoads * kThreads) {
        float v[kLoads];
#pragma unroll
        for (int k = 0; k < kLoads; ++k) {
            const int i = base + k * kThreads + static_cast<int>(threadIdx.x);
            v[k] = i < n ? l[i] : -FLT_MAX;
        }
#pragma unroll
        for (int k = 0; k < kLoads; ++k) take(v[k], base + k * kThreads + static_cast<int>(threadIdx.x));
    }
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
        if (threadIdx.x == 0) fsh[0] = mx, best_id = arg;
    }
    __syncthreads();
    mx = fsh[0];
    const int top = best_id;
    if (p.temperature <= 0.0f) {
        if (threadIdx.x == 0) {
            *out = top;
            if (a.next) *a.next = top;
        }
        return;
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
    const uint64_t state = mix(p.seed) + (step + 1) * 0x9E3779B97F4A7C15ull;
    const double u = static_cast<double>(static_cast<float>(mix(state) >> 40) * 0x1.0p-24f);
    // largest θ whose mass over {l ≥ θ} exceeds u·S: the drawn token has logit θ
    const uint32_t th = search([&](uint32_t t) { return mass_at(t, floor_key, min_p) > u * s_total ? 1.0 : 0.0; }, 1.0);
    __syncthreads();
    if (threadIdx.x == 0) best_id = n;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += kThreads)
        if (key(l[i]) == th && key(l[i]) >= floor_key && w[i] > 0.0 && (!min_p || w[i] >= p.min_p)) atomicMin(&best_id, i);
    __syncthreads();
    if (threadIdx.x == 0) {
        *out = best_id < n ? best_id : top;
        if (a.next) *a.next = *out;
    }
}

}  // namespace

Launch sample(const SampleArgs& a) { return make_launch<Sample>(dim3(1), dim3(kThreads), a); }

}  // namespace edgerunner::cuda
