// Prefill matmuls on the tensor cores: Y = W · X for a chunk of tokens, int8 mma.m16n8k32 on the
// raw weight blocks and the int8 activations (QBlock) the one-token GEMV reads, so a prompt and
// a decode step multiply the same integers. A block of 8 warps computes 128 weight rows × 64
// tokens; the K dimension goes tile by tile (4 blocks, or one 256-element super-block), each
// tile's raw weight bytes and QBlocks copied by cp.async into a ring of shared-memory stages while
// the previous tile is multiplied. Per 32-element unit a warp turns its rows' bytes into mma
// operands (quant_mma.cuh), multiplies them with its tokens' int8 values into exact int32 sums,
// and adds them, scaled by the weight's and the activation's block scales, to float accumulators.
// Same fusions as the GEMV: several matrices sharing an input (rows numbered across them), the
// gated pair (a warp holds a gate row and its up row: act(gate)·up on the way out), the
// residual added, a bias.
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "async_copy.cuh"
#include "gemv.cuh"
#include "quant_mma.cuh"
#include "warp.cuh"

namespace edgerunner::cuda {
namespace {

constexpr int kBM = 128, kBN = 64;  // weight row slots × tokens per block
constexpr int kThreads = 256;       // 8 warps: 4 along the rows (32 slots each) × 2 along the tokens (32 each)
constexpr int kQBytes = sizeof(QBlock);

constexpr int pad_stride(int bytes) { return (bytes + 31) / 32 * 32 + 16; }  // an odd number of 16-byte lines

// int32 sums read as floats: C starts at 1.5·2^23, so the float bits of C + Σ are 1.5·2^23 + Σ
// exactly while |Σ| < 2^22 (a 32-element unit's int8 dot is at most 32·128·128 = 2^19).
constexpr int kBiasBits = 0x4B400000;
constexpr float kBias = 12582912.0f;

__device__ __forceinline__ void mma_k32(int (&c)[4], const int (&a)[4], int b0, int b1, int init) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(init));
}
__device__ __forceinline__ void mma_k16(int (&c)[4], int a0, int a1, int b0) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}

template <TensorType T>
struct Gemm {
    using Args = GemvArgs;
    using M = MmaUnit<T>;
    // two blocks per SM: registers capped at 128 (the K-quants' 148–167 otherwise left one block
    // of 8 warps per SM; two measured 10–22 % faster prefill)
    static constexpr int kBlockThreads = kThreads, kMinBlocks = 2;
    static constexpr int kTileUnits = M::kUnits == 8 ? 8 : 4;  // 32-element units per K tile
    static constexpr int kRawBytes = kTileUnits / M::kUnits * static_cast<int>(sizeof(typename M::Block));  // a row's bytes per tile
    static constexpr int kRowStride = pad_stride(kRawBytes + 15);   // + room to start on the source's 16-byte phase
    static constexpr int kTokStride = pad_stride(kTileUnits * kQBytes);
    static constexpr int kStageBytes = kBM * kRowStride + kBN * kTokStride;
    static constexpr int kStages = kStageBytes <= 40 * 1024 ? 3 : 2;
    static constexpr int kSumBytes = M::kMin ? kBN * kTileUnits * 4 : 0;
    static constexpr size_t kSmem = static_cast<size_t>(kStages) * kStageBytes + kSumBytes;

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

    static __device__ void run(const Args& a) {
        extern __shared__ uint4 smem_lines[];
        uint8_t* smem = reinterpret_cast<uint8_t*>(smem_lines);
        allow_next();
        const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
        const int g = lane / 4, t = lane % 4;
        const int wm = warp % 4, wn = warp / 4;
        const int64_t bx = blockIdx.x, n0 = static_cast<int64_t>(blockIdx.y) * kBN;
        const int64_t n_units = a.cols / 32;
        const int n_tiles = static_cast<int>((n_units + kTileUnits - 1) / kTileUnits);

        // Copy duties: two threads per row slot, four per token (rows and tokens past the end
        // copy the last valid one: their results are never stored).
        const uint8_t* my_row;
        {
            int64_t r;
            int p = slot_row(a, bx, tid / 2, &r);
            if (p < 0) p = 0, r = a.part[0].rows - 1;  // a valid row to copy
            my_row = (p == 0 ? a.part[0].w : p == 1 ? a.part[1].w : a.part[2].w) + static_cast<size_t>(r) * a.row_bytes;
        }
        const int64_t my_tok = min(n0 + tid / 4, a.n_tokens - 1);
        const uint8_t* my_q = reinterpret_cast<const uint8_t*>(a.xq + my_tok * a.xq_stride);
        auto stage = [&](int k) { return smem + (k % kStages) * kStageBytes; };
        auto copy_weights = [&](int k) {
            if (k >= n_tiles) return;
            const int64_t u0 = static_cast<int64_t>(k) * kTileUnits;
            const int64_t bytes = min(static_cast<int64_t>(kTileUnits), n_units - u0) / M::kUnits * sizeof(typename M::Block);
            stage_copy(stage(k) + (tid / 2) * kRowStride, my_row + u0 / M::kUnits * sizeof(typename M::Block),
                       static_cast<size_t>(bytes), tid % 2, 2);
        };
        auto copy_tokens = [&](int k) {
            if (k >= n_tiles) return;
            const int64_t u0 = static_cast<int64_t>(k) * kTileUnits;
            const int64_t bytes = min(static_cast<int64_t>(kTileUnits), n_units - u0) * kQBytes;
            stage_copy(stage(k) + kBM * kRowStride + (tid / 4) * kTokStride, my_q + u0 * kQBytes, static_cast<size_t>(bytes), tid % 4, 4);
        };
        // the first tiles' weights before waiting for the input, then their activations
        for (int k = 0; k < kStages - 1; ++k) copy_weights(k);
        wait_inputs();
        for (int k = 0; k < kStages - 1; ++k) {
            copy_tokens(k);
            commit();
        }

        // This thread's four weight rows (m-tile i: rows g, g + 8) in global memory: a staged tile
        // lies at (row + tile offset) mod 16 in its slot, as the copy keeps the source's phase.
        uintptr_t row_at[2][2];
        for (int i = 0; i < 2; ++i)
            for (int h = 0; h < 2; ++h) {
                int64_t r;
                int p = slot_row(a, bx, wm * 32 + i * 16 + g + 8 * h, &r);
                if (p < 0) p = 0, r = a.part[0].rows - 1;
                row_at[i][h] = reinterpret_cast<uintptr_t>((p == 0 ? a.part[0].w : p == 1 ? a.part[1].w : a.part[2].w) +
                                                          static_cast<size_t>(r) * a.row_bytes);
            }

        float acc[2][4][4] = {};  // [m-tile][n-tile][c element]
        for (int k = 0; k < n_tiles; ++k) {
            wait_pending<kStages - 2>();
            __syncthreads();  // tile k is in for every thread, and tile k - 1's stage is free
            copy_weights(k + kStages - 1);
            copy_tokens(k + kStages - 1);
            commit();
            const uint8_t* sa = stage(k);
            const uint8_t* sb = sa + kBM * kRowStride;
            const int units = static_cast<int>(min(static_cast<int64_t>(kTileUnits), n_units - static_cast<int64_t>(k) * kTileUnits));
            float* sums = reinterpret_cast<float*>(smem + kStages * kStageBytes);
            if constexpr (M::kMin) {  // d_x · Σ q_x per token and unit: the weights' offset term
                for (int j = tid; j < kBN * kTileUnits; j += kThreads) {
                    const uint8_t* q = sb + (j / kTileUnits) * kTokStride + (j % kTileUnits) * kQBytes;
                    int s = 0;
#pragma unroll
                    for (int w = 0; w < 8; ++w) s = __dp4a(kOnes, *reinterpret_cast<const int*>(q + 4 + 4 * w), s);
                    sums[j] = *reinterpret_cast<const float*>(q) * static_cast<float>(s);
                }
                __syncthreads();
            }
            const size_t tile_offset = static_cast<size_t>(k) * kRawBytes;
#pragma unroll 2
            for (int u = 0; u < units; ++u) {
                MmaFrag f[2][2];
                for (int i = 0; i < 2; ++i)
                    for (int h = 0; h < 2; ++h)
                        f[i][h] = M::load(sa + (wm * 32 + i * 16 + g + 8 * h) * kRowStride + ((row_at[i][h] + tile_offset) & 15), u, t);
                int b[4][2];
                float dx[4][2], sx[4][2];
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const uint8_t* q = sb + (wn * 32 + j * 8 + g) * kTokStride + u * kQBytes + 4;
                    b[j][0] = *reinterpret_cast<const int*>(q + 4 * t);
                    b[j][1] = *reinterpret_cast<const int*>(q + 16 + 4 * t);
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int tok = wn * 32 + j * 8 + 2 * t + e;
                        dx[j][e] = *reinterpret_cast<const float*>(sb + tok * kTokStride + u * kQBytes);
                        if constexpr (M::kMin) sx[j][e] = sums[tok * kTileUnits + u];
                    }
                }
#pragma unroll
                for (int i = 0; i < 2; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        int c[4];
                        if constexpr (M::kTwoScales) {
                            int c1[4];
                            mma_k16(c, f[i][0].lo, f[i][1].lo, b[j][0]);
                            mma_k16(c1, f[i][0].hi, f[i][1].hi, b[j][1]);
#pragma unroll
                            for (int e = 0; e < 4; ++e) {
                                const MmaFrag& w = f[i][e / 2];
                                acc[i][j][e] += static_cast<float>(w.s0 * c[e] + w.s1 * c1[e]) * (w.d * dx[j][e % 2]);
                            }
                        } else {
                            const int a4[4] = {f[i][0].lo, f[i][1].lo, f[i][0].hi, f[i][1].hi};
                            mma_k32(c, a4, b[j][0], b[j][1], kBiasBits);
#pragma unroll
                            for (int e = 0; e < 4; ++e) {
                                const MmaFrag& w = f[i][e / 2];
                                float v = (__int_as_float(c[e]) - kBias) * (w.d * dx[j][e % 2]);
                                if constexpr (M::kMin) v = fmaf(w.m, sx[j][e % 2], v);
                                acc[i][j][e] += v;
                            }
                        }
                    }
            }
        }

        // Out: element e of (m-tile i, n-tile j) is row slot wm·32 + i·16 + g + 8·(e / 2), token
        // wn·32 + j·8 + 2t + e % 2.
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
                for (int j = 0; j < 4; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int64_t tok = n0 + wn * 32 + j * 8 + 2 * t + e;
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

template <TensorType T>
Launch launch(const GemvArgs& a) {
    using K = Gemm<T>;
    static const bool sized = allow_smem<K>(K::kSmem);
    (void)sized;
    const int64_t rows = a.glu != Glu::None ? a.part[0].rows
                                            : a.part[0].rows + (a.n_parts > 1 ? a.part[1].rows : 0) + (a.n_parts > 2 ? a.part[2].rows : 0);
    const int64_t per_block = a.glu != Glu::None ? kBM / 2 : kBM;
    return make_launch<K>(dim3(static_cast<unsigned>((rows + per_block - 1) / per_block), static_cast<unsigned>((a.n_tokens + kBN - 1) / kBN)),
                          dim3(kThreads), a, K::kSmem);
}

}  // namespace

bool gemm_supports(TensorType type, const GemvArgs& a) {
    // the activations' rows must start on 16-byte boundaries (the copies take whole lines)
    const bool aligned = reinterpret_cast<uintptr_t>(a.xq) % 16 == 0 && (a.xq_stride * kQBytes) % 16 == 0;
    if (!aligned || a.n_tokens < kPrefillKernelTokens) return false;
    switch (type) {
        case TensorType::Q4_0: case TensorType::Q4_1: case TensorType::Q5_0: case TensorType::Q5_1: case TensorType::Q8_0:
        case TensorType::IQ4_NL: case TensorType::Q3_K: case TensorType::Q4_K: case TensorType::Q5_K: case TensorType::Q6_K:
        case TensorType::IQ4_XS: return true;
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
        default: throw std::invalid_argument("the CUDA tensor-core GEMM has no kernel for " + std::string(tensor_type_name(type)));
    }
}

}  // namespace edgerunner::cuda
