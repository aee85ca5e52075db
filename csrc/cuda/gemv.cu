// Quantized matrix-vector products: one warp per weight row, lanes striding over the row's
// 32-element units (four lanes to a unit for the common formats, quant_quarter.cuh; one lane
// to a unit otherwise, quant_unit.cuh), a shuffle reduction, one store (or add: the residual).
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>

#include "check.cuh"
#include "cuda.h"
#include "gemv.cuh"
#include "quant_quarter.cuh"

namespace edgerunner::cuda {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
    return v;
}

// One warp per R rows, tokens [NT·blockIdx.y, +NT): each weight unit is loaded once for NT
// tokens, each activation quarter once for R rows.
template <TensorType T, int R, int NT>
__global__ void gemv_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t rows, int64_t cols,
                            const float* __restrict__ x, const float* __restrict__ bias, float* __restrict__ y,
                            bool accumulate, int64_t n_tokens, int64_t x_stride, int64_t y_stride,
                            const QBlock* __restrict__ xq, int64_t xq_stride) {
    const int64_t t0 = static_cast<int64_t>(blockIdx.y) * NT;
    const int nt = static_cast<int>(n_tokens - t0 < NT ? n_tokens - t0 : NT);
    x += t0 * x_stride;
    xq += t0 * xq_stride;
    y += t0 * y_stride;
    const int lane = threadIdx.x % 32;
    const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32) * R;
    if (row0 >= rows) return;
    const uint8_t* r[R];
#pragma unroll
    for (int i = 0; i < R; ++i) r[i] = w + static_cast<size_t>(row0 + i < rows ? row0 + i : row0) * row_bytes;
    float sum[R][NT] = {};
    if constexpr (Quarter<T>::kFast) {
        // lanes 4i..4i+3 share unit i of the warp's 8: quarters side by side in memory
        const int k = lane % 4;
#pragma unroll 4
        for (int64_t u = lane / 4; u < cols / 32; u += 8)
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                if (t >= nt) break;
                const QBlock& a = xq[t * xq_stride + u];
#pragma unroll
                for (int i = 0; i < R; ++i) sum[i][t] += Quarter<T>::dot(r[i], u, k, a);
            }
    } else {
        for (int64_t u = lane; u < cols / 32; u += 32)
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                if (t >= nt) break;
#pragma unroll
                for (int i = 0; i < R; ++i) sum[i][t] += Unit<T>::dot(r[i], u, x + t * x_stride + 32 * u);
            }
    }
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            if (t >= nt) break;
            float v = warp_sum(sum[i][t]);
            if (lane == 0 && row0 + i < rows) {
                if (bias) v += bias[row0 + i];
                float* out = y + t * y_stride + row0 + i;
                *out = accumulate ? *out + v : v;
            }
        }
}

namespace {

constexpr int kWarpsPerBlock = 4;

// A step of one token (decode) takes the one-token kernel; several tokens share weight loads
// eight at a time.
template <TensorType T>
void launch(const GemvArgs& a, cudaStream_t stream) {
    constexpr int kDecodeRows = 1;  // 4 rows per warp measured 1.8× slower on 8B shapes: fewer warps in flight
    if (a.n_tokens == 1) {
        const unsigned blocks = static_cast<unsigned>((a.rows + kWarpsPerBlock * kDecodeRows - 1) / (kWarpsPerBlock * kDecodeRows));
        gemv_kernel<T, kDecodeRows, 1><<<dim3(blocks, 1), 32 * kWarpsPerBlock, 0, stream>>>(
            a.w, a.row_bytes, a.rows, a.cols, a.x, a.bias, a.y, a.accumulate, 1, a.x_stride, a.y_stride, a.xq, a.xq_stride);
        return;
    }
    const dim3 blocks(static_cast<unsigned>((a.rows + kWarpsPerBlock - 1) / kWarpsPerBlock), static_cast<unsigned>((a.n_tokens + 7) / 8));
    gemv_kernel<T, 1, 8><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(a.w, a.row_bytes, a.rows, a.cols, a.x, a.bias, a.y,
                                                                   a.accumulate, a.n_tokens, a.x_stride, a.y_stride, a.xq,
                                                                   a.xq_stride);
}

using LaunchFn = void (*)(const GemvArgs&, cudaStream_t);

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

// One warp per 32-value block.
__global__ void quantize_kernel(const float* x, QBlock* out, int64_t blocks_per_token, int64_t n_blocks, int64_t x_stride,
                                int64_t out_stride) {
    const int64_t g = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    if (g >= n_blocks) return;
    const int lane = threadIdx.x % 32;
    const int64_t t = g / blocks_per_token, b = g % blocks_per_token;
    const float v = x[t * x_stride + 32 * b + lane];
    float amax = fabsf(v);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
    const float d = amax / 127.0f;
    QBlock& q = out[t * out_stride + b];
    q.q[lane] = static_cast<int8_t>(d > 0.0f ? __float2int_rn(v / d) : 0);
    if (lane == 0) q.d = d;
}

void quantize_activations(const float* x, QBlock* out, int64_t n_tokens, int64_t cols, int64_t x_stride, int64_t out_stride,
                          cudaStream_t stream) {
    const int64_t n_blocks = n_tokens * (cols / 32);
    quantize_kernel<<<static_cast<unsigned>((n_blocks + 7) / 8), 256, 0, stream>>>(x, out, cols / 32, n_blocks, x_stride, out_stride);
    ER_CUDA(cudaGetLastError());
}

void gemv_launch(TensorType type, const GemvArgs& args, cudaStream_t stream) {
    const LaunchFn fn = launcher(type);
    if (!fn) throw std::invalid_argument("the CUDA backend has no GEMV kernel for " + std::string(tensor_type_name(type)));
    if (args.cols % 32 != 0) throw std::invalid_argument("GEMV columns must be a multiple of 32");
    fn(args, stream);
    ER_CUDA(cudaGetLastError());
}

std::vector<float> gemv(TensorType type, const uint8_t* rows, int64_t n_rows, size_t row_bytes, const float* x, int64_t n) {
    auto w = device_alloc<uint8_t>(static_cast<size_t>(n_rows) * row_bytes);
    auto xd = device_alloc<float>(static_cast<size_t>(n));
    auto yd = device_alloc<float>(static_cast<size_t>(n_rows));
    auto xq = device_alloc<QBlock>(static_cast<size_t>(n / 32));
    ER_CUDA(cudaMemcpy(w.get(), rows, static_cast<size_t>(n_rows) * row_bytes, cudaMemcpyHostToDevice));
    ER_CUDA(cudaMemcpy(xd.get(), x, static_cast<size_t>(n) * sizeof(float), cudaMemcpyHostToDevice));
    GemvArgs args{w.get(), row_bytes, n_rows, n, xd.get(), nullptr, yd.get(), false};
    if (gemv_wants_q8(type)) {
        quantize_activations(xd.get(), xq.get(), 1, n, n, n / 32, nullptr);
        args.xq = xq.get();
    }
    gemv_launch(type, args, nullptr);
    std::vector<float> y(static_cast<size_t>(n_rows));
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

}  // namespace edgerunner::cuda
