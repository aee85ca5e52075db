// The attention kernels (see attention.cuh): decode and short steps split over blocks
// (DecodeAttention), prefill on the tensor cores (FlashAttention, head sizes 64 and 128), prefill
// over shared key tiles otherwise (TiledAttention).
#include <algorithm>
#include <cfloat>
#include <cstdlib>
#include <stdexcept>

#include "async_copy.cuh"
#include "attention.cuh"
#include "kv_slot.cuh"
#include "quant_dot.cuh"
#include "warp.cuh"

namespace edgerunner::cuda {
namespace {

constexpr int kMaxDims = 8;  // head sizes up to 256: lane l holds dimensions l, l + 32, ...

// Head h of token t of the attention output (v: lane's dimensions, normalised), and its int8
// copy for the output projection.
template <int D>
__device__ __forceinline__ void write_head(const AttentionArgs& a, int64_t t, int h, int lane, const float (&v)[D]) {
    const int hd = a.head_dim;
    float* out = a.out + (t * a.n_head + h) * hd;
#pragma unroll
    for (int i = 0; i < D; ++i) {
        if (32 * i >= hd) break;
        const int d = lane + 32 * i;
        if (d < hd) out[d] = v[i];
        if (a.q_out) quantize_block(d < hd ? v[i] : 0.0f, a.q_out[t * a.q_stride + (static_cast<int64_t>(h) * hd) / 32 + i], lane);
    }
}

// Decode, and steps under kPrefillKernelTokens (flash-decoding): one block per (token, run of its
// keys, KV head — and set of up to kDecodeHeads of the query heads it serves). Each warp walks
// every kDecodeWarps-th key of the run, four keys' rows in flight (two above head size 128; of
// its first ones, the keys of earlier steps requested before the wait for the input); lanes hold head
// dimensions (l, l + 32, ...), and each K row is scored against all the block's query heads and
// each V row added into all their running outputs, so a row is read once for its whole group
// (GQA). The warps' (max, sum, output) are merged in shared memory. A token's keys are cut into
// at most kSplits runs of at least kSplitKeys keys, from its position alone (so its arithmetic
// is the same whatever the step size). With one run the block writes the output; with several,
// each block leaves its (max, sum, unnormalised output) per head in `partial`, and the last of
// them to finish (a counter in `done`, which it resets) merges the runs in order.
//
// A token with few keys (AttentionArgs::short_keys or fewer: the whole context in tg128) takes
// the short path instead: block j of its runs takes query head h0 + j alone. It stages every
// key's K and V row of the KV head in shared memory (cp.async; the rows of earlier steps before
// the wait for the input: each of the group's blocks reads them, from L2), then scores a key a
// thread, softmaxes over the block, and sums the weighted V rows a key per warp at a time (as the
// split path's warps do), the warps' sums then added in order. No partial results, no counter,
// no chain of keys through one warp, and the group's heads on as many SMs. The choice is by the
// token's own key count, so its arithmetic is still the same whatever the step size. The grid
// is (KV head × set, token × run): blocks start in that order, so the short path's blocks (runs
// 0 .. 3 of every set) are its first ones and take the SMs that free up first, ahead of the blocks
// that have no work (8B Q4_K_M +0.5 %: bench/NOTES.md, twenty-fourth CUDA session).
constexpr int kDecodeWarps = 8, kDecodeHeads = 4, kSplits = 32, kSplitKeys = 32;  // runs of 32: 2–5 % faster decode than 64 or 128
constexpr int kShortMaxKeys = 32 * kDecodeWarps;  // the short path's most keys (a thread each) ...
constexpr size_t kShortSmem = 96 * 1024;          // ... where they fit in this (two blocks an SM)
static_assert(kDecodeHeads <= kSplits, "a block of the runs per query head of a set");

// The short path's shared memory: K rows, V rows (head_bytes each, padded to an odd multiple of
// 16 bytes: eight threads' 16-byte loads of eight rows fall in distinct banks), the query
// (pre-scaled floats), the weights, the warps' maxima and sums, and the warps' output sums.
struct ShortLayout {
    int row;  // bytes between rows
    size_t k, v, q, p, red, acc, end;
    __host__ __device__ ShortLayout(int head_bytes, int head_dim, int keys) {
        const int r = (head_bytes + 15) / 16 * 16;
        row = r % 32 == 0 ? r + 16 : r;
        k = 0;
        v = k + static_cast<size_t>(keys) * row;
        q = v + static_cast<size_t>(keys) * row;
        p = q + sizeof(float) * head_dim;
        red = p + sizeof(float) * keys;
        acc = red + sizeof(float) * 2 * kDecodeWarps;
        end = acc + sizeof(float) * kDecodeWarps * head_dim;
    }
};

// Eight values d .. d + 7 of a K row (f16 or f32) staged in shared memory, as floats.
template <KvType K>
__device__ __forceinline__ void load8f(const uint8_t* row, int d, float (&f)[8]) {
    if constexpr (K == KvType::F16) {
        const uint4 w = *reinterpret_cast<const uint4*>(row + 2 * d);
        const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 x = __half22float2(*reinterpret_cast<const __half2*>(&u[i]));
            f[2 * i] = x.x, f[2 * i + 1] = x.y;
        }
    } else {
        const float4 a = *reinterpret_cast<const float4*>(row + 4 * d), b = *reinterpret_cast<const float4*>(row + 4 * d + 16);
        f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
    }
}

template <KvType K, int D>  // D: dimensions per lane (head sizes up to 32·D)
struct DecodeAttention {
    using Args = AttentionArgs;
    static constexpr int kKeys = D <= 4 ? 4 : 2;  // keys per warp in flight

    static __device__ void run(const Args& a) {
        allow_next();
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        const int hd = a.head_dim, group = a.n_head / a.n_head_kv, sets = (group + kDecodeHeads - 1) / kDecodeHeads;
        const int64_t t = blockIdx.y / kSplits;
        const int split = static_cast<int>(blockIdx.y % kSplits);
        const int g = static_cast<int>(blockIdx.x) / sets;                             // the KV head
        const int h0 = g * group + (static_cast<int>(blockIdx.x) % sets) * kDecodeHeads;  // its first query head here
        const int nh = min(kDecodeHeads, (g + 1) * group - h0);
        // (the step block is written before the step's first kernel starts: no wait for it)
        const int64_t pos0 = *a.pos0, pos = pos0 + t;
        const int64_t start = a.window > 0 && pos - a.window + 1 > 0 ? pos - a.window + 1 : 0;
        const int64_t n_keys = pos - start + 1;
        if (n_keys <= a.short_keys) {
            if constexpr (K != KvType::Q8_0)
                if (split < nh) run_short(a, t, g, h0 + split, start, pos0, pos);
            return;
        }
        const int64_t runs = min(static_cast<int64_t>(kSplits), (n_keys + kSplitKeys - 1) / kSplitKeys);
        const int64_t per = (n_keys + runs - 1) / runs;
        const int n_split = static_cast<int>((n_keys + per - 1) / per);
        if (split >= n_split) return;
        const int64_t lo = start + split * per, hi = min(lo + per, pos + 1);  // keys [lo, hi)
        const int head_off = g * hd;

        auto load_row = [&](const uint8_t* cache, int64_t p, float(&v)[D]) {
            const uint8_t* slot = cache + static_cast<size_t>(p % a.capacity) * a.slot_bytes;
#pragma unroll
            for (int i = 0; i < D; ++i) v[i] = lane + 32 * i < hd ? Kv<K>::load(slot, head_off + lane + 32 * i) : 0.0f;
        };
        // The warp's keys: lo + warp, then every kDecodeWarps-th, kKeys rows of K and V in flight.
        // Of its first kKeys, those before the step's first position were written by earlier
        // steps: they are loaded before the wait (the previous kernel writes only this step's).
        float kr[kKeys][D], vr[kKeys][D];
#pragma unroll
        for (int k = 0; k < kKeys; ++k) {
            const int64_t p = lo + warp + k * kDecodeWarps;
            if (p < hi && p < pos0) load_row(a.k_cache, p, kr[k]), load_row(a.v_cache, p, vr[k]);
        }
        wait_inputs();

        float q[kDecodeHeads][D], acc[kDecodeHeads][D], m[kDecodeHeads], l[kDecodeHeads];
        const float scale = rsqrtf(static_cast<float>(hd));
#pragma unroll
        for (int j = 0; j < kDecodeHeads; ++j) {
#pragma unroll
            for (int i = 0; i < D; ++i) {
                const int d = lane + 32 * i;
                q[j][i] = j < nh && d < hd ? a.q[(t * a.n_head + h0 + j) * hd + d] * scale : 0.0f;
                acc[j][i] = 0.0f;
            }
            m[j] = -FLT_MAX, l[j] = 0.0f;
        }
        auto add_key = [&](const float(&kr)[D], const float(&vr)[D]) {
#pragma unroll
            for (int j = 0; j < kDecodeHeads; ++j) {
                if (j >= nh) break;
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < D; ++i) s += q[j][i] * kr[i];
                s = warp_sum(s);
                const float m_new = fmaxf(m[j], s);
                const float corr = __expf(m[j] - m_new), e = __expf(s - m_new);
                l[j] = l[j] * corr + e;
#pragma unroll
                for (int i = 0; i < D; ++i) acc[j][i] = acc[j][i] * corr + e * vr[i];
                m[j] = m_new;
            }
        };
        for (int64_t p0 = lo + warp; p0 < hi; p0 += kKeys * kDecodeWarps) {
#pragma unroll
            for (int k = 0; k < kKeys; ++k) {
                const int64_t p = p0 + k * kDecodeWarps;
                if (p < hi && (p0 != lo + warp || p >= pos0)) load_row(a.k_cache, p, kr[k]), load_row(a.v_cache, p, vr[k]);
            }
#pragma unroll
            for (int k = 0; k < kKeys; ++k)
                if (p0 + k * kDecodeWarps < hi) add_key(kr[k], vr[k]);
        }

        // the warps' states, merged per head by warp j < nh (a warp that saw no key has l = 0)
        __shared__ float sm[kDecodeWarps][kDecodeHeads], sl[kDecodeWarps][kDecodeHeads];
        extern __shared__ uint4 dyn[];  // (the short path's staging area, here the warps' outputs)
        auto sacc = reinterpret_cast<float(*)[kDecodeHeads][32 * D]>(dyn);
#pragma unroll
        for (int j = 0; j < kDecodeHeads; ++j) {
            if (lane == 0) sm[warp][j] = m[j], sl[warp][j] = l[j];
#pragma unroll
            for (int i = 0; i < D; ++i) sacc[warp][j][lane + 32 * i] = acc[j][i];
        }
        __syncthreads();
        const bool merger = warp < nh;
        float v[D] = {}, mx = -FLT_MAX, denom = 0.0f;
        if (merger) {
            for (int w = 0; w < kDecodeWarps; ++w) mx = fmaxf(mx, sm[w][warp]);
            for (int w = 0; w < kDecodeWarps; ++w) {
                if (sl[w][warp] == 0.0f) continue;
                const float f = __expf(sm[w][warp] - mx);
                denom += sl[w][warp] * f;
#pragma unroll
                for (int i = 0; i < D; ++i) v[i] += sacc[w][warp][lane + 32 * i] * f;
            }
        }
        if (n_split == 1) {
            if (!merger) return;
#pragma unroll
            for (int i = 0; i < D; ++i) v[i] /= denom;
            write_head(a, t, h0 + warp, lane, v);
            return;
        }
        // this run's (max, sum, unnormalised output) of each head: hd + 2 floats
        const int64_t stride = static_cast<int64_t>(kSplits) * (hd + 2);
        if (merger) {
            float* part = a.partial + (t * a.n_head + h0 + warp) * stride + static_cast<int64_t>(split) * (hd + 2);
#pragma unroll
            for (int i = 0; i < D; ++i)
                if (lane + 32 * i < hd) part[lane + 32 * i] = v[i];
            if (lane == 0) part[hd] = mx, part[hd + 1] = denom;
        }
        __threadfence();  // the partials are visible device-wide before the count says so
        __syncthreads();
        __shared__ bool last;
        if (threadIdx.x == 0) {
            int32_t* done = a.done + t * gridDim.x + blockIdx.x;
            last = atomicAdd(done, 1) == n_split - 1;
            if (last) *done = 0;  // ready for the next step
        }
        __syncthreads();
        if (!last || !merger) return;
        __threadfence();
        const float* part = a.partial + (t * a.n_head + h0 + warp) * stride;
        // lane r holds run r's max and sum (kSplits = 32 runs at most)
        const float mr = lane < n_split ? __ldcg(part + lane * (hd + 2) + hd) : -FLT_MAX;
        const float lr = lane < n_split ? __ldcg(part + lane * (hd + 2) + hd + 1) : 0.0f;
        const float m_all = warp_max(mr);
        const float wr = lane < n_split ? __expf(mr - m_all) : 0.0f;
        const float l_all = warp_sum(lr * wr);
        float out[D] = {};
        for (int r = 0; r < n_split; ++r) {
            const float w = __shfl_sync(0xFFFFFFFFu, wr, r);
#pragma unroll
            for (int i = 0; i < D; ++i)
                if (lane + 32 * i < hd) out[i] += w * __ldcg(part + r * (hd + 2) + lane + 32 * i);
        }
#pragma unroll
        for (int i = 0; i < D; ++i) out[i] /= l_all;
        write_head(a, t, h0 + warp, lane, out);
    }

    static constexpr size_t split_smem() { return sizeof(float) * kDecodeWarps * kDecodeHeads * 32 * D; }

    // Token t's attention over keys [start, pos] of KV head g for query head h, by one block (the
    // short path above).
    static __device__ void run_short(const Args& a, int64_t t, int g, int h, int64_t start, int64_t pos0, int64_t pos) {
        extern __shared__ uint4 dyn[];
        uint8_t* smem = reinterpret_cast<uint8_t*>(dyn);
        const int hd = a.head_dim, n = static_cast<int>(pos - start + 1);
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        const int head_bytes = hd * (K == KvType::F16 ? 2 : 4);
        const ShortLayout at(head_bytes, hd, a.short_keys);
        const int pieces = head_bytes / 16;  // per row (head_bytes % 16 == 0: short_keys says so)
        // a thread's piece c of every step-th row, from row r0 (threads past step · pieces: none);
        // its divisions once, not per piece: blocks that start only as the previous kernel ends
        // issue the earlier steps' rows before their wait, on the step's critical path
        const int step = static_cast<int>(blockDim.x) / pieces, c = static_cast<int>(threadIdx.x) % pieces,
                  r0 = static_cast<int>(threadIdx.x) / pieces;
        // rows [from, to) of K and V into shared memory: row i is position start + i
        auto stage = [&](int from, int to) {
            if (r0 < step && from + r0 < to) {
                int64_t p = (start + from + r0) % a.capacity;  // row i's slot
                for (int i = from + r0; i < to; i += step) {
                    const size_t at_row = static_cast<size_t>(i) * at.row + 16 * c;
                    const size_t at_slot = static_cast<size_t>(p) * a.slot_bytes + static_cast<size_t>(g) * head_bytes + 16 * c;
                    copy16(smem + at.k + at_row, a.k_cache + at_slot);
                    copy16(smem + at.v + at_row, a.v_cache + at_slot);
                    for (p += step; p >= a.capacity;) p -= a.capacity;
                }
            }
            commit();
        };
        const int old = static_cast<int>(max(static_cast<int64_t>(0), min(pos0 - start, static_cast<int64_t>(n))));  // written by earlier steps
        stage(0, old);
        wait_inputs();
        stage(old, n);
        float* q = reinterpret_cast<float*>(smem + at.q);
        float* p = reinterpret_cast<float*>(smem + at.p);
        float* red = reinterpret_cast<float*>(smem + at.red);
        float* acc_w = reinterpret_cast<float*>(smem + at.acc);
        const float scale = rsqrtf(static_cast<float>(hd));
        for (int e = threadIdx.x; e < hd; e += blockDim.x) q[e] = a.q[(t * a.n_head + h) * hd + e] * scale;
        wait_pending<0>();
        __syncthreads();
        trace_mark(0);  // (the keys, values and query staged)
        // key i's score by thread i, over 8 values at a time (two sums: a shorter chain)
        const int i = threadIdx.x;
        float s = -FLT_MAX;
        if (i < n) {
            const uint8_t* krow = smem + at.k + static_cast<size_t>(i) * at.row;
            float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
            for (int c = 0; c < 4 * D; ++c) {
                if (8 * c >= hd) break;
                float kv[8];
                load8f<K>(krow, 8 * c, kv);
                const float4 q0 = *reinterpret_cast<const float4*>(q + 8 * c), q1 = *reinterpret_cast<const float4*>(q + 8 * c + 4);
                s0 += q0.x * kv[0] + q0.y * kv[1] + q0.z * kv[2] + q0.w * kv[3];
                s1 += q1.x * kv[4] + q1.y * kv[5] + q1.z * kv[6] + q1.w * kv[7];
            }
            s = s0 + s1;
        }
        // the softmax over the block: max, weights, sum
        float m = warp_max(s);
        if (lane == 0) red[warp] = m;
        __syncthreads();
        m = red[0];
        for (int w = 1; w < kDecodeWarps; ++w) m = fmaxf(m, red[w]);
        const float e = i < n ? __expf(s - m) : 0.0f;
        if (i < n) p[i] = e;
        const float sum_w = warp_sum(e);
        if (lane == 0) red[kDecodeWarps + warp] = sum_w;
        __syncthreads();
        float l = 0.0f;
        for (int w = 0; w < kDecodeWarps; ++w) l += red[kDecodeWarps + w];
        trace_mark(1);  // (the softmax done)
        // warp w adds keys w, w + 8, ... into its lanes' dimensions (l, l + 32, ...)
        float acc[D] = {};
#pragma unroll 4
        for (int k = warp; k < n; k += kDecodeWarps) {
            const float pk = p[k];
            const uint8_t* vrow = smem + at.v + static_cast<size_t>(k) * at.row;
#pragma unroll
            for (int j = 0; j < D; ++j)
                if (lane + 32 * j < hd) acc[j] += pk * Kv<K>::load(vrow, lane + 32 * j);
        }
#pragma unroll
        for (int j = 0; j < D; ++j)
            if (lane + 32 * j < hd) acc_w[warp * hd + lane + 32 * j] = acc[j];
        __syncthreads();
        // value d of the head: the warps' sums in order (whole warps on 32 values where the head
        // size is a multiple of 32: q_out's int8 block is a warp's)
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            float v = 0.0f;
            for (int w = 0; w < kDecodeWarps; ++w) v += acc_w[w * hd + d];
            v /= l;
            a.out[(t * a.n_head + h) * hd + d] = v;
            if (a.q_out) quantize_block(v, a.q_out[t * a.q_stride + (static_cast<int64_t>(h) * hd + d) / 32], lane);
        }
    }
};

// Prefill (chunks of kPrefillKernelTokens or more): one block per (run of tokens, KV head),
// one warp per query row (token, head of that KV head's group), 16 rows per block (a group of
// more than 16 heads takes several blocks per token). The block
// walks the keys its rows see in tiles of 32 staged in shared memory as floats, so each key and
// value is read once per block rather than once per row; within a tile lane j scores key j, the
// running max and sum are updated once per tile, and the weights are broadcast to the lanes that
// hold the output dimensions (l, l + 32, ...).
constexpr int kTileKeys = 32, kTileRows = 16;

template <KvType K>
struct TiledAttention {
    using Args = AttentionArgs;
    static __device__ void run(const Args& a) {
        extern __shared__ float smem[];
        allow_next();
        wait_inputs();
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        const int hd = a.head_dim, group = a.n_head / a.n_head_kv;
        // a block's rows: per_block tokens × `heads` query heads (a group's, or 16 of a larger one's)
        const int heads = min(group, kTileRows), chunks = (group + kTileRows - 1) / kTileRows;
        const int per_block = kTileRows / heads;
        const int64_t t0 = static_cast<int64_t>(blockIdx.x) * per_block;
        const int64_t t_last = min(t0 + per_block, a.n_tokens) - 1;
        const int g = static_cast<int>(blockIdx.y) / chunks;  // the KV head
        const int64_t t = t0 + warp / heads;
        const int hg = (static_cast<int>(blockIdx.y) % chunks) * kTileRows + warp % heads;  // head within the group
        const int h = g * group + hg;
        const bool active = warp < per_block * heads && t <= t_last && hg < group;
        const int64_t pos = *a.pos0 + t;
        const int64_t start = a.window > 0 && pos - a.window + 1 > 0 ? pos - a.window + 1 : 0;
        const int64_t first_pos = *a.pos0 + t0;
        const int64_t lo = a.window > 0 && first_pos - a.window + 1 > 0 ? first_pos - a.window + 1 : 0, hi = *a.pos0 + t_last;
        const int64_t head_off = static_cast<int64_t>(g) * hd;
        const int ks = hd + 1;  // K rows padded: lane j reads row j without bank conflicts
        float* kt = smem;                     // kTileKeys × ks
        float* vt = kt + kTileKeys * ks;      // kTileKeys × hd
        float* qs = vt + kTileKeys * hd;      // kTileRows × hd, pre-scaled by 1/√d
        const float scale = rsqrtf(static_cast<float>(hd));
        if (active)
            for (int d = lane; d < hd; d += 32) qs[warp * hd + d] = a.q[(t * a.n_head + h) * hd + d] * scale;

        float acc[kMaxDims] = {};
        float m = -FLT_MAX, l = 0.0f;
        for (int64_t p0 = lo; p0 <= hi; p0 += kTileKeys) {
            __syncthreads();  // the previous tile is consumed (and the queries are in)
            for (int j = warp; j < kTileKeys && p0 + j <= hi; j += kTileRows) {  // a warp per key
                const int64_t slot = (p0 + j) % a.capacity;
                for (int d = lane; d < hd; d += 32) {
                    kt[j * ks + d] = Kv<K>::load(a.k_cache + slot * a.slot_bytes, static_cast<int>(head_off) + d);
                    vt[j * hd + d] = Kv<K>::load(a.v_cache + slot * a.slot_bytes, static_cast<int>(head_off) + d);
                }
            }
            __syncthreads();
            if (!active) continue;
            const int64_t p = p0 + lane;
            const bool seen = p >= start && p <= pos;
            float sc = -FLT_MAX;
            if (seen) {
                const float* q = qs + warp * hd;
                const float* k = kt + lane * ks;
                float dot[4] = {};  // four chains of multiply-adds in flight
                int d = 0;
                for (; d + 4 <= hd; d += 4)
#pragma unroll
                    for (int c = 0; c < 4; ++c) dot[c] += q[d + c] * k[d + c];
                for (; d < hd; ++d) dot[0] += q[d] * k[d];
                sc = (dot[0] + dot[1]) + (dot[2] + dot[3]);
            }
            const float m_new = fmaxf(m, warp_max(sc));
            const float e = seen ? __expf(sc - m_new) : 0.0f, corr = __expf(m - m_new);
            l = l * corr + warp_sum(e);
#pragma unroll
            for (int i = 0; i < kMaxDims; ++i) acc[i] *= corr;
            for (int j = 0; j < kTileKeys; ++j) {
                const float w = __shfl_sync(0xFFFFFFFFu, e, j);
                if (w == 0.0f) continue;  // masked (uniform across the warp)
#pragma unroll
                for (int i = 0; i < kMaxDims; ++i)
                    if (lane + 32 * i < hd) acc[i] += w * vt[j * hd + lane + 32 * i];
            }
            m = m_new;
        }
        if (!active) return;
        float v[kMaxDims];
#pragma unroll
        for (int i = 0; i < kMaxDims; ++i) v[i] = acc[i] / l;
        write_head(a, t, h, lane, v);
    }

    static size_t smem(int head_dim) { return sizeof(float) * (kTileKeys * (head_dim + 1) + kTileKeys * head_dim + kTileRows * head_dim); }
};

// Prefill on the tensor cores (head sizes 64 and 128): the step's query rows of one KV head —
// (token, head of its group) pairs, n_tokens × group of them — in blocks of 64, 16 per warp,
// held as f16 A fragments pre-scaled by log2(e)/√d. Keys and values are staged 64 at a time in
// shared memory as f16 (rows padded by 8 halves: ldmatrix without bank conflicts); S = Q Kᵀ by
// mma.m16n8k16 with f32 sums, masked per row (causal, window), an online softmax on the
// fragments (a row's 64 scores spread over the four lanes of a quad), and O += P V by mma with
// P taken straight from S's fragments as f16 and V's fragments loaded transposed. No score
// matrix is stored. The rows are finished through shared memory, a row per warp pass, as the
// other attention kernels write them (write_head).
constexpr int kFlashWarps = 4, kFlashKeys = 64;

#ifndef ER_CUDA_EMULATOR
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8×8 f16 matrices from shared memory (lane i gives row i % 8 of matrix i / 8), or their
// transposes.
template <bool Trans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
    if constexpr (Trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
#else  // (the CPU emulator runs no tensor-core kernel: its tests keep prefill chunks under kPrefillKernelTokens)
__device__ __forceinline__ void mma_f16(float (&)[4], const uint32_t (&)[4], uint32_t, uint32_t) { er_cuda_emulator::not_emulated("mma.sync"); }
template <bool Trans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&)[4], const void*) { er_cuda_emulator::not_emulated("ldmatrix"); }
#endif

template <KvType K, int HD>
struct FlashAttention {
    using Args = AttentionArgs;
    static constexpr int kRow = HD + 8;  // halves per staged key or value row

    static __device__ void run(const Args& a) {
        extern __shared__ float smem[];
        __half* ks = reinterpret_cast<__half*>(smem);  // kFlashKeys × kRow
        __half* vs = ks + kFlashKeys * kRow;
        allow_next();
        wait_inputs();
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
        const int group = a.n_head / a.n_head_kv, g = static_cast<int>(blockIdx.y);
        const int64_t rows = a.n_tokens * group, r0 = static_cast<int64_t>(blockIdx.x) * kFlashWarps * 16;
        const int64_t pos0 = *a.pos0;
        auto first_key = [&](int64_t pos) { return a.window > 0 && pos - a.window + 1 > 0 ? pos - a.window + 1 : int64_t{0}; };
        // the block's keys [lo, hi]: from its first row's window to its last row's position
        const int64_t lo = first_key(pos0 + r0 / group), hi = pos0 + (min(r0 + kFlashWarps * 16, rows) - 1) / group;

        // this lane's two rows (gq and gq + 8 of the warp's 16): which keys each sees
        int64_t row_pos[2], row_lo[2];
        uint32_t qa[HD / 16][4];
        const float qscale = rsqrtf(static_cast<float>(HD)) * 1.4426950408889634f;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int64_t r = r0 + 16 * warp + gq + 8 * e;
            const bool ok = r < rows;
            const int64_t t = ok ? r / group : 0;
            row_pos[e] = ok ? pos0 + t : -1;  // a row past the end sees no key
            row_lo[e] = first_key(pos0 + t);
            const float* q = a.q + (t * a.n_head + g * group + r % group) * HD;
#pragma unroll
            for (int kk = 0; kk < HD / 16; ++kk)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const float2 v = ok ? *reinterpret_cast<const float2*>(q + 16 * kk + 8 * c + 2 * tq) : float2{0.0f, 0.0f};
                    qa[kk][e + 2 * c] = pack_half2(v.x * qscale, v.y * qscale);
                }
        }

        float o[HD / 8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
        const size_t head_off = static_cast<size_t>(g) * HD;
        for (int64_t p0 = lo; p0 <= hi; p0 += kFlashKeys) {
            const int n = static_cast<int>(min(static_cast<int64_t>(kFlashKeys), hi - p0 + 1));
            __syncthreads();  // the previous tile is consumed
            for (int e = threadIdx.x; e < kFlashKeys * HD / 8; e += blockDim.x) {  // 8 values a thread and step
                const int j = e / (HD / 8), d = 8 * (e % (HD / 8));
                uint4 kv = {0, 0, 0, 0}, vv = {0, 0, 0, 0};  // rows past the tile: zeros (their scores are masked)
                if (j < n) {
                    const size_t slot = static_cast<size_t>((p0 + j) % a.capacity) * a.slot_bytes;
                    kv = Kv<K>::load8(a.k_cache + slot, static_cast<int>(head_off) + d);
                    vv = Kv<K>::load8(a.v_cache + slot, static_cast<int>(head_off) + d);
                }
                *reinterpret_cast<uint4*>(ks + j * kRow + d) = kv;
                *reinterpret_cast<uint4*>(vs + j * kRow + d) = vv;
            }
            __syncthreads();

            // S = Q Kᵀ: 8 tiles of 8 keys; ldmatrix gives two key tiles' B fragments at a time
            float sc[kFlashKeys / 8][4] = {};
#pragma unroll
            for (int np = 0; np < kFlashKeys / 16; ++np)
#pragma unroll
                for (int kk = 0; kk < HD / 16; ++kk) {
                    uint32_t b[4];
                    ldmatrix_x4<false>(b, ks + (16 * np + (lane / 16) * 8 + lane % 8) * kRow + 16 * kk + ((lane / 8) % 2) * 8);
                    mma_f16(sc[2 * np], qa[kk], b[0], b[1]);
                    mma_f16(sc[2 * np + 1], qa[kk], b[2], b[3]);
                }
            // mask, then the online softmax per row (a row's scores over the four lanes of a quad)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float mx = -INFINITY;
#pragma unroll
                for (int nt = 0; nt < kFlashKeys / 8; ++nt)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        const int j = 8 * nt + 2 * tq + c;
                        const int64_t p = p0 + j;
                        const bool seen = j < n && p >= row_lo[e] && p <= row_pos[e];
                        float& v = sc[nt][2 * e + c];
                        v = seen ? v : -INFINITY;
                        mx = fmaxf(mx, v);
                    }
                mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
                const float m_new = fmaxf(m[e], mx);
                const float base = m_new == -INFINITY ? 0.0f : m_new;  // a row that has seen nothing yet
                const float corr = exp2f(m[e] - base);
                float sum = 0.0f;
#pragma unroll
                for (int nt = 0; nt < kFlashKeys / 8; ++nt)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        float& v = sc[nt][2 * e + c];
                        v = exp2f(v - base);
                        sum += v;
                    }
                l[e] = l[e] * corr + sum;  // this lane's share; the quad's are added at the end
#pragma unroll
                for (int dt = 0; dt < HD / 8; ++dt) o[dt][2 * e] *= corr, o[dt][2 * e + 1] *= corr;
                m[e] = m_new;
            }
            // O += P V: P's A fragments are S's accumulators, 16 keys per step
#pragma unroll
            for (int kk = 0; kk < kFlashKeys / 16; ++kk) {
                const uint32_t pa[4] = {pack_half2(sc[2 * kk][0], sc[2 * kk][1]), pack_half2(sc[2 * kk][2], sc[2 * kk][3]),
                                        pack_half2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]), pack_half2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
                for (int dp = 0; dp < HD / 16; ++dp) {
                    uint32_t b[4];
                    ldmatrix_x4<true>(b, vs + (16 * kk + ((lane / 8) % 2) * 8 + lane % 8) * kRow + 16 * dp + (lane / 16) * 8);
                    mma_f16(o[2 * dp], pa, b[0], b[1]);
                    mma_f16(o[2 * dp + 1], pa, b[2], b[3]);
                }
            }
        }

        // the rows' sums over their quads, O / l into shared memory (the tiles are done), then
        // each warp writes its 16 rows
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            l[e] += __shfl_xor_sync(0xFFFFFFFFu, l[e], 1);
            l[e] += __shfl_xor_sync(0xFFFFFFFFu, l[e], 2);
        }
        __syncthreads();
        float* os = reinterpret_cast<float*>(smem) + warp * 16 * HD;
#pragma unroll
        for (int dt = 0; dt < HD / 8; ++dt)
#pragma unroll
            for (int e = 0; e < 2; ++e)
#pragma unroll
                for (int c = 0; c < 2; ++c) os[(gq + 8 * e) * HD + 8 * dt + 2 * tq + c] = l[e] > 0.0f ? o[dt][2 * e + c] / l[e] : 0.0f;
        __syncwarp();
        for (int i = 0; i < 16; ++i) {
            const int64_t r = r0 + 16 * warp + i;
            if (r >= rows) break;
            float v[HD / 32];
#pragma unroll
            for (int k = 0; k < HD / 32; ++k) v[k] = os[i * HD + lane + 32 * k];
            write_head(a, r / group, g * group + static_cast<int>(r % group), lane, v);
        }
    }

    static constexpr size_t smem() {
        const size_t tiles = 2 * kFlashKeys * kRow * sizeof(__half), rows = kFlashWarps * 16 * HD * sizeof(float);
        return tiles > rows ? tiles : rows;
    }
};

}  // namespace

// The most keys a token may have for the decode attention's short path (0: none; a multiple
// of 32): rows of whole 16-byte pieces in f16 or f32 caches, as many as fit in kShortSmem.
// The launch asks that memory at every position (one graph serves them all), so past it the
// split path runs two blocks an SM (at 96 KB on sm_90): where its one-token grid would then take
// more than one wave (many KV heads: Phi-3 mini's 32 make 1024 blocks), none, and the split path
// keeps its own small memory. (By the one-token grid, not a step's: the same for every step of a
// model.) EDGERUNNER_CUDA_SHORT_ATTENTION=0 says none, =N at most N (for measurements: its
// shared memory is sized for what it may take).
int short_keys(KvType kv, const AttentionArgs& a) {
    static const int most = [] {
        const char* env = std::getenv("EDGERUNNER_CUDA_SHORT_ATTENTION");
        const int n = env ? std::atoi(env) : 1;
        return n == 1 ? kShortMaxKeys : std::clamp(n / 32 * 32, 0, kShortMaxKeys);
    }();
    const int head_bytes = a.head_dim * (kv == KvType::F16 ? 2 : 4);
    const bool aligned = reinterpret_cast<uintptr_t>(a.k_cache) % 16 == 0 && reinterpret_cast<uintptr_t>(a.v_cache) % 16 == 0 &&
                         a.slot_bytes % 16 == 0 && head_bytes % 16 == 0 && a.head_dim % 8 == 0;
    const int64_t sets = (a.n_head / a.n_head_kv + kDecodeHeads - 1) / kDecodeHeads;
    const bool one_wave = static_cast<int64_t>(kSplits) * a.n_head_kv * sets <= 2 * static_cast<int64_t>(sm_count());
    if (kv == KvType::Q8_0 || !aligned || !one_wave) return 0;
    int keys = most;
    while (keys > 0 && ShortLayout(head_bytes, a.head_dim, keys).end > kShortSmem) keys -= 32;
    return keys;
}

// Kernel K with `smem` bytes of dynamic shared memory (allowed once, up to its most).
template <class K>
Launch with_smem(dim3 grid, dim3 block, const AttentionArgs& a, size_t smem, size_t most) {
    allow_smem<K>(most);
    return make_launch<K>(grid, block, a, smem);
}

Launch attention(KvType kv, const AttentionArgs& a, int64_t fewest_keys) {
    if (a.head_dim > 32 * kMaxDims) throw std::invalid_argument("the CUDA attention kernel takes head sizes up to 256");
    if (a.q_out && a.head_dim % 32 != 0) throw std::invalid_argument("quantized attention output needs head sizes that are multiples of 32");
    const int64_t group = a.n_head / a.n_head_kv;
    if (a.n_tokens >= kPrefillKernelTokens && (a.head_dim == 64 || a.head_dim == 128)) {
        const dim3 grid(static_cast<unsigned>((a.n_tokens * group + 16 * kFlashWarps - 1) / (16 * kFlashWarps)), static_cast<unsigned>(a.n_head_kv)),
            block(32 * kFlashWarps);
        switch (kv) {
#define ER_FLASH(KV)                                                                                                              \
    case KvType::KV:                                                                                                              \
        if (a.head_dim == 64) return with_smem<FlashAttention<KvType::KV, 64>>(grid, block, a, FlashAttention<KvType::KV, 64>::smem(), \
                                                                               FlashAttention<KvType::KV, 64>::smem());            \
        return with_smem<FlashAttention<KvType::KV, 128>>(grid, block, a, FlashAttention<KvType::KV, 128>::smem(),                 \
                                                          FlashAttention<KvType::KV, 128>::smem());
            ER_FLASH(F16) ER_FLASH(F32) ER_FLASH(Q8_0)
#undef ER_FLASH
        }
    }
    if (a.n_tokens >= kPrefillKernelTokens) {
        const int64_t heads = std::min<int64_t>(group, kTileRows), chunks = (group + kTileRows - 1) / kTileRows, per_block = kTileRows / heads;
        const dim3 grid(static_cast<unsigned>((a.n_tokens + per_block - 1) / per_block), static_cast<unsigned>(a.n_head_kv * chunks)),
            block(32 * kTileRows);
        const size_t smem = TiledAttention<KvType::F16>::smem(a.head_dim), most = TiledAttention<KvType::F16>::smem(32 * kMaxDims);
        switch (kv) {
            case KvType::F16: return with_smem<TiledAttention<KvType::F16>>(grid, block, a, smem, most);
            case KvType::F32: return with_smem<TiledAttention<KvType::F32>>(grid, block, a, smem, most);
            case KvType::Q8_0: return with_smem<TiledAttention<KvType::Q8_0>>(grid, block, a, smem, most);
        }
    }
    if (!a.partial || !a.done) throw std::logic_error("the decode attention needs its scratch (attention_scratch)");
    const int64_t sets = (group + kDecodeHeads - 1) / kDecodeHeads;
    const dim3 grid(static_cast<unsigned>(a.n_head_kv * sets), static_cast<unsigned>(a.n_tokens * kSplits)), block(32 * kDecodeWarps);
    const int dims = (a.head_dim + 31) / 32;
    AttentionArgs d = a;
    const int few = short_keys(kv, a);
    d.short_keys = fewest_keys > few ? 0 : few;  // (no token of the step could take it: no memory for it)
    const size_t short_smem = d.short_keys ? ShortLayout(a.head_dim * (kv == KvType::F16 ? 2 : 4), a.head_dim, d.short_keys).end : 0;
    switch (kv) {
#define ER_DECODE_D(KV, D)                                                                                       \
    {                                                                                                            \
        using Kernel = DecodeAttention<KvType::KV, D>;                                                           \
        return with_smem<Kernel>(grid, block, d, std::max(Kernel::split_smem(), short_smem),                     \
                                 std::max(Kernel::split_smem(), kShortSmem));                                    \
    }
#define ER_DECODE(KV)                       \
    case KvType::KV:                        \
        if (dims <= 2) ER_DECODE_D(KV, 2)   \
        if (dims <= 4) ER_DECODE_D(KV, 4)   \
        ER_DECODE_D(KV, 8)
        ER_DECODE(F16) ER_DECODE(F32) ER_DECODE(Q8_0)
#undef ER_DECODE
#undef ER_DECODE_D
    }
    throw std::logic_error("KV type");
}

AttentionScratch attention_scratch(int64_t n_tokens, int32_t n_head, int32_t n_head_kv, int32_t head_dim) {
    const int64_t tokens = std::min<int64_t>(n_tokens, kPrefillKernelTokens - 1);
    const int64_t group = n_head / n_head_kv, sets = (group + kDecodeHeads - 1) / kDecodeHeads;
    return AttentionScratch{tokens * n_head * kSplits * (head_dim + 2), tokens * n_head_kv * sets};
}

}  // namespace edgerunner::cuda
