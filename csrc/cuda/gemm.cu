// Prefill matmuls on the tensor cores: Y = W · X for a chunk of tokens, bf16 mma.m16n8k16 into
// float accumulators. The weights are turned into bf16 operands in registers straight from their
// raw blocks (quant_mma.cuh: the integer part exactly, then the unit's scale and offset, one
// rounding: to_bf16; F32 values rounded to bf16 once, BF16 ones as they are), the activations a
// bf16 copy of the input (half_activations, gemv.cu), so no float weights are written anywhere
// and the accumulators need no per-block scaling. F16 weights are multiplied as they are, in f16
// (mma .f16), against an f16 copy of the activations (each token's values divided by a power of
// two where they reach 2^15: its sums multiplied back on the way out, GemvArgs::xh_scale). A block
// computes 128 weight rows × 64 tokens: 4 warps of 32 rows × all 64 tokens (a weight converted
// once serves 64 tokens), or 8 warps of 32 rows × 32 tokens where the blocks are too few to fill
// the GPU. The K dimension goes 128 elements a tile, each tile's raw weight bytes (the 32-element
// blocks it spans, the whole super-block that holds it, or for Q4_K / Q5_K the pieces of it the
// tile reads) and bf16 activations copied by cp.async into a ring of shared-memory stages while
// the previous tile is multiplied; the tile's scales are decoded once per row into shared
// memory. Same fusions as the GEMV: several matrices sharing an input (rows numbered across
// them), the gated pair (a warp holds a gate row and its up row: act(gate)·up on the way out),
// the residual added, a bias.
//
// On Hopper (compute capability 9.0, sm_90a code in the build) large matrices take GemmWg
// instead: warpgroup MMA (wgmma) with both operands in shared memory, each tile's weights
// converted once into a swizzled bf16 tile (the same to_bf16) while the tensor cores multiply
// the previous one; 128 rows × 128 tokens a block (below). The float formats' weights go
// straight into their tiles: BF16 and F16 as above, F32 in tf32 (its values and the float
// activations as they are: the tensor cores read each one's top 19 bits). wgmma_wanted says where.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
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

// c += A · B for a 16×16 A (a0..a3: rows g and g + 8, k pairs 2t and 2t + 8) and 16×8 B (b0,
// b1: k pairs 2t and 2t + 8 of column g), both bf16, or with kF16 both f16.
template <bool kF16 = false>
__device__ __forceinline__ void mma16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    if constexpr (kF16)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// A format's pieces staged per half super-block (MmaUnit::kHalfPieces), 0: the whole block.
template <class M, class = void>
constexpr int kHalfPieces = 0;
template <class M>
constexpr int kHalfPieces<M, std::void_t<decltype(M::kHalfPieces)>> = M::kHalfPieces;

// One row's sums for a thread's kJ × 2 tokens (tok(j, e); those past the chunk skipped) stored
// into row r of part.y: value(j, e) (the sum plus the bias, or the gate's activation times the up
// sum), plus the value already there where the matmul adds to its output (the residual). Those are
// loaded first, all together: between the stores, which may alias them, each load would wait for
// the store before it, and so for the load before that (one L2 latency an output).
template <int kJ, class Tok, class Value>
__device__ __forceinline__ void store_sums(const GemvArgs& a, const GemvPart& part, int64_t r, Tok tok, Value value) {
    float old[kJ][2];
    if (a.accumulate) {
#pragma unroll
        for (int j = 0; j < kJ; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) old[j][e] = tok(j, e) < a.n_tokens ? part.y[tok(j, e) * part.y_stride + r] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kJ; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            if (tok(j, e) >= a.n_tokens) continue;
            const float v = value(j, e);
            part.y[tok(j, e) * part.y_stride + r] = a.accumulate ? old[j][e] + v : v;
        }
}

// What the two GEMM kernels share: a format's K tile as staged (the raw bytes a row's tile takes
// and the shared-memory stride that holds them, where a tile starts in its row), and the row
// slots of a block of kRows: a matrix's rows in order across the parts (Q, K, V), or gated runs
// of kRun gate rows, each followed by the same kRun up rows.
template <TensorType T, int kRows, int kRun>
struct GemmTiles {
    using Args = GemvArgs;
    using M = MmaUnit<T>;
    static constexpr int kBlockBytes = sizeof(typename M::Block);
    static constexpr int kHalf = kHalfPieces<M>;  // pieces of the half super-block a tile stages, or 0
    static_assert(kHalf == 0 || kTileUnits == M::kUnits / 2, "a staged half is a tile");
    static_assert(M::kUnits == 1 || M::kUnits % kTileUnits == 0, "a tile within one super-block");
    // a row's staged bytes per tile, + room to start on the source's 16-byte phase: up to 15
    // bytes, or where rows_aligned only the phases tile offsets take (16 − gcd(tile step, 16):
    // Q5_1's 96-byte tiles start at 0 only, Q4_1's 80-byte ones too, Q5_0's 88-byte ones at 0 or 8)
    static constexpr int kRawBytes = kHalf ? 16 * kHalf : (M::kUnits == 1 ? kTileUnits : 1) * kBlockBytes;
    static constexpr int kStep = M::kUnits == 1 ? kTileUnits * kBlockBytes : kBlockBytes;
    // The float formats' rows are on 16-byte boundaries (launch checks): their tiles lie 32 bytes
    // (F16, BF16: a quad's 8-byte loads of four rows meet every bank once) or 64 bytes (F32: two
    // rows' 16-byte loads) beyond a multiple of 128 apart.
    static constexpr int kFloatStride = kRawBytes + (kBlockBytes == 128 ? 64 : 32);
    static constexpr int kRowStride = kFloatUnit<M> ? kFloatStride : pad_stride(kRawBytes + (kHalf ? 0 : 15));
    static constexpr int kRowStrideAligned = kFloatUnit<M> ? kFloatStride : pad_stride(kRawBytes + (kHalf ? 0 : 16 - gcd16(kStep)));

    // where tile k's weight bytes start in a row, and the tile's first unit within them
    static __device__ int64_t tile_byte(int k) { return static_cast<int64_t>(k) * kTileUnits / M::kUnits * kBlockBytes; }
    static __device__ int tile_unit(int k) { return k * kTileUnits % M::kUnits; }

    // Row slot s of block `bx` → (part, row), or part -1 past the end.
    static __device__ int slot_row(const Args& a, int64_t bx, int s, int64_t* r) {
        if (a.glu != Glu::None) {
            *r = bx * (kRows / 2) + (s / (2 * kRun)) * kRun + s % kRun;
            return *r < a.part[0].rows ? (s % (2 * kRun)) / kRun : -1;
        }
        int64_t row = bx * kRows + s;
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
    // Where slot s's row starts in global memory (a staged tile lies at (row + tile offset) mod 16
    // in its slot, as the copy keeps the source's phase); past the end a valid row to read, whose
    // results are never stored.
    static __device__ const uint8_t* row_at(const Args& a, int64_t bx, int s) {
        int64_t r;
        int p = slot_row(a, bx, s, &r);
        if (p < 0) p = 0, r = a.part[0].rows - 1;
        return (p == 0 ? a.part[0].w : p == 1 ? a.part[1].w : a.part[2].w) + static_cast<size_t>(r) * a.row_bytes;
    }
};

// kSplit warps share a block's 64 tokens: 1 (4 warps, each 32 slots × 64 tokens: a weight
// converted once serves 64 tokens) for matrices with blocks enough to fill the GPU, 2 (8 warps of
// 32 × 32: twice the warps on the same blocks) for small ones. Gated: warp w's slots are 16 gate
// rows then the same 16 up rows.
template <TensorType T, int kSplit>
struct Gemm : GemmTiles<T, kBM, 16> {
    using Base = GemmTiles<T, kBM, 16>;
    using typename Base::Args;
    using typename Base::M;
    using Base::kBlockBytes, Base::kHalf, Base::kRowStride, Base::kRowStrideAligned, Base::slot_row, Base::row_at, Base::tile_byte,
        Base::tile_unit;
    static constexpr int kWarpTokens = kBN / kSplit, kThreads = 128 * kSplit;
    static constexpr bool kF16 = T == TensorType::F16;  // f16 operands (gemm_f16_input)
    static constexpr int kBlockThreads = kThreads, kMinBlocks = kSplit == 1 ? 3 : 2;  // registers capped at 168, 128
    // a token's tile of bf16 values, + 32 bytes: the eight tokens of a fragment load land in
    // distinct banks
    static constexpr int kTokStride = kTileUnits * 64 + 32;
    static constexpr int kStageBytes = kBM * kRowStride + kBN * kTokStride;
    using Rec = ScaleRecord<M>;
    static constexpr int kRecBytes = kFloatUnit<M> ? 0 : kTileUnits * kBM * Rec::kWords * 4;  // the current tile's scale records
    static constexpr int kStages = kMinBlocks * (3 * kStageBytes + kRecBytes) <= 220 * 1024 ? 3 : 2;  // as deep as kMinBlocks per SM allow
    static constexpr size_t kSmem = static_cast<size_t>(kStages) * kStageBytes + kRecBytes;  // the most a launch asks
    static constexpr size_t smem(bool aligned) {
        return static_cast<size_t>(kStages) * (kBM * (aligned ? kRowStrideAligned : kRowStride) + kBN * kTokStride) + kRecBytes;
    }
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
        const uint8_t* my_row = row_at(a, bx, tid / kSplit);
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

        // Where the rows are (row_at): this thread multiplies four (m-tile i: slots g, g + 8 of the
        // warp's 32) and decodes the scales of one (slot `lane`).
        auto at = [&](int slot) { return reinterpret_cast<uintptr_t>(row_at(a, bx, slot)); };
        uintptr_t mine[2][2];
        for (int i = 0; i < 2; ++i)
            for (int h = 0; h < 2; ++h) mine[i][h] = at(wm * 32 + i * 16 + g + 8 * h);
        const uintptr_t scaled = at(wm * 32 + lane);
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
            // warp has passed the barrier above.) Float formats have none.
            if constexpr (!kFloatUnit<M>) {
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
                        const uint8_t* row = sa + (wm * 32 + slot) * row_stride + ((mine[i][h] + offset) & 15);
                        if constexpr (kFloatUnit<M>) {
                            const uint4 v = M::weights(row, u0 + u, t);
                            w[i][h][0] = v.x, w[i][h][1] = v.y, w[i][h][2] = v.z, w[i][h][3] = v.w;
                        } else {
                            const uint2 q = M::quants(row, u0 + u, t);
                            const uint4 r = Rec::load(recs + (u * 32 + slot) * Rec::kWords);  // s_lo, s_hi, m_lo, m_hi
                            to_bf16<M>(q.x, r.x, r.z, w[i][h][0], w[i][h][1]);
                            to_bf16<M>(q.y, r.y, r.w, w[i][h][2], w[i][h][3]);
                        }
                    }
#pragma unroll
                for (int j = 0; j < kWarpTokens / 8; ++j) {
                    const uint8_t* x = sb + (wn * kWarpTokens + j * 8 + g) * kTokStride + u * 64 + 8 * t;
                    const uint2 lo = *reinterpret_cast<const uint2*>(x), hi = *reinterpret_cast<const uint2*>(x + 32);
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        mma16<kF16>(acc[i][j], w[i][0][0], w[i][1][0], w[i][0][1], w[i][1][1], lo.x, lo.y);
                        mma16<kF16>(acc[i][j], w[i][0][2], w[i][1][2], w[i][0][3], w[i][1][3], hi.x, hi.y);
                    }
                }
            }
        }

        // Out: element e of (m-tile i, n-tile j) is row slot wm·32 + i·16 + g + 8·(e / 2), token
        // wn·kWarpTokens + j·8 + 2t + e % 2.
        if constexpr (kF16) {  // (f16: the sums times what each token's copy was divided by, first:
                               // loads alone, in flight together; between the stores below, which
                               // may alias them, each would wait for the one before)
#pragma unroll
            for (int j = 0; j < kWarpTokens / 8; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int64_t tok = n0 + wn * kWarpTokens + j * 8 + 2 * t + e;
                    const float scale = tok < a.n_tokens ? a.xh_scale[tok] : 1.0f;
#pragma unroll
                    for (int i = 0; i < 2; ++i)
#pragma unroll
                        for (int h = 0; h < 2; ++h) acc[i][j][2 * h + e] *= scale;
                }
        }
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
                store_sums<kWarpTokens / 8>(
                    a, part, r, [&](int j, int e) { return n0 + wn * kWarpTokens + j * 8 + 2 * t + e; },
                    [&](int j, int e) { return gated ? gate_act(a.glu, acc[i][j][2 * h + e]) * acc[1][j][2 * h + e] : acc[i][j][2 * h + e] + bias; });
            }
    }
};

// ---- Hopper (sm_90a): warpgroup MMA, both operands from shared memory ----
//
// wgmma reads its operands from shared memory and runs asynchronously: a warpgroup (four warps)
// issues a tile's multiplies and goes on converting the next tile's weights while the tensor
// cores work, so the issue and latency limits of mma.sync (every operand through registers, two
// to three warps per scheduler) no longer bind. Both operands are K-major bf16 tiles in the
// 128-byte swizzled layout: rows of 64 values (128 bytes) in atoms of eight rows, 16-byte chunk c
// of row r stored at chunk c ^ (r mod 8), a tile's 128 values of K as two such columns of atoms.

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // (the helpers exist only where the kernel's body does)
// A shared-memory matrix descriptor: K-major, 128-byte swizzle, eight-row atoms 1024 bytes apart.
__device__ __forceinline__ uint64_t wg_desc(const void* p) {
    const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
    return static_cast<uint64_t>((a & 0x3FFFF) >> 4) | static_cast<uint64_t>(1) << 16 | static_cast<uint64_t>(1024 >> 4) << 32 |
           static_cast<uint64_t>(1) << 62;
}
// Where 16-byte chunk `chunk` (0..15: K values 8·chunk..) of row `row` of a swizzled 128-value tile lies.
__device__ __forceinline__ int wg_offset(int row, int chunk, int rows) {
    return (chunk / 8) * (rows * 128) + row * 128 + (((chunk % 8) ^ (row % 8)) * 16);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Shared memory written by threads (stores, cp.async) made visible to the tensor cores' reads.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// The accumulators as the compiler sees them: not read or moved across an asynchronous multiply.
template <int N>
__device__ __forceinline__ void wg_fence_regs(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (64 rows × 128 tokens, float) += A (64 × 32 bytes of K) · B (128 × 32 bytes of K)ᵀ. Thread
// (warp w, lane g·4 + t) holds d[4j + e]: row 16w + g + 8·(e / 2), token 8j + 2t + e % 2.
// (GemmOperands: bf16 and f16 k16, tf32 k8; 32 bytes of each K-major row a step either way)
template <GemmOperands kOps>
__device__ __forceinline__ void wgmma_m64n128(float (&d)[64], uint64_t a, uint64_t b) {
#define ER_F8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define ER_D "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define ER_OUT ER_F8(0), ER_F8(8), ER_F8(16), ER_F8(24), ER_F8(32), ER_F8(40), ER_F8(48), ER_F8(56)
    if constexpr (kOps == GemmOperands::Bf16)
        asm volatile("{.reg .pred p; setp.ne.b32 p, %66, 0; wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " ER_D ", %64, %65, p, 1, 1, 0, 0;}"
                     : ER_OUT : "l"(a), "l"(b), "r"(1));
    else if constexpr (kOps == GemmOperands::F16)
        asm volatile("{.reg .pred p; setp.ne.b32 p, %66, 0; wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " ER_D ", %64, %65, p, 1, 1, 0, 0;}"
                     : ER_OUT : "l"(a), "l"(b), "r"(1));
    else  // (tf32 takes K-major operands only: no transpose arguments)
        asm volatile("{.reg .pred p; setp.ne.b32 p, %66, 0; wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 " ER_D ", %64, %65, p, 1, 1;}"
                     : ER_OUT : "l"(a), "l"(b), "r"(1));
#undef ER_OUT
#undef ER_D
#undef ER_F8
}
#endif

// The GEMM on Hopper: 128 weight rows × kN = 128 tokens a block, two warpgroups of 64 rows × kN. Per K
// tile (128 values) a warpgroup decodes its rows' scales once (shared memory, as the mma.sync
// kernel) and converts its 64 rows into a bf16 tile with the same to_bf16 (the same weights, bit
// for bit), double-buffered: tile k + 1 is converted while the tensor cores multiply tile k. The
// raw weight bytes (a ring of three stages where they fit, else two: copied that many tiles before
// their conversion, less one) and the bf16 activations (three stages, straight into their swizzled
// places, two tiles ahead) arrive by cp.async. A tile takes one block barrier and two of the
// warpgroup's. Gated: a warp's 16 rows are 8 gate rows and the same 8 up rows, so a gate value and
// its up value are accumulated by one thread.
template <TensorType T, bool kAligned>
struct GemmWg : GemmTiles<T, 128, 8> {
    using Base = GemmTiles<T, 128, 8>;
    using typename Base::Args;
    using typename Base::M;
    using Base::kBlockBytes, Base::kHalf, Base::slot_row, Base::row_at, Base::tile_byte, Base::tile_unit;
    static constexpr int kRows = 128, kN = 128, kTokens = kN, kThreads = 256, kTokenStages = 3;
    static constexpr int kBlockThreads = kThreads, kMinBlocks = 1;
    static constexpr int kWeightTile = kRows * 256, kTokenTile = kN * 256;  // operand tiles: 256 bytes of K a row
    using Rec = ScaleRecord<M>;
    static constexpr int kRecBytes = kTileUnits * kRows * Rec::kWords * 4;
    // rows on 16-byte boundaries (rows_aligned): a tile's phase in its row is its offset's
    static constexpr int kStride = kAligned ? Base::kRowStrideAligned : Base::kRowStride;
    static constexpr size_t kMaxSmem = 227 * 1024;
    // The float formats' weights (kDirect): copied straight into their swizzled weight tiles, three
    // stages like the activations' (two tiles ahead); no raw stages, no scale records, no
    // conversion. BF16 against the bf16 activations, F16 in f16 against their f16 copy (its
    // sums multiplied by the token's xh_scale on the way out), F32 in tf32 against the float
    // activations themselves (GemvArgs::x), 64 values a tile: a row's tile is 256 bytes in every case.
    static constexpr bool kDirect = kFloatUnit<M>;
    static constexpr GemmOperands kOps = T == TensorType::F16 ? GemmOperands::F16 : T == TensorType::F32 ? GemmOperands::Tf32 : GemmOperands::Bf16;
    static constexpr int kUnits = kOps == GemmOperands::Tf32 ? 2 : kTileUnits;  // 32-value units a K tile
    static_assert(!kDirect || kUnits * sizeof(typename M::Block) == 256, "a float row's tile is 256 bytes");
    static constexpr int kWeightStages = kDirect ? 3 : 2;
    static constexpr size_t smem(int raw) {
        return 1024 + kWeightStages * kWeightTile + kTokenStages * kTokenTile + (kDirect ? 0 : static_cast<size_t>(raw) * kRows * kStride + kRecBytes);
    }
    // raw stages: three where they fit (the copy two tiles ahead of the conversion), else two
    static constexpr int kRaw = smem(3) <= kMaxSmem ? 3 : 2;
    static constexpr size_t kSmem = smem(kRaw);

    static __device__ void run(const Args& a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        extern __shared__ uint4 smem_lines[];
        // (the 1024-byte boundary the swizzle needs, found by pointer arithmetic: shared loads stay shared loads)
        uint8_t* smem = reinterpret_cast<uint8_t*>(smem_lines) + ((1024 - (static_cast<unsigned>(__cvta_generic_to_shared(smem_lines)) & 1023)) & 1023);
        allow_next();
        const int tid = threadIdx.x, wg = tid / 128, wt = tid % 128, warp = wt / 32, lane = tid % 32;
        const int g = lane / 4, t = lane % 4;
        const int64_t bx = blockIdx.y, n0 = static_cast<int64_t>(blockIdx.x) * kN;
        const int64_t n_units = a.cols / 32;
        const int n_tiles = static_cast<int>((n_units + kUnits - 1) / kUnits);
        constexpr int row_stride = kStride, n_raw = kRaw;
        uint8_t* const weights = smem;                                  // kWeightStages converted weight tiles
        uint8_t* const tokens = weights + kWeightStages * kWeightTile;  // kTokenStages activation tiles
        uint8_t* const raw = tokens + kTokenStages * kTokenTile;        // n_raw stages of raw rows
        uint32_t* const recs = reinterpret_cast<uint32_t*>(raw + n_raw * kRows * row_stride);  // [unit][slot][word]
        auto raw_stage = [&](int k) { return raw + (k % n_raw) * (kRows * row_stride); };
        auto token_stage = [&](int k) { return tokens + (k % kTokenStages) * kTokenTile; };
        auto weight_tile = [&](int k) { return weights + (k % kWeightStages) * kWeightTile; };
        auto units_of = [&](int k) { return static_cast<int>(min(static_cast<int64_t>(kUnits), n_units - static_cast<int64_t>(k) * kUnits)); };

        // Copy duties: two threads per row slot, and sixteen per token (piece tid mod 16 of tokens
        // tid / 16 + 16i). Each copy's addresses are a base register and a constant, and a token
        // pointer is advanced one tile before its copy is issued, not after (cp.async holds its
        // address registers for a while: rewriting one at once stalls).
        const uint8_t* my_row = row_at(a, bx, tid / 2);
        const int half = tid % 2;
        auto copy_weights = [&](int k) {
            if (k >= n_tiles) return;
            if constexpr (kDirect) {  // the tile's 16-byte pieces half, half + 2, ... of the row into their places
                uint8_t* to = weight_tile(k);
                const uint8_t* from = my_row + 256 * static_cast<int64_t>(k);
                const int pieces = units_of(k) * kBlockBytes / 16;
#pragma unroll
                for (int c = half; c < 16; c += 2)
                    if (c < pieces) copy16(to + wg_offset(tid / 2, c, kRows), from + 16 * c);
                return;
            }
            uint8_t* to = raw_stage(k) + (tid / 2) * row_stride + 16 * half;
            if constexpr (kHalf > 0) {  // 16-byte aligned blocks: the pieces the tile's half reads
                const uint8_t* from = my_row + tile_byte(k) + 16 * half;
                const int h = tile_unit(k) / kTileUnits;
#pragma unroll
                for (int i = 0; i < (kHalf + 1) / 2; ++i) {
                    const int piece = 2 * i + half;
                    if (piece < kHalf) copy16(to + 32 * i, from + 32 * i + (piece < M::kHead ? 0 : 16 * M::kHalfQuantPieces * h));
                }
            } else {
                const int64_t bytes = M::kUnits == 1 ? units_of(k) * kBlockBytes : kBlockBytes;
                const uintptr_t b = reinterpret_cast<uintptr_t>(my_row + tile_byte(k));
                const uint8_t* lo = reinterpret_cast<const uint8_t*>(b & ~uintptr_t{15}) + 16 * half;
                const int pieces = static_cast<int>(((b + bytes + 15) & ~uintptr_t{15}) - (b & ~uintptr_t{15})) / 16;
#pragma unroll
                for (int i = 0; i < (kStride / 16 + 1) / 2; ++i)
                    if (2 * i + half < pieces) copy16(to + 32 * i, lo + 32 * i);
            }
        };
        // (the activations: 16-bit values, 4 pieces a unit, or with tf32 floats, 8)
        constexpr int kTokenCopies = kN * 16 / kThreads, kUnitPieces = kOps == GemmOperands::Tf32 ? 8 : 4;
        const int piece = tid % 16;
        const uint8_t* tok_src[kTokenCopies];  // token tid / 16 + 16i's piece of the last tile copied
#pragma unroll
        for (int i = 0; i < kTokenCopies; ++i) {
            const int64_t tok = min(n0 + tid / 16 + 16 * i, a.n_tokens - 1);
            tok_src[i] = (kOps == GemmOperands::Tf32 ? reinterpret_cast<const uint8_t*>(a.x + tok * a.x_stride) : reinterpret_cast<const uint8_t*>(a.xh + tok * a.xh_stride)) + 16 * piece;
        }
        const int tok_dst = wg_offset(tid / 16, piece, kN);  // (+ 2048 · i: the same swizzle row)
        auto copy_tokens = [&](int k) {  // (called for k = 0, 1, 2, ... in turn)
            uint8_t* to = token_stage(k) + tok_dst;
            const bool on = k < n_tiles && piece < units_of(k) * kUnitPieces;
#pragma unroll
            for (int i = 0; i < kTokenCopies; ++i) {
                if (k > 0) tok_src[i] += 256;
                if (on) copy16(to + 2048 * i, tok_src[i]);
            }
        };

        // This warpgroup's rows: slots 64·wg .. 64·wg + 63. A thread converts, per tile, the units
        // of two of them (slots 64·wg + 8·(2·warp + h) + gr, h = 0, 1: eight rows per warp and unit,
        // gr = 2·(g mod 4) + g / 4 so that each half warp's 8-byte stores meet every bank once) and
        // decodes the scales of one slot for two units.
        const int gr = 2 * (g % 4) + g / 4;
        uintptr_t mine[2];
        for (int h = 0; h < 2; ++h) mine[h] = reinterpret_cast<uintptr_t>(row_at(a, bx, 64 * wg + 8 * (2 * warp + h) + gr));
        const int scale_slot = 64 * wg + wt % 64, scale_u0 = (wt / 64) * 2;
        const uintptr_t scaled = reinterpret_cast<uintptr_t>(row_at(a, bx, scale_slot));
        const int barrier = 1 + wg;  // the warpgroup's own (barrier 0 is __syncthreads')
        auto wg_sync = [&] { asm volatile("bar.sync %0, 128;" ::"r"(barrier) : "memory"); };
        // tile k's scales, then its rows converted into weight tile k % 2 (free: its multiplies are
        // done); not for kDirect
        auto prepare = [&](int k) {
            if constexpr (!kDirect) {
                const int units = units_of(k), u0 = tile_unit(k);
                const int64_t offset = tile_byte(k);
                const uint8_t* sa = raw_stage(k);
                {
                    const uint8_t* row = sa + scale_slot * row_stride + ((scaled + offset) & 15);
#pragma unroll
                    for (int v = 0; v < 2; ++v)
                        if (scale_u0 + v < units) Rec::store(recs + ((scale_u0 + v) * kRows + scale_slot) * Rec::kWords, M::scale(row, u0 + scale_u0 + v));
                }
                wg_sync();
                uint8_t* w = weight_tile(k);
                auto convert = [&](int h, int u) {
                    const int slot = 64 * wg + 8 * (2 * warp + h) + gr;
                    const uint2 q = M::quants(sa + slot * row_stride + ((mine[h] + offset) & 15), u0 + u, t);
                    const uint4 r = Rec::load(recs + (u * kRows + slot) * Rec::kWords);
                    uint32_t w0, w1, w2, w3;
                    to_bf16<M>(q.x, r.x, r.z, w0, w1);  // elements 32u + 4t ..
                    to_bf16<M>(q.y, r.y, r.w, w2, w3);  // elements 32u + 16 + 4t ..
                    const int chunk = 4 * u + t / 2;
                    *reinterpret_cast<uint2*>(w + wg_offset(slot, chunk, kRows) + 8 * (t % 2)) = make_uint2(w0, w1);
                    *reinterpret_cast<uint2*>(w + wg_offset(slot, chunk + 2, kRows) + 8 * (t % 2)) = make_uint2(w2, w3);
                };
                if (units == kTileUnits) {
#pragma unroll
                    for (int h = 0; h < 2; ++h)
#pragma unroll
                        for (int u = 0; u < kTileUnits; ++u) convert(h, u);
                } else {
                    for (int h = 0; h < 2; ++h)
                        for (int u = 0; u < units; ++u) convert(h, u);
                }
                fence_async_smem();
                wg_sync();  // the tile is in for this warpgroup's multiplies; the records are free
            }
        };
        // The first raw tiles (kDirect: weight tiles 0 and 1) before waiting for the input, then the
        // first two activation tiles. Copy groups: the prologue's two (raw tiles 0 .. n_raw − 1 and
        // activations 0; activations 1), then one a tile (tile k: activations k + 2, raw rows k +
        // n_raw; kDirect: weight tile k + 2).
        const int ahead = kDirect ? 2 : n_raw;
        for (int k = 0; k < ahead; ++k) copy_weights(k);
        wait_inputs();
        copy_tokens(0);
        commit();
        copy_tokens(1);
        commit();
        float acc[kN / 2];
#pragma unroll
        for (int i = 0; i < kN / 2; ++i) acc[i] = 0.0f;
        wait_pending<1>();
        if constexpr (!kDirect) {
            __syncthreads();
            prepare(0);
        }
        for (int k = 0; k < n_tiles; ++k) {
            // Tile k's activations and tile k + 1's raw rows have landed for every thread (with
            // three raw stages they are in the groups before the newest; kDirect: tile k's group
            // waited for last iteration), and every warpgroup is done with tile k − 1: the stages
            // it held are free.
            if constexpr (!kDirect) wait_pending<n_raw == 3 ? 1 : 0>();
            fence_async_smem();
            __syncthreads();
            copy_tokens(k + 2);       // (over tile k − 1's)
            copy_weights(k + ahead);  // (over tile k's raw rows, converted last iteration; kDirect: over tile k − 1's)
            commit();
            // tile k's multiplies, in flight while tile k + 1 is converted
            wg_fence_regs(acc);
            wg_fence();
            {
                const uint8_t* wa = weight_tile(k) + 64 * wg * 128;
                const uint8_t* xb = token_stage(k);
                auto step = [&](int s) {
                    wgmma_m64n128<kOps>(acc, wg_desc(wa + (s / 4) * (kRows * 128) + (s % 4) * 32), wg_desc(xb + (s / 4) * (kN * 128) + (s % 4) * 32));
                };
                constexpr int kUnitSteps = kOps == GemmOperands::Tf32 ? 4 : 2;  // steps (of 32 bytes of K) a unit
                const int steps = kUnitSteps * units_of(k);
                if (steps == 8) {  // (no branch between the multiplies of a whole tile)
#pragma unroll
                    for (int s = 0; s < 8; ++s) step(s);
                } else {
                    for (int s = 0; s < steps; ++s) step(s);
                }
            }
            wg_commit();
            if (k + 1 < n_tiles) {
                if constexpr (kDirect) {
                    wait_pending<1>();  // (tile k + 1's group: all but the one just issued)
                } else {
                    prepare(k + 1);  // (weight tile (k + 1) % 2: tile k − 1's multiplies are done)
                }
            }
            wg_wait<0>();
        }
        wg_fence_regs(acc);

        // Out: d[4j + e] is slot 64·wg + 16·warp + g + 8·(e / 2), token n0 + 8j + 2t + e % 2.
        if constexpr (kOps == GemmOperands::F16) {  // (the token's scale first, as Gemm's)
#pragma unroll
            for (int j = 0; j < kN / 8; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int64_t tok = n0 + j * 8 + 2 * t + e;
                    const float scale = tok < a.n_tokens ? a.xh_scale[tok] : 1.0f;
                    acc[4 * j + e] *= scale;
                    acc[4 * j + 2 + e] *= scale;
                }
        }
        const bool gated = a.glu != Glu::None;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int64_t r;
            const int p = slot_row(a, bx, 64 * wg + 16 * warp + g + 8 * h, &r);
            if (p < 0 || (gated && h == 1)) continue;  // (the up rows: consumed with their gate rows)
            const GemvPart& part = p == 0 ? a.part[0] : p == 1 ? a.part[1] : a.part[2];
            const float bias = part.bias ? part.bias[r] : 0.0f;
            store_sums<kN / 8>(
                a, part, r, [&](int j, int e) { return n0 + j * 8 + 2 * t + e; },
                [&](int j, int e) { return gated ? gate_act(a.glu, acc[4 * j + 2 * h + e]) * acc[4 * j + 2 + e] : acc[4 * j + 2 * h + e] + bias; });
        }
#else
        (void)a;
        __trap();  // (launched only where wgmma_device(): never without sm_90a code)
#endif
    }
};

template <TensorType T, int kSplit>
Launch launch(const GemvArgs& a, dim3 grid, bool aligned) {
    using K = Gemm<T, kSplit>;
    allow_smem<K>(K::kSmem);
    return make_launch<K>(grid, dim3(K::kThreads), a, K::smem(aligned));
}

// The Hopper kernel (GemmWg) where the build has sm_90a machine code and the device is a
// compute capability 9.0 one (EDGERUNNER_CUDA_WGMMA=0: the mma.sync kernel there too, for measurements).
bool wgmma_device() {
#if defined(ER_CUDA_SM90A)
    static const bool off = [] {
        const char* env = std::getenv("EDGERUNNER_CUDA_WGMMA");
        return env && std::string(env) == "0";
    }();
    static PerGpu<bool> hopper;
    return !off && hopper([](int device) {
        int major = 0, minor = 0;
        return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
               cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess && major == 9 && minor == 0;
    });
#else
    return false;
#endif
}

// Whether a format's wgmma kernel fits a block's shared memory with two raw stages (rows anywhere;
// the float formats' values go straight into the tiles, GemmWg::kDirect: they need none).
template <TensorType T>
constexpr bool kWgmmaFits = GemmWg<T, false>::smem(GemmWg<T, false>::kDirect ? 0 : 2) <= GemmWg<T, false>::kMaxSmem;

template <class K>
Launch launch_wg(const GemvArgs& a) {
    allow_smem<K>(K::kSmem);
    const int64_t per_block = a.glu != Glu::None ? K::kRows / 2 : K::kRows;
    const dim3 grid(static_cast<unsigned>((a.n_tokens + K::kTokens - 1) / K::kTokens), static_cast<unsigned>((gemv_rows(a) + per_block - 1) / per_block));
    return make_launch<K>(grid, dim3(K::kThreads), a, K::kSmem);
}

// Where Auto takes the wgmma kernel: K of 1024 or more and a grid of a quarter of the SMs or
// more (measured on the H200, pp512: 8B +30 to +41 %, Llama-3.2-1B +14 to +24 %; SmolLM2's
// matrices, K of 576 and grids of 20 to 96 blocks, lost 3 to 7 % with it and keep mma.sync).
bool wgmma_wanted(const GemvArgs& a) {
    const int64_t per_block = a.glu != Glu::None ? 64 : 128;
    const int64_t blocks = (a.n_tokens + 127) / 128 * ((gemv_rows(a) + per_block - 1) / per_block);
    return a.cols >= 1024 && 4 * blocks >= sm_count();
}

// Whether these arguments take the wgmma kernel (else mma.sync): asked for by name, or by Auto
// where wgmma_wanted. F32's reads the float activations, copied in 16-byte pieces.
template <TensorType T>
bool takes_wgmma(const GemvArgs& a, GemmKernel kernel) {
    bool wgmma = false;
    if constexpr (kWgmmaFits<T>) wgmma = wgmma_device() && GemmWg<T, false>::kSmem <= smem_per_block();
    if (kernel == GemmKernel::Wgmma && !wgmma)
        throw std::invalid_argument(!kWgmmaFits<T> ? "the wgmma GEMM takes no " + std::string(tensor_type_name(T)) + " weights (the mma.sync kernel does)"
                                                   : std::string("the wgmma GEMM needs a compute capability 9.0 device and a build with sm_90a code"));
    if (!wgmma || !(kernel == GemmKernel::Wgmma || (kernel == GemmKernel::Auto && wgmma_wanted(a)))) return false;
    if (T == TensorType::F32 && (reinterpret_cast<uintptr_t>(a.x) % 16 != 0 || a.x_stride % 4 != 0)) {
        if (kernel == GemmKernel::Wgmma) throw std::logic_error("the wgmma GEMM reads F32 weights' float activations from 16-byte boundaries");
        return false;
    }
    return true;
}

template <TensorType T>
Launch launch(const GemvArgs& a, GemmKernel kernel) {
    const bool aligned = rows_aligned(a);
    if ((kHalfPieces<MmaUnit<T>> > 0 || kFloatUnit<MmaUnit<T>>) && !aligned)  // staged as 16-byte pieces, or read as floats
        throw std::logic_error("the tensor-core GEMM reads " + std::string(tensor_type_name(T)) + " weights from 16-byte boundaries");
    if (T == TensorType::F16 && !a.xh_scale) throw std::logic_error("the tensor-core GEMM of F16 weights needs its f16 input's per-token scales");
    const bool wgmma = takes_wgmma<T>(a, kernel);
    if constexpr (kWgmmaFits<T>)
        if (wgmma) return aligned ? launch_wg<GemmWg<T, true>>(a) : launch_wg<GemmWg<T, false>>(a);
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
        ER_MMA(Q6_K) ER_MMA(IQ4_XS) ER_MMA(F32) ER_MMA(F16) ER_MMA(BF16)
#undef ER_MMA
        default: return false;
    }
}

bool gemm_has_wgmma() { return wgmma_device(); }

GemmOperands gemm_operands(TensorType type, const GemvArgs& a, GemmKernel kernel) {
    if (type == TensorType::F16) return GemmOperands::F16;
    if (type == TensorType::F32 && takes_wgmma<TensorType::F32>(a, kernel)) return GemmOperands::Tf32;
    return GemmOperands::Bf16;
}

Launch gemm(TensorType type, const GemvArgs& a, GemmKernel kernel) {
    switch (type) {
        case TensorType::Q4_0: return launch<TensorType::Q4_0>(a, kernel);
        case TensorType::Q4_1: return launch<TensorType::Q4_1>(a, kernel);
        case TensorType::Q5_0: return launch<TensorType::Q5_0>(a, kernel);
        case TensorType::Q5_1: return launch<TensorType::Q5_1>(a, kernel);
        case TensorType::Q8_0: return launch<TensorType::Q8_0>(a, kernel);
        case TensorType::Q4_K: return launch<TensorType::Q4_K>(a, kernel);
        case TensorType::Q5_K: return launch<TensorType::Q5_K>(a, kernel);
        case TensorType::Q6_K: return launch<TensorType::Q6_K>(a, kernel);
        case TensorType::IQ4_NL: return launch<TensorType::IQ4_NL>(a, kernel);
        case TensorType::Q3_K: return launch<TensorType::Q3_K>(a, kernel);
        case TensorType::IQ4_XS: return launch<TensorType::IQ4_XS>(a, kernel);
        case TensorType::Q2_K: return launch<TensorType::Q2_K>(a, kernel);
        case TensorType::F32: return launch<TensorType::F32>(a, kernel);
        case TensorType::F16: return launch<TensorType::F16>(a, kernel);
        case TensorType::BF16: return launch<TensorType::BF16>(a, kernel);
        default: throw std::invalid_argument("the CUDA tensor-core GEMM has no kernel for " + std::string(tensor_type_name(type)));
    }
}

}  // namespace edgerunner::cuda
