// The GEMV kernels' interface for the step runner (device pointers).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "edgerunner/tensor_type.h"
#include "launch.cuh"

namespace edgerunner::cuda {

struct QBlock;  // int8 activations (quant_quarter.cuh)

// out[r] = in[r] / rms(in[r]) · w (or out[r] += that: a post-norm into the residual) for `rows`
// contiguous rows of n values (in == out allowed); with q, each written row is also quantized
// for the matmuls that read it.
struct NormArgs {
    const float* in;
    const float* w;
    float* out;
    int64_t rows, n;
    float eps;
    bool accumulate;
    QBlock* q;           // or null
    int64_t q_stride;    // blocks between rows of q
};

// One weight matrix of a fused GEMV: its rows are numbered after the previous part's.
struct GemvPart {
    const uint8_t* w = nullptr;  // rows × row_bytes raw blocks
    const float* bias = nullptr;  // rows floats, or null
    float* y = nullptr;           // per token: y_stride floats apart
    int64_t rows = 0, y_stride = 0;
};

enum class Glu : int32_t { None, SiLU, GELU };

// y = W x (+ bias), or y += that (accumulate: the residual), for up to three matrices of one
// type that read the same input (Q, K, V). With a gate (glu != None) the two parts are the gate
// and up matrices, and part 0's y receives act(gate · x) · (up · x): no UP rows in memory.
struct GemvArgs {
    GemvPart part[3];
    int32_t n_parts = 1;
    Glu glu = Glu::None;
    size_t row_bytes = 0;
    int64_t cols = 0;
    int64_t n_tokens = 1;
    const float* x = nullptr;    // per token: cols floats, x_stride apart (float-activation types)
    int64_t x_stride = 0;
    const QBlock* xq = nullptr;  // x quantized (types where gemv_wants_q8), xq_stride blocks apart
    int64_t xq_stride = 0;
    bool accumulate = false;
    // One token (gemv_can_norm): then the RMSNorm of one row that follows, run by the block that
    // finishes last, so it needs no launch of its own. norm.rows == 0: none.
    NormArgs norm{};
    unsigned* done = nullptr;  // device counter of finished blocks, zero between launches
};

// Picks the kernel: the tensor-core GEMM (gemm.cu) for chunks of kGemmMinTokens tokens or more
// where it applies, else a GEMV (one token, or eight tokens per weight load).
Launch gemv(TensorType type, const GemvArgs& args);
// Whether gemv(type, args) takes a following RMSNorm (GemvArgs::norm): the one-token int8 GEMV.
bool gemv_can_norm(TensorType type, const GemvArgs& args);

// The tensor-core GEMM: int8 formats, int8 activations whose rows start on 16-byte boundaries
// (xq and xq_stride · sizeof(QBlock) multiples of 16).
constexpr int64_t kGemmMinTokens = 16;
bool gemm_supports(TensorType type, const GemvArgs& args);
Launch gemm(TensorType type, const GemvArgs& args);

// Whether the type's GEMV reads int8 activations (GemvArgs::xq) rather than floats.
bool gemv_wants_q8(TensorType type);
size_t qblock_bytes();

struct QuantizeArgs {
    const float* x;  // n_tokens rows of cols floats, x_stride apart
    QBlock* out;     // cols/32 blocks per token, out_stride apart: d = max|x| / 127, q = round(x / d)
    int64_t n_tokens, cols, x_stride, out_stride;
};
Launch quantize_activations(const QuantizeArgs& args);

}  // namespace edgerunner::cuda
