// Prefill matmuls on the tensor cores: Y = W · X for a chunk of tokens, bf16 mma.m16n8k16 into
// float accumulators. The weights are turned into bf16 operands in registers straight from their
// raw blocks (quant_mma.cuh: the integer part exactly, then the unit's scale and offset, one
// rounding: to_bf16), the activations a bf16 copy of the input (bf16_activations, gemv.cu), so no float
// weights are written anywhere and the accumulators need no per-block scaling. A block
// computes 128 weight rows × 64 tokens: 4 warps of 32 rows × all 64 tokens (a weight converted
// once serves 64 tokens), or 8 warps of 32 rows × 32 tokens where the blocks are too few to fill
// the GPU. The K dimension goes 128 elements a tile, each tile's raw weight bytes (the 32-element
// blocks it spans, the whole super-block that holds it, or for Q4_K / Q5_K the pieces of it the
// tile reads) and bf16 activations copied by cp.async into a ring of shared-memory stages while
// the previous tile is multiplied; the tile's scales are decoded once per row into shared
// memory. Same fusions as the GEMV: several matrices sharing an input (rows numbered across
// them), the gated pair (a warp holds a gate row and its up row: act(gate)·up on the way out),
// the residual added, a bias.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "async_copy.cuh"
#include "gemv.cuh"
#include "quant_mma.cuh"
#include "warp.cuh"

namespace edgerunner::cuda {
namespace {

constexpr int kBM = 128, kBN = 64;  // weight row slots × tokens per block; warps of 32 slots
constexpr int kTileUnits = 4;       // 32-element units per K tile

constexpr int pad_stride(int bytes) { return ((bytes + 15) / 16 | 1) * 16; }  // an odd number of 16-byte lines
constexpr int gcd16(int v) { return v % 16 == 0 ? 16 : v % 8 == 0 ? 8 : v % 4 == 0 ? 4 : v % 2 == 0 ? 2 : 1; }

// Whether every matrix's rows start on 16-byte boundaries (then a staged tile's phase is fixed by
// its offset in the row alone).
__host__ __device__ inline bool rows_aligned(const GemvArgs& a) {
    bool ok = a.row_bytes % 16 == 0;
    for (int p = 0; p < a.n_parts; ++p) ok = ok && reinterpret_cast<uintptr_t>(a.part[p].w) % 16 == 0;
    return ok;
}

__device__ __forceinline__ uint32_t bits(__nv_bfloat162 v) {
    uint32_t r;
    memcpy(&r, &v, sizeof r);
    return r;
}
__device__ __forceinline__ __nv_bfloat162 bf16x2(uint32_t r) {
    __nv_bfloat162 v;
    memcpy(&v, &r, sizeof v);
    return v;
}

// Four bytes of a unit (elements e..e+3: UnitScale's quants) as bf16 weights, pairs (e, e+1) and
// (e+2, e+3): s · (byte − kBias) + m with s and m bf16 pairs, the integer part exact, then one
// rounding (a multiply, or a fused multiply-add). A byte placed under the bits 0x43 is the bf16
// 128 + byte for bytes below 128: less 128 + kBias is the integer. A signed byte b: its low seven
// bits under 0x43 make 128 + (b & 127), its sign bit there makes 128 or 256 (it lands on the
// exponent's last bit), and the difference of the two is b.
template <class M>
__device__ __forceinline__ void to_bf16(uint32_t q, uint32_t s, uint32_t m, uint32_t& w01, uint32_t& w23) {
    const uint32_t p01 = __byte_perm(q, 0x43434343u, 0x4140u), p23 = __byte_perm(q, 0x43434343u, 0x4342u);
    __nv_bfloat162 a, b;
    if constexpr (M::kSigned) {
        a = __hsub2(bf16x2(p01 & 0xFF7FFF7Fu), bf16x2(p01 & 0xFF80FF80u));
        b = __hsub2(bf16x2(p23 & 0xFF7FFF7Fu), bf16x2(p23 & 0xFF80FF80u));
    } else {
        const __nv_bfloat162 bias = __float2bfloat162_rn(128.0f + M::kBias);
        a = __hsub2(bf16x2(p01), bias);
        b = __hsub2(bf16x2(p23), bias);
    }
    if constexpr (M::kMin) {
        w01 = bits(__hfma2(a, bf16x2(s), bf16x2(m)));
        w23 = bits(__hfma2(b, bf16x2(s), bf16x2(m)));
    } else {
        w01 = bits(__hmul2(a, bf16x2(s)));
        w23 = bits(__hmul2(b, bf16x2(s)));
    }
}

// A unit's scales as the bf16 pairs to_bf16 takes, kept in shared memory per row: s_lo, then
// s_hi (kSplit), then m_lo (, m_hi) (kMin) — one to four words, read with one load.
template <class M>
struct ScaleRecord {
    static constexpr int kWords = (M::kSplit ? 2 : 1) * (M::kMin ? 2 : 1);
    static __device__ void store(uint32_t* to, const UnitScale& f) {
        uint32_t w[4] = {bits(__float2bfloat162_rn(f.s_lo)), bits(__float2bfloat162_rn(f.s_hi)), bits(__float2bfloat162_rn(f.m_lo)),
                         bits(__float2bfloat162_rn(f.m_hi))};
        if constexpr (kWords == 1) *to = w[0];
        if constexpr (kWords == 2) *reinterpret_cast<uint2*>(to) = M::kSplit ? make_uint2(w[0], w[1]) : make_uint2(w[0], w[2]);
        if constexpr (kWords == 4) *reinterpret_cast<uint4*>(to) = make_uint4(w[0], w[1], w[2], w[3]);
    }
    // (s_lo, s_hi, m_lo, m_hi)
    static __device__ uint4 load(const uint32_t* from) {
        if constexpr (kWords == 1) return make_uint4(*from, *from, 0, 0);
        if constexpr (kWords == 4) return *reinterpret_cast<const uint4*>(from);
        const uint2 v = *reinterpret_cast<const uint2*>(from);
        return M::kSplit ? make_uint4(v.x, v.y, 0, 0) : make_uint4(v.x, v.x, v.y, v.y);
    }
};

// c += A · B for a 16×16 bf16 A (a0..a3: rows g and g + 8, k pairs 2t and 2t + 8) and 16×8 B (b0,
// b1: k pairs 2t and 2t + 8 of column g).
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// A format's pieces staged per half super-block (MmaUnit::kHalfPieces), 0: the whole block.
template <class M, class = void>
constexpr int kHalfPieces = 0;
template <class M>
constexpr int kHalfPieces<M, std::void_t<decltype(M::kHalfPieces)>> = M::kHalfPieces;

// kSplit warps share a block's 64 tokens: 1 (4 warps, each 32 slots × 64 tokens: a weight
// converted once serves 64 tokens) for matrices with blocks enough to fill the GPU, 2 (8 warps of
// 32 × 32: twice the warps on the same blocks) for small ones.
template <TensorType T, int kSplit>
struct Gemm {
    using Args = GemvArgs;
    using M = MmaUnit<T>;
    static constexpr int kWarpTokens = kBN / kSplit, kThreads = 128 * kSplit;
    static constexpr int kBlockThreads = kThreads, kMinBlocks = kSplit == 1 ? 3 : 2;  // registers capped at 168, 128
    static constexpr int kBlockBytes = sizeof(typename M::Block);
    static constexpr int kHalf = kHalfPieces<M>;  // pieces of the half super-block a tile stages, or 0
    static_assert(kHalf == 0 || kTileUnits == M::kUnits / 2, "a staged half is a tile");
    // a row's staged bytes per tile, + room to start on the source's 16-byte phase: up to 15
    // bytes, or where rows_aligned only the phases tile offsets take (16 − gcd(tile step, 16):
    // Q8_0's 136-byte tiles start at 0 or 8)
    static constexpr int kRawBytes = kHalf ? 16 * kHalf : (M::kUnits == 1 ? kTileUnits : 1) * kBlockBytes;
    static constexpr int kStep = M::kUnits == 1 ? kTileUnits * kBlockBytes : kBlockBytes;
    static constexpr int kRowStride = pad_stride(kRawBytes + (kHalf ? 0 : 15));
    static constexpr int kRowStrideAligned = pad_stride(kRawBytes + (kHalf ? 0 : 16 - gcd16(kStep)));
    // a token's tile of bf16 values, + 32 bytes: the eight tokens of a fragment load land in
    // distinct banks
    static constexpr int kTokStride = kTileUnits * 64 + 32;
    static constexpr int kStageBytes = kBM * kRowStride + kBN * kTokStride;
    using Rec = ScaleRecord<M>;
    static constexpr int kRecBytes = kTileUnits * kBM * Rec::kWords * 4;  // the current tile's scale records
    static constexpr int kStages = kMinBlocks * (3 * kStageBytes + kRecBytes) <= 220 * 1024 ? 3 : 2;  // as deep as kMinBlocks per SM allow
    static constexpr size_t kSmem = static_cast<size_t>(kStages) * kStageBytes + kRecBytes;  // the most a launch asks
    static constexpr size_t smem(bool aligned) {
        return static_cast<size_t>(kStages) * (kBM * (aligned ? kRowStrideAligned : kRowStride) + kBN * kTokStride) + kRecBytes;
    }
    static_assert(M::kUnits == 1 || M::kUnits % kTileUnits == 0, "a tile within one super-block");

    // Row slot s of block `bx` → (part, row), or part -1 past the end. Gated: warp w's slots are
    // 16 gate rows then the same 16 up rows.
    static __device__ int slot_row(const Args& a, int64_t bx, int s, int64_t* r) {
        if (a.glu != Glu::None) {
            *r = bx * (kBM / 2) + (s / 32) * 16 + s % 16;
            return *r < a.part[0].rows ? (s % 32) / 16 : -1;
        }
        int64_t row = bx * kBM + s;
        for (int p = 0; p < 3; ++p) {
            const int64_t rows = p == 0 ? a.part[0].rows : p == 1 ? a.part[1].rows : a.part[2].rows;
            if (p < a.n_parts && row < rows) {
                *r = row;
                return p;
            }
            row -= rows;
        }
        return -1;
    }

    // where tile k's weight bytes start in a row, and the tile's first unit within them
    static __device__ int64_t tile_byte(int k) { return static_cast<int64_t>(k) * kTileUnits / M::kUnits * kBlockBytes; }
    static __device__ int tile_unit(int k) { return k * kTileUnits % M::kUnits; }

    static __device__ void run(const Args& a) {
        extern __shared__ uint4 smem_lines[];
        uint8_t* smem = reinterpret_cast<uint8_t*>(smem_lines);
        allow_next();
        const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
        const int g = lane / 4, t = lane % 4;
        const int wm = warp % 4, wn = warp / 4;  // the warp's 32 slots and its share of the tokens
        // blocks in launch order: the token blocks of a row block, then the next rows (a weight
        // row block is read from memory once while its token blocks run, then from L2)
        const int64_t bx = blockIdx.y, n0 = static_cast<int64_t>(blockIdx.x) * kBN;
        const int64_t n_units = a.cols / 32;
        const int n_tiles = static_cast<int>((n_units + kTileUnits - 1) / kTileUnits);

        // Copy duties: kSplit threads per row slot; the tokens' pieces in turn (rows and tokens
        // past the end copy the last valid one: their results are never stored).
        const uint8_t* my_row;
        {
            int64_t r;
            int p = slot_row(a, bx, tid / kSplit, &r);
            if (p < 0) p = 0, r = a.part[0].rows - 1;  // a valid row to copy
            my_row = (p == 0 ? a.part[0].w : p == 1 ? a.part[1].w : a.part[2].w) + static_cast<size_t>(r) * a.row_bytes;
        }
        const int row_stride = rows_aligned(a) ? kRowStrideAligned : kRowStride;  // (as the launch sized it)
        const int stage_bytes = kBM * row_stride + kBN * kTokStride;
        auto stage = [&](int k) { return smem + (k % kStages) * stage_bytes; };
        auto copy_weights = [&](int k) {
            if (k >= n_tiles) return;
            uint8_t* to = stage(k) + (tid / kSplit) * row_stride;
            if constexpr (kHalf > 0) {  // 16-byte aligned blocks: the pieces the tile's half reads
                for (int i = tid % kSplit; i < kHalf; i += kSplit) copy16(to + 16 * i, my_row + tile_byte(k) + 16 * M::half_piece(tile_unit(k) / kTileUnits, i));
            } else {
                const int64_t units = min(static_cast<int64_t>(kTileUnits), n_units - static_cast<int64_t>(k) * kTileUnits);
                const int64_t bytes = M::kUnits == 1 ? units * kBlockBytes : kBlockBytes;
                stage_copy(to, my_row + tile_byte(k), static_cast<size_t>(bytes), tid % kSplit, kSplit);
            }
        };
        constexpr int kTokPieces = kTileUnits * 4;  // 16-byte pieces of a token's tile
        auto copy_tokens = [&](int k) {
            if (k >= n_tiles) return;
            const int pieces = static_cast<int>(min(static_cast<int64_t>(kTileUnits), n_units - static_cast<int64_t>(k) * kTileUnits)) * 4;
            uint8_t* to = stage(k) + kBM * row_stride;
#pragma unroll
            for (int i = 0; i < kBN * kTokPieces / kThreads; ++i) {
                const int j = tid + i * kThreads, tok = j / kTokPieces, piece = j % kTokPieces;
                if (piece >= pieces) continue;
                const int64_t row = min(n0 + tok, a.n_tokens - 1);
                copy16(to + tok * kTokStride + 16 * piece, a.xh + row * a.xh_stride + static_cast<int64_t>(k) * kTileUnits * 32 + 8 * piece);
            }
        };
        // the first tiles' weights before waiting for the input, then their activations
        for (int k = 0; k < kStages - 1; ++k) copy_weights(k);
        wait_inputs();
        for (int k = 0; k < kStages - 1; ++k) {
            copy_tokens(k);
            commit();
        }

        // Where row slots are in global memory: a staged tile lies at (row + tile offset) mod 16 in
        // its slot, as the copy keeps the source's phase. This thread multiplies four rows (m-tile
        // i: slots g, g + 8 of the warp's 32) and decodes the scales of one (slot `lane`).
        auto row_at = [&](int slot) {
            int64_t r;
            int p = slot_row(a, bx, slot, &r);
            if (p < 0) p = 0, r = a.part[0].rows - 1;
            return reinterpret_cast<uintptr_t>((p == 0 ? a.part[0].w : p == 1 ? a.part[1].w : a.part[2].w) + static_cast<size_t>(r) * a.row_bytes);
        };
        uintptr_t mine[2][2];
        for (int i = 0; i < 2; ++i)
            for (int h = 0; h < 2; ++h) mine[i][h] = row_at(wm * 32 + i * 16 + g + 8 * h);
        const uintptr_t scaled = row_at(wm * 32 + lane);
        // the scale records of the warp's 32 slots for the current tile: [unit][slot][word]
        uint32_t* recs = reinterpret_cast<uint32_t*>(smem + kStages * stage_bytes) + wm * (kTileUnits * 32 * Rec::kWords);

        // Per unit, thread t of a quad holds elements 4t..4t+3 and 16+4t..16+4t+3 of its rows'
        // weights and of its tokens' activations: the mma's k pairs (2t, 2t+1), (2t+8, 2t+9) of the
        // first k16 step are elements (4t, 4t+1), (4t+2, 4t+3), those of the second the same + 16 —
        // one permutation of the unit's 32 elements, the same for both operands.
        float acc[2][kWarpTokens / 8][4] = {};  // [m-tile][n-tile][c element]
        for (int k = 0; k < n_tiles; ++k) {
            wait_pending<kStages - 2>();
            __syncthreads();  // tile k is in for every thread, and tile k - 1's stage is free
            copy_weights(k + kStages - 1);
            copy_tokens(k + kStages - 1);
            commit();
            const uint8_t* sa = stage(k);
            const uint8_t* sb = sa + kBM * row_stride;
            const int units = static_cast<int>(min(static_cast<int64_t>(kTileUnits), n_units - static_cast<int64_t>(k) * kTileUnits));
            const int64_t offset = tile_byte(k);
            const int u0 = tile_unit(k);
            // The tile's scales, decoded once per row: lane l those of slot l, the kSplit warps of
            // the same slots a share of the units each. (Tile k − 1's records are free: every
            // warp has passed the barrier above.)
            {
                const uint8_t* row = sa + (wm * 32 + lane) * row_stride + ((scaled + offset) & 15);
#pragma unroll
                for (int v = 0; v < kTileUnits / kSplit; ++v) {
                    const int u = wn * (kTileUnits / kSplit) + v;
                    if (u < units) Rec::store(recs + (u * 32 + lane) * Rec::kWords, M::scale(row, u0 + u));
                }
                if constexpr (kSplit == 1) __syncwarp();
                else asm volatile("bar.sync %0, %1;" ::"r"(1 + wm), "n"(32 * kSplit) : "memory");  // (barrier 0 is __syncthreads')
            }
#pragma unroll 2
            for (int u = 0; u < units; ++u) {
                uint32_t w[2][2][4];  // [m-tile][row g, g + 8][elements 4t.., 4t+2.., 16+4t.., 16+4t+2..]
#pragma unroll
                for (int i = 0; i < 2; ++i)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int slot = i * 16 + g + 8 * h;
                        const uint2 q = M::quants(sa + (wm * 32 + slot) * row_stride + ((mine[i][h] + offset) & 15), u0 + u, t);
                        const uint4 r = Rec::load(recs + (u * 32 + slot) * Rec::kWords);  // s_lo, s_hi, m_lo, m_hi
                        to_bf16<M>(q.x, r.x, r.z, w[i][h][0], w[i][h][1]);
                        to_bf16<M>(q.y, r.y, r.w, w[i][h][2], w[i][h][3]);
                    }
#pragma unroll
                for (int j = 0; j < kWarpTokens / 8; ++j) {
                    const uint8_t* x = sb + (wn * kWarpTokens + j * 8 + g) * kTokStride + u * 64 + 8 * t;
                    const uint2 lo = *reinterpret_cast<const uint2*>(x), hi = *reinterpret_cast<const uint2*>(x + 32);
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        mma_bf16(acc[i][j], w[i][0][0], w[i][1][0], w[i][0][1], w[i][1][1], lo.x, lo.y);
                        mma_bf16(acc[i][j], w[i][0][2], w[i][1][2], w[i][0][3], w[i][1][3], hi.x, hi.y);
                    }
                }
            }
        }

        // Out: element e of (m-tile i, n-tile j) is row slot wm·32 + i·16 + g + 8·(e / 2), token
        // wn·kWarpTokens + j·8 + 2t + e % 2.
        const bool gated = a.glu != Glu::None;
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if (gated && i == 1) break;  // the up rows: consumed with their gate rows
                int64_t r;
                const int p = slot_row(a, bx, wm * 32 + i * 16 + g + 8 * h, &r);
                if (p < 0) continue;
                const GemvPart& part = p == 0 ? a.part[0] : p == 1 ? a.part[1] : a.part[2];
                const float bias = part.bias ? part.bias[r] : 0.0f;
#pragma unroll
                for (int j = 0; j < kWarpTokens / 8; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int64_t tok = n0 + wn * kWarpTokens + j * 8 + 2 * t + e;
                        if (tok >= a.n_tokens) continue;
                        float v = acc[i][j][2 * h + e];
                        if (gated) v = gate_act(a.glu, v) * acc[1][j][2 * h + e];
                        else v += bias;
                        float* out = part.y + tok * part.y_stride + r;
                        *out = a.accumulate ? *out + v : v;
                    }
            }
    }
};

template <TensorType T, int kSplit>
Launch launch(const GemvArgs& a, dim3 grid, bool aligned) {
    using K = Gemm<T, kSplit>;
    static const bool sized = allow_smem<K>(K::kSmem);
    (void)sized;
    return make_launch<K>(grid, dim3(K::kThreads), a, K::smem(aligned));
}

template <TensorType T>
Launch launch(const GemvArgs& a) {
    const bool aligned = rows_aligned(a);
    if (kHalfPieces<MmaUnit<T>> > 0 && !aligned)  // staged as 16-byte pieces
        throw std::logic_error("the tensor-core GEMM reads " + std::string(tensor_type_name(T)) + " weights from 16-byte boundaries");
    const int64_t rows = gemv_rows(a);
    const int64_t per_block = a.glu != Glu::None ? kBM / 2 : kBM;
    const dim3 grid(static_cast<unsigned>((a.n_tokens + kBN - 1) / kBN), static_cast<unsigned>((rows + per_block - 1) / per_block));
    // Four warps a block where the blocks fill the GPU one and a half times or more, else eight
    // (measured on the H200, 132 SMs: 8B's 256-block down and output projections gain from four,
    // 1B's 192-block QKV and SmolLM2's 192-block gate·up lose) — where eight's stages fit
    const bool wide = static_cast<int64_t>(grid.x) * grid.y * 2 >= 3 * static_cast<int64_t>(sm_count()) ||
                      Gemm<T, 2>::smem(aligned) > smem_per_block();
    return wide ? launch<T, 1>(a, grid, aligned) : launch<T, 2>(a, grid, aligned);
}

}  // namespace

bool gemm_takes(TensorType type, int64_t n_tokens) {
    if (n_tokens < kPrefillKernelTokens) return false;
    // (a device whose blocks cannot hold the four-warp kernel's stages prefills with the GEMV:
    // Q6_K's 108 KB on sm_89)
    switch (type) {
#define ER_MMA(T) \
    case TensorType::T: return MmaUnit<TensorType::T>::kFast && Gemm<TensorType::T, 1>::kSmem <= smem_per_block();
        ER_MMA(Q4_0) ER_MMA(Q4_1) ER_MMA(Q5_0) ER_MMA(Q5_1) ER_MMA(Q8_0) ER_MMA(IQ4_NL) ER_MMA(Q2_K) ER_MMA(Q3_K) ER_MMA(Q4_K) ER_MMA(Q5_K)
        ER_MMA(Q6_K) ER_MMA(IQ4_XS)
#undef ER_MMA
        default: return false;
    }
}

Launch gemm(TensorType type, const GemvArgs& a) {
    switch (type) {
        case TensorType::Q4_0: return launch<TensorType::Q4_0>(a);
        case TensorType::Q4_1: return launch<TensorType::Q4_1>(a);
        case TensorType::Q5_0: return launch<TensorType::Q5_0>(a);
        case TensorType::Q5_1: return launch<TensorType::Q5_1>(a);
        case TensorType::Q8_0: return launch<TensorType::Q8_0>(a);
        case TensorType::Q4_K: return launch<TensorType::Q4_K>(a);
        case TensorType::Q5_K: return launch<TensorType::Q5_K>(a);
        case TensorType::Q6_K: return launch<TensorType::Q6_K>(a);
        case TensorType::IQ4_NL: return launch<TensorType::IQ4_NL>(a);
        case TensorType::Q3_K: return launch<TensorType::Q3_K>(a);
        case TensorType::IQ4_XS: return launch<TensorType::IQ4_XS>(a);
        case TensorType::Q2_K: return launch<TensorType::Q2_K>(a);
        default: throw std::invalid_argument("the CUDA tensor-core GEMM has no kernel for " + std::string(tensor_type_name(type)));
    }
}

}  // namespace edgerunner::cuda
