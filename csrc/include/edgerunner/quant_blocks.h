// Quantized block layouts: the one definition shared by C++, CUDA (nvcc) and Metal.
//
// Field order and sizes are ggml's (ggml-common.h), so GGUF tensor data is an array of these
// structs as stored on disk. Everything is little-endian. Keep this file free of anything a
// Metal or CUDA compiler would reject: plain structs of fixed-width integers, no namespaces,
// no std::, no functions.
#pragma once

// ---- prelude: integer and half types per compiler ---------------------------------------
// er_half is an IEEE fp16 value. Host C++ sees it as its raw bits (uint16_t; convert with
// edgerunner/half.h); CUDA and Metal see their native half type, which has the same layout.
#if defined(__METAL_VERSION__)
#include <metal_stdlib>
typedef half er_half;
#define ER_TABLE(type, name, size) static constant type name[size]  // constant: read-only already
#elif defined(__CUDACC__)
#include <cuda_fp16.h>
#include <stdint.h>
typedef half er_half;
#define ER_TABLE(type, name, size) static const __device__ type name[size]
#else
#include <stdint.h>
typedef uint16_t er_half;
#define ER_TABLE(type, name, size) static const type name[size]
#endif

// ---- block sizes (elements per block) ---------------------------------------------------
#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK4_NL 32
#define QK_K 256          // super-block of the k-quants and IQ4_XS
#define K_SCALE_SIZE 12   // packed 6-bit scales/mins of Q4_K and Q5_K

// ---- 32-element blocks ------------------------------------------------------------------
// 4-bit nibbles: qs[j] & 0xF is element j, qs[j] >> 4 is element j + 16.

// x = d * (q - 8)
typedef struct {
    er_half d;
    uint8_t qs[QK4_0 / 2];
} block_q4_0;
static_assert(sizeof(block_q4_0) == 2 + QK4_0 / 2, "block_q4_0 size");

// x = d * q + m
typedef struct {
    er_half d;
    er_half m;
    uint8_t qs[QK4_1 / 2];
} block_q4_1;
static_assert(sizeof(block_q4_1) == 2 * 2 + QK4_1 / 2, "block_q4_1 size");

// x = d * (q - 16); qh: bit j (of the little-endian uint32) is bit 4 of element j
typedef struct {
    er_half d;
    uint8_t qh[4];
    uint8_t qs[QK5_0 / 2];
} block_q5_0;
static_assert(sizeof(block_q5_0) == 2 + 4 + QK5_0 / 2, "block_q5_0 size");

// x = d * q + m; qh as in block_q5_0
typedef struct {
    er_half d;
    er_half m;
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
} block_q5_1;
static_assert(sizeof(block_q5_1) == 2 * 2 + 4 + QK5_1 / 2, "block_q5_1 size");

// x = d * q
typedef struct {
    er_half d;
    int8_t qs[QK8_0];
} block_q8_0;
static_assert(sizeof(block_q8_0) == 2 + QK8_0, "block_q8_0 size");

// x = d * kvalues_iq4nl[q]; nibbles as in block_q4_0
typedef struct {
    er_half d;
    uint8_t qs[QK4_NL / 2];
} block_iq4_nl;
static_assert(sizeof(block_iq4_nl) == 2 + QK4_NL / 2, "block_iq4_nl size");

// ---- 256-element super-blocks (k-quants) ------------------------------------------------
// Where bits are spread over bytes below, "group g" is a run of 32 (or 16) consecutive bytes
// and "shift s" picks a bit field of each byte; element = g*(32 * fields per byte) + s*32 + l.

// 16 sub-blocks of 16: x = d * (scales[i] & 0xF) * q - dmin * (scales[i] >> 4).
// qs: 2-bit quants, 2 groups of 32 bytes, 4 fields (shifts 0, 2, 4, 6) per byte.
typedef struct {
    uint8_t scales[QK_K / 16];  // low nibble: scale, high nibble: min
    uint8_t qs[QK_K / 4];
    er_half d;                  // super-block scale for scales
    er_half dmin;               // super-block scale for mins
} block_q2_K;
static_assert(sizeof(block_q2_K) == 2 * 2 + QK_K / 16 + QK_K / 4, "block_q2_K size");

// 16 sub-blocks of 16: x = d * (scale - 32) * (q - (hmask bit ? 0 : 4)).
// qs: low 2 bits as in block_q2_K; hmask: 1 group of 32 bytes, 8 one-bit fields per byte.
typedef struct {
    uint8_t hmask[QK_K / 8];  // high bit of each quant, inverted (set means no -4 offset)
    uint8_t qs[QK_K / 4];     // low 2 bits
    uint8_t scales[12];       // 16 6-bit scales: low 4 bits in bytes 0-7 (both nibbles),
                              // high 2 bits in bytes 8-11 (four fields each)
    er_half d;
} block_q3_K;
static_assert(sizeof(block_q3_K) == 2 + QK_K / 4 + QK_K / 8 + 12, "block_q3_K size");

// 8 sub-blocks of 32: x = d * sc * q - dmin * m.
// qs: 4 groups of 32 bytes; low nibbles then high nibbles (sub-blocks 2g, 2g+1).
typedef struct {
    er_half d;                     // super-block scale for scales
    er_half dmin;                  // super-block scale for mins
    uint8_t scales[K_SCALE_SIZE];  // 12 bytes packing 8 6-bit scales and 8 6-bit mins:
                                   // bytes 0-3 sc0-3 (+ top bits of sc4-7), 4-7 m0-3 (+ top
                                   // bits of m4-7), 8-11 low nibble sc4-7, high nibble m4-7
    uint8_t qs[QK_K / 2];
} block_q4_K;
static_assert(sizeof(block_q4_K) == 2 * 2 + K_SCALE_SIZE + QK_K / 2, "block_q4_K size");

// As block_q4_K plus a fifth bit: qh is 1 group of 32 bytes, bit s of qh[l] belongs to
// element s*32 + l.
typedef struct {
    er_half d;
    er_half dmin;
    uint8_t scales[K_SCALE_SIZE];  // packed as in block_q4_K
    uint8_t qh[QK_K / 8];          // bit 4 of each quant
    uint8_t qs[QK_K / 2];          // low 4 bits, as in block_q4_K
} block_q5_K;
static_assert(sizeof(block_q5_K) == 2 * 2 + K_SCALE_SIZE + QK_K / 2 + QK_K / 8, "block_q5_K size");

// 16 sub-blocks of 16: x = d * scales[i] * (q - 32), q 6 bits.
// Two halves of 128 elements: ql 64 bytes per half (low nibbles = elements 0-63, high =
// 64-127), qh 32 bytes per half (shifts 0, 2, 4, 6 = elements +0, +32, +64, +96).
typedef struct {
    uint8_t ql[QK_K / 2];      // low 4 bits
    uint8_t qh[QK_K / 4];      // high 2 bits
    int8_t scales[QK_K / 16];  // 8-bit signed scales
    er_half d;
} block_q6_K;
static_assert(sizeof(block_q6_K) == 2 + QK_K / 16 + 3 * QK_K / 4, "block_q6_K size");

// Activation format for k-quant dot products: x = d * q; bsums[i] = sum of qs[16i..16i+15].
typedef struct {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
} block_q8_K;
static_assert(sizeof(block_q8_K) == 4 + QK_K + QK_K / 16 * 2, "block_q8_K size");

// 8 sub-blocks of 32: x = d * (scale - 32) * kvalues_iq4nl[q].
// qs: 8 groups of 16 bytes; low nibbles = elements 0-15, high = 16-31 of sub-block g.
typedef struct {
    er_half d;
    uint16_t scales_h;            // high 2 bits of the 8 6-bit scales (bits 2i, 2i+1)
    uint8_t scales_l[QK_K / 64];  // low 4 bits: scale 2k in scales_l[k] & 0xF, 2k+1 in >> 4
    uint8_t qs[QK_K / 2];
} block_iq4_xs;
static_assert(sizeof(block_iq4_xs) == 2 + 2 + QK_K / 64 + QK_K / 2, "block_iq4_xs size");

// Non-linear 4-bit code book of IQ4_NL and IQ4_XS.
ER_TABLE(int8_t, kvalues_iq4nl, 16) = {
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
};
