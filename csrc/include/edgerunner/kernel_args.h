// Kernel argument structs: one definition shared by C++ hosts, CUDA (nvcc) and Metal (MSL).
//
// One struct per kernel family: the tensors it touches (device addresses) and the sizes and
// strides it needs; nothing that changes from one step to the next (that is the step block,
// er_step_block). A GPU host writes each op's struct once when it prepares a plan (Metal: into
// an argument table, so recorded command lists replay unchanged) and the kernel reads it as
//     constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]]      (MSL)
//     const er_matmul_args a                                     (CUDA: by value)
// Flags that select code paths (bias, residual, fused norm, KV precision, ...) are not fields:
// Metal specializes pipelines on them (function constants ER_FC_*), CUDA would use template
// parameters.
//
// Layout rules, so that every compiler lays the structs out the same way: fixed-width fields,
// pointers (8 bytes) first, then 4-byte fields, explicit padding to a multiple of 8 bytes, no
// bool, no enums. Every struct's size and the offsets of its fields are static_asserts, checked
// by the host compiler, nvcc and the Metal compiler alike (and by the Metal lint on Linux).
#pragma once

#if defined(__METAL_VERSION__)
#include <metal_stdlib>
#define ER_DEVICE device  // tensors live in the device address space
#else
#include <stdint.h>
#define ER_DEVICE
#endif

#define ER_ASSERT_SIZE(T, n) static_assert(sizeof(T) == (n), #T " size")
#define ER_ASSERT_OFFSET(T, field, n) static_assert(__builtin_offsetof(T, field) == (n), #T "." #field " offset")

// ---- bindings ---------------------------------------------------------------------------
// Every kernel takes exactly two buffers: its argument struct and the step block.
#define ER_BUFFER_ARGS 0
#define ER_BUFFER_STEP 1
// Step blocks in flight: the host writes block N+1 while the device may still read block N.
#define ER_STEP_SLOTS 3

// ---- threads per threadgroup each kernel is written for (the host dispatches exactly these) --
#define ER_THREADS_EMBED 128
#define ER_THREADS_RMS_NORM 256
#define ER_THREADS_GEMV 128       // 4 simdgroups × ER_GEMV_ROWS weight rows each
#define ER_GEMV_ROWS 4
#define ER_THREADS_GEMM 128       // a tile of ER_GEMM_TILE rows × ER_GEMM_TILE tokens
#define ER_GEMM_TILE 32
#define ER_THREADS_ROPE 32        // one simdgroup per (token, head); also the KV store
#define ER_THREADS_ATTENTION 128  // decode: one (token, head); prefill: ER_ATTENTION_QUERIES tokens of one head
#define ER_ATTENTION_QUERIES 8
#define ER_ATTENTION_MAX_HEAD_DIM 256
#define ER_THREADS_GLU 256
#define ER_THREADS_SAMPLE 1024
#define ER_THREADS_PENALIZE 1024
#define ER_PENALIZE_SLICE 16384   // a penalize threadgroup's tokens (16 per thread)

// ---- function constants (Metal) / template parameters (CUDA) ----------------------------
#define ER_FC_ACCUMULATE 0  // bool: out += result (the residual connection), else out = result
#define ER_FC_HAS_BIAS 1    // bool: MatMul adds part[i].bias
#define ER_FC_NORM_IN 2     // bool: MatMul's input is RMS-normalized first, weight norm_w (fused norm)
#define ER_FC_GLU 3         // uint: ER_GLU_*; MatMul of two parts writes act(part 0) · part 1
#define ER_FC_KV_TYPE 4     // uint: ER_KV_*, the KV cache precision
#define ER_FC_NEOX 5        // bool: RoPE rotates pairs (i, i + rope_dim/2), else (2i, 2i + 1)
#define ER_FC_HEAD_NORM 6   // bool: RoPE first applies RMSNorm over each head (q_norm_w, k_norm_w)
#define ER_FC_STORE_KV 7    // bool: RoPE then stores the step's K and V heads into the cache
#define ER_FC_COUNT 8

#define ER_GLU_NONE 0
#define ER_GLU_SILU 1  // silu(g) · u          (SwiGLU)
#define ER_GLU_GELU 2  // gelu_tanh(g) · u     (GeGLU)

// KV cache precisions, numbered as edgerunner::KvType (csrc/core/kv_cache.h). A cache slot is one
// token's K (or V) row of n_head_kv heads, head after head; a q8_0 head is head_dim/32 block_q8_0.
#define ER_KV_F32 0
#define ER_KV_F16 1
#define ER_KV_Q8_0 2

// ---- the step block ---------------------------------------------------------------------
// What changes from one step to the next; the host writes one of ER_STEP_SLOTS per step.
typedef struct {
    int32_t pos0;         // position of tokens[0]
    int32_t n_tokens;     // tokens in this step (at most the plan's max_tokens)
    int32_t first_row;    // the first row "tail" ops compute: n_tokens - 1, or 0 when every row's
                          // logits are wanted
    uint32_t slot;        // which slot this block is in (the sampler writes out[slot])
    float temperature;    // sampling, read by the sample kernel: <= 0 greedy
    int32_t top_k;        // 0: off
    float top_p;          // 1: off
    float min_p;          // 0: off
    uint64_t seed;
    uint64_t sample_step;  // the sampler's RNG counter
    // Bias and penalties, read by the penalize kernel (run before the sampler when a step has
    // either; penalties off: 1, 0, 0 and a window of 0).
    float repetition_penalty;
    float presence_penalty;
    float frequency_penalty;
    int32_t penalty_last_n;  // the window: this many positions up to the step's last (-1: all)
    uint32_t n_bias;         // entries in the bias table (er_penalize_args)
    uint32_t pad;
    // int32_t tokens[n_tokens] follow the struct in the same buffer.
} er_step_block;
ER_ASSERT_SIZE(er_step_block, 72);
ER_ASSERT_OFFSET(er_step_block, temperature, 16);
ER_ASSERT_OFFSET(er_step_block, seed, 32);
ER_ASSERT_OFFSET(er_step_block, sample_step, 40);
ER_ASSERT_OFFSET(er_step_block, repetition_penalty, 48);
ER_ASSERT_OFFSET(er_step_block, n_bias, 64);

// ---- embedding rows ---------------------------------------------------------------------
// x[t] = row tokens[t] of w, decoded from its blocks, × scale (gemma3 scales by √n_embd); and
// history[pos0 + t] = tokens[t], the token history the penalties read (where history is set).
typedef struct {
    ER_DEVICE const uint8_t* w;  // the embedding matrix: n_vocab rows of row_bytes raw blocks
    ER_DEVICE float* x;          // per token x_stride floats
    uint32_t row_bytes;
    uint32_t cols;               // a multiple of 32
    uint32_t x_stride;
    float scale;
    ER_DEVICE int32_t* history;  // n_ctx ints: the token at each position (null: not kept)
} er_embed_args;
ER_ASSERT_SIZE(er_embed_args, 40);
ER_ASSERT_OFFSET(er_embed_args, x, 8);
ER_ASSERT_OFFSET(er_embed_args, row_bytes, 16);
ER_ASSERT_OFFSET(er_embed_args, scale, 28);
ER_ASSERT_OFFSET(er_embed_args, history, 32);

// ---- RMSNorm ----------------------------------------------------------------------------
// Row r: y_r (+)= x_r / rms(x_r) · w over n values. A token holds rows_per_token rows, rows
// x_stride floats apart: 1 row of n_embd (RmsNorm), or one row per head (HeadRmsNorm, heads
// head_dim apart). tail: only the rows of tokens from the step block's first_row on.
typedef struct {
    ER_DEVICE const float* x;
    ER_DEVICE const float* w;    // n floats
    ER_DEVICE float* y;          // may equal x (in place)
    uint32_t n;
    uint32_t x_stride;
    uint32_t y_stride;
    uint32_t rows_per_token;
    uint32_t tail;
    float eps;
} er_rms_norm_args;
ER_ASSERT_SIZE(er_rms_norm_args, 48);
ER_ASSERT_OFFSET(er_rms_norm_args, n, 24);
ER_ASSERT_OFFSET(er_rms_norm_args, eps, 44);

// ---- matrix × activations (GEMV for a few tokens, GEMM for many) ---------------------------
// Up to three matrices of one type over the same input, their rows numbered one after another
// (Q, K, V; or gate and up with ER_FC_GLU). y[t][r] = W_r · x[t] (+ bias[r]), or += (residual).
typedef struct {
    ER_DEVICE const uint8_t* w;    // rows × row_bytes raw blocks
    ER_DEVICE const float* bias;   // rows floats (with ER_FC_HAS_BIAS)
    ER_DEVICE float* y;            // per token y_stride floats
    uint32_t rows;
    uint32_t y_stride;
} er_matmul_part;
ER_ASSERT_SIZE(er_matmul_part, 32);
ER_ASSERT_OFFSET(er_matmul_part, rows, 24);

typedef struct {
    er_matmul_part part[3];
    ER_DEVICE const float* x;       // per token x_stride floats, cols of them used
    ER_DEVICE const float* norm_w;  // with ER_FC_NORM_IN: x ∘ norm_w / rms(x) is multiplied instead
    uint32_t n_parts;
    uint32_t rows;                  // sum of the parts' rows (with ER_FC_GLU: one part's)
    uint32_t cols;                  // a multiple of 32
    uint32_t row_bytes;             // the same for every part (same type, same cols)
    uint32_t x_stride;
    uint32_t tail;                  // only tokens from the step block's first_row on
    float norm_eps;
    uint32_t pad;
} er_matmul_args;
ER_ASSERT_SIZE(er_matmul_args, 144);
ER_ASSERT_OFFSET(er_matmul_args, x, 96);
ER_ASSERT_OFFSET(er_matmul_args, n_parts, 112);
ER_ASSERT_OFFSET(er_matmul_args, norm_eps, 136);

// ---- RoPE (with the per-head norm before it and the KV store after it, when fused) ---------
// One simdgroup/warp per (token, head): heads [0, n_head) of q, then [0, n_head_kv) of k, each
// rotated in place at position pos0 + t (× pos_scale); cos and sin × attn_factor (LongRoPE).
// The pairs' inverse frequencies come precomputed (inv_freq, rope_dim/2 floats). With
// ER_FC_STORE_KV a K head is then written to its cache slot (pos % capacity) with the V head.
typedef struct {
    ER_DEVICE float* q;               // per token q_stride floats (null with n_head = 0)
    ER_DEVICE float* k;               // per token k_stride floats (null with n_head_kv = 0)
    ER_DEVICE const float* v;         // per token v_stride floats (ER_FC_STORE_KV)
    ER_DEVICE const float* inv_freq;
    ER_DEVICE const float* q_norm_w;  // head_dim floats (ER_FC_HEAD_NORM)
    ER_DEVICE const float* k_norm_w;
    ER_DEVICE uint8_t* k_cache;       // this layer's K slots (ER_FC_STORE_KV)
    ER_DEVICE uint8_t* v_cache;       // this layer's V slots
    uint32_t n_head;
    uint32_t n_head_kv;
    uint32_t head_dim;
    uint32_t rope_dim;                // the first rope_dim dimensions of a head rotate
    uint32_t q_stride;
    uint32_t k_stride;
    uint32_t v_stride;
    uint32_t capacity;                // this layer's slots
    uint32_t slot_bytes;              // one slot: n_head_kv heads in the cache precision
    float pos_scale;
    float attn_factor;
    float norm_eps;
} er_rope_args;
ER_ASSERT_SIZE(er_rope_args, 112);
ER_ASSERT_OFFSET(er_rope_args, n_head, 64);
ER_ASSERT_OFFSET(er_rope_args, norm_eps, 108);

// ---- KV store (when not fused into RoPE) -----------------------------------------------------
typedef struct {
    ER_DEVICE const float* k;
    ER_DEVICE const float* v;
    ER_DEVICE uint8_t* k_cache;
    ER_DEVICE uint8_t* v_cache;
    uint32_t n_head_kv;
    uint32_t head_dim;
    uint32_t k_stride;
    uint32_t v_stride;
    uint32_t capacity;
    uint32_t slot_bytes;
} er_kv_store_args;
ER_ASSERT_SIZE(er_kv_store_args, 56);
ER_ASSERT_OFFSET(er_kv_store_args, n_head_kv, 32);

// ---- attention ---------------------------------------------------------------------------
// out[t][h] = softmax(q[t][h] · K_p / √head_dim) V_p over the positions p this token sees:
// [max(0, pos - window + 1), pos] (window 0: from 0), pos = pos0 + t; slot p % capacity.
// Query head h reads KV head h / (n_head / n_head_kv) (grouped-query attention).
typedef struct {
    ER_DEVICE const float* q;
    ER_DEVICE const uint8_t* k_cache;
    ER_DEVICE const uint8_t* v_cache;
    ER_DEVICE float* out;
    uint32_t n_head;
    uint32_t n_head_kv;
    uint32_t head_dim;                // at most 256
    uint32_t q_stride;
    uint32_t out_stride;
    uint32_t capacity;
    uint32_t window;
    uint32_t slot_bytes;
    float scale;                      // 1 / √head_dim
    uint32_t pad;
} er_attention_args;
ER_ASSERT_SIZE(er_attention_args, 72);
ER_ASSERT_OFFSET(er_attention_args, n_head, 32);
ER_ASSERT_OFFSET(er_attention_args, scale, 64);

// ---- gated activations (when not fused into the gate/up matmul) -----------------------------
// g = act(g) · u over width values per token: silu (SwiGLU) or gelu_tanh (GeGLU).
typedef struct {
    ER_DEVICE float* g;
    ER_DEVICE const float* u;
    uint32_t width;
    uint32_t g_stride;
    uint32_t u_stride;
    uint32_t pad;
} er_glu_args;
ER_ASSERT_SIZE(er_glu_args, 32);
ER_ASSERT_OFFSET(er_glu_args, width, 16);

// ---- sampling ----------------------------------------------------------------------------
// The next token from the step's last logits row, with the step block's parameters and RNG
// counter (the CPU sampler's contract, csrc/core/sampler.cpp): out[slot] = the token.
typedef struct {
    ER_DEVICE const float* logits;  // rows logits_stride floats apart; row n_tokens - 1 is used
    ER_DEVICE float* weights;       // n_vocab floats of scratch
    ER_DEVICE int32_t* out;         // ER_STEP_SLOTS ints
    uint32_t n_vocab;
    uint32_t logits_stride;
} er_sample_args;
ER_ASSERT_SIZE(er_sample_args, 32);
ER_ASSERT_OFFSET(er_sample_args, n_vocab, 24);

// ---- bias and penalties (before the sampler, when a step has either) --------------------------
// out = the step's last logits row after the CPU contract's steps 1-3: the bias table's entries
// added, then each distinct token of the penalty window (the step block's penalty_last_n
// positions up to the step's last, read from history) penalized once with its count. The sampler
// then reads out. Threadgroups of ER_PENALIZE_SLICE tokens, each over the whole window.
typedef struct {
    ER_DEVICE const float* logits;       // rows logits_stride floats apart; row n_tokens - 1 is used
    ER_DEVICE float* out;                // n_vocab floats
    ER_DEVICE const int32_t* history;    // n_ctx ints: the token at each position (the embedding writes it)
    ER_DEVICE const int32_t* bias_tokens;  // the bias table: the step block's n_bias entries, tokens
    ER_DEVICE const float* bias_values;    // rising, one each (merged_bias)
    ER_DEVICE int32_t* counts;           // n_vocab ints: zero, and left zero
    uint32_t n_vocab;
    uint32_t logits_stride;
} er_penalize_args;
ER_ASSERT_SIZE(er_penalize_args, 56);
ER_ASSERT_OFFSET(er_penalize_args, counts, 40);
ER_ASSERT_OFFSET(er_penalize_args, n_vocab, 48);
