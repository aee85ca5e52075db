// The CUDA backend's per-op kernels; see ops.cuh.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "check.cuh"
#include "kv_slot.cuh"
#include "ops.cuh"
#include "quant_dot.cuh"
#include "rms_norm.cuh"
#include "rope.cuh"
#include "warp.cuh"

namespace edgerunner::cuda {
namespace {

// One block a token, a thread a 32-value unit at a time: the unit decoded into registers
// (Unit<T>::load) and scaled, then through shared memory (float4s, swizzled against bank
// conflicts), so that the block stores the row as whole coalesced float4s (a thread storing its
// unit's 32 floats itself touched 32 lines an instruction: 6.2 µs for the 8B's row).
// A unit of 32 decoded values × scale into slot `slot` of a tile of float4s, swizzled against bank
// conflicts, and where float4 i of the tile's run of slots sits (so that a block stores a row as
// whole coalesced float4s: Embed, EmbedNorm).
template <TensorType T>
__device__ __forceinline__ void unit_to_tile(const uint8_t* row, int64_t unit, float scale, float4* tile, int slot) {
    float w[32];
    Unit<T>::load(row, unit, w);
#pragma unroll
    for (int c = 0; c < 8; ++c)
        tile[8 * slot + (c ^ (slot & 7))] = make_float4(w[4 * c] * scale, w[4 * c + 1] * scale, w[4 * c + 2] * scale, w[4 * c + 3] * scale);
}
__device__ __forceinline__ int tile_at(int i) { return i - i % 8 + ((i % 8) ^ (i / 8 & 7)); }

// Token t of the step into the history, at its position (EmbedArgs::history).
__device__ __forceinline__ void keep_token(const EmbedArgs& a, int64_t t) {
    if (a.history && threadIdx.x == 0) a.history[*a.pos0 + t] = a.tokens[t];
}
// Token t's row of the table (row 0 for a token outside the vocabulary).
__device__ __forceinline__ const uint8_t* embedding_row(const EmbedArgs& a, int64_t t) {
    const int32_t id = a.tokens[t];
    return a.w + static_cast<size_t>(id >= 0 && id < a.rows ? id : 0) * a.row_bytes;
}

template <TensorType T>
struct Embed {
    using Args = EmbedArgs;
    static constexpr int kThreads = 128;
    static __device__ void run(const Args& a) {
        __shared__ float4 tile[kThreads * 8];  // kThreads units
        allow_next();
        wait_inputs();
        const int64_t t = blockIdx.x;
        keep_token(a, t);
        const uint8_t* row = embedding_row(a, t);
        float4* x = reinterpret_cast<float4*>(a.x + t * a.cols);
        const int n_units = static_cast<int>(a.cols / 32), me = threadIdx.x;
        for (int u0 = 0; u0 < n_units; u0 += kThreads) {
            if (u0 + me < n_units) unit_to_tile<T>(row, u0 + me, a.scale, tile, me);
            __syncthreads();
            const int n4 = 8 * min(kThreads, n_units - u0);
            for (int i = me; i < n4; i += kThreads) x[8 * u0 + i] = tile[tile_at(i)];
            __syncthreads();
        }
    }
};

// The RMSNorm of a row held as load_row's float4s (v; its weight's in g) by the whole block: the
// int8 copy's bytes first (eight threads quantize each 32-value run together: its bytes need the
// run only, not the row's 1/rms, quantize_normed4), stored while the block sums the squares
// (rms_norm.cuh: the order the GEMVs that fold a norm in share); then each thread writes its
// values into y (or y +=; y may be null), and each run's scale d' · (1/rms) into q (or null: no
// int8 copy). Rows a multiple of 32 wide where q: a run's eight threads are all in or all out.
template <int kPasses>
__device__ __forceinline__ void rms_norm_row(const float4 (&v)[kPasses], const float4 (&g)[kPasses], int n4, int64_t n, float eps,
                                             float4* y, bool accumulate, QBlock* q) {
    __shared__ float unit_ss[kRmsNormMaxCols / 32];
    float d_unscaled[kPasses] = {};  // (q: run i / 8's d', by its thread i % 8 == 0)
    if (q)
#pragma unroll
        for (int k = 0; k < kPasses; ++k) {
            const int i = threadIdx.x + k * blockDim.x;
            if (k * blockDim.x >= n4) break;  // (uniform)
            const uint32_t word = quantize_normed4(v[k], g[k], d_unscaled[k]);  // (zeros past the row)
            if (i < n4) *reinterpret_cast<uint32_t*>(q[i / 8].q + 4 * (i % 8)) = word;
        }
    const float scale = block_rms_scale(v, n4, n, eps, unit_ss);
    trace_mark(0);  // (the row read and its scale known)
#pragma unroll
    for (int k = 0; k < kPasses; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (k * blockDim.x >= n4) break;  // (uniform)
        if (y && i < n4) {  // (in == out: the whole row was read before)
            float4 o = normed4(v[k], scale, g[k]);
            if (accumulate) {
                const float4 r = y[i];
                o.x += r.x, o.y += r.y, o.z += r.z, o.w += r.w;
            }
            y[i] = o;
        }
        if (q && i < n4 && i % 8 == 0) q[i / 8].d = d_unscaled[k] * scale;
    }
}

// One block per row, four consecutive values per thread and pass (float4 loads, all in flight at
// once, kept in registers: the row is read once; the weight's values loaded before the wait for
// the input), normalized as rms_norm_row does. Its body is that function's written out: calling
// it, the kernel measured 0.25-0.4 % slower a token on the 8B and 1B (bench/NOTES.md, twenty-
// seventh CUDA session), and the kernel runs twice a layer where EmbedNorm runs once a step.
struct RmsNorm {
    using Args = NormArgs;
    static constexpr int kPasses = kRmsNormMaxCols / 4 / 1024;  // float4s per thread at most
    static constexpr int kBlockThreads = 1024, kMinBlocks = 1;  // (launch bounds: 64 registers)
    static __device__ void run(const Args& a) {
        allow_next();
        const int n4 = static_cast<int>(a.n / 4);
        float4 g[kPasses], v[kPasses];
        load_row(reinterpret_cast<const float4*>(a.w), n4, g);
        wait_inputs();
        __shared__ float unit_ss[kRmsNormMaxCols / 32];
        load_row(reinterpret_cast<const float4*>(a.in + blockIdx.x * a.n), n4, v);
        float d_unscaled[kPasses];
        if (a.q)
#pragma unroll
            for (int k = 0; k < kPasses; ++k) {
                const int i = threadIdx.x + k * blockDim.x;
                if (k * blockDim.x >= n4) break;  // (uniform)
                const uint32_t word = quantize_normed4(v[k], g[k], d_unscaled[k]);  // (zeros past the row)
                if (i < n4) *reinterpret_cast<uint32_t*>(a.q[blockIdx.x * a.q_stride + i / 8].q + 4 * (i % 8)) = word;
            }
        const float scale = block_rms_scale(v, n4, a.n, a.eps, unit_ss);
        trace_mark(0);  // (the row read and its scale known)
        float4* y = a.out ? reinterpret_cast<float4*>(a.out + blockIdx.x * a.n) : nullptr;
#pragma unroll
        for (int k = 0; k < kPasses; ++k) {
            const int i = threadIdx.x + k * blockDim.x;
            if (k * blockDim.x >= n4) break;  // (uniform)
            float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (y && i < n4) {  // (in == out: the whole row was read above)
                o = normed4(v[k], scale, g[k]);
                if (a.accumulate) {
                    const float4 r = y[i];
                    o.x += r.x, o.y += r.y, o.z += r.z, o.w += r.w;
                }
                y[i] = o;
            }
            if (a.q) {
                if (i < n4 && i % 8 == 0) a.q[blockIdx.x * a.q_stride + i / 8].d = d_unscaled[k] * scale;
            }
        }
    }
};

// The embedding with its norm's int8 copy (EmbedArgs::q): one block a token, laid out as the
// RmsNorm kernel's, so that the next kernel reads the norm's copy at once (no norm kernel between:
// one kernel boundary less a token, where the next GEMV's weights already stream). Thread t holds
// the row's float4s t, t + P, ... as load_row leaves them: in each pass, a unit's first lane
// decodes it into shared memory (unit_to_tile, as Embed), each lane takes its float4 and stores
// it (coalesced).
template <TensorType T>
struct EmbedNorm {
    using Args = EmbedArgs;
    static constexpr int kPasses = kEmbedNormMaxCols / 4 / 1024;  // (two: a unit's 32 values fit in registers beside them)
    static constexpr int kBlockThreads = 1024, kMinBlocks = 1;
    static __device__ void run(const Args& a) {
        __shared__ float4 tile[kBlockThreads];  // a pass's float4s
        allow_next();
        const int n4 = static_cast<int>(a.cols / 4);
        float4 g[kPasses], v[kPasses];
        load_row(reinterpret_cast<const float4*>(a.norm_w), n4, g);
        wait_inputs();
        const int64_t t = blockIdx.x;
        keep_token(a, t);
        const uint8_t* row = embedding_row(a, t);
        float4* x = reinterpret_cast<float4*>(a.x + t * a.cols);
        const int me = threadIdx.x, unit = me / 8;  // (the pass's unit of this thread's float4)
#pragma unroll
        for (int k = 0; k < kPasses; ++k) {
            const int i = me + k * blockDim.x;
            v[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (k * blockDim.x >= n4) continue;  // (uniform)
            if (me % 8 == 0 && i < n4) unit_to_tile<T>(row, i / 8, a.scale, tile, unit);
            __syncthreads();
            if (i < n4) x[i] = v[k] = tile[tile_at(me)];
            __syncthreads();
        }
        rms_norm_row(v, g, n4, a.cols, a.eps, nullptr, false, a.q + t * a.q_stride);
    }
};

// One block per (kTokens tokens, head) of Q, K and V (grid.y = n_head + 2·n_head_kv), a thread per
// pair of the head: Q and K heads are rotated in place; K and V heads are then written to the
// cache. A thread's angles are computed before the wait for the input (they depend on the
// positions and the frequencies only), and its pair of every token is loaded before any is
// rotated: four independent loads in flight per thread (one token a block of 64 threads ran at
// ~6 waves of latency on an 8B prefill of 512 tokens).
template <KvType K>
struct RopeKv {
    using Args = RopeKvArgs;
    static constexpr int kTokens = 4;
    static __device__ void run(const Args& a) {
        allow_next();
        const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kTokens;
        const int nt = static_cast<int>(min(static_cast<int64_t>(kTokens), a.n_tokens - t0));
        const int h = blockIdx.y;
        const int64_t pos0 = *a.pos0 + t0;  // (the step block is written before the step's first kernel starts)
        const int half = a.rope_dim / 2;
        const int64_t kv_dim = static_cast<int64_t>(a.n_head_kv) * a.head_dim;
        auto slot = [&](uint8_t* cache, int j) { return cache + ((pos0 + j) % a.capacity) * a.slot_bytes; };
        if (h >= a.n_head + a.n_head_kv) {  // a V head: into the cache as it is
            if (!a.v_cache) return;
            wait_inputs();
            const int64_t off = static_cast<int64_t>(h - a.n_head - a.n_head_kv) * a.head_dim;
            for (int j = 0; j < nt; ++j) Kv<K>::store(slot(a.v_cache, j), off, a.v + (t0 + j) * kv_dim + off, a.head_dim);
            return;
        }
        auto angle = [&](int j, int i, float& cs, float& sn) { rope_angle(pos0 + j, a.pos_scale, a.inv_freq[i], a.attn_factor, cs, sn); };
        float cs0[kTokens] = {}, sn0[kTokens] = {};
        if (static_cast<int>(threadIdx.x) < half)
#pragma unroll
            for (int j = 0; j < kTokens; ++j) angle(j, threadIdx.x, cs0[j], sn0[j]);
        wait_inputs();
        const bool is_q = h < a.n_head;
        float* x[kTokens];
#pragma unroll
        for (int j = 0; j < kTokens; ++j) {
            const int64_t t = t0 + (j < nt ? j : 0);  // (past the last token: a row that exists, never read)
            x[j] = is_q ? a.q + (t * a.n_head + h) * a.head_dim : a.k + t * kv_dim + static_cast<int64_t>(h - a.n_head) * a.head_dim;
        }
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            const int i0 = a.neox ? i : 2 * i, i1 = a.neox ? i + half : 2 * i + 1;
            float v0[kTokens] = {}, v1[kTokens] = {};
#pragma unroll
            for (int j = 0; j < kTokens; ++j)
                if (j < nt) v0[j] = x[j][i0], v1[j] = x[j][i1];
#pragma unroll
            for (int j = 0; j < kTokens; ++j) {
                if (j >= nt) break;
                float cs = cs0[j], sn = sn0[j];
                if (i != static_cast<int>(threadIdx.x)) angle(j, i, cs, sn);
                const float2 y = rope_rotate(v0[j], v1[j], cs, sn);
                x[j][i0] = y.x;
                x[j][i1] = y.y;
            }
        }
        if (is_q || !a.k_cache) return;
        __syncthreads();
        for (int j = 0; j < nt; ++j) Kv<K>::store(slot(a.k_cache, j), static_cast<int64_t>(h - a.n_head) * a.head_dim, x[j], a.head_dim);
    }
};

struct GatedAct {
    using Args = GluArgs;
    static __device__ void run(const Args& a) {
        allow_next();
        wait_inputs();
        for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < a.n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
            a.g[i] = gate_act(a.glu, a.g[i]) * a.u[i];
        }
    }
};

}  // namespace

Launch embed(TensorType type, const EmbedArgs& a) {
    static_assert(kEmbedNormMaxCols <= kRmsNormMaxCols, "rows the norm takes");
    if (a.q && (a.cols % 32 != 0 || a.cols > kEmbedNormMaxCols || !a.norm_w))
        throw std::invalid_argument("the CUDA embedding with its norm's int8 copy takes rows of a multiple of 32 values, up to " +
                                    std::to_string(kEmbedNormMaxCols) + ", and the norm's weight (got " + std::to_string(a.cols) + ")");
    const dim3 grid(static_cast<unsigned>(a.n_tokens)), block(Embed<TensorType::F32>::kThreads);
    const dim3 block_norm(static_cast<unsigned>(std::min<int64_t>(1024, (a.cols / 4 + 31) / 32 * 32)));  // (as rms_norm's)
    switch (type) {
#define ER_EMBED(T)                                                                                   \
    case TensorType::T:                                                                               \
        if (a.q) return make_launch<EmbedNorm<TensorType::T>>(grid, block_norm, a);                  \
        return make_launch<Embed<TensorType::T>>(grid, block, a);
        ER_EMBED(F32) ER_EMBED(F16) ER_EMBED(BF16) ER_EMBED(Q4_0) ER_EMBED(Q4_1) ER_EMBED(Q5_0) ER_EMBED(Q5_1)
        ER_EMBED(Q8_0) ER_EMBED(IQ4_NL) ER_EMBED(Q2_K) ER_EMBED(Q3_K) ER_EMBED(Q4_K) ER_EMBED(Q5_K) ER_EMBED(Q6_K)
        ER_EMBED(Q8_K) ER_EMBED(IQ4_XS)
#undef ER_EMBED
        default: throw std::invalid_argument("the CUDA backend cannot read embeddings of type " + std::string(tensor_type_name(type)));
    }
}

Launch rms_norm(const NormArgs& a) {
    if (a.q && a.n % 32 != 0) throw std::invalid_argument("quantized RMSNorm rows must be a multiple of 32 wide");
    if (a.q && a.accumulate) throw std::logic_error("an RMSNorm added into its output has no int8 copy");
    if (a.n % 4 != 0 || a.n > kRmsNormMaxCols)
        throw std::invalid_argument("the CUDA RMSNorm takes rows of a multiple of 4 values, up to " + std::to_string(kRmsNormMaxCols) +
                                    " (got " + std::to_string(a.n) + ")");
    const unsigned threads = static_cast<unsigned>(std::min<int64_t>(1024, std::max<int64_t>(32, (a.n / 4 + 31) / 32 * 32)));
    return make_launch<RmsNorm>(dim3(static_cast<unsigned>(a.rows)), dim3(threads), a);
}

Launch rope_kv(KvType kv, const RopeKvArgs& a) {
    constexpr int64_t kTokens = RopeKv<KvType::F16>::kTokens;
    const dim3 grid(static_cast<unsigned>((a.n_tokens + kTokens - 1) / kTokens), static_cast<unsigned>(a.n_head + (a.k_cache ? 2 : 1) * a.n_head_kv));
    const dim3 block(static_cast<unsigned>(std::clamp((a.rope_dim / 2 + 31) / 32 * 32, 32, 128)));  // a thread per pair (heads up to 256)
    switch (kv) {
        case KvType::F16: return make_launch<RopeKv<KvType::F16>>(grid, block, a);
        case KvType::F32: return make_launch<RopeKv<KvType::F32>>(grid, block, a);
        case KvType::Q8_0: return make_launch<RopeKv<KvType::Q8_0>>(grid, block, a);
    }
    throw std::logic_error("KV type");
}

Launch glu(const GluArgs& a) {
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((a.n + 255) / 256, 4096));
    return make_launch<GatedAct>(dim3(blocks), dim3(256), a);
}

}  // namespace edgerunner::cuda
