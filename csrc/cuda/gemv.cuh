// The GEMV kernels' interface for the step runner (device pointers).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda.h"
#include "edgerunner/tensor_type.h"
#include "launch.cuh"

namespace edgerunner::cuda {

struct QBlock;  // int8 activations (quant_dot.cuh)

// One weight matrix of a fused GEMV: its rows are numbered after the previous part's.
struct GemvPart {
    const uint8_t* w = nullptr;  // rows of GemvArgs::row_bytes (device_row_bytes), in the device layout
    const float* bias = nullptr;  // rows floats, or null
    float* y = nullptr;           // per token: y_stride floats apart
    int64_t rows = 0, y_stride = 0;
    // with GemvArgs::rope (Q, K and V of one token): rotate the rows' pairs (Q, K), and store
    // them into this layer's KV-cache slot at the step's position too (K, V)
    bool rope = false;
    uint8_t* cache = nullptr;
};

// RoPE of adjacent pairs and the KV write, done by the one-token GEMV as it stores Q, K and V (the
// RoPE + KV write kernel's arithmetic, rope.cuh: the same bits), for a cache of f16 or f32.
struct GemvRope {
    const int64_t* pos0 = nullptr;  // device: the step block's position; null: no RoPE here
    const float* inv_freq = nullptr;
    float pos_scale = 1.0f, attn_factor = 1.0f;
    int32_t head_dim = 0, rope_dim = 0;
    int64_t capacity = 0;  // slots of the layer's cache
    size_t slot_bytes = 0;
    bool f16 = true;       // else f32
};

enum class Glu : int32_t { None, SiLU, GELU };

// An RMSNorm folded into the one-token GEMV that reads its output (gemv_folds_norm): each block
// normalizes the row x itself and quantizes it into shared memory, by the RmsNorm kernel's
// arithmetic in its order (rms_norm.cuh: the bits of the norm kernel's int8 copy), instead of
// reading GemvArgs::xq; a float format's GEMV keeps the normed floats there (the bits of the norm
// kernel's output) instead of reading GemvArgs::x. No norm kernel runs, and no copy goes through
// memory.
struct GemvNorm {
    const float* x = nullptr;  // cols floats (the residual); null: no norm here
    const float* w = nullptr;  // the norm's weight, cols floats
    float eps = 0.0f;
};

// The int8 copy of the RMSNorm of the residual a one-token GEMV adds to (gemv_norms_out), written
// by that GEMV as it stores the residual: each block's 32 rows are one unit of the norm's row,
// quantized before the row's 1/rms is known (rms_norm.cuh, quantize_normed4): its bytes and
// d' into q, its sum of squares into ss. The GEMVs that read the copy scale each d' by the 1/rms
// of those sums (GemvArgs::xq_ss). No norm kernel runs.
struct GemvNormOut {
    const float* w = nullptr;  // the norm's weight (a value per row); null: none here
    QBlock* q = nullptr;       // rows / 32 units
    float* ss = nullptr;       // rows / 32 floats
};

// Gate·up's values handed to the quantize kernel after it one block of 32 at a time, each as it
// lands, not once the whole grid has ended (gemv_tags_out): the streamed GEMV stores each value as
// one 8-byte word, its bits beside a tag that names the step and the launch (tag_of), and the
// quantize kernel (QuantizeArgs::tagged) reads its block's 32 words until all carry the tag it
// expects. A word is written and read whole, so no fence or count is needed; and every tag
// differs from the one the word held before (a step's launches have their own ordinals, and the
// step block's sequence number grows by one each one-token step), so a stale word never passes.
// It skips the grid boundary gate·up → quantize (~0.8 µs a layer, the quantize kernel's whole
// cost 1.76 µs a layer on the 8B Q4_0: bench/NOTES.md, forty-sixth CUDA session); measured against
// the wait (EDGERUNNER_CUDA_TAGGED=0) on an H200: +1.2 % on the 8B Q4_0 and the 1B Q4_0, +1.5 % on
// the 8B Q4_K_M (bench/NOTES.md, forty-eighth CUDA session). Handing the quantize kernel's copy on
// to the down projection the same way lost 5–10 % there (the same notes).
// (The launch's ordinal among the step's tagged ones sits beside it, GemvArgs::tag_ordinal: in
// the padding after xq_eps, so that GemvArgs stays within half of Launch::kMaxArgs.)
struct GemvTagged {
    uint64_t* y = nullptr;          // rows words; null: part[0].y takes plain floats
    const uint64_t* seq = nullptr;  // device: the step block's sequence number
};
constexpr uint32_t kTagOrdinals = 1024;
__host__ __device__ inline uint32_t tag_of(uint64_t seq, uint32_t ordinal) { return static_cast<uint32_t>(seq) * kTagOrdinals + ordinal; }

// y = W x (+ bias), or y += that (accumulate: the residual), for up to three matrices of one
// type that read the same input (Q, K, V). With a gate (glu != None) the two parts are the gate
// and up matrices, and part 0's y receives act(gate · x) · (up · x): no UP rows in memory.
struct GemvArgs {
    GemvPart part[3];
    int32_t n_parts = 1;
    Glu glu = Glu::None;
    size_t row_bytes = 0;  // device_row_bytes(type, cols)
    int64_t cols = 0;
    int64_t n_tokens = 1;
    const float* x = nullptr;    // per token: cols floats, x_stride apart (float-activation types)
    int64_t x_stride = 0;
    const QBlock* xq = nullptr;  // x quantized (types where gemv_wants_q8), xq_stride blocks apart
    int64_t xq_stride = 0;
    const uint16_t* xh = nullptr;  // x as bf16 or f16 (the tensor-core GEMM: gemm_takes; HalfArgs), xh_stride values apart
    int64_t xh_stride = 0;
    const float* xh_scale = nullptr;  // f16 (gemm_f16_input): per token, what its values were divided by
    bool accumulate = false;
    GemvRope rope;
    QBlock* xq_out = nullptr;  // gated: also act(gate)·up as int8 blocks (gemv_quantizes_out)
    GemvNorm norm;             // one token: the input is norm(norm.x), computed here (gemv_folds_norm)
    GemvNormOut norm_out;      // one token: also the int8 copy of the residual's norm (gemv_norms_out)
    // one token: xq is a norm's copy written by GemvNormOut, each unit's d still to be scaled by
    // the 1/rms of these sums of squares (cols / 32 floats) and the norm's eps
    const float* xq_ss = nullptr;
    float xq_eps = 0.0f;
    uint32_t tag_ordinal = 0;  // with tagged: this launch's among the step's tagged ones (< kTagOrdinals)
    GemvTagged tagged;         // one token, gated: part 0's values as tagged words (gemv_tags_out)
};

// The rows a GEMV computes: its parts' together, or with a gate the gate's (each joined with its up row).
int64_t gemv_rows(const GemvArgs& args);

// Picks the kernel: the tensor-core GEMM (gemm.cu) where gemm_takes, else a GEMV (one token, or
// eight tokens per weight load).
Launch gemv(TensorType type, const GemvArgs& args);

// Streaming multiprocessors of the current device, and the shared memory a block may have
// (opted in: 227 KB on sm_90, 163 KB on sm_80, 99 KB on sm_89), asked once.
int sm_count();
size_t smem_per_block();

// The tensor-core GEMM (gemm.cu), where gemm_takes (cuda.h): it reads the 16-bit activations
// (GemvArgs::xh, rows on 16-byte boundaries: xh and xh_stride · 2 multiples of 16), or for F32
// weights on Hopper's kernel the float ones (x, where x and x_stride · 4 are multiples of 16).
Launch gemm(TensorType type, const GemvArgs& args, GemmKernel kernel = GemmKernel::Auto);
// What that GEMM's tensor cores multiply: Bf16 (weights and activations rounded to bf16), F16
// (F16 weights as they are, the activations' f16 copy) or Tf32 (F32 weights and the float
// activations themselves on Hopper's kernel: each value's top 19 bits).
enum class GemmOperands { Bf16, F16, Tf32 };
GemmOperands gemm_operands(TensorType type, const GemvArgs& args, GemmKernel kernel = GemmKernel::Auto);

// Two one-token GEMVs of different formats reading the same int8 input (Q·K and a V of another
// type) as one launch, each half of its blocks running its own format's kernel: the second no
// longer waits for the first to finish. gemv_pairs: whether they can (the format pairs of the
// quantization mixes, no gate, no residual, both with RoPE or neither).
bool gemv_pairs(TensorType t1, const GemvArgs& a1, TensorType t2, const GemvArgs& a2);
Launch gemv_pair(TensorType t1, const GemvArgs& a1, TensorType t2, const GemvArgs& a2);

// Whether the type's GEMV reads int8 activations (GemvArgs::xq) rather than floats.
bool gemv_wants_q8(TensorType type);
// Whether the type is a float format (F32, F16, BF16: FloatGemv, gemv.cu).
constexpr bool float_weights(TensorType type) { return type == TensorType::F32 || type == TensorType::F16 || type == TensorType::BF16; }
// Whether args.rope can be given: one token of an int8 format (the staged kernel), no gate.
bool gemv_ropes(TensorType type, const GemvArgs& args);
// Whether args.xq_out can be given: one token of an int8 format, gated, rows a multiple of 32
// and of one chunk of the kernel (up to 1024–2048 columns, by format).
bool gemv_quantizes_out(TensorType type, const GemvArgs& args);
// Whether args.norm is worth giving: one token of an int8 format (the staged or short-row kernel)
// or a float one (F32, F16, BF16: FloatGemv, its input in shared memory), rows of up to 4096
// values, and a grid whose blocks together read at most 1 MiB of the row after their wait (each
// reads all of it, from L2; more cost more than the norm kernel: bench/NOTES.md, fourteenth and
// fifty-fifth CUDA sessions). EDGERUNNER_CUDA_FOLD_NORM=0 says never, =all always, =N with N KiB
// (for measurements).
bool gemv_folds_norm(TensorType type, const GemvArgs& args);
// Whether args.norm_out can be given: one token of an int8 format (the staged kernel), one matrix
// added to the residual (no gate, RoPE or int8 output), rows a multiple of 32 (its blocks hold 32)
// and its blocks at most half the SMs (the readers' blocks start on the others meanwhile).
// EDGERUNNER_CUDA_NORM_OUT=0 says never (for measurements).
bool gemv_norms_out(TensorType type, const GemvArgs& args);
// Whether args.tagged can be given: the one-token gated GEMV streams (its grid the blocks the SMs
// hold), rows a multiple of 32. EDGERUNNER_CUDA_TAGGED=0 says never (for measurements).
bool gemv_tags_out(TensorType type, const GemvArgs& args);
size_t qblock_bytes();

// The bytes apart a weight's rows of `cols` values lie on the device (GemvArgs::row_bytes): the
// file's row, but Q4_0's, Q5_0's, Q8_0's and IQ4_NL's padded to whole groups of eight blocks (Group8,
// quant_unit.cuh).
size_t device_row_bytes(TensorType type, int64_t cols);
// `rows` rows of a weight just copied to the device as the file holds them (at `from`) into the
// layout the kernels read (at `to`, device_row_bytes apart), on `stream`: Q4_0's, Q5_0's, Q8_0's and
// IQ4_NL's groups of eight blocks (quant_unit.cuh), Q4_K's (quant_unit.cuh) and Q6_K's
// (quant_dot.cuh) super-blocks with each unit's bits gathered; every other format as stored. In place (from == to) where the file's rows
// are as long as the device's; else the two must not overlap.
void to_device_layout(TensorType type, const uint8_t* from, uint8_t* to, int64_t rows, int64_t cols, cudaStream_t stream);

struct QuantizeArgs {
    const float* x;  // n_tokens rows of cols floats, x_stride apart
    QBlock* out;     // cols/32 blocks per token, out_stride apart: d = max|x| / 127, q = round(x / d)
    int64_t n_tokens, cols, x_stride, out_stride;
    // one token: the values as a streamed gate·up stores them (GemvTagged, and its tag_ordinal),
    // read in place of x block by block as they land, without waiting for that grid to end
    GemvTagged tagged = {};
    uint32_t tag_ordinal = 0;
};
Launch quantize_activations(const QuantizeArgs& args);

// The tensor-core GEMM's 16-bit copy of its input (gemm_takes): bf16, rounded to nearest even;
// or f16 for F16 weights (gemm_f16_input), each token's values first divided by 2^e, e >= 0 the
// least that brings them under 2^15 (f16's range ends at 65504; e is 0 unless a value reaches
// 32768), and 2^e written to scale[token] for the GEMM to multiply its sums by.
struct HalfArgs {
    const float* x;  // n_tokens rows of cols floats, x_stride apart
    uint16_t* out;   // the same as 16-bit floats, out_stride apart
    int64_t n_tokens, cols, x_stride, out_stride;
    bool f16 = false;
    float* scale = nullptr;  // f16: n_tokens floats
};
Launch half_activations(const HalfArgs& args);
// Whether the tensor-core GEMM of a format multiplies an f16 copy of its input (GemvArgs::xh and
// xh_scale, HalfArgs::f16): F16 weights, which it then takes as they are; else a bf16 copy.
bool gemm_f16_input(TensorType type);

}  // namespace edgerunner::cuda
