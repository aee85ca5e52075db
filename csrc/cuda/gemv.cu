// Quantized matrix-vector products: one warp per weight row (or gate and up row pair), lanes
// striding over the row's 32-element units (a whole unit per lane against int8 activations for
// Q4_0, Q4_K and Q5_K, four lanes to a unit for the other int8 formats, quant_quarter.cuh; one
// lane to a unit with float activations otherwise, quant_unit.cuh), a shuffle reduction, one
// store (or add: the residual; or act(gate)·up). Before it waits for its input, each warp pulls
// its whole row towards L2: the weights do not depend on the previous kernel, so they stream
// while it drains, and the loads of the loop find them near.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

#include "async_copy.cuh"
#include "check.cuh"
#include "cuda.h"
#include "gemv.cuh"
#include "quant_quarter.cuh"
#include "warp.cuh"

namespace edgerunner::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

// Field f of part p (selects, not an indexed parameter array, which would go to local memory).
template <typename F>
__device__ __forceinline__ F field(const GemvArgs& a, int p, F GemvPart::*f) {
    return p == 0 ? a.part[0].*f : p == 1 ? a.part[1].*f : a.part[2].*f;
}

// Tokens [NT·blockIdx.y, +NT): each weight unit is loaded once for NT tokens.
template <TensorType T, int NT>
struct Gemv {
    using Args = GemvArgs;
    static __device__ void run(const Args& a) {
        allow_next();
        const int lane = threadIdx.x % 32;
        int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
        // which part the warp's row is in
        int p = 0;
        if (a.glu == Glu::None) {
            if (a.n_parts > 1 && r >= a.part[0].rows) r -= a.part[0].rows, p = 1;
            if (p == 1 && a.n_parts > 2 && r >= a.part[1].rows) r -= a.part[1].rows, p = 2;
        }
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
        if constexpr (Whole<T>::kFast) {
            // a lane per unit: lane l takes units l, l + 32, ... (as the one-token kernel)
            const QBlock* xq = a.xq + t0 * a.xq_stride;
            for (int64_t u = lane; u < a.cols / 32; u += 32)
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    if (t >= nt) break;
                    const XUnit x = load_x(xq[t * a.xq_stride + u]);
                    sum[t] += Whole<T>::dot(row, u, x);
                    if (gated) sum2[t] += Whole<T>::dot(row2, u, x);
                }
        } else if constexpr (Quarter<T>::kFast) {
            // lanes 4i..4i+3 share unit i of the warp's 8: quarters side by side in memory
            const int k = lane % 4;
            const QBlock* xq = a.xq + t0 * a.xq_stride;
#pragma unroll 4
            for (int64_t u = lane / 4; u < a.cols / 32; u += 8)
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    if (t >= nt) break;
                    const QBlock& x = xq[t * a.xq_stride + u];
                    sum[t] += Quarter<T>::dot(row, u, k, x);
                    if (gated) sum2[t] += Quarter<T>::dot(row2, u, k, x);
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
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            if (t >= nt) break;
            float v = warp_sum(sum[t]);
            if (gated) v = gate_act(a.glu, v) * warp_sum(sum2[t]);
            if (lane == 0) {
                if (const float* bias = field(a, p, &GemvPart::bias)) v += bias[r];
                float* out = field(a, p, &GemvPart::y) + (t0 + t) * field(a, p, &GemvPart::y_stride) + r;
                *out = a.accumulate ? *out + v : v;
            }
        }
    }
};

// The one-token GEMV of the int8 formats, staged through shared memory. A block of eight warps
// loads the int8 activations into shared memory once; each warp takes two rows (or a gate row
// and its up row) and streams them through a ring of three chunk buffers: every lane copies
// 16-byte pieces of the raw bytes (cp.async), so three chunks per row are in flight while one is
// computed, and the dot products read blocks and activations out of shared memory (Q4_0, Q4_K,
// Q5_K: chunks of 32 units, a unit per lane; the others: four lanes per unit). Global loads are thus
// full-width and coalesced whatever the block size (18, 20, 22, 24, 34, 144, 176, 210 bytes), and
// the first chunks are requested before the kernel waits for its input. (The whole unit per lane
// issues about half the instructions per weight byte of the quarters: the kernel is issue-bound,
// bench/NOTES.md.)
constexpr int kStagedWarps = 8;
constexpr int64_t kMaxStagedCols = 65536;  // activations of up to this many columns in shared memory (72 KiB)
constexpr int kStage = 1024;               // bytes of one row per chunk (at most)
constexpr int kStageBytes = kStage + 32;   // + room to start and end on 16-byte boundaries
constexpr int kRing = 3;                   // chunk buffers per row
constexpr int kSlots = 2;                  // rows per warp
constexpr size_t kWeightSmem = static_cast<size_t>(kStagedWarps) * kRing * kSlots * kStageBytes;

template <TensorType T, bool Wide>  // Wide: a lane per unit (Whole<T>), 32 units per chunk
struct GemvStaged {
    using Args = GemvArgs;
    using Q = Quarter<T>;
    static constexpr int kBlockBytes = sizeof(typename Q::Block);
    static_assert(kBlockBytes <= kStage, "a chunk holds at least one block");
    static_assert(!Wide || (Whole<T>::kFast && 32 % Q::kUnits == 0 && 32 / Q::kUnits * kBlockBytes <= kStage), "32 units a chunk");

    static __device__ void run(const Args& a) {
        extern __shared__ uint4 smem[];
        allow_next();
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        const int64_t wg = static_cast<int64_t>(blockIdx.x) * kStagedWarps + warp;
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

        // chunks of equal block counts, each at most kStage bytes
        const int64_t n_blocks = a.cols / (32 * Q::kUnits);
        const int64_t per_chunk = Wide ? 32 / Q::kUnits : kStage / kBlockBytes;
        const int64_t n_chunks = (n_blocks + per_chunk - 1) / per_chunk;
        const int64_t chunk_blocks = Wide ? per_chunk : (n_blocks + n_chunks - 1) / n_chunks;
        uint8_t* stage = reinterpret_cast<uint8_t*>(smem) + static_cast<size_t>(warp) * kRing * kSlots * kStageBytes;
        // chunk c of row s: where it lands in ring buffer c % kRing
        auto staged = [&](int64_t c, int s) {
            return stage + ((c % kRing) * kSlots + s) * kStageBytes + (reinterpret_cast<uintptr_t>(row[s] + c * chunk_blocks * kBlockBytes) & 15);
        };
        // chunk c of the warp's rows into its ring buffer: one commit group (empty past the end)
        auto issue = [&](int64_t c) {
            if (c < n_chunks) {
                const int64_t b0 = c * chunk_blocks, nb = min(chunk_blocks, n_blocks - b0);
#pragma unroll
                for (int s = 0; s < kSlots; ++s)
                    if (row[s])
                        stage_copy(stage + ((c % kRing) * kSlots + s) * kStageBytes, row[s] + b0 * kBlockBytes,
                                   static_cast<size_t>(nb) * kBlockBytes, lane, 32);
            }
            commit();
        };
        for (int c = 0; c < kRing; ++c) issue(c);
        wait_inputs();
        // the activations, once for the block's 16 rows (plain 16-byte loads: the copy groups
        // above stay the weights')
        {
            const uintptr_t b = reinterpret_cast<uintptr_t>(a.xq), lo = b & ~uintptr_t{15};
            const uintptr_t hi = (b + static_cast<uintptr_t>(a.cols / 32) * sizeof(QBlock) + 15) & ~uintptr_t{15};
            uint8_t* dst = reinterpret_cast<uint8_t*>(smem) + kWeightSmem;
            for (uintptr_t off = 16 * threadIdx.x; off < hi - lo; off += 16 * blockDim.x)
                *reinterpret_cast<uint4*>(dst + off) = *reinterpret_cast<const uint4*>(lo + off);
            __syncthreads();
        }
        const QBlock* xs = reinterpret_cast<const QBlock*>(reinterpret_cast<uint8_t*>(smem) + kWeightSmem +
                                                           (reinterpret_cast<uintptr_t>(a.xq) & 15));

        float sum[kSlots] = {};
        const int k = lane % 4;
        if (row[0])
            for (int64_t c = 0; c < n_chunks; ++c) {
                wait_pending<kRing - 1>();  // this lane's pieces of chunk c have landed ...
                __syncwarp();   // ... and every lane's
                const int64_t units = min(chunk_blocks, n_blocks - c * chunk_blocks) * Q::kUnits;
                const QBlock* x = xs + c * chunk_blocks * Q::kUnits;
                const uint8_t* w0 = staged(c, 0);
                const uint8_t* w1 = row[1] ? staged(c, 1) : nullptr;
                if constexpr (Wide) {
                    if (lane < units) {  // one unit a lane
                        const XUnit xu = load_x(x[lane]);
                        sum[0] += Whole<T>::dot(w0, lane, xu);
                        if (w1) sum[1] += Whole<T>::dot(w1, lane, xu);
                    }
                } else {
#pragma unroll 4
                    for (int64_t u = lane / 4; u < units; u += 8) {
                        sum[0] += Q::dot(w0, u, k, x[u]);
                        if (w1) sum[1] += Q::dot(w1, u, k, x[u]);
                    }
                }
                __syncwarp();  // everyone is done with this buffer
                issue(c + kRing);
            }
        const float v0 = warp_sum(sum[0]), v1 = warp_sum(sum[1]);
        if (lane == 0 && row[0]) {
            if (gated) {
                a.part[0].y[r[0]] = gate_act(a.glu, v0) * v1;
            } else {
#pragma unroll
                for (int s = 0; s < kSlots; ++s) {
                    if (!row[s]) continue;
                    float v = s == 0 ? v0 : v1;
                    if (const float* bias = field(a, part[s], &GemvPart::bias)) v += bias[r[s]];
                    float* out = field(a, part[s], &GemvPart::y) + r[s];
                    *out = a.accumulate ? *out + v : v;
                }
            }
        }
    }

    static size_t smem(const GemvArgs& a) { return kWeightSmem + static_cast<size_t>(a.cols / 32) * sizeof(QBlock) + 32; }
};

template <class K>
Launch staged(const GemvArgs& a, int64_t rows) {
    const int64_t warps = a.glu != Glu::None ? rows : (rows + kSlots - 1) / kSlots;
    const size_t smem = K::smem(a);
    static const bool sized = allow_smem<K>(K::smem(GemvArgs{}) + kMaxStagedCols / 32 * sizeof(QBlock));
    (void)sized;
    if (smem > kWeightSmem + kMaxStagedCols / 32 * sizeof(QBlock) + 32)
        throw std::invalid_argument("the CUDA GEMV takes rows of up to " + std::to_string(kMaxStagedCols) + " columns");
    return make_launch<K>(dim3(static_cast<unsigned>((warps + kStagedWarps - 1) / kStagedWarps)), dim3(32 * kStagedWarps), a, smem);
}

// A step of one token (decode) takes the one-token kernel; several tokens share weight loads
// eight at a time.
template <TensorType T>
Launch launch(const GemvArgs& a) {
    const int64_t rows = a.glu != Glu::None ? a.part[0].rows : a.part[0].rows + (a.n_parts > 1 ? a.part[1].rows : 0) + (a.n_parts > 2 ? a.part[2].rows : 0);
    const dim3 block(32 * kWarpsPerBlock);
    const unsigned row_blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
    if (a.n_tokens == 1) {
        if constexpr (Quarter<T>::kFast) return staged<GemvStaged<T, Whole<T>::kFast>>(a, rows);
        else return make_launch<Gemv<T, 1>>(dim3(row_blocks, 1), block, a);
    }
    return make_launch<Gemv<T, 8>>(dim3(row_blocks, static_cast<unsigned>((a.n_tokens + 7) / 8)), block, a);
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

// Device memory owned by a unique_ptr.
struct Free {
    void operator()(void* p) const noexcept { cudaFree(p); }
};
template <typename T>
std::unique_ptr<T, Free> device_alloc(size_t count) {
    void* p = nullptr;
    ER_CUDA(cudaMalloc(&p, count * sizeof(T) + (count == 0)));
    return std::unique_ptr<T, Free>(static_cast<T*>(p));
}

// One warp per 32-value block.
struct Quantize {
    using Args = QuantizeArgs;
    static __device__ void run(const Args& a) {
        allow_next();
        wait_inputs();
        const int64_t per_token = a.cols / 32;
        const int64_t g = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
        if (g >= a.n_tokens * per_token) return;
        const int lane = threadIdx.x % 32;
        const int64_t t = g / per_token, b = g % per_token;
        quantize_block(a.x[t * a.x_stride + 32 * b + lane], a.out[t * a.out_stride + b], lane);
    }
};

}  // namespace

bool gemv_supports(TensorType type) { return launcher(type) != nullptr; }

bool gemv_wants_q8(TensorType type) {
    switch (type) {
        case TensorType::Q4_0: return Quarter<TensorType::Q4_0>::kFast;
        case TensorType::Q4_1: return Quarter<TensorType::Q4_1>::kFast;
        case TensorType::Q5_0: return Quarter<TensorType::Q5_0>::kFast;
        case TensorType::Q5_1: return Quarter<TensorType::Q5_1>::kFast;
        case TensorType::Q8_0: return Quarter<TensorType::Q8_0>::kFast;
        case TensorType::Q4_K: return Quarter<TensorType::Q4_K>::kFast;
        case TensorType::Q5_K: return Quarter<TensorType::Q5_K>::kFast;
        case TensorType::Q6_K: return Quarter<TensorType::Q6_K>::kFast;
        default: return false;
    }
}

size_t qblock_bytes() { return sizeof(QBlock); }

Launch quantize_activations(const QuantizeArgs& a) {
    const int64_t n_blocks = a.n_tokens * (a.cols / 32);
    return make_launch<Quantize>(dim3(static_cast<unsigned>((n_blocks + 7) / 8)), dim3(256), a);
}

Launch gemv(TensorType type, const GemvArgs& args) {
    const LaunchFn fn = launcher(type);
    if (!fn) throw std::invalid_argument("the CUDA backend has no GEMV kernel for " + std::string(tensor_type_name(type)));
    if (args.cols % 32 != 0) throw std::invalid_argument("GEMV columns must be a multiple of 32");
    if (gemm_supports(type, args)) return gemm(type, args);
    return fn(args);
}

std::vector<float> matmul(TensorType type, const uint8_t* rows, int64_t n_rows, size_t row_bytes, const float* x, int64_t n_tokens,
                          int64_t n) {
    const int64_t q_stride = (n / 32 + 3) / 4 * 4;  // QBlocks per token row, rows on 16-byte boundaries (as the runner's)
    auto w = device_alloc<uint8_t>(static_cast<size_t>(n_rows) * row_bytes + 256);  // kernels may read up to 15 bytes past a row
    auto xd = device_alloc<float>(static_cast<size_t>(n_tokens * n));
    auto yd = device_alloc<float>(static_cast<size_t>(n_tokens * n_rows));
    auto xq = device_alloc<QBlock>(static_cast<size_t>(n_tokens * q_stride) + 8);
    ER_CUDA(cudaMemcpy(w.get(), rows, static_cast<size_t>(n_rows) * row_bytes, cudaMemcpyHostToDevice));
    ER_CUDA(cudaMemcpy(xd.get(), x, static_cast<size_t>(n_tokens * n) * sizeof(float), cudaMemcpyHostToDevice));
    GemvArgs args;
    args.part[0] = GemvPart{w.get(), nullptr, yd.get(), n_rows, n_rows};
    args.row_bytes = row_bytes;
    args.cols = n;
    args.n_tokens = n_tokens;
    args.x = xd.get();
    args.x_stride = n;
    if (gemv_wants_q8(type)) {
        enqueue(quantize_activations(QuantizeArgs{xd.get(), xq.get(), n_tokens, n, n, q_stride}), nullptr, nullptr, false);
        args.xq = xq.get();
        args.xq_stride = q_stride;
    }
    enqueue(gemv(type, args), nullptr, nullptr, false);
    std::vector<float> y(static_cast<size_t>(n_tokens * n_rows));
    ER_CUDA(cudaMemcpy(y.data(), yd.get(), y.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return y;
}

double copy_bandwidth(size_t n_bytes, int reps) {
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

bool available() {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

std::string describe() {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(status);
    if (count == 0) return "no CUDA device";
    cudaDeviceProp p{};
    ER_CUDA(cudaGetDeviceProperties(&p, 0));
    return std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
           std::to_string(p.multiProcessorCount) + " SMs, " + std::to_string(p.totalGlobalMem >> 20) + " MiB)";
}

bool overlap_supported() {
    static const bool supported = [] {
        const char* env = std::getenv("EDGERUNNER_CUDA_OVERLAP");
        if (env && std::string(env) == "0") return false;
        int device = 0, major = 0;
        return cudaGetDevice(&device) == cudaSuccess &&
               cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9;
    }();
    return supported;
}

void enqueue(const Launch& l, cudaStream_t stream, const void* table, bool overlap) {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = l.grid;
    config.blockDim = l.block;
    config.dynamicSmemBytes = l.smem;
    config.stream = stream;
    config.attrs = &attr;
    config.numAttrs = overlap ? 1 : 0;
    void* param = table ? const_cast<void*>(static_cast<const void*>(&table)) : const_cast<unsigned char*>(l.args);
    ER_CUDA(cudaLaunchKernelExC(&config, table ? l.by_table : l.by_value, &param));
}

}  // namespace edgerunner::cuda
