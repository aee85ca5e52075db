// The CUDA backend's per-op kernels; see ops.cuh.
#include <cfloat>
#include <stdexcept>
#include <string>

#include "check.cuh"
#include "ops.cuh"
#include "quant_unit.cuh"

namespace edgerunner::cuda {
namespace {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
    return v;
}

template <TensorType T>
__global__ void embed_kernel(const uint8_t* w, size_t row_bytes, int64_t cols, const int32_t* tokens, float* x) {
    const int64_t t = blockIdx.x;
    const uint8_t* row = w + static_cast<size_t>(tokens[t]) * row_bytes;
    for (int64_t u = threadIdx.x; u < cols / 32; u += blockDim.x) Unit<T>::load(row, u, x + t * cols + 32 * u);
}

template <TensorType T>
void launch_embed(const uint8_t* w, size_t row_bytes, int64_t cols, const int32_t* tokens, int64_t n, float* x, cudaStream_t s) {
    embed_kernel<T><<<static_cast<unsigned>(n), 128, 0, s>>>(w, row_bytes, cols, tokens, x);
}

__global__ void rms_norm_kernel(const float* in, const float* w, float* out, int64_t n, float eps) {
    __shared__ float partial[32];
    const float* x = in + blockIdx.x * n;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += x[i] * x[i];
    ss = warp_sum(ss);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
        v = warp_sum(v);
        if (threadIdx.x == 0) partial[0] = v;
    }
    __syncthreads();
    const float scale = 1.0f / sqrtf(partial[0] / static_cast<float>(n) + eps);
    float* y = out + blockIdx.x * n;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[i] = (x[i] * scale) * w[i];
}

__global__ void rope_kernel(RopeArgs a) {
    const int64_t t = blockIdx.x;
    const int h = blockIdx.y;
    float* x = h < a.n_head ? a.q + (t * a.n_head + h) * a.head_dim : a.k + (t * a.n_head_kv + (h - a.n_head)) * a.head_dim;
    const float pos = static_cast<float>(*a.pos0 + t) * a.pos_scale;
    const int half = a.rope_dim / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float theta = pos * a.inv_freq[i];
        float sn, cs;
        sincosf(theta, &sn, &cs);
        const int i0 = a.neox ? i : 2 * i, i1 = a.neox ? i + half : 2 * i + 1;
        const float x0 = x[i0], x1 = x[i1];
        x[i0] = x0 * cs - x1 * sn;
        x[i1] = x0 * sn + x1 * cs;
    }
}

__global__ void kv_store_kernel(const float* k, const float* v, __half* kc, __half* vc, const int64_t* pos0, int64_t capacity,
                                int64_t kv_dim) {
    const int64_t t = blockIdx.x;
    const int64_t slot = (*pos0 + t) % capacity;
    for (int64_t i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        kc[slot * kv_dim + i] = __float2half_rn(k[t * kv_dim + i]);
        vc[slot * kv_dim + i] = __float2half_rn(v[t * kv_dim + i]);
    }
}

// One block per (token, head): each warp walks every kWarps-th position with its own running
// max, sum and output (lane l holds dimensions l, l + 32, ...), then the warps are merged.
constexpr int kWarps = 4, kMaxDims = 8;  // head sizes up to 256

__global__ void attention_kernel(AttentionArgs a) {
    const int64_t t = blockIdx.x;
    const int h = blockIdx.y;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int hd = a.head_dim, group = a.n_head / a.n_head_kv;
    const int64_t kv_dim = static_cast<int64_t>(a.n_head_kv) * hd;
    const int64_t pos = *a.pos0 + t;
    const int64_t start = a.window > 0 && pos - a.window + 1 > 0 ? pos - a.window + 1 : 0;
    const float* q = a.q + (t * a.n_head + h) * hd;
    const int64_t head_off = static_cast<int64_t>(h / group) * hd;
    const float scale = rsqrtf(static_cast<float>(hd));

    float qr[kMaxDims], acc[kMaxDims];
#pragma unroll
    for (int i = 0; i < kMaxDims; ++i) {
        const int d = lane + 32 * i;
        qr[i] = d < hd ? q[d] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -FLT_MAX, l = 0.0f;
    for (int64_t p = start + warp; p <= pos; p += kWarps) {
        const int64_t slot = p % a.capacity;
        const __half* kr = a.k_cache + slot * kv_dim + head_off;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < kMaxDims; ++i) {
            const int d = lane + 32 * i;
            if (d < hd) s += qr[i] * __half2float(kr[d]);
        }
        s = warp_sum(s) * scale;
        const float m_new = fmaxf(m, s);
        const float corr = __expf(m - m_new), e = __expf(s - m_new);
        l = l * corr + e;
        const __half* vr = a.v_cache + slot * kv_dim + head_off;
#pragma unroll
        for (int i = 0; i < kMaxDims; ++i) {
            const int d = lane + 32 * i;
            if (d < hd) acc[i] = acc[i] * corr + e * __half2float(vr[d]);
        }
        m = m_new;
    }
    __shared__ float sm[kWarps], sl[kWarps], sacc[kWarps][32 * kMaxDims];
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < kMaxDims; ++i) sacc[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    float mx = -FLT_MAX;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm[w]);
    float denom = 0.0f;
    for (int w = 0; w < kWarps; ++w) denom += sl[w] > 0.0f ? sl[w] * __expf(sm[w] - mx) : 0.0f;
    float* out = a.out + (t * a.n_head + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float v = 0.0f;
        for (int w = 0; w < kWarps; ++w)
            if (sl[w] > 0.0f) v += sacc[w][d] * __expf(sm[w] - mx);
        out[d] = v / denom;
    }
}

__global__ void swiglu_kernel(float* g, const float* u, int64_t n) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        g[i] = g[i] / (1.0f + __expf(-g[i])) * u[i];
}

}  // namespace

void embed(TensorType type, const uint8_t* w, size_t row_bytes, int64_t cols, const int32_t* tokens, int64_t n_tokens,
           float* x, cudaStream_t stream) {
    switch (type) {
#define ER_EMBED(T) \
    case TensorType::T: launch_embed<TensorType::T>(w, row_bytes, cols, tokens, n_tokens, x, stream); break;
        ER_EMBED(F32) ER_EMBED(F16) ER_EMBED(BF16) ER_EMBED(Q4_0) ER_EMBED(Q4_1) ER_EMBED(Q5_0) ER_EMBED(Q5_1)
        ER_EMBED(Q8_0) ER_EMBED(IQ4_NL) ER_EMBED(Q2_K) ER_EMBED(Q3_K) ER_EMBED(Q4_K) ER_EMBED(Q5_K) ER_EMBED(Q6_K)
        ER_EMBED(Q8_K) ER_EMBED(IQ4_XS)
#undef ER_EMBED
        default: throw std::invalid_argument("the CUDA backend cannot read embeddings of type " + std::string(tensor_type_name(type)));
    }
    ER_CUDA(cudaGetLastError());
}

void rms_norm(const float* in, const float* w, float* out, int64_t rows, int64_t n, float eps, cudaStream_t stream) {
    rms_norm_kernel<<<static_cast<unsigned>(rows), 256, 0, stream>>>(in, w, out, n, eps);
    ER_CUDA(cudaGetLastError());
}

void rope(const RopeArgs& a, cudaStream_t stream) {
    rope_kernel<<<dim3(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>(a.n_head + a.n_head_kv)), 64, 0, stream>>>(a);
    ER_CUDA(cudaGetLastError());
}

void kv_store(const float* k, const float* v, __half* k_cache, __half* v_cache, int64_t n_tokens, const int64_t* pos0,
              int64_t capacity, int64_t kv_dim, cudaStream_t stream) {
    kv_store_kernel<<<static_cast<unsigned>(n_tokens), 256, 0, stream>>>(k, v, k_cache, v_cache, pos0, capacity, kv_dim);
    ER_CUDA(cudaGetLastError());
}

void attention(const AttentionArgs& a, cudaStream_t stream) {
    if (a.head_dim > 32 * kMaxDims) throw std::invalid_argument("the CUDA attention kernel takes head sizes up to 256");
    attention_kernel<<<dim3(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>(a.n_head)), 32 * kWarps, 0, stream>>>(a);
    ER_CUDA(cudaGetLastError());
}

void swiglu(float* g, const float* u, int64_t n, cudaStream_t stream) {
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 4096));
    swiglu_kernel<<<blocks, 256, 0, stream>>>(g, u, n);
    ER_CUDA(cudaGetLastError());
}

}  // namespace edgerunner::cuda
