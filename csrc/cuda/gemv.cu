// Quantized matrix-vector products: one warp per weight row (or gate and up row pair), a lane
// per 32-element unit, striding over the row's units (against int8 activations for the int8
// formats, quant_dot.cuh; float activations otherwise, quant_unit.cuh), a shuffle reduction, one
// store (or add: the residual; or act(gate)·up). The one-token kernel of the int8 formats stages
// the weights through shared memory (GemvStaged).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "async_copy.cuh"
#include "check.cuh"
#include "cuda.h"
#include "gemv.cuh"
#include "kv_slot.cuh"
#include "quant_dot.cuh"
#include "rms_norm.cuh"
#include "rope.cuh"
#include "warp.cuh"

namespace edgerunner::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

// Field f of part p (selects, not an indexed parameter array, which would go to local memory).
template <typename F>
__device__ __forceinline__ F field(const GemvArgs& a, int p, F GemvPart::*f) {
    return p == 0 ? a.part[0].*f : p == 1 ? a.part[1].*f : a.part[2].*f;
}

template <TensorType T>
constexpr bool kFloatWeights = float_weights(T);

constexpr int kFloatSteps = 8;  // 16-byte loads a lane issues before their sums (float weights)

// The float4s a thread holds of a folded norm's row, in a block of `warps` warps: rows of up to
// kMaxFoldCols values.
constexpr int64_t kMaxFoldCols = 4096;
constexpr int64_t kFoldBudget = 1 << 20;  // gemv_folds_norm (the int8 formats)
constexpr int fold_passes(int warps) { return static_cast<int>(kMaxFoldCols / 4 / (32 * warps)); }

// The warp's row of a GEMV of one row (or gate and up row pair) a warp, kWarpsPerBlock a block:
// its part p and its row r in that part.
__device__ __forceinline__ void warp_row(const GemvArgs& a, int& p, int64_t& r) {
    r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
    p = 0;
    if (a.glu == Glu::None) {
        if (a.n_parts > 1 && r >= a.part[0].rows) r -= a.part[0].rows, p = 1;
        if (p == 1 && a.n_parts > 2 && r >= a.part[1].rows) r -= a.part[1].rows, p = 2;
    }
}

// A warp's sums for tokens t0 .. t0 + nt - 1 of row r of part p reduced and stored (or added: the
// residual; or act(gate)·up where gated).
template <int NT>
__device__ __forceinline__ void store_sums(const GemvArgs& a, int p, int64_t r, int64_t t0, int nt, const float (&sum)[NT],
                                           const float (&sum2)[NT], bool gated) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        if (t >= nt) break;
        float v = warp_sum(sum[t]);
        if (gated) v = gate_act(a.glu, v) * warp_sum(sum2[t]);
        if (threadIdx.x % 32 == 0) {
            if (const float* bias = field(a, p, &GemvPart::bias)) v += bias[r];
            float* out = field(a, p, &GemvPart::y) + (t0 + t) * field(a, p, &GemvPart::y_stride) + r;
            *out = a.accumulate ? *out + v : v;
        }
    }
}

// Tokens [NT·blockIdx.y, +NT) of the formats that take no staged kernel here: the int8 formats'
// several-token GEMV (each weight unit loaded once for NT tokens, in the one-token kernel's order:
// the same sums) and Q8_K's. Before it waits for its input, each warp pulls its whole row towards
// L2 (the weights do not depend on the previous kernel).
template <TensorType T, int NT>
struct Gemv {
    using Args = GemvArgs;
    static __device__ void run(const Args& a) {
        allow_next();
        const int lane = threadIdx.x % 32;
        int p;
        int64_t r;
        warp_row(a, p, r);
        const bool gated = a.glu != Glu::None;
        if (r >= field(a, p, &GemvPart::rows)) return wait_inputs();
        const uint8_t* row = field(a, p, &GemvPart::w) + static_cast<size_t>(r) * a.row_bytes;
        const uint8_t* row2 = gated ? a.part[1].w + static_cast<size_t>(r) * a.row_bytes : row;
        prefetch_l2(row, a.row_bytes, lane, 32);
        if (gated) prefetch_l2(row2, a.row_bytes, lane, 32);
        wait_inputs();

        const int64_t t0 = static_cast<int64_t>(blockIdx.y) * NT;
        const int nt = static_cast<int>(a.n_tokens - t0 < NT ? a.n_tokens - t0 : NT);
        float sum[NT] = {}, sum2[NT] = {};
        // lane l takes units l, l + 32, ...
        if constexpr (QuantDot<T>::kFast) {
            const QBlock* xq = a.xq + t0 * a.xq_stride;
            for (int64_t u = lane; u < a.cols / 32; u += 32)
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    if (t >= nt) break;
                    const XUnit x = load_x(xq[t * a.xq_stride + u]);
                    sum[t] += QuantDot<T>::dot(row, u, x);
                    if (gated) sum2[t] += QuantDot<T>::dot(row2, u, x);
                }
        } else {
            const float* x = a.x + t0 * a.x_stride;
            for (int64_t u = lane; u < a.cols / 32; u += 32)
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    if (t >= nt) break;
                    sum[t] += Unit<T>::dot(row, u, x + t * a.x_stride + 32 * u);
                    if (gated) sum2[t] += Unit<T>::dot(row2, u, x + t * a.x_stride + 32 * u);
                }
        }
        store_sums(a, p, r, t0, nt, sum, sum2, gated);
    }
};

// A one-token float GEMV's input in shared memory (FloatGemv's kStaged: `xs`), by the whole block,
// by cp.async (every piece in flight at once, none through registers, which the GEMV's loads
// want): a.x as it is (a.cols floats), or with a folded RMSNorm (GemvArgs::norm) the norm of
// a.norm.x: the norm's weight into xs before the wait for the input, the residual's row after it
// into the a.cols floats past them, then the normed row over the weight, by the RmsNorm kernel's
// arithmetic (rms_norm.cuh): the bits of its output, whatever the block size. Each thread copies
// float4s i, i + blockDim.x, ... and alone reads them back before the barrier.
__device__ __forceinline__ void stage_row(const float* from, int64_t cols, float4* xs) {
    const float4* x = reinterpret_cast<const float4*>(from);
    for (int i = threadIdx.x; i < cols / 4; i += blockDim.x) copy16(xs + i, x + i);
    commit();
}
__device__ __forceinline__ void stage_input(const GemvArgs& a, float4* xs) {
    const int n4 = static_cast<int>(a.cols / 4);
    if (!a.norm.x) {
        stage_row(a.x, a.cols, xs);
        wait_pending<0>();
        __syncthreads();
        return;
    }
    __shared__ float unit_ss[kMaxFoldCols / 32];
    const float4* row = xs + n4;
    stage_row(a.norm.x, a.cols, xs + n4);
    wait_pending<0>();  // (this thread's pieces of both)
    for (int i0 = threadIdx.x - threadIdx.x % 32; i0 < n4; i0 += blockDim.x) {  // (whole warps: unit_squares' shuffles)
        const int i = i0 + threadIdx.x % 32;
        const float ss = unit_squares(i < n4 ? row[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f));
        if (i < n4 && i % 8 == 0) unit_ss[i / 8] = ss;
    }
    __syncthreads();
    const float scale = units_rms_scale(unit_ss, (n4 + 7) / 8, a.cols, a.norm.eps);
    for (int i = threadIdx.x; i < n4; i += blockDim.x) xs[i] = normed4(row[i], scale, xs[i]);
    __syncthreads();
}
// Its shared memory, bytes.
size_t staged_input_bytes(const GemvArgs& a) { return static_cast<size_t>(a.cols) * 4 * (a.norm.x ? 2 : 1); }

// Float weights (F32, F16, BF16), tokens [NT·blockIdx.y, +NT): a warp a row (or gate and up row
// pair, kGated: a plain GEMV's registers, and so its warps an SM, do not pay for the gated pair's
// loads in flight; the gated one held to four blocks an SM, 128 registers), read 16 bytes a lane
// at a time, the rows and the activations on 16-byte boundaries (check_rows_aligned): lane l takes
// pieces l, l + 32, ... (kPer16 values each), a warp 512 contiguous bytes a step, kFloatSteps
// steps' loads issued before their sums, the raw bytes held, not floats. One token: the first
// step's loads are issued before the wait for the input (the weights do not depend on the previous
// kernel; a 1B's rows of 2048 F16 values are all in registers by then; H100: +7 % on the 1B F16,
// bench/NOTES.md, fifty-fifth CUDA session), the rest of the row pulled towards L2 (several tokens:
// all of it, their sums want the registers). A one-token GEMV of 16-bit values whose rows take more than one step (kAhead: a 1B's down
// projection, four) issues each step's loads before the sums of the one before, so a warp keeps
// its row's bytes in flight from its first step to its last (`loads_ahead`). A one-token GEMV may
// read its input from shared memory (kStaged, `stages_x`: each block copies it there once, rather
// than each warp reading it all from L2, 4 bytes a value against F16's 2; +3 % on the 1B F16, +16 %
// on SmolLM2 F32), and fold in the RMSNorm before it (GemvArgs::norm, stage_input): each block then
// normalizes the row itself there.
template <bool kBounded>
struct GemvBounds {};
template <>
struct GemvBounds<true> {
    static constexpr int kBlockThreads = 32 * kWarpsPerBlock, kMinBlocks = 4;
};
template <TensorType T, int NT, bool kGated = false, bool kAhead = false, bool kStaged = false>
struct FloatGemv : GemvBounds<kGated> {
    static_assert(kFloatWeights<T>, "float weights");
    static_assert(!kAhead || (!kGated && NT == 1), "loads a step ahead: plain one-token GEMVs");
    static_assert(!kStaged || NT == 1, "the input in shared memory: one-token GEMVs");
    using Args = GemvArgs;
    static __device__ void run(const Args& a) {
        allow_next();
        const int lane = threadIdx.x % 32;
        int p;
        int64_t r;
        warp_row(a, p, r);
        const bool has_row = r < field(a, p, &GemvPart::rows);
        if (!kStaged && !has_row) return wait_inputs();  // (kStaged: every warp stages the input)
        constexpr int kV = Unit<T>::kPer16;
        const int64_t pieces = a.cols / kV;
        const uint4* w4 = reinterpret_cast<const uint4*>(field(a, p, &GemvPart::w) + static_cast<size_t>(r) * a.row_bytes);
        const uint4* w4b = kGated ? reinterpret_cast<const uint4*>(a.part[1].w + static_cast<size_t>(r) * a.row_bytes) : w4;
        // the step from piece c0 on: lane's pieces c0, c0 + 32, ... of the row (and its up row)
        auto load = [&](uint4(&w)[kFloatSteps], uint4(&w2)[kFloatSteps], int64_t c0) {
#pragma unroll
            for (int i = 0; i < kFloatSteps; ++i)
                if (c0 + 32 * i < pieces) {
                    w[i] = __ldcs(w4 + c0 + 32 * i);
                    if (kGated) w2[i] = __ldcs(w4b + c0 + 32 * i);
                }
        };
        uint4 w[kFloatSteps], w2[kFloatSteps], next[kAhead ? kFloatSteps : 1];
        constexpr bool kFirstEarly = NT == 1;  // (several tokens' sums want the registers)
        if (has_row) {
            if (kFirstEarly) load(w, w2, lane);
            const int64_t early = kFirstEarly ? 512 * kFloatSteps : 0;
            if (a.row_bytes > early) {
                prefetch_l2(w4 + early / 16, a.row_bytes - early, lane, 32);
                if (kGated) prefetch_l2(w4b + early / 16, a.row_bytes - early, lane, 32);
            }
        }
        extern __shared__ float4 gemv_xs[];  // (kStaged: the input, staged_input_bytes)
        if (kStaged && a.norm.x) stage_row(a.norm.w, a.cols, gemv_xs);
        wait_inputs();
        const float* x = a.x;
        if constexpr (kStaged) {
            stage_input(a, gemv_xs);
            if (!has_row) return;
            x = reinterpret_cast<const float*>(gemv_xs);
        }

        const int64_t t0 = static_cast<int64_t>(blockIdx.y) * NT;
        const int nt = static_cast<int>(a.n_tokens - t0 < NT ? a.n_tokens - t0 : NT);
        x += t0 * a.x_stride;
        float sum[NT] = {}, sum2[NT] = {};
        for (int64_t c0 = lane; c0 < pieces; c0 += kFloatSteps * 32) {
            if constexpr (kAhead) {
                load(next, w2, c0 + kFloatSteps * 32);  // (the next step's: past the row's end, none; the first's before the wait)
            } else {
                if (!kFirstEarly || c0 != lane) load(w, w2, c0);  // (kFirstEarly: the first step's before the wait)
            }
#pragma unroll
            for (int i = 0; i < kFloatSteps; ++i) {
                const int64_t c = c0 + 32 * i;
                if (c >= pieces) break;
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    if (t >= nt) break;
                    const float* xc = x + t * a.x_stride + kV * c;
                    sum[t] += Unit<T>::dot16(w[i], xc);
                    if (kGated) sum2[t] += Unit<T>::dot16(w2[i], xc);
                }
            }
            if constexpr (kAhead)
#pragma unroll
                for (int i = 0; i < kFloatSteps; ++i) w[i] = next[i];
        }
        store_sums(a, p, r, t0, nt, sum, sum2, kGated);
    }
};

// The one-token GEMV of the int8 formats, staged through shared memory. A block of eight warps
// loads the int8 activations into shared memory once (laid out for 16-byte loads, with each
// unit's sums); each warp takes two rows (or a gate row and its up row) and streams them through
// a ring of three chunk buffers: every lane copies 16-byte pieces of the raw bytes (cp.async), so
// three chunks per row are in flight while one is computed, and a lane takes a whole unit of the
// chunk (kPerLane of them) out of shared memory. Global loads are thus full-width and coalesced
// whatever the block size (18 to 210 bytes), and the first chunks are requested before the
// kernel waits for its input. Instruction issue and shared-memory wavefronts limit the dots
// (bench/NOTES.md): chunks of one or two units per lane keep the ring's bookkeeping small beside
// the dot products, the weights are read by shared (not generic) loads, and where every chunk is
// staged before the wait the block packs them meanwhile (kPack below). Where a warp's ring of three
// does not keep enough bytes in flight, two forms keep more (kStream, kDepth below).
constexpr int kStagedWarps = 8;
constexpr int64_t kMaxStagedCols = 65536;  // activations of up to this many columns in shared memory (96 KiB)
constexpr int kRing = 3;                   // chunk buffers per row
constexpr int kSlots = 2;                  // rows per warp
constexpr int kMaxChunkBytes = 1536;       // two units per lane where a chunk stays within this

// Activations staged in shared memory for 16-byte loads: per unit, its words 0..3 at xs[u], 4..7 at
// xs[n_units + u], then (d, sum) as int2s (x_ds), then the sums of the first 16 (x_sum_lo: a load
// the formats that do not use it leave out). 44 of the 48 bytes a unit is given.
__device__ __forceinline__ int2* x_ds(int4* xs, int n_units) { return reinterpret_cast<int2*>(xs + 2 * n_units); }
__device__ __forceinline__ int* x_sum_lo(int4* xs, int n_units) { return reinterpret_cast<int*>(xs + 2 * n_units) + 2 * n_units; }
__device__ __forceinline__ XUnit staged_x(int4* xs, int n_units, int u) {
    const int4 lo = xs[u], hi = xs[n_units + u];
    const int2 ds = x_ds(xs, n_units)[u];
    return XUnit{{lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w}, ds.y, x_sum_lo(xs, n_units)[u], __int_as_float(ds.x)};
}

// Where a one-token GEMV's int8 input comes from, a variant of each kernel (as a runtime branch,
// the scaling changed how the compiler scheduled every kernel's dots, and they ran up to 7 %
// slower: bench/NOTES.md, seventeenth CUDA session): a.xq as it is
// (Q8), an RMSNorm folded in (Norm: GemvArgs::norm), or a norm's copy written unit by unit by the
// GEMV before it (Scaled: GemvArgs::xq_ss, each unit's d' scaled by the row's 1/rms).
enum class In { Q8, Norm, Scaled };
template <In kIn>
using InputIs = std::integral_constant<In, kIn>;
// f(InputIs<...>{}) for the input `a` has
template <class F>
auto by_input(const GemvArgs& a, F f) {
    if (a.norm.x) return f(InputIs<In::Norm>{});
    if (a.xq_ss) return f(InputIs<In::Scaled>{});
    return f(InputIs<In::Q8>{});
}

// A unit of a Scaled input (a norm's copy from GemvNormOut): d' times the row's 1/rms, which
// every warp works out itself from the units' sums of squares (all lanes call this). The unit's
// 36 bytes are requested before those sums, so that the two round trips to L2 overlap. (It repeats
// load_x's sums rather than share a helper with it, and works the scale out for every unit it
// stages: both tidier forms changed how the compiler built the Scaled kernels, and SmolLM2 lost
// 2 %: bench/NOTES.md, seventeenth CUDA session.)
__device__ __forceinline__ XUnit scaled_unit(const GemvArgs& a, int u, int n_units) {
    int w[8] = {};
    float d = 0.0f;
    if (u < n_units) {
        const QBlock& b = a.xq[u];
#pragma unroll
        for (int j = 0; j < 8; ++j) w[j] = *reinterpret_cast<const int*>(b.q + 4 * j);
        d = b.d;
    }
    const float scale = units_rms_scale<8>(a.xq_ss, n_units, a.cols, a.xq_eps);
    XUnit x;
    x.sum_lo = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) x.w[j] = w[j];
#pragma unroll
    for (int j = 0; j < 4; ++j) x.sum_lo = __dp4a(kOnes, w[j], x.sum_lo);
    x.sum = x.sum_lo;
#pragma unroll
    for (int j = 4; j < 8; ++j) x.sum = __dp4a(kOnes, w[j], x.sum);
    x.d = d * scale;
    return x;
}

// a.xq's int8 units into that layout, by the whole block (then its barrier).
template <In kIn>
__device__ __forceinline__ void stage_q8(const GemvArgs& a, int4* xs, int n_units) {
    auto put = [&](const XUnit& x, int u) {
        xs[u] = make_int4(x.w[0], x.w[1], x.w[2], x.w[3]);
        xs[n_units + u] = make_int4(x.w[4], x.w[5], x.w[6], x.w[7]);
        x_ds(xs, n_units)[u] = make_int2(__float_as_int(x.d), x.sum);
        x_sum_lo(xs, n_units)[u] = x.sum_lo;
    };
    if constexpr (kIn == In::Scaled) {
        for (int u0 = threadIdx.x - threadIdx.x % 32; u0 < n_units; u0 += blockDim.x) {  // (whole warps: scaled_unit's shuffles)
            const XUnit x = scaled_unit(a, u0 + threadIdx.x % 32, n_units);
            if (u0 + threadIdx.x % 32 < n_units) put(x, u0 + threadIdx.x % 32);
        }
    } else {
        for (int u = threadIdx.x; u < n_units; u += blockDim.x) put(load_x(a.xq[u]), u);
    }
    __syncthreads();
}

// A folded RMSNorm (GemvArgs::norm): norm(a.norm.x) quantized into that layout by the whole block
// (then its barrier) from the row held in registers (kPasses float4s a thread: rows of up to
// 4 · kPasses · blockDim.x values, gemv_folds_norm), by the RmsNorm kernel's arithmetic
// (rms_norm.cuh): the same bits as its int8 copy. The block's threads are a multiple of 32.
// g: the norm's weight, load_row'd before the wait for the input (a weight: off the critical path).
template <int kPasses>
__device__ __forceinline__ void stage_normed(const GemvArgs& a, const float4 (&g)[kPasses], int4* xs, int n_units) {
    __shared__ float unit_ss[kRmsNormMaxCols / 32];
    const int n4 = 8 * n_units;
    float4 v[kPasses];
    load_row(reinterpret_cast<const float4*>(a.norm.x), n4, v);
    const float scale = block_rms_scale(v, n4, a.cols, a.norm.eps, unit_ss);
    int* words = reinterpret_cast<int*>(xs);
#pragma unroll
    for (int k = 0; k < kPasses; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i - threadIdx.x % 32 >= n4) break;  // (the warp's lanes together; a unit's eight all in or all out)
        float d;
        const int word = static_cast<int>(quantize_normed4(v[k], g[k], d));
        // the unit's sums of its bytes: the first four words', then all eight
        int lo = __dp4a(kOnes, word, 0);
        lo += __shfl_xor_sync(0xFFFFFFFFu, lo, 1);
        lo += __shfl_xor_sync(0xFFFFFFFFu, lo, 2);
        const int sum = lo + __shfl_xor_sync(0xFFFFFFFFu, lo, 4);
        if (i < n4) {
            const int u = i / 8, j = i % 8;
            words[4 * (j < 4 ? u : n_units + u) + j % 4] = word;
            if (j == 0) x_ds(xs, n_units)[u] = make_int2(__float_as_int(d * scale), sum), x_sum_lo(xs, n_units)[u] = lo;
        }
    }
    __syncthreads();
}

// Variants: kRope (GemvRope: Q, K and V stored rotated and into the cache), kQuantOut (gate·up
// also written as int8 for the down projection, GemvArgs::xq_out: a block of 32 warps holds the
// 32 rows of a block of values and quantizes them, the quantize kernel's arithmetic; rows of one
// chunk, so each warp's ring is one buffer), kIn (In::Norm: an RMSNorm folded in, GemvArgs::norm,
// stage_normed, a variant of its own so that the others keep their registers; In::Scaled), kPack (the chunks
// rewritten into aligned fields while the block waits for its input, quant_dot.cuh's Packed: a
// grid of one wave whose rows fit in the ring, `packs`), kNormOut (GemvArgs::norm_out: blocks of
// 16 warps, whose 32 rows of the residual are one unit of its norm's int8 copy, quantized by warp
// 0 once the block's rows are stored), kStream (a matrix of several waves of blocks: a grid of the
// blocks the SMs hold, each warp's ring running on through its rows, `stream`), kDepth (a ring of
// four or six chunks a row: a one-wave grid of few blocks an SM whose rows stream more chunks
// than three, such as the 8B's down projections, `deepens`; their dots wait on the ring, whose
// next chunks arrive a loaded memory's latency after they are asked for).
struct Bounds1024 {
    static constexpr int kBlockThreads = 1024, kMinBlocks = 1;
};
struct Bounds256x3 {  // (kNorm's registers: still three blocks an SM, as the others get unbounded)
    static constexpr int kBlockThreads = 256, kMinBlocks = 3;
};
struct Bounds512 {
    static constexpr int kBlockThreads = 512, kMinBlocks = 1;
};
struct NoBounds {};

template <TensorType T, bool kRope, bool kQuantOut = false, In kIn = In::Q8, bool kPack = false, bool kNormOut = false,
          bool kStream = false, int kDepth = kRing>
struct GemvStaged : std::conditional_t<kQuantOut, Bounds1024,
                                       std::conditional_t<kIn == In::Norm, Bounds256x3, std::conditional_t<kNormOut, Bounds512, NoBounds>>> {
    using Args = GemvArgs;
    using D = QuantDot<T>;
    static constexpr bool kNorm = kIn == In::Norm;
    static_assert(!kNormOut || (!kRope && !kQuantOut && kIn == In::Q8), "the norm's copy: of a plain GEMV added to the residual");
    static_assert(!kStream || (!kRope && !kQuantOut && !kNorm && !kPack && !kNormOut), "streamed: plain or gated GEMVs");
    static constexpr int kWarps = kQuantOut ? 32 : kNormOut ? 16 : kStagedWarps;
    static_assert(kDepth == kRing || (!kRope && !kQuantOut && kIn == In::Q8 && !kPack && !kNormOut && !kStream), "deeper rings: plain GEMVs");
    static constexpr int kBuffers = kQuantOut ? 1 : kDepth;  // a warp's ring (one chunk per row: one)
    static constexpr int kBlockBytes = sizeof(typename D::Block);
    static constexpr int kPerLane = 64 / D::kUnits * kBlockBytes <= kMaxChunkBytes ? 2 : 1;
    static constexpr int kChunkUnits = 32 * kPerLane;
    static constexpr int kChunkBytes = kChunkUnits / D::kUnits * kBlockBytes;
    static constexpr int kPieces = (kChunkBytes + 15 + 15) / 16;  // 16-byte pieces from the boundary at or below a chunk's start
    using P = Packed<T>;
    static_assert(!kPack || (P::kPacks && !kQuantOut), "packed chunks: a format that has them, rings of three");
    static constexpr int kStageBytes = std::max(16 * kPieces, kPack ? (P::bytes(kChunkUnits) + 15) / 16 * 16 : 0);
    static constexpr size_t kWeightSmem = static_cast<size_t>(kWarps) * kBuffers * kSlots * kStageBytes;
    static_assert(kChunkUnits % D::kUnits == 0, "chunks of whole blocks");
    // the bytes of a chunk of `units` units: whole blocks (a row's last group of eight 32-value blocks
    // padded, Group8; the super-block formats' rows are whole blocks)
    static constexpr bool kPadded = group_bytes(T) > 0;
    static __device__ int chunk_bytes(int units) { return (kPadded ? units + D::kUnits - 1 : units) / D::kUnits * kBlockBytes; }
    // the dot's per-lane form (QuantDot<T>::Lane), where every chunk of a row starts as far past a
    // 4-byte boundary
    static constexpr bool kLanes = LanesOf<D>::value && kChunkBytes % 4 == 0 && kPerLane == 1;
    using Lane = typename LanesOf<D>::type;

    static __device__ void run(const Args& a) {
        if constexpr (kStream) stream(a);
        else run_block(a, blockIdx.x);
    }
    // block `block` of the launch (StagedPair: of one of its two halves)
    static __device__ void run_block(const Args& a, int64_t block) {
        extern __shared__ uint4 smem[];
        allow_next();
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        const int64_t wg = block * kWarps + warp;
        const bool gated = a.glu != Glu::None;
        // the warp's two rows: gate row wg and up row wg, or rows 2wg and 2wg + 1 of the parts
        const uint8_t* row[kSlots];
        int64_t r[kSlots];
        int part[kSlots];
#pragma unroll
        for (int s = 0; s < kSlots; ++s) {
            r[s] = gated ? wg : 2 * wg + s;
            part[s] = gated ? s : 0;
            if (!gated) {
                if (a.n_parts > 1 && r[s] >= a.part[0].rows) r[s] -= a.part[0].rows, part[s] = 1;
                if (part[s] == 1 && a.n_parts > 2 && r[s] >= a.part[1].rows) r[s] -= a.part[1].rows, part[s] = 2;
            }
            row[s] = r[s] < field(a, part[s], &GemvPart::rows) ? field(a, part[s], &GemvPart::w) + static_cast<size_t>(r[s]) * a.row_bytes
                                                              : nullptr;
        }

        const int n_units = static_cast<int>(a.cols / 32);
        const int n_chunks = (n_units + kChunkUnits - 1) / kChunkUnits;
        uint8_t* stage = reinterpret_cast<uint8_t*>(smem) + warp * (kBuffers * kSlots * kStageBytes);
        // where the bytes of chunk c of row s start, past the 16-byte boundary they are copied from
        auto skew = [&](int c, int s) { return static_cast<int>((reinterpret_cast<uintptr_t>(row[s]) + c * kChunkBytes) & 15); };
        // chunk c of the warp's rows into ring buffer `slot`: one commit group (empty past the end)
        auto issue = [&](int c, int slot) {
            if (c < n_chunks) {
                const int bytes = chunk_bytes(min(kChunkUnits, n_units - c * kChunkUnits));
#pragma unroll
                for (int s = 0; s < kSlots; ++s) {
                    if (!row[s]) continue;
                    const int k = skew(c, s), pieces = (k + bytes + 15) / 16;
                    const uint8_t* from = row[s] + c * kChunkBytes - k;
                    uint8_t* to = stage + (slot * kSlots + s) * kStageBytes;
#pragma unroll
                    for (int i = 0; i < (kPieces + 31) / 32; ++i)
                        if (lane + 32 * i < pieces) copy16(to + 16 * (lane + 32 * i), from + 16 * (lane + 32 * i));
                }
            }
            commit();
        };
        for (int c = 0; c < kDepth; ++c) issue(c, c);
        // what the sums join at the end, loaded off the tail: the bias before the wait (weights),
        // the residual after it (an activation)
        float bias[kSlots] = {}, residual[kSlots] = {};
        float* out[kSlots] = {};
        if (lane == 0 && !gated)
#pragma unroll
            for (int s = 0; s < kSlots; ++s)
                if (row[s]) {
                    if (const float* b = field(a, part[s], &GemvPart::bias)) bias[s] = b[r[s]];
                    out[s] = field(a, part[s], &GemvPart::y) + r[s];
                }
        float4 g[kNorm ? fold_passes(kWarps) : 1];  // (kNorm: the norm's weight, before the wait)
        if constexpr (kNorm) load_row(reinterpret_cast<const float4*>(a.norm.w), n_units * 8, g);
        float4 g_out = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // (kNormOut: warp 0's lanes 0-7, the weight of the block's rows)
        if (kNormOut && warp == 0 && lane < 8) g_out = reinterpret_cast<const float4*>(a.norm_out.w + 32 * block)[lane];
        // RoPE (GemvRope): the warp's two rows are a pair (2i, 2i + 1) of one head, its angle
        // computed now; the cache slot of the step's position
        float cs = 1.0f, sn = 0.0f;
        bool rotate = false;
        uint8_t* slot[kSlots] = {};
        if (kRope && lane == 0 && row[1]) {
            const int64_t pos = *a.rope.pos0;  // (the step block is written before the step's first kernel starts)
            const int d = static_cast<int>(r[0] % a.rope.head_dim);
            rotate = field(a, part[0], &GemvPart::rope) && d < a.rope.rope_dim;
            if (rotate) rope_angle(pos, a.rope.pos_scale, a.rope.inv_freq[d / 2], a.rope.attn_factor, cs, sn);
#pragma unroll
            for (int s = 0; s < kSlots; ++s)
                if (uint8_t* c = field(a, part[s], &GemvPart::cache)) slot[s] = c + static_cast<size_t>(pos % a.rope.capacity) * a.rope.slot_bytes;
        }
        // kPack: the chunks staged so far (the ring's first three: whole rows, as launched)
        // rewritten into packed form, in place: each lane's units into registers, then (every
        // lane's read) out
        if constexpr (kPack) {
            wait_pending<0>();
            __syncwarp();
            for (int c = 0; c < kDepth && c < n_chunks; ++c)
#pragma unroll
                for (int s = 0; s < kSlots; ++s) {
                    if (!row[s]) continue;
                    uint8_t* buffer = stage + (c * kSlots + s) * kStageBytes;
                    const int units = min(kChunkUnits, n_units - c * kChunkUnits);
                    typename P::Unit v[kPerLane];
#pragma unroll
                    for (int i = 0; i < kPerLane; ++i)
                        if (32 * i + lane < units) v[i] = P::load(buffer + skew(c, s), 32 * i + lane);
                    __syncwarp();
#pragma unroll
                    for (int i = 0; i < kPerLane; ++i)
                        if (32 * i + lane < units) P::store(buffer, kChunkUnits, 32 * i + lane, v[i]);
                    __syncwarp();
                }
        }
        wait_inputs();
        if (a.accumulate)
#pragma unroll
            for (int s = 0; s < kSlots; ++s)
                if (out[s]) residual[s] = *out[s];
        int4* xs = reinterpret_cast<int4*>(reinterpret_cast<uint8_t*>(smem) + kWeightSmem);
        if constexpr (kNorm) stage_normed(a, g, xs, n_units);
        else stage_q8<kIn>(a, xs, n_units);
        trace_mark(0);  // (the input staged)

        float sum[kSlots] = {};
        Lane lanes[kSlots] = {};  // (kLanes: each row's unit of this lane)
        if constexpr (kLanes)
#pragma unroll
            for (int s = 0; s < kSlots; ++s) lanes[s] = D::lane(static_cast<int>(reinterpret_cast<uintptr_t>(row[s]) & 3), lane);
        if (row[0])
            for (int c = 0, slot = 0; c < n_chunks; ++c) {
                wait_pending<kDepth - 1>();  // this lane's pieces of chunk c have landed ...
                __syncwarp();               // ... and every lane's
                // the chunk's units of this lane, dot(s, j, x) giving row s's unit j of the chunk
                auto chunk = [&](auto dot) {
#pragma unroll
                    for (int i = 0; i < kPerLane; ++i) {
                        const int u = c * kChunkUnits + 32 * i + lane;
                        if (u < n_units) {
                            const XUnit x = staged_x(xs, n_units, u);
                            // (both rows without a branch between them, so that their loads and
                            // products interleave; a warp with one row sums whatever its second
                            // buffer holds into sum[1], which nothing reads)
                            sum[0] += dot(0, 32 * i + lane, x);
                            sum[1] += dot(1, 32 * i + lane, x);
                        }
                    }
                };
                const uint8_t* buffer = stage + slot * kSlots * kStageBytes;  // (row s's: + s · kStageBytes)
                if (kPack && c < kDepth) {
                    if constexpr (kPack) chunk([&](int s, int j, const XUnit& x) { return P::dot(buffer + s * kStageBytes, kChunkUnits, j, x); });
                } else if constexpr (kLanes) {
                    chunk([&](int s, int, const XUnit& x) { return D::dot(buffer + s * kStageBytes + (skew(c, s) & ~3), lanes[s], x); });
                } else {
                    chunk([&](int s, int j, const XUnit& x) { return D::dot(buffer + s * kStageBytes + skew(c, s), j, x); });
                }
                __syncwarp();  // everyone is done with this buffer
                issue(c + kDepth, slot);
                slot = slot == kDepth - 1 ? 0 : slot + 1;
            }
        trace_mark(1);  // (warp 0's dots done)
        const float v0 = warp_sum(sum[0]), v1 = warp_sum(sum[1]);
        if constexpr (kQuantOut) {  // (gated; whole blocks of 32 rows)
            __shared__ float gated_out[32];
            if (lane == 0) gated_out[warp] = a.part[0].y[r[0]] = gate_act(a.glu, v0) * v1;
            __syncthreads();
            if (warp == 0) quantize_block(gated_out[lane], a.xq_out[block], lane);
            return;
        }
        float stored[kSlots] = {};  // (kNormOut: lane 0's values of the residual)
        if (lane == 0 && row[0]) {
            if (gated) {
                a.part[0].y[r[0]] = gate_act(a.glu, v0) * v1;
            } else {
                float v[kSlots] = {v0, v1};
#pragma unroll
                for (int s = 0; s < kSlots; ++s)
                    if (row[s] && field(a, part[s], &GemvPart::bias)) v[s] += bias[s];
                if (kRope && rotate) {
                    const float2 y = rope_rotate(v[0], v[1], cs, sn);
                    v[0] = y.x, v[1] = y.y;
                }
#pragma unroll
                for (int s = 0; s < kSlots; ++s) {
                    if (!row[s]) continue;
                    *out[s] = stored[s] = a.accumulate ? residual[s] + v[s] : v[s];
                    if (kRope && slot[s]) {
                        if (a.rope.f16) Kv<KvType::F16>::store1(slot[s], r[s], v[s]);
                        else Kv<KvType::F32>::store1(slot[s], r[s], v[s]);
                    }
                }
            }
        }
        if constexpr (kNormOut) {  // (rows a multiple of 32: every row of the block is there)
            __shared__ float4 unit[8];
            if (lane == 0)
#pragma unroll
                for (int s = 0; s < kSlots; ++s) reinterpret_cast<float*>(unit)[kSlots * warp + s] = stored[s];
            __syncthreads();
            if (warp == 0) {  // the unit's eight float4s in lanes 0-7, as the norm kernel holds them
                const float4 v = lane < 8 ? unit[lane] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                float ss = squares4(v);
#pragma unroll
                for (int offset = 1; offset < 8; offset *= 2) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, offset);
                float d;
                const uint32_t word = quantize_normed4(v, g_out, d);
                QBlock& q = a.norm_out.q[block];
                if (lane < 8) *reinterpret_cast<uint32_t*>(q.q + 4 * lane) = word;
                if (lane == 0) q.d = d, a.norm_out.ss[block] = ss;
            }
        }
    }

    // kStream: a grid of the blocks the SMs hold at once, for a matrix of one part (or a gate and
    // its up) in several waves of blocks (gate·up, the LM head: `streams`), whose warp w of W
    // takes items w, w + W, ... (an item: run_block's two rows of a warp). Its ring runs on from
    // one item's last chunk into the next one's first, so the SMs keep pulling weights where
    // blocks would end and start, and the activations are staged once per block, not per item.
    // Each row's sum is run_block's, in its order: the same bits. (Its own code, not helpers
    // shared with run_block: a form that shared them compiled every run_block kernel differently,
    // 0.3–0.8 % slower: bench/NOTES.md, nineteenth CUDA session.)
    static __device__ void stream(const Args& a) {
        extern __shared__ uint4 smem[];
        allow_next();
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        const bool gated = a.glu != Glu::None;
        const int64_t rows = a.part[0].rows, items = gated ? rows : (rows + 1) / 2;
        const int64_t first = static_cast<int64_t>(blockIdx.x) * kWarps + warp, stride = static_cast<int64_t>(gridDim.x) * kWarps;
        const int n_units = static_cast<int>(a.cols / 32);
        const int n_chunks = (n_units + kChunkUnits - 1) / kChunkUnits;
        uint8_t* stage = reinterpret_cast<uint8_t*>(smem) + warp * (kBuffers * kSlots * kStageBytes);
#if defined(ER_BULK_COPY)
        // The ring filled by the TMA unit (async_copy.cuh's bulk copies) where the device pass has
        // them and a chunk is two units a lane (Q4_0, Q4_K, ...): such a stream is bound by the
        // instructions its SMs issue, ~90 of a warp's ~390 a chunk went to its cp.async pieces
        // (bench/NOTES.md, twentieth CUDA session), and with bulk copies the 8B Q4_0 and Q4_K_M ran
        // 1 % faster, the 1B Q4_0 3 %. Q8_0's streams, one unit a lane, ran 8 % slower so (Q6_K's,
        // also one unit a lane, stay with them), and the other kernels' rings (run_block) 0.4–5 %
        // slower (the deep rings alone: the 8B Q4_0 0.8 % slower, the 1B 2 % faster; twenty-ninth
        // CUDA session): they keep cp.async. The bulk copies read with an evict-first L2 policy, so
        // that gate·up's 66 MB a layer on the 8B go first when L2 needs room, before what the step
        // reads again (the trace: the stream's readers got faster, and the stream itself): 8B Q4_0
        // +0.8–1.3 %, 1B Q4_0 +0.6–1.1 % (thirtieth CUDA session). enqueue's access-policy window
        // says the same of every one-token GEMV's weights, but only for a read's first 128 MiB: the
        // LM head's rest needs the policy here. (cp.async with such a policy: CUDA 13.0's ptxas
        // builds GEMVs that die, twenty-eighth CUDA session.)
        // bar: ring buffer i's barrier; bit i of `phases`: the parity of its next phase.
        constexpr bool kBulk = kPerLane == 2;
        [[maybe_unused]] uint64_t* bar = nullptr;
        [[maybe_unused]] unsigned phases = 0;
        [[maybe_unused]] uint64_t policy = 0;
        if constexpr (kBulk) {
            policy = evict_first_policy();
            __shared__ uint64_t bars[kWarps * kBuffers];
            bar = bars + warp * kBuffers;
            if (lane == 0) {
                for (int i = 0; i < kBuffers; ++i) barrier_init(bar + i);
                fence_barrier_init();
            }
            __syncwarp();
        }
#endif
        // item w's rows: gate row w and up row w, or rows 2w and 2w + 1 (null past the end)
        auto item_rows = [&](int64_t w, const uint8_t* (&row)[kSlots]) {
            row[0] = a.part[0].w + static_cast<size_t>(gated ? w : 2 * w) * a.row_bytes;
            row[1] = gated ? a.part[1].w + static_cast<size_t>(w) * a.row_bytes : 2 * w + 1 < rows ? row[0] + a.row_bytes : nullptr;
        };
        auto skew = [](const uint8_t* row, int c) { return static_cast<int>((reinterpret_cast<uintptr_t>(row) + c * kChunkBytes) & 15); };
        // the ring's feed: chunk fc of item fi goes next, into ring buffer `slot` (one commit group,
        // empty past the warp's last item; kBulk: lane 0 asks for each row's bytes, which the
        // buffer's barrier counts in, and nothing past the last item)
        int64_t fi = first;
        int fc = 0;
        const uint8_t* feed[kSlots];
        item_rows(fi, feed);
        auto issue = [&](int slot) {
#if defined(ER_BULK_COPY)
            if constexpr (kBulk) {
                if (fi < items) {
                    if (lane == 0) {
                        const int bytes = chunk_bytes(min(kChunkUnits, n_units - fc * kChunkUnits));
                        unsigned size[kSlots], total = 0;
#pragma unroll
                        for (int s = 0; s < kSlots; ++s) total += size[s] = feed[s] ? (skew(feed[s], fc) + bytes + 15) / 16 * 16 : 0;
                        barrier_expect(bar + slot, total);
#pragma unroll
                        for (int s = 0; s < kSlots; ++s)
                            if (size[s]) bulk_copy(stage + (slot * kSlots + s) * kStageBytes, feed[s] + fc * kChunkBytes - skew(feed[s], fc), size[s], bar + slot, policy);
                    }
                    if (++fc == n_chunks) fc = 0, fi += stride, item_rows(fi, feed);
                }
                return;
            }
#endif
            if (fi < items) {
                const int bytes = chunk_bytes(min(kChunkUnits, n_units - fc * kChunkUnits));
#pragma unroll
                for (int s = 0; s < kSlots; ++s) {
                    if (!feed[s]) continue;
                    const int k = skew(feed[s], fc), pieces = (k + bytes + 15) / 16;
                    const uint8_t* from = feed[s] + fc * kChunkBytes - k;
                    uint8_t* to = stage + (slot * kSlots + s) * kStageBytes;
#pragma unroll
                    for (int i = 0; i < (kPieces + 31) / 32; ++i)
                        if (lane + 32 * i < pieces) copy16(to + 16 * (lane + 32 * i), from + 16 * (lane + 32 * i));
                }
                if (++fc == n_chunks) fc = 0, fi += stride, item_rows(fi, feed);
            }
            commit();
        };
        for (int c = 0; c < kDepth; ++c) issue(c);
        // (GemvTagged: the step block's sequence number, read before the wait as launch.cuh allows)
        const uint32_t tag = a.tagged.y ? tag_of(*a.tagged.seq, a.tag_ordinal) : 0;
        wait_inputs();
        int4* xs = reinterpret_cast<int4*>(reinterpret_cast<uint8_t*>(smem) + kWeightSmem);
        stage_q8<kIn>(a, xs, n_units);

        int slot = 0;
        // the rows' sums stored evict-last: written while the rest of the matrix still streams
        // through L2, they stay there for the kernel after (1B Q8_0 +0.7 %, 1B Q4_0 +0.4 %, 8B Q4_0
        // +0.1 %; thirtieth CUDA session)
        const uint64_t kept = evict_last_policy();
        for (int64_t w = first; w < items; w += stride) {
            const uint8_t* row[kSlots];
            item_rows(w, row);
            float sum[kSlots] = {};
            Lane lanes[kSlots] = {};  // (kLanes: as run_block's)
            if constexpr (kLanes)
#pragma unroll
                for (int s = 0; s < kSlots; ++s) lanes[s] = D::lane(static_cast<int>(reinterpret_cast<uintptr_t>(row[s]) & 3), lane);
            for (int c = 0; c < n_chunks; ++c) {
#if defined(ER_BULK_COPY)
                if constexpr (kBulk) {
                    barrier_wait(bar + slot, (phases >> slot) & 1);  // chunk c has landed
                    phases ^= 1u << slot;
                } else
#endif
                {
                    wait_pending<kDepth - 1>();  // this lane's pieces of chunk c have landed ...
                    __syncwarp();               // ... and every lane's
                }
                const uint8_t* buffer = stage + slot * kSlots * kStageBytes;
#pragma unroll
                for (int i = 0; i < kPerLane; ++i) {
                    const int u = c * kChunkUnits + 32 * i + lane;
                    if (u < n_units) {  // (both rows without a branch between them, as run_block's)
                        const XUnit x = staged_x(xs, n_units, u);
                        if constexpr (kLanes) {
                            sum[0] += D::dot(buffer + (skew(row[0], c) & ~3), lanes[0], x);
                            sum[1] += D::dot(buffer + kStageBytes + (skew(row[1], c) & ~3), lanes[1], x);
                        } else {
                            sum[0] += D::dot(buffer + skew(row[0], c), 32 * i + lane, x);
                            sum[1] += D::dot(buffer + kStageBytes + skew(row[1], c), 32 * i + lane, x);
                        }
                    }
                }
                __syncwarp();  // everyone is done with this buffer
                issue(slot);
                slot = slot == kDepth - 1 ? 0 : slot + 1;
            }
            const float v0 = warp_sum(sum[0]), v1 = warp_sum(sum[1]);
            if (lane != 0) continue;
            if (gated) {
                const float y = gate_act(a.glu, v0) * v1;
                if (a.tagged.y) store_tagged(a.tagged.y + w, tag, y, kept);
                else store_kept(a.part[0].y + w, y, kept);
                continue;
            }
            const float v[kSlots] = {v0, v1};
#pragma unroll
            for (int s = 0; s < kSlots; ++s) {
                if (!row[s]) continue;
                const int64_t r = 2 * w + s;
                const float y = a.part[0].bias ? v[s] + a.part[0].bias[r] : v[s];
                float* out = a.part[0].y + r;
                store_kept(out, a.accumulate ? *out + y : y, kept);
            }
        }
    }

    static size_t smem(const GemvArgs& a) { return kWeightSmem + static_cast<size_t>(a.cols / 32) * 3 * sizeof(int4); }
};

// Two one-token GEMVs of different int8 formats on the same input as one launch (Q·K in one
// format and V in another: Q4_K_M's Q6_K V layers): blocks [0, blocks1) are the first's, the rest
// the second's, each running its own kernel's code on its own arguments. As two launches the
// second would wait for the first to finish (a kernel waits for the whole grid before it) though
// it reads nothing the first writes.
template <class K1, class K2>
struct StagedPair {
    // (registers as the single kernels': three blocks per SM, as their shared memory allows)
    static constexpr int kBlockThreads = 32 * K1::kWarps, kMinBlocks = 3;
    static constexpr size_t kWeightSmem = std::max(K1::kWeightSmem, K2::kWeightSmem);
    struct Args {
        GemvArgs a1, a2;
        int64_t blocks1;
    };
    static __device__ void run(const Args& p) {
        if (static_cast<int64_t>(blockIdx.x) < p.blocks1) K1::run_block(p.a1, blockIdx.x);
        else K2::run_block(p.a2, static_cast<int64_t>(blockIdx.x) - p.blocks1);
    }
};

// The one-token GEMV of a matrix of many short rows (32 units or fewer: SmolLM2's and Gemma 3
// 270M's LM heads, 49152 and 262144 rows of 18 and 20 units). GemvStaged gives such a matrix
// thousands of blocks that each hold two rows a warp in flight and pay the block's start (the
// activations staged, a barrier) for them: SmolLM2's LM head ran at 877 GB/s, 7.8 waves of
// blocks. Here a grid of the blocks the SMs hold at once walks the row pairs (warp w of W:
// pairs w, w + W, ...), each warp keeping kRowsRing pairs in flight (cp.async of the pair's
// contiguous bytes, as GemvStaged copies a chunk); lane l always takes unit l, so its activations
// stay in registers. Each row's sum is one unit per lane and a warp reduction: GemvStaged's and
// Gemv's order, the same bits.
constexpr int kRowsWarps = 8;
constexpr int kRowsRing = 4;  // row pairs in flight per warp
constexpr int64_t kRowsMinWaves = 3;  // where GemvStaged's grid is this many waves or more

template <TensorType T, In kIn = In::Q8>
struct GemvRows {
    static constexpr bool kNorm = kIn == In::Norm;
    using Args = GemvArgs;
    using D = QuantDot<T>;
    static constexpr int kBlockThreads = 32 * kRowsWarps, kMinBlocks = 3;
    static __host__ __device__ int slot_bytes(const Args& a) { return static_cast<int>((2 * a.row_bytes + 15 + 16 + 15) / 16 * 16); }
    static __host__ __device__ size_t ring_bytes(const Args& a) { return static_cast<size_t>(kRowsWarps) * kRowsRing * slot_bytes(a); }
    // (with a folded norm, the activations staged after the ring)
    static size_t smem(const Args& a) { return ring_bytes(a) + (kNorm ? static_cast<size_t>(a.cols / 32) * 3 * sizeof(int4) : 0); }

    static __device__ void run(const Args& a) {
        extern __shared__ uint4 smem[];
        allow_next();
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        const int64_t pairs = (a.part[0].rows + 1) / 2, stride = static_cast<int64_t>(gridDim.x) * kRowsWarps;
        const int slot_size = slot_bytes(a);
        uint8_t* ring = reinterpret_cast<uint8_t*>(smem) + warp * kRowsRing * slot_size;
        auto pair_at = [&](int64_t p) { return a.part[0].w + static_cast<size_t>(2 * p) * a.row_bytes; };
        // pair p into ring slot s: one commit group (empty past the last pair)
        auto issue = [&](int64_t p, int s) {
            if (p < pairs) stage_copy(ring + s * slot_size, pair_at(p), static_cast<size_t>(min(static_cast<int64_t>(2), a.part[0].rows - 2 * p)) * a.row_bytes, lane, 32);
            commit();
        };
        int64_t p = static_cast<int64_t>(blockIdx.x) * kRowsWarps + warp;
#pragma unroll
        for (int s = 0; s < kRowsRing; ++s) issue(p + s * stride, s);
        const int n_units = static_cast<int>(a.cols / 32);
        float4 g[fold_passes(kRowsWarps)];  // (kNorm: the norm's weight)
        if constexpr (kNorm) load_row(reinterpret_cast<const float4*>(a.norm.w), n_units * 8, g);
        wait_inputs();
        XUnit x{};
        if constexpr (kNorm) {
            int4* xs = reinterpret_cast<int4*>(reinterpret_cast<uint8_t*>(smem) + ring_bytes(a));
            stage_normed(a, g, xs, n_units);
            if (lane < n_units) x = staged_x(xs, n_units, lane);
        } else {
            if constexpr (kIn == In::Scaled) x = scaled_unit(a, lane, n_units);
            else if (lane < n_units) x = load_x(a.xq[lane]);
        }
        const float* bias = a.part[0].bias;
        float* y = a.part[0].y;
        for (int s = 0; p < pairs; p += stride) {
            wait_pending<kRowsRing - 1>();  // this lane's pieces of pair p have landed ...
            __syncwarp();                   // ... and every lane's
            const int64_t r = 2 * p;
            const bool two = r + 1 < a.part[0].rows;
            // where stage_copy put the pair's first byte (past the 16-byte boundary it copied from)
            const uint8_t* w0 = ring + s * slot_size + (reinterpret_cast<uintptr_t>(pair_at(p)) & 15);
            float s0 = 0.0f, s1 = 0.0f;
            if (lane < n_units) {
                s0 += D::dot(w0, lane, x);
                if (two) s1 += D::dot(w0 + a.row_bytes, lane, x);
            }
            __syncwarp();  // everyone is done with this slot
            issue(p + kRowsRing * stride, s);
            s = s == kRowsRing - 1 ? 0 : s + 1;
            const float v0 = warp_sum(s0), v1 = warp_sum(s1);
            if (lane == 0) {
                const float u0 = bias ? v0 + bias[r] : v0;
                y[r] = a.accumulate ? y[r] + u0 : u0;
                if (two) {
                    const float u1 = bias ? v1 + bias[r + 1] : v1;
                    y[r + 1] = a.accumulate ? y[r + 1] + u1 : u1;
                }
            }
        }
    }
};

// Whether a one-token GEMV takes GemvRows: plain (no gate, RoPE or int8 output; one part), rows of
// one unit per lane at most, and so many of them that GemvStaged's grid is kRowsMinWaves waves of
// the blocks the SMs hold (three of eight warps each). EDGERUNNER_CUDA_GEMV_ROWS=0 says no (for
// measurements).
bool rows_wanted(const GemvArgs& a) {
    static const bool enabled = [] {
        const char* env = std::getenv("EDGERUNNER_CUDA_GEMV_ROWS");
        return !(env && std::string(env) == "0");
    }();
    return enabled && a.n_parts == 1 && a.glu == Glu::None && !a.rope.pos0 && !a.xq_out && a.cols / 32 <= 32 &&
           (a.part[0].rows + 2 * kStagedWarps - 1) / (2 * kStagedWarps) >= kRowsMinWaves * 3 * sm_count();
}

// The blocks of kernel K (of `threads` threads, `smem` bytes of shared memory) an SM holds at once,
// asked once per device and shared-memory size: the last eight sizes kept, as a model's launches of one kernel
// take a few (eager dispatch builds its launches every step).
template <class K>
int blocks_per_sm(int threads, size_t smem) {
    struct Asked {
        int device;
        size_t smem;
        int per_sm;
    };
    constexpr int kKept = 8;
    thread_local Asked asked[kKept];
    thread_local int n_asked = 0;
    const int device = current_device();
    for (int i = 0; i < std::min(n_asked, kKept); ++i)
        if (asked[i].device == device && asked[i].smem == smem) return asked[i].per_sm;
    int per_sm = 1;
    ER_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, value_entry<K>(), threads, smem));
    per_sm = std::max(per_sm, 1);
    asked[n_asked++ % kKept] = {device, smem, per_sm};
    return per_sm;
}

template <TensorType T, In kIn>
Launch rows_launch(const GemvArgs& a) {
    using K = GemvRows<T, kIn>;
    allow_smem<K>(max_dynamic_smem<K>(smem_per_block()));
    const int64_t pairs = (a.part[0].rows + 1) / 2;
    const int64_t blocks = std::min<int64_t>(blocks_per_sm<K>(K::kBlockThreads, K::smem(a)) * static_cast<int64_t>(sm_count()),
                                             (pairs + kRowsWarps - 1) / kRowsWarps);
    return make_launch<K>(dim3(static_cast<unsigned>(blocks)), dim3(K::kBlockThreads), a, K::smem(a));
}

// The staged kernel's blocks of `block_warps` warps (a warp: a gate/up row pair, or two rows).
int64_t staged_blocks(const GemvArgs& a, int block_warps) {
    if (a.cols > kMaxStagedCols)
        throw std::invalid_argument("the CUDA GEMV takes rows of up to " + std::to_string(kMaxStagedCols) + " columns");
    const int64_t rows = gemv_rows(a), warps = a.glu != Glu::None ? rows : (rows + kSlots - 1) / kSlots;
    return (warps + block_warps - 1) / block_warps;
}

// The most dynamic shared memory kernel K may be allowed (a staged GEMV, or FloatGemv with its input
// staged), asked once per device.
template <class K>
size_t staged_smem_limit() {
    static PerGpu<size_t> limit;
    return limit([](int) { return max_dynamic_smem<K>(smem_per_block()); });
}

// A staged kernel K (or a pair of them) allowed the shared memory of its widest rows, once: before
// its first launch, and before the occupancy calculator is asked about it (which counts on that).
template <class K>
void allow_staged_smem() {
    allow_smem<K>(std::min(K::kWeightSmem + kMaxStagedCols / 32 * 3 * sizeof(int4), staged_smem_limit<K>()));
}

template <class K>
Launch staged(const GemvArgs& a) {
    if (K::smem(a) > staged_smem_limit<K>())
        throw std::invalid_argument("the CUDA GEMV of rows of " + std::to_string(a.cols) + " columns needs " + std::to_string(K::smem(a) >> 10) +
                                    " KiB of shared memory a block; this GPU gives " + std::to_string(staged_smem_limit<K>() >> 10));
    allow_staged_smem<K>();
    return make_launch<K>(dim3(static_cast<unsigned>(staged_blocks(a, K::kWarps))), dim3(32 * K::kWarps), a, K::smem(a));
}

// Whether a staged launch of `blocks` blocks (`smem` bytes of shared memory each) takes the kernel
// that packs its chunks before its wait (kPack): where its grid is one wave, so that every block
// starts while the previous kernel still runs and has time to spare (in later waves the packing
// would only add to the dots), and its rows are at most the ring's three chunks, all staged before
// the wait (a longer row streams after it; its dots wait on that, not on the packing). K: the kernel
// that runs (its occupancy), S: the staged kernel whose rows those are. EDGERUNNER_CUDA_PACK=0 says
// never (for measurements).
template <class K, class S>
bool packs(int64_t blocks, size_t smem, int64_t cols) {
    static const bool enabled = [] {
        const char* env = std::getenv("EDGERUNNER_CUDA_PACK");
        return !(env && std::string(env) == "0");
    }();
    allow_staged_smem<K>();
    return enabled && cols / 32 <= kRing * S::kChunkUnits && blocks <= static_cast<int64_t>(blocks_per_sm<K>(32 * S::kWarps, smem)) * sm_count();
}

// Whether a one-token staged GEMV of `blocks` blocks runs as kStream's grid of the blocks the SMs
// hold (`per_sm` an SM): a matrix of one part (or a gate and its up) in more than one wave of
// blocks. EDGERUNNER_CUDA_STREAM=0 says never (for measurements).
bool streams(const GemvArgs& a, int64_t blocks, int per_sm) {
    static const bool enabled = [] {
        const char* env = std::getenv("EDGERUNNER_CUDA_STREAM");
        return !(env && std::string(env) == "0");
    }();
    return enabled && (a.glu != Glu::None || a.n_parts == 1) && blocks > static_cast<int64_t>(per_sm) * sm_count();
}

// Whether a plain one-token staged GEMV takes K, a deeper ring than three: where its rows stream
// more chunks than three and K's grid is still one wave (a grid of few blocks an SM, such as the
// 8B's down projections: two, with shared memory to spare). EDGERUNNER_CUDA_DEPTH=0 says never.
template <class K>
bool deepens(const GemvArgs& a) {
    static const bool enabled = [] {
        const char* env = std::getenv("EDGERUNNER_CUDA_DEPTH");
        return !(env && std::string(env) == "0");
    }();
    if (!enabled || a.cols / 32 <= kRing * K::kChunkUnits || K::smem(a) > staged_smem_limit<K>()) return false;
    allow_staged_smem<K>();
    return staged_blocks(a, K::kWarps) <= static_cast<int64_t>(blocks_per_sm<K>(32 * K::kWarps, K::smem(a))) * sm_count();
}

// The blocks an SM holds of the streamed kernel K where a one-token GEMV streams (`streams`), else 0.
template <class K>
int streamed_per_sm(const GemvArgs& a) {
    allow_staged_smem<K>();
    const int per_sm = blocks_per_sm<K>(32 * K::kWarps, K::smem(a));
    return K::smem(a) <= staged_smem_limit<K>() && streams(a, staged_blocks(a, K::kWarps), per_sm) ? per_sm : 0;
}

// The one-token staged GEMV (no int8 output): streamed where `streams`, else packed where its
// format has that and `packs`, else with a deeper ring where `deepens`.
template <TensorType T, bool kRope, In kIn>
Launch staged_one(const GemvArgs& a) {
    if constexpr (!kRope && kIn != In::Norm) {
        using K = GemvStaged<T, false, false, kIn, false, false, true>;
        if (const int per_sm = streamed_per_sm<K>(a))
            return make_launch<K>(dim3(static_cast<unsigned>(per_sm * sm_count())), dim3(32 * K::kWarps), a, K::smem(a));
    }
    if constexpr (Packed<T>::kPacks) {
        using K = GemvStaged<T, kRope, false, kIn, true>;
        if (packs<K, K>(staged_blocks(a, K::kWarps), K::smem(a), a.cols)) return staged<K>(a);
    }
    if constexpr (!kRope && kIn == In::Q8) {
        using K6 = GemvStaged<T, false, false, In::Q8, false, false, false, 6>;
        using K4 = GemvStaged<T, false, false, In::Q8, false, false, false, 4>;
        if (deepens<K6>(a)) return staged<K6>(a);
        if (deepens<K4>(a)) return staged<K4>(a);
    }
    return staged<GemvStaged<T, kRope, false, kIn>>(a);
}

// The one-token staged GEMV that also writes its residual's norm's int8 copy (kNormOut): packed
// where its format has that and `packs`.
template <TensorType T>
Launch staged_norm_out(const GemvArgs& a) {
    if constexpr (Packed<T>::kPacks) {
        using K = GemvStaged<T, false, false, In::Q8, true, true>;
        if (packs<K, K>(staged_blocks(a, K::kWarps), K::smem(a), a.cols)) return staged<K>(a);
    }
    return staged<GemvStaged<T, false, false, In::Q8, false, true>>(a);
}

template <class K1, class K2>
Launch staged_pair(const GemvArgs& a1, const GemvArgs& a2) {
    using P = StagedPair<K1, K2>;
    static_assert(K1::kWarps == K2::kWarps, "one block size");
    allow_staged_smem<P>();
    const int64_t b1 = staged_blocks(a1, K1::kWarps), b2 = staged_blocks(a2, K2::kWarps);
    return make_launch<P>(dim3(static_cast<unsigned>(b1 + b2)), dim3(32 * K1::kWarps), typename P::Args{a1, a2, b1},
                          std::max(K1::smem(a1), K2::smem(a2)));
}

// The pair, packed where both formats have that and `packs` for both.
template <TensorType T1, TensorType T2, bool kRope, In kIn>
Launch staged_pair(const GemvArgs& a1, const GemvArgs& a2) {
    if constexpr (Packed<T1>::kPacks && Packed<T2>::kPacks) {
        using K1 = GemvStaged<T1, kRope, false, kIn, true>;
        using K2 = GemvStaged<T2, kRope, false, kIn, true>;
        const int64_t blocks = staged_blocks(a1, K1::kWarps) + staged_blocks(a2, K2::kWarps);
        const size_t smem = std::max(K1::smem(a1), K2::smem(a2));
        using P = StagedPair<K1, K2>;
        if (packs<P, K1>(blocks, smem, a1.cols) && packs<P, K2>(blocks, smem, a2.cols)) return staged_pair<K1, K2>(a1, a2);
    }
    return staged_pair<GemvStaged<T1, kRope, false, kIn>, GemvStaged<T2, kRope, false, kIn>>(a1, a2);
}

// The format pairs that run as one launch (the mixes' Q·K and V types; others take two).
#define ER_PAIRS(X) X(Q4_K, Q6_K) X(Q5_K, Q6_K) X(Q4_K, Q5_K) X(Q5_0, Q8_0)

// Whether a plain one-token float GEMV loads each step ahead (Gemv's kAhead): where its rows take
// more than one step of loads, for the 16-bit formats (H100: the 1B BF16 +2.6 %, F16 +1.4 %, F32
// ±0, SmolLM2 F32 −0.9 %: bench/NOTES.md, fifty-fourth session). EDGERUNNER_CUDA_FLOAT_AHEAD=0 says
// never, =all takes F32 too (for measurements).
template <TensorType T>
bool loads_ahead(const GemvArgs& a) {
    static const std::string knob = [] {
        const char* env = std::getenv("EDGERUNNER_CUDA_FLOAT_AHEAD");
        return std::string(env ? env : "");
    }();
    const bool wanted = knob == "all" || (knob != "0" && T != TensorType::F32);
    return wanted && a.cols / Unit<T>::kPer16 > 32 * kFloatSteps;
}

// Whether a one-token float GEMV reads its input from shared memory (FloatGemv's kStaged): with a
// norm folded in always, else where EDGERUNNER_CUDA_FLOAT_STAGE is not 0 (for measurements) and
// the row fits (the device's limit, asked once: staged_smem_limit).
template <class K>
bool stages_x(const GemvArgs& a) {
    static const bool enabled = [] {
        const char* env = std::getenv("EDGERUNNER_CUDA_FLOAT_STAGE");
        return !(env && std::string(env) == "0");
    }();
    return a.norm.x || (enabled && staged_input_bytes(a) <= staged_smem_limit<K>());
}
template <class K>
Launch staged_float(const GemvArgs& a, dim3 grid, dim3 block) {
    allow_smem<K>(staged_smem_limit<K>());
    return make_launch<K>(grid, block, a, staged_input_bytes(a));
}

// The plain GEMV of NT tokens a block: Gemv, or for the float formats FloatGemv (the gated pair as
// a kernel of its own, one-token rows of several steps loaded ahead, one-token inputs in shared
// memory, with a norm folded in or not).
template <TensorType T, int NT>
Launch plain(const GemvArgs& a, dim3 grid, dim3 block) {
    if constexpr (kFloatWeights<T>) {
        if constexpr (NT == 1) {
            using Gated = FloatGemv<T, 1, true, false, true>;
            using Ahead = FloatGemv<T, 1, false, true, true>;
            using Plain = FloatGemv<T, 1, false, false, true>;
            if (a.glu != Glu::None) {
                if (stages_x<Gated>(a)) return staged_float<Gated>(a, grid, block);
            } else if (loads_ahead<T>(a)) {
                if (stages_x<Ahead>(a)) return staged_float<Ahead>(a, grid, block);
                return make_launch<FloatGemv<T, 1, false, true>>(grid, block, a);
            } else if (stages_x<Plain>(a)) {
                return staged_float<Plain>(a, grid, block);
            }
        }
        if (a.glu != Glu::None) return make_launch<FloatGemv<T, NT, true>>(grid, block, a);
        return make_launch<FloatGemv<T, NT>>(grid, block, a);
    } else {
        return make_launch<Gemv<T, NT>>(grid, block, a);
    }
}

// A step of one token (decode) takes the one-token kernel; several tokens share weight loads
// eight at a time.
template <TensorType T>
Launch launch(const GemvArgs& a) {
    const int64_t rows = gemv_rows(a);
    const dim3 block(32 * kWarpsPerBlock);
    const unsigned row_blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
    if (a.n_tokens == 1) {
        if constexpr (QuantDot<T>::kFast) {
            return by_input(a, [&](auto in) -> Launch {
                constexpr In kIn = decltype(in)::value;
                if (a.xq_out) return staged<GemvStaged<T, false, true, kIn>>(a);
                if constexpr (kIn == In::Q8) {
                    if (a.norm_out.w) return staged_norm_out<T>(a);
                }
                if (rows_wanted(a)) return rows_launch<T, kIn>(a);
                if (a.rope.pos0) return staged_one<T, true, kIn>(a);
                return staged_one<T, false, kIn>(a);
            });
        }
        else return plain<T, 1>(a, dim3(row_blocks, 1), block);
    }
    return plain<T, 8>(a, dim3(row_blocks, static_cast<unsigned>((a.n_tokens + 7) / 8)), block);
}

using LaunchFn = Launch (*)(const GemvArgs&);

LaunchFn launcher(TensorType type) {
    switch (type) {
        case TensorType::F32: return launch<TensorType::F32>;
        case TensorType::F16: return launch<TensorType::F16>;
        case TensorType::BF16: return launch<TensorType::BF16>;
        case TensorType::Q4_0: return launch<TensorType::Q4_0>;
        case TensorType::Q4_1: return launch<TensorType::Q4_1>;
        case TensorType::Q5_0: return launch<TensorType::Q5_0>;
        case TensorType::Q5_1: return launch<TensorType::Q5_1>;
        case TensorType::Q8_0: return launch<TensorType::Q8_0>;
        case TensorType::IQ4_NL: return launch<TensorType::IQ4_NL>;
        case TensorType::Q2_K: return launch<TensorType::Q2_K>;
        case TensorType::Q3_K: return launch<TensorType::Q3_K>;
        case TensorType::Q4_K: return launch<TensorType::Q4_K>;
        case TensorType::Q5_K: return launch<TensorType::Q5_K>;
        case TensorType::Q6_K: return launch<TensorType::Q6_K>;
        case TensorType::Q8_K: return launch<TensorType::Q8_K>;
        case TensorType::IQ4_XS: return launch<TensorType::IQ4_XS>;
        default: return nullptr;
    }
}

// One warp per 32-value block.
struct Quantize {
    using Args = QuantizeArgs;
    static __device__ void run(const Args& a) {
        allow_next();
        if (a.tagged.y) return run_tagged(a);
        wait_inputs();
        const int64_t per_token = a.cols / 32;
        const int64_t g = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
        if (g >= a.n_tokens * per_token) return;
        const int lane = threadIdx.x % 32;
        const int64_t t = g / per_token, b = g % per_token;
        quantize_block(a.x[t * a.x_stride + 32 * b + lane], a.out[t * a.out_stride + b], lane);
    }

    // From a streamed gate·up's tagged words (GemvTagged): no wait for its grid to end. The warp
    // reads its block's 32 words until every one carries this step's tag; gate·up stores them
    // after its own wait, so the kernels before it have ended too. Its output goes where no kernel
    // still running reads (the runner's gate·up copy, not the int8 buffer gate·up reads). Past
    // 2^16 reads (tens of ms) it waits for the grid's end instead; a tag missing then is a bug
    // (a trap: the step fails with an error, not a wrong token).
    static __device__ void run_tagged(const Args& a) {
        const int64_t b = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
        if (b >= a.cols / 32) return;
        const int lane = threadIdx.x % 32;
        const uint32_t tag = tag_of(*a.tagged.seq, a.tag_ordinal);  // (the step block: before any wait)
        const uint64_t* p = a.tagged.y + 32 * b + lane;
        auto missing = [&](uint64_t word) { return __ballot_sync(0xFFFFFFFFu, static_cast<uint32_t>(word >> 32) != tag) != 0; };
        uint64_t word = load_tagged(p);
        for (int reads = 1; missing(word); ++reads) {
            if (reads == 1 << 16) {
                wait_inputs();
                word = load_tagged(p);
                if (missing(word)) __trap();
                break;
            }
            word = load_tagged(p);
        }
        trace_waited();
        quantize_block(__uint_as_float(static_cast<uint32_t>(word)), a.out[b], lane);
    }
};

// Four values per thread.
struct ToBf16 {
    using Args = HalfArgs;
    static __device__ void run(const Args& a) {
        allow_next();
        wait_inputs();
        const int64_t per_token = a.cols / 4;
        const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
        if (i >= a.n_tokens * per_token) return;
        const int64_t t = i / per_token, c = 4 * (i % per_token);
        const float4 v = *reinterpret_cast<const float4*>(a.x + t * a.x_stride + c);
        const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
        uint2 out;
        memcpy(&out.x, &lo, 4);
        memcpy(&out.y, &hi, 4);
        *reinterpret_cast<uint2*>(a.out + t * a.out_stride + c) = out;
    }
};

// The f16 copy (HalfArgs::f16): a block a token, its largest |value| found first, then every value
// divided by the power of two that brings it under 2^15 (exact: 1 unless a value reaches 32768)
// and rounded to nearest even.
struct ToF16 {
    using Args = HalfArgs;
    static constexpr int kThreads = 256;
    static __device__ void run(const Args& a) {
        allow_next();
        wait_inputs();
        const int64_t t = blockIdx.x;
        const float4* x = reinterpret_cast<const float4*>(a.x + t * a.x_stride);
        const int n4 = static_cast<int>(a.cols / 4);
        float m = 0.0f;
        for (int i = threadIdx.x; i < n4; i += kThreads) {
            const float4 v = x[i];
            m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
        }
        __shared__ float warp_m[kThreads / 32];
        m = warp_max(m);
        if (threadIdx.x % 32 == 0) warp_m[threadIdx.x / 32] = m;
        __syncthreads();
#pragma unroll
        for (int w = 0; w < kThreads / 32; ++w) m = fmaxf(m, warp_m[w]);
        int e = 0;  // (an infinite value: none; it stays infinite)
        if (m >= 32768.0f && m <= 3.4028235e38f) {
            frexpf(m, &e);  // m in [2^(e-1), 2^e)
            e -= 15;
        }
        const float s = ldexpf(1.0f, -e);
        uint2* out = reinterpret_cast<uint2*>(a.out + t * a.out_stride);
        for (int i = threadIdx.x; i < n4; i += kThreads) {
            const float4 v = x[i];
            const __half2 lo = __floats2half2_rn(v.x * s, v.y * s), hi = __floats2half2_rn(v.z * s, v.w * s);
            uint2 o;
            memcpy(&o.x, &lo, 4);
            memcpy(&o.y, &hi, 4);
            out[i] = o;
        }
        if (threadIdx.x == 0) a.scale[t] = ldexpf(1.0f, e);
    }
};

}  // namespace

bool gemv_supports(TensorType type) { return launcher(type) != nullptr; }

bool gemv_wants_q8(TensorType type) {
    switch (type) {
#define ER_Q8(T) \
    case TensorType::T: return QuantDot<TensorType::T>::kFast;
        ER_Q8(Q4_0) ER_Q8(Q4_1) ER_Q8(Q5_0) ER_Q8(Q5_1) ER_Q8(Q8_0) ER_Q8(IQ4_NL) ER_Q8(Q2_K) ER_Q8(Q3_K) ER_Q8(Q4_K) ER_Q8(Q5_K)
        ER_Q8(Q6_K) ER_Q8(IQ4_XS)
#undef ER_Q8
        default: return false;
    }
}

static int device_attribute(cudaDeviceAttr attr, int device) {
    int n = 0;
    return cudaDeviceGetAttribute(&n, attr, device) == cudaSuccess ? n : 0;
}
int sm_count() {
    static PerGpu<int> count;
    return count([](int d) { return device_attribute(cudaDevAttrMultiProcessorCount, d); });
}
size_t smem_per_block() {
    static PerGpu<size_t> bytes;
    return bytes([](int d) { return static_cast<size_t>(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, d)); });
}

bool gemv_quantizes_out(TensorType type, const GemvArgs& a) {
    // blocks of 1024 threads take a whole SM each: where they are more than one wave, the
    // quantize kernel costs less (measured: SmolLM2's 48 blocks +2–4 %, Llama-3.2-1B's 256 −2 %)
    if (!gemv_wants_q8(type) || a.n_tokens != 1 || a.glu == Glu::None || a.part[0].rows % 32 != 0 || a.part[0].rows / 32 > sm_count())
        return false;
    int64_t chunk_units = 0;  // the kernel's: a row must be one chunk
    switch (type) {
#define ER_CHUNK(T) \
    case TensorType::T: chunk_units = GemvStaged<TensorType::T, false, true>::kChunkUnits; break;
        ER_CHUNK(Q4_0) ER_CHUNK(Q4_1) ER_CHUNK(Q5_0) ER_CHUNK(Q5_1) ER_CHUNK(Q8_0) ER_CHUNK(IQ4_NL) ER_CHUNK(Q2_K) ER_CHUNK(Q3_K)
        ER_CHUNK(Q4_K) ER_CHUNK(Q5_K) ER_CHUNK(Q6_K) ER_CHUNK(IQ4_XS)
#undef ER_CHUNK
        default: return false;
    }
    return a.cols <= 32 * chunk_units;
}

int64_t gemv_rows(const GemvArgs& a) {
    return a.glu != Glu::None ? a.part[0].rows : a.part[0].rows + (a.n_parts > 1 ? a.part[1].rows : 0) + (a.n_parts > 2 ? a.part[2].rows : 0);
}

bool gemv_pairs(TensorType t1, const GemvArgs& a1, TensorType t2, const GemvArgs& a2) {
    auto alone = [](const GemvArgs& a) { return a.n_tokens == 1 && a.glu == Glu::None && !a.xq_out && !a.accumulate; };
    if (!alone(a1) || !alone(a2) || a1.xq != a2.xq || a1.cols != a2.cols || (a1.rope.pos0 == nullptr) != (a2.rope.pos0 == nullptr)) return false;
#define ER_PAIR(A, B) if (t1 == TensorType::A && t2 == TensorType::B) return true;
    ER_PAIRS(ER_PAIR)
#undef ER_PAIR
    return false;
}

// The grouped formats' (Group8) and Q4_K's dots read a unit's quants with 16-byte loads
// (quant_dot.cuh): their rows (of whole groups and blocks, device_row_bytes apart) must start on
// 16-byte boundaries, as the runner's uploads (256) and cudaMalloc give them.
static void check_rows_aligned(TensorType type, const GemvArgs& a) {
    const bool floats = float_weights(type);
    if (floats && (a.row_bytes % 16 != 0 || reinterpret_cast<uintptr_t>(a.x) % 16 != 0 || a.x_stride % 4 != 0))
        throw std::logic_error("the CUDA GEMV reads " + std::string(tensor_type_name(type)) + " rows and their float activations from 16-byte boundaries");
    if (!group_bytes(type) && type != TensorType::Q4_K && !floats) return;
    if (group_bytes(type) && a.row_bytes != device_row_bytes(type, a.cols))  // (rows padded to whole groups)
        throw std::logic_error("the CUDA GEMV reads " + std::string(tensor_type_name(type)) + " rows of " + std::to_string(a.cols) +
                               " values as " + std::to_string(device_row_bytes(type, a.cols)) + " bytes apart (device_row_bytes), not " +
                               std::to_string(a.row_bytes));
    for (int p = 0; p < a.n_parts; ++p)
        if (reinterpret_cast<uintptr_t>(a.part[p].w) % 16 != 0)
            throw std::logic_error("the CUDA GEMV needs " + std::string(tensor_type_name(type)) + " weights on 16-byte boundaries; this one starts " +
                                   std::to_string(reinterpret_cast<uintptr_t>(a.part[p].w) % 16) + " bytes past one");
}

// A one-token GEMV reads its weights once (Launch::once): the span from its lowest part's rows to
// the end of its highest's (the runner's weights are one allocation, so what lies between them is
// weights too), at most cudaDevAttrMaxAccessPolicyWindowSize long (a longer read is covered from
// its start). EDGERUNNER_CUDA_L2_WINDOW=0: none (for measurements).
static void mark_read_once(Launch& l, const GemvArgs& a, const GemvArgs* b = nullptr) {
    static const bool off = [] {
        const char* env = std::getenv("EDGERUNNER_CUDA_L2_WINDOW");
        return env && std::string(env) == "0";
    }();
    static PerGpu<size_t> window_size;
    if (off || a.n_tokens != 1) return;
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (const GemvArgs* g : {&a, b}) {
        if (!g) continue;
        for (int i = 0; i < g->n_parts; ++i) {
            const auto p = reinterpret_cast<uintptr_t>(g->part[i].w);
            lo = std::min(lo, p);
            hi = std::max(hi, p + static_cast<uintptr_t>(g->part[i].rows) * g->row_bytes);
        }
    }
    l.once = reinterpret_cast<const void*>(lo);
    l.once_bytes = std::min<size_t>(hi - lo, window_size([](int d) {
        return static_cast<size_t>(device_attribute(cudaDevAttrMaxAccessPolicyWindowSize, d));
    }));
}

Launch gemv_pair(TensorType t1, const GemvArgs& a1, TensorType t2, const GemvArgs& a2) {
    if (!gemv_pairs(t1, a1, t2, a2)) throw std::logic_error("these two GEMVs cannot run as one launch (gemv_pairs)");
    check_rows_aligned(t1, a1), check_rows_aligned(t2, a2);
    if ((a1.norm.x && !gemv_folds_norm(t1, a1)) || (a2.norm.x && !gemv_folds_norm(t2, a2)))
        throw std::logic_error("this GEMV cannot fold an RMSNorm in (gemv_folds_norm)");
    if ((a1.norm.x == nullptr) != (a2.norm.x == nullptr) || a1.xq_ss != a2.xq_ss)
        throw std::logic_error("one launch: both GEMVs read the same input the same way");
    Launch l = by_input(a1, [&](auto in) -> Launch {
        constexpr In kIn = decltype(in)::value;
#define ER_PAIR(A, B)                                                                                            \
    if (t1 == TensorType::A && t2 == TensorType::B)                                                              \
        return a1.rope.pos0 ? staged_pair<TensorType::A, TensorType::B, true, kIn>(a1, a2)                       \
                            : staged_pair<TensorType::A, TensorType::B, false, kIn>(a1, a2);
        ER_PAIRS(ER_PAIR)
#undef ER_PAIR
        throw std::logic_error("gemv_pair");
    });
    mark_read_once(l, a1, &a2);
    return l;
}

bool gemv_folds_norm(TensorType type, const GemvArgs& a) {
    // Every block of the launch reads the whole row (4 bytes a value) after its wait, all at
    // once and from the same lines of L2: fold only where that is at most `budget` bytes in all
    // (the int8 formats: bench/NOTES.md, fourteenth CUDA session; the float formats the same: the
    // 1B's Q·K·V and gate·up, 6 and 16 MiB, lost 5 % folded, SmolLM2's, under 1 MiB, won 5 %:
    // fifty-fifth session). EDGERUNNER_CUDA_FOLD_NORM=0: never, =all: always, =N: N KiB (for
    // measurements).
    static const int64_t budget = []() -> int64_t {
        const char* env = std::getenv("EDGERUNNER_CUDA_FOLD_NORM");
        if (!env) return kFoldBudget;
        if (std::string(env) == "all") return std::numeric_limits<int64_t>::max();
        return static_cast<int64_t>(std::atoll(env)) * 1024;
    }();
    if (budget <= 0 || a.n_tokens != 1 || a.cols % 32 != 0 || a.cols > kMaxFoldCols) return false;
    int64_t blocks = 0;
    if (float_weights(type)) {
        blocks = (gemv_rows(a) + kWarpsPerBlock - 1) / kWarpsPerBlock;  // (FloatGemv)
    } else {
        if (!gemv_wants_q8(type)) return false;
        // the short-row kernel's grid of (about) the blocks the SMs hold (three of eight warps), the
        // staged kernel's blocks (of 32 warps where it writes the int8 copy)
        blocks = rows_wanted(a) ? std::min<int64_t>(3 * sm_count(), ((a.part[0].rows + 1) / 2 + kRowsWarps - 1) / kRowsWarps)
                                : staged_blocks(a, a.xq_out ? 32 : kStagedWarps);
    }
    return budget == std::numeric_limits<int64_t>::max() || blocks * a.cols * 4 <= budget;
}

// Whether the staged kernel that writes its residual's norm's copy (blocks of 16 warps) has the
// shared memory for these rows, packed or not.
template <TensorType T>
bool norm_out_fits(const GemvArgs& a) {
    using K = GemvStaged<T, false, false, In::Q8, false, true>;
    if constexpr (Packed<T>::kPacks) {
        using P = GemvStaged<T, false, false, In::Q8, true, true>;
        if (P::smem(a) > staged_smem_limit<P>()) return false;
    }
    return K::smem(a) <= staged_smem_limit<K>();
}

bool gemv_tags_out(TensorType type, const GemvArgs& a) {
    static const bool enabled = [] {
        const char* env = std::getenv("EDGERUNNER_CUDA_TAGGED");
        return !(env && std::string(env) == "0");
    }();
    if (!enabled || !gemv_wants_q8(type) || a.n_tokens != 1 || a.glu == Glu::None || a.part[0].rows % 32 != 0 || a.xq_out || a.norm.x ||
        a.rope.pos0)
        return false;
    switch (type) {  // (launch: the gated one-token GEMV takes staged_one, which streams where this says)
#define ER_STREAMS(T) \
    case TensorType::T: \
        return a.xq_ss ? streamed_per_sm<GemvStaged<TensorType::T, false, false, In::Scaled, false, false, true>>(a) > 0 \
                       : streamed_per_sm<GemvStaged<TensorType::T, false, false, In::Q8, false, false, true>>(a) > 0;
        ER_STREAMS(Q4_0) ER_STREAMS(Q4_1) ER_STREAMS(Q5_0) ER_STREAMS(Q5_1) ER_STREAMS(Q8_0) ER_STREAMS(IQ4_NL) ER_STREAMS(Q2_K)
        ER_STREAMS(Q3_K) ER_STREAMS(Q4_K) ER_STREAMS(Q5_K) ER_STREAMS(Q6_K) ER_STREAMS(IQ4_XS)
#undef ER_STREAMS
        default: return false;
    }
}

bool gemv_norms_out(TensorType type, const GemvArgs& a) {
    static const int mode = [] {  // 0: never, 1: the rule below, 2 (=wide): on every SM for every format (measurements)
        const char* env = std::getenv("EDGERUNNER_CUDA_NORM_OUT");
        return env && std::string(env) == "0" ? 0 : env && std::string(env) == "wide" ? 2 : 1;
    }();
    // Its blocks of 32 rows at most half the SMs: the GEMVs that read the norm's copy then start on
    // the other SMs and pull their weights while this one runs, as they did while the norm kernel
    // ran. A grid on every SM (the 8B's 128 blocks of 4096 rows) holds them off until it ends, and
    // the pull the norm kernel hid shows: it cost more than the norm kernel saves in the formats
    // under 6.5 bits a weight we measured, and less in Q6_K and Q8_0, which keep it. Measured on
    // H100s, the 8B's recorded tg128, every format on every SM against the half-SM rule: Q6_K
    // +3.3 %, Q8_0 +2.0 %, Q4_K_M +1.3 %, Q4_K −0.4 %, Q5_0 −0.5 %, IQ4_NL −0.7 %, Q4_0 −1.2 %,
    // Q5_K_M −1.8 %, Q4_1 −2.0 %; this rule against the half-SM rule: Q6_K +2.8 %, Q8_0 +1.7 %,
    // Q4_K_M +0.7 %, Q5_K_M (Q6_K down projections in half its layers) −0.4 %, Q4_0 the same
    // (bench/NOTES.md, fifty-second session; Llama-3.2-1B and SmolLM2, whose grids take at most
    // half, +2–6 %: seventeenth).
    const bool heavy = type == TensorType::Q6_K || type == TensorType::Q8_0;
    if (mode == 0 || !gemv_wants_q8(type) || a.n_tokens != 1 || a.n_parts != 1 || a.glu != Glu::None || !a.accumulate || a.rope.pos0 ||
        a.xq_out || a.norm.x || a.xq_ss || a.part[0].rows % 32 != 0 || (mode == 1 && !heavy && a.part[0].rows / 32 > sm_count() / 2) ||
        a.cols > kMaxStagedCols || rows_wanted(a))
        return false;
    switch (type) {
#define ER_FITS(T) \
    case TensorType::T: return norm_out_fits<TensorType::T>(a);
        ER_FITS(Q4_0) ER_FITS(Q4_1) ER_FITS(Q5_0) ER_FITS(Q5_1) ER_FITS(Q8_0) ER_FITS(IQ4_NL) ER_FITS(Q2_K) ER_FITS(Q3_K) ER_FITS(Q4_K)
        ER_FITS(Q5_K) ER_FITS(Q6_K) ER_FITS(IQ4_XS)
#undef ER_FITS
        default: return false;
    }
}

bool gemv_ropes(TensorType type, const GemvArgs& a) {
    return gemv_wants_q8(type) && a.n_tokens == 1 && a.glu == Glu::None;
}

size_t qblock_bytes() { return sizeof(QBlock); }

Launch quantize_activations(const QuantizeArgs& a) {
    const int64_t n_blocks = a.n_tokens * (a.cols / 32);
    return make_launch<Quantize>(dim3(static_cast<unsigned>((n_blocks + 7) / 8)), dim3(256), a);
}

Launch half_activations(const HalfArgs& a) {
    if (a.f16) {
        if (!a.scale) throw std::logic_error("the f16 copy of the activations needs its per-token scales");
        return make_launch<ToF16>(dim3(static_cast<unsigned>(a.n_tokens)), dim3(ToF16::kThreads), a);
    }
    const int64_t n = a.n_tokens * (a.cols / 4);
    return make_launch<ToBf16>(dim3(static_cast<unsigned>((n + 255) / 256)), dim3(256), a);
}

bool gemm_f16_input(TensorType type) { return type == TensorType::F16; }

Launch gemv(TensorType type, const GemvArgs& args) {
    const LaunchFn fn = launcher(type);
    if (!fn) throw std::invalid_argument("the CUDA backend has no GEMV kernel for " + std::string(tensor_type_name(type)));
    check_rows_aligned(type, args);
    if (args.cols % 32 != 0) throw std::invalid_argument("GEMV columns must be a multiple of 32");
    if (args.rope.pos0 && !gemv_ropes(type, args)) throw std::logic_error("only the one-token GEMV of an int8 format stores RoPE'd Q, K and V");
    if (args.xq_out && !gemv_quantizes_out(type, args)) throw std::logic_error("this GEMV cannot write an int8 copy of its output");
    if (args.tagged.y && !gemv_tags_out(type, args)) throw std::logic_error("only a streamed one-token gate·up stores tagged values (gemv_tags_out)");
    if (args.norm.x && !gemv_folds_norm(type, args)) throw std::logic_error("this GEMV cannot fold an RMSNorm in (gemv_folds_norm)");
    if (args.norm_out.w && !gemv_norms_out(type, args)) throw std::logic_error("this GEMV cannot write its residual's norm (gemv_norms_out)");
    if (args.xq_ss && !(gemv_wants_q8(type) && args.n_tokens == 1 && !args.norm.x))
        throw std::logic_error("only a one-token GEMV of an int8 format reads a norm's copy written unit by unit (xq_ss)");
    if (gemm_takes(type, args.n_tokens)) {
        if (!args.xh || reinterpret_cast<uintptr_t>(args.xh) % 16 != 0 || args.xh_stride % 8 != 0)
            throw std::logic_error("the tensor-core GEMM reads bf16 activations whose rows start on 16-byte boundaries");
        return gemm(type, args);
    }
    Launch l = fn(args);
    mark_read_once(l, args);
    return l;
}

namespace {

// Each Q6_K super-block from the file's layout into the device layout (quant_dot.cuh), in place,
// one thread a block: unit j = h·4 + s's element l has its low nibble in ql[h·64 + (s % 2)·32 + l]
// (the high one for s ≥ 2) and its two high bits at 2s of qh[h·32 + l].
__global__ void q6_k_device_layout(uint8_t* data, int64_t n_blocks) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_blocks) return;
    uint8_t* b = data + i * static_cast<int64_t>(sizeof(block_q6_K));
    uint8_t ql[128], qh[64];
    for (int k = 0; k < 128; ++k) ql[k] = b[k];
    for (int k = 0; k < 64; ++k) qh[k] = b[128 + k];
    for (int j = 0; j < 8; ++j) {
        const int h = j / 4, s = j % 4;
        auto low = [&](int l) { return (ql[h * 64 + (s % 2) * 32 + l] >> (4 * (s / 2))) & 0xF; };
        auto high = [&](int l) { return (qh[h * 32 + l] >> (2 * s)) & 3; };
        for (int l = 0; l < 16; ++l) b[16 * j + l] = static_cast<uint8_t>(low(l) | low(16 + l) << 4);
        for (int w = 0; w < 2; ++w)
            for (int l = 0; l < 4; ++l) {
                int v = 0;
                for (int k = 0; k < 4; ++k) v |= high(16 * w + 4 * k + l) << (2 * k);
                b[128 + 8 * j + 4 * w + l] = static_cast<uint8_t>(v);
            }
    }
}

// Each Q4_K super-block from the file's layout into the device layout (q4_k_scale_min,
// quant_unit.cuh), in place, one thread a block: unit j's element l is nibble j % 2 of
// qs[(j / 2)·32 + l]; its scale and min as k_scale_min reads them.
__global__ void q4_k_device_layout(uint8_t* data, int64_t n_blocks) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_blocks) return;
    block_q4_K& b = reinterpret_cast<block_q4_K*>(data)[i];
    uint8_t scales[12], qs[128];
    for (int k = 0; k < 12; ++k) scales[k] = b.scales[k];
    for (int k = 0; k < 128; ++k) qs[k] = b.qs[k];
    for (int k = 8; k < 12; ++k) b.scales[k] = 0;
    for (int j = 0; j < 8; ++j) {
        int sc, m;
        k_scale_min(scales, j, &sc, &m);
        b.scales[j] = static_cast<uint8_t>(sc | (m & 3) << 6);
        b.scales[8 + j / 2] |= static_cast<uint8_t>((m >> 2) << (4 * (j % 2)));
        auto q = [&](int l) { return (qs[(j / 2) * 32 + l] >> (4 * (j % 2))) & 0xF; };
        for (int l = 0; l < 16; ++l) b.qs[16 * j + l] = static_cast<uint8_t>(q(l) | q(16 + l) << 4);
    }
}

// Q4_0, Q5_0, Q8_0 or IQ4_NL rows of the file's blocks (`units` a row, from_row bytes apart) into
// groups of eight (Group8, quant_unit.cuh; to_row bytes apart), one thread a group: a row's last
// group padded with blocks of d = 0 and quants 0. In place where the rows are as long (every thread
// reads its own group's bytes before it writes them).
template <typename Block>
__global__ void group_device_layout(const uint8_t* from, uint8_t* to, int64_t rows, int units, size_t from_row, size_t to_row) {
    const int groups = (units + 7) / 8;
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * groups) return;
    const int64_t r = i / groups;
    const int g = static_cast<int>(i % groups);
    const Block* b = reinterpret_cast<const Block*>(from + r * from_row) + 8 * g;
    Group8<Block> out;
    for (int j = 0; j < 8; ++j) {
        const bool in = 8 * g + j < units;
        out.d[j] = in ? b[j].d : __ushort_as_half(0);
        for (int l = 0; l < static_cast<int>(sizeof(b[j].qs)); ++l) out.qs[j][l] = in ? b[j].qs[l] : 0;
        if constexpr (std::is_same_v<Block, block_q5_0>)
            for (int l = 0; l < 4; ++l) out.qh[j][l] = in ? b[j].qh[l] : 0;
    }
    reinterpret_cast<Group8<Block>*>(to + r * to_row)[g] = out;
}

template <typename Block>
void rearrange(void (*kernel)(uint8_t*, int64_t), uint8_t* data, size_t bytes, cudaStream_t stream) {
    const int64_t n_blocks = static_cast<int64_t>(bytes / sizeof(Block));
    if (n_blocks == 0) return;
#ifndef ER_CUDA_EMULATOR
    kernel<<<static_cast<unsigned>((n_blocks + 255) / 256), 256, 0, stream>>>(data, n_blocks);
#else
    er_cuda_emulator::launch_plain(static_cast<unsigned>((n_blocks + 255) / 256), 256, [=] { kernel(data, n_blocks); });
#endif
    ER_CUDA(cudaGetLastError());
}

size_t file_row_bytes(TensorType type, int64_t cols) {
    const TensorTypeInfo info = tensor_type_info(type);
    return static_cast<size_t>(cols / info.block_size) * info.type_size;
}

}  // namespace

size_t device_row_bytes(TensorType type, int64_t cols) {
    if (const size_t group = group_bytes(type)) return static_cast<size_t>((cols / 32 + 7) / 8) * group;
    return file_row_bytes(type, cols);
}

namespace {

template <typename Block>
void group(const uint8_t* from, uint8_t* to, int64_t rows, int64_t cols, size_t from_row, size_t to_row, cudaStream_t stream) {
    if (from != to && from < to + rows * to_row && to < from + rows * from_row)
        throw std::logic_error("to_device_layout: the file's rows and the device's overlap where they are not in place");
    if (from == to && from_row != to_row)
        throw std::logic_error("to_device_layout: rows of " + std::to_string(cols) + " values are padded to whole groups, not rearranged in place");
    const int64_t groups = rows * ((cols / 32 + 7) / 8);
#ifndef ER_CUDA_EMULATOR
    group_device_layout<Block><<<static_cast<unsigned>((groups + 255) / 256), 256, 0, stream>>>(from, to, rows, static_cast<int>(cols / 32), from_row, to_row);
#else
    er_cuda_emulator::launch_plain(static_cast<unsigned>((groups + 255) / 256), 256,
                                   [=] { group_device_layout<Block>(from, to, rows, static_cast<int>(cols / 32), from_row, to_row); });
#endif
    ER_CUDA(cudaGetLastError());
}

}  // namespace

void to_device_layout(TensorType type, const uint8_t* from, uint8_t* to, int64_t rows, int64_t cols, cudaStream_t stream) {
    const size_t from_row = file_row_bytes(type, cols), to_row = device_row_bytes(type, cols);
    if (rows == 0) return;
    if (type == TensorType::Q4_0) return group<block_q4_0>(from, to, rows, cols, from_row, to_row, stream);
    if (type == TensorType::Q5_0) return group<block_q5_0>(from, to, rows, cols, from_row, to_row, stream);
    if (type == TensorType::Q8_0) return group<block_q8_0>(from, to, rows, cols, from_row, to_row, stream);
    if (type == TensorType::IQ4_NL) return group<block_iq4_nl>(from, to, rows, cols, from_row, to_row, stream);
    if (from != to) ER_CUDA(cudaMemcpyAsync(to, from, static_cast<size_t>(rows) * to_row, cudaMemcpyDeviceToDevice, stream));
    if (type == TensorType::Q4_K) rearrange<block_q4_K>(q4_k_device_layout, to, static_cast<size_t>(rows) * to_row, stream);
    if (type == TensorType::Q6_K) rearrange<block_q6_K>(q6_k_device_layout, to, static_cast<size_t>(rows) * to_row, stream);
}

std::vector<float> matmul(TensorType type, const uint8_t* rows, int64_t n_rows, size_t row_bytes, const float* x, int64_t n_tokens,
                          int64_t n, GemmKernel kernel, const float* residual) {
    const int64_t q_stride = (n / 32 + 3) / 4 * 4;  // QBlocks per token row, rows on 16-byte boundaries (as the runner's)
    if (row_bytes != file_row_bytes(type, n))
        throw std::invalid_argument("rows of " + std::to_string(n) + " " + std::string(tensor_type_name(type)) + " values take " +
                                    std::to_string(file_row_bytes(type, n)) + " bytes, not " + std::to_string(row_bytes));
    const size_t device_row = device_row_bytes(type, n);
    auto raw = device_alloc<uint8_t>(static_cast<size_t>(n_rows) * row_bytes);
    auto w = device_alloc<uint8_t>(static_cast<size_t>(n_rows) * device_row + 256);  // kernels may read up to 15 bytes past a row
    auto xd = device_alloc<float>(static_cast<size_t>(n_tokens * n));
    auto yd = device_alloc<float>(static_cast<size_t>(n_tokens * n_rows));
    auto xq = device_alloc<QBlock>(static_cast<size_t>(n_tokens * q_stride) + 8);
    const int64_t h_stride = (n + 7) / 8 * 8;
    auto xh = device_alloc<uint16_t>(static_cast<size_t>(n_tokens * h_stride));
    auto xh_scale = device_alloc<float>(static_cast<size_t>(n_tokens));
    ER_CUDA(cudaMemcpy(raw.get(), rows, static_cast<size_t>(n_rows) * row_bytes, cudaMemcpyHostToDevice));
    to_device_layout(type, raw.get(), w.get(), n_rows, n, nullptr);
    ER_CUDA(cudaMemcpy(xd.get(), x, static_cast<size_t>(n_tokens * n) * sizeof(float), cudaMemcpyHostToDevice));
    GemvArgs args;
    args.part[0] = GemvPart{w.get(), nullptr, yd.get(), n_rows, n_rows};
    args.row_bytes = device_row;
    args.cols = n;
    args.n_tokens = n_tokens;
    args.x = xd.get();
    args.x_stride = n;
    if (residual) {
        ER_CUDA(cudaMemcpy(yd.get(), residual, static_cast<size_t>(n_tokens * n_rows) * sizeof(float), cudaMemcpyHostToDevice));
        args.accumulate = true;
    }
    if (gemm_takes(type, n_tokens)) {  // (as the runner: 16-bit rows on 16-byte boundaries)
        const bool f16 = gemm_f16_input(type);
        enqueue(half_activations(HalfArgs{xd.get(), xh.get(), n_tokens, n, n, h_stride, f16, f16 ? xh_scale.get() : nullptr}), nullptr, nullptr, false);
        args.xh = xh.get();
        args.xh_stride = h_stride;
        if (f16) args.xh_scale = xh_scale.get();
    } else if (gemv_wants_q8(type)) {
        enqueue(quantize_activations(QuantizeArgs{xd.get(), xq.get(), n_tokens, n, n, q_stride}), nullptr, nullptr, false);
        args.xq = xq.get();
        args.xq_stride = q_stride;
    }
    enqueue(gemm_takes(type, n_tokens) ? gemm(type, args, kernel) : gemv(type, args), nullptr, nullptr, false);
    std::vector<float> y(static_cast<size_t>(n_tokens * n_rows));
    ER_CUDA(cudaMemcpy(y.data(), yd.get(), y.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return y;
}

std::vector<uint16_t> half_copy(const float* x, int64_t n_tokens, int64_t cols, bool f16, std::vector<float>* scales) {
    if (n_tokens < 1 || cols < 4 || cols % 4 != 0) throw std::invalid_argument("half_copy takes one token or more of a multiple of 4 values");
    const size_t n = static_cast<size_t>(n_tokens * cols);
    auto xd = device_alloc<float>(n);
    auto out = device_alloc<uint16_t>(n);
    auto scale = device_alloc<float>(static_cast<size_t>(n_tokens));
    ER_CUDA(cudaMemcpy(xd.get(), x, n * sizeof(float), cudaMemcpyHostToDevice));
    enqueue(half_activations(HalfArgs{xd.get(), out.get(), n_tokens, cols, cols, cols, f16, f16 ? scale.get() : nullptr}), nullptr, nullptr, false);
    std::vector<uint16_t> y(n);
    ER_CUDA(cudaMemcpy(y.data(), out.get(), n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    if (f16 && scales) {
        scales->resize(static_cast<size_t>(n_tokens));
        ER_CUDA(cudaMemcpy(scales->data(), scale.get(), scales->size() * sizeof(float), cudaMemcpyDeviceToHost));
    }
    return y;
}

std::string matmul_operands(TensorType type, int64_t n_rows, int64_t n, int64_t n_tokens, GemmKernel kernel) {
    if (!gemm_takes(type, n_tokens)) return gemv_wants_q8(type) ? "int8" : "float";
    GemvArgs a;  // (matmul's: one matrix, activations on 16-byte boundaries)
    a.part[0].rows = n_rows;
    a.cols = n;
    a.n_tokens = n_tokens;
    a.x_stride = n;
    switch (gemm_operands(type, a, kernel)) {
        case GemmOperands::F16: return "f16";
        case GemmOperands::Tf32: return "tf32";
        default: return "bf16";
    }
}

double copy_bandwidth(size_t n_bytes, int reps, int gpu) {
    if (const std::string why = unusable(gpu); !why.empty()) throw std::invalid_argument(why);
    const OnGpu on(gpu);
    auto a = device_alloc<uint8_t>(n_bytes), b = device_alloc<uint8_t>(n_bytes);
    ER_CUDA(cudaMemset(a.get(), 1, n_bytes));
    cudaEvent_t start, stop;
    ER_CUDA(cudaEventCreate(&start));
    ER_CUDA(cudaEventCreate(&stop));
    float best = 1e30f;
    for (int i = 0; i < reps + 1; ++i) {  // the first copy warms up
        ER_CUDA(cudaEventRecord(start));
        ER_CUDA(cudaMemcpy(b.get(), a.get(), n_bytes, cudaMemcpyDeviceToDevice));
        ER_CUDA(cudaEventRecord(stop));
        ER_CUDA(cudaEventSynchronize(stop));
        float ms = 0;
        ER_CUDA(cudaEventElapsedTime(&ms, start, stop));
        if (i) best = std::min(best, ms);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return 2.0 * static_cast<double>(n_bytes) / (best * 1e-3) / 1e9;
}

bool available() { return device_count() > 0; }

int device_count() {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

std::string unusable(int gpu) {
    const int count = device_count();
    if (count == 0) return describe();
    if (gpu >= 0 && gpu < count) return "";
    std::string there;
    for (int d = 0; d < count; ++d) there += (d ? ", " : "") + ("cuda:" + std::to_string(d)) + " " + describe(d);
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    if (visible) there += std::string(" (CUDA_VISIBLE_DEVICES=") + visible + " chooses them, numbered from 0)";
    return "there is no CUDA device " + std::to_string(gpu) + "; this machine has " + std::to_string(count) + ": " + there;
}

std::string describe(int gpu) {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status == cudaErrorInsufficientDriver)  // (also where no NVIDIA driver is installed at all)
        return "no usable CUDA driver (none is installed, or it is older than this build's CUDA " + std::to_string(CUDART_VERSION / 1000) +
               "." + std::to_string(CUDART_VERSION % 1000 / 10) + " runtime needs)";
    if (status == cudaErrorNoDevice || (status == cudaSuccess && count == 0)) return "no CUDA device";
    if (status != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(status);
    cudaDeviceProp p{};
    ER_CUDA(cudaGetDeviceProperties(&p, gpu));
    return std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
           std::to_string(p.multiProcessorCount) + " SMs, " + std::to_string(p.totalGlobalMem >> 20) + " MiB)";
}

bool overlap_supported() {
    static const bool off = [] {
        const char* env = std::getenv("EDGERUNNER_CUDA_OVERLAP");
        return env && std::string(env) == "0";
    }();
    static PerGpu<bool> supported;
    return !off && supported([](int d) { return device_attribute(cudaDevAttrComputeCapabilityMajor, d) >= 9; });
}

void enqueue(const Launch& l, cudaStream_t stream, const void* table, bool overlap) {
    // What a launch reads once (Launch::once) goes through L2 as streaming, first to be evicted:
    // the 8B's one-token GEMVs pull 122 MB a layer through the 60 MiB L2 (H200), and what the
    // step writes and reads again (the residual the norms read, outputs, the KV cache) should stay
    // (bench/NOTES.md, thirty-first CUDA session: 1B Q4_0 +1.9 %, 8B +0.15–0.7 %). The span is
    // mark_read_once's: at most the device's window size.
    cudaLaunchAttribute attrs[2]{};
    unsigned n_attrs = 0;
    if (overlap) {
        attrs[n_attrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attrs[n_attrs++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (l.once_bytes) {
        cudaLaunchAttribute& w = attrs[n_attrs++];
        w.id = cudaLaunchAttributeAccessPolicyWindow;
        w.val.accessPolicyWindow.base_ptr = const_cast<void*>(l.once);
        w.val.accessPolicyWindow.num_bytes = l.once_bytes;
        w.val.accessPolicyWindow.hitRatio = 1.0f;
        w.val.accessPolicyWindow.hitProp = cudaAccessPropertyStreaming;
        w.val.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
    }
    cudaLaunchConfig_t config{};
    config.gridDim = l.grid;
    config.blockDim = l.block;
    config.dynamicSmemBytes = l.smem;
    config.stream = stream;
    config.attrs = attrs;
    config.numAttrs = n_attrs;
    void* param = table ? const_cast<void*>(static_cast<const void*>(&table)) : const_cast<unsigned char*>(l.args);
    ER_CUDA(cudaLaunchKernelExC(&config, table ? l.by_table : l.by_value, &param));
}

}  // namespace edgerunner::cuda
