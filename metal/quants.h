// Weights in their raw blocks (edgerunner/quant_blocks.h), read eight elements at a time.
//
// Every format splits a row into units of 32 consecutive elements: a 32-element block, or
// sub-block u % 8 of a 256-element super-block. A quarter is 8 consecutive elements of a unit;
// dequant8(Type(), row, u, k, w) decodes quarter k (elements 8k..8k+7) of unit u into w. GEMV,
// GEMM and the embedding lookup all read weights through it, so each layout is written once.
// Element orders follow csrc/core/dequantize.cpp (the bit-exact reference); CUDA's
// quant_unit.cuh decodes the same units.
#pragma once

#include "common.h"

namespace quant {
struct F32 {};
struct F16 {};
struct BF16 {};
struct Q4_0 {};
struct Q4_1 {};
struct Q5_0 {};
struct Q5_1 {};
struct Q8_0 {};
struct IQ4_NL {};
struct Q2_K {};
struct Q3_K {};
struct Q4_K {};
struct Q5_K {};
struct Q6_K {};
struct Q8_K {};
struct IQ4_XS {};
}  // namespace quant

inline void dequant8(quant::F32, device const uint8_t* row, uint u, uint k, thread float* w) {
    device const float* p = reinterpret_cast<device const float*>(row) + 32 * u + 8 * k;
    for (uint i = 0; i < 8; ++i) w[i] = p[i];
}

inline void dequant8(quant::F16, device const uint8_t* row, uint u, uint k, thread float* w) {
    device const half* p = reinterpret_cast<device const half*>(row) + 32 * u + 8 * k;
    for (uint i = 0; i < 8; ++i) w[i] = float(p[i]);
}

// bf16 is the top half of a float32.
inline void dequant8(quant::BF16, device const uint8_t* row, uint u, uint k, thread float* w) {
    device const uint16_t* p = reinterpret_cast<device const uint16_t*>(row) + 32 * u + 8 * k;
    for (uint i = 0; i < 8; ++i) w[i] = as_type<float>(uint(p[i]) << 16);
}

// Nibble formats: element l < 16 is the low nibble of qs[l], l >= 16 the high nibble of
// qs[l - 16]; quarter k reads bytes 8 (k % 2).. with shift 4 (k / 2).
inline void dequant8(quant::Q4_0, device const uint8_t* row, uint u, uint k, thread float* w) {
    device const block_q4_0* b = reinterpret_cast<device const block_q4_0*>(row) + u;
    const float d = float(b->d);
    const uint shift = 4 * (k / 2);
    for (uint i = 0; i < 8; ++i) w[i] = d * float(int((b->qs[8 * (k % 2) + i] >> shift) & 0xF) - 8);
}

inline void dequant8(quant::Q4_1, device const uint8_t* row, uint u, uint k, thread float* w) {
    device const block_q4_1* b = reinterpret_cast<device const block_q4_1*>(row) + u;
    const float d = float(b->d), m = float(b->m);
    const uint shift = 4 * (k / 2);
    for (uint i = 0; i < 8; ++i) w[i] = d * float((b->qs[8 * (k % 2) + i] >> shift) & 0xF) + m;
}

inline void dequant8(quant::IQ4_NL, device const uint8_t* row, uint u, uint k, thread float* w) {
    device const block_iq4_nl* b = reinterpret_cast<device const block_iq4_nl*>(row) + u;
    const float d = float(b->d);
    const uint shift = 4 * (k / 2);
    for (uint i = 0; i < 8; ++i) w[i] = d * float(kvalues_iq4nl[(b->qs[8 * (k % 2) + i] >> shift) & 0xF]);
}

// Q5: bit l of the little-endian qh word is bit 4 of element l.
inline uint q5_high(device const uint8_t* qh) {
    return uint(qh[0]) | uint(qh[1]) << 8 | uint(qh[2]) << 16 | uint(qh[3]) << 24;
}

inline void dequant8(quant::Q5_0, device const uint8_t* row, uint u, uint k, thread float* w) {
    device const block_q5_0* b = reinterpret_cast<device const block_q5_0*>(row) + u;
    const float d = float(b->d);
    const uint qh = q5_high(b->qh), shift = 4 * (k / 2);
    for (uint i = 0; i < 8; ++i) {
        const uint q = ((b->qs[8 * (k % 2) + i] >> shift) & 0xF) | ((qh >> (8 * k + i)) & 1) << 4;
        w[i] = d * float(int(q) - 16);
    }
}

inline void dequant8(quant::Q5_1, device const uint8_t* row, uint u, uint k, thread float* w) {
    device const block_q5_1* b = reinterpret_cast<device const block_q5_1*>(row) + u;
    const float d = float(b->d), m = float(b->m);
    const uint qh = q5_high(b->qh), shift = 4 * (k / 2);
    for (uint i = 0; i < 8; ++i) {
        const uint q = ((b->qs[8 * (k % 2) + i] >> shift) & 0xF) | ((qh >> (8 * k + i)) & 1) << 4;
        w[i] = d * float(q) + m;
    }
}

inline void dequant8(quant::Q8_0, device const uint8_t* row, uint u, uint k, thread float* w) {
    device const block_q8_0* b = reinterpret_cast<device const block_q8_0*>(row) + u;
    const float d = float(b->d);
    for (uint i = 0; i < 8; ++i) w[i] = float(b->qs[8 * k + i]) * d;
}

// ---- k-quants: unit j = u % 8 of super-block u / 8; element e = 32 j + l of the super-block ----

// Q2_K: bits 2 (j % 4) of qs[32 (j / 4) + l]; 16-element sub-block 2j + l / 16 has scale (low
// nibble) and min (high nibble) of scales[].
inline void dequant8(quant::Q2_K, device const uint8_t* row, uint u, uint k, thread float* w) {
    device const block_q2_K* b = reinterpret_cast<device const block_q2_K*>(row) + u / 8;
    const uint j = u % 8;
    const uint8_t sc = b->scales[2 * j + k / 2];  // l = 8k + i, so l / 16 = k / 2
    const float dl = float(b->d) * float(sc & 0xF), ml = float(b->dmin) * float(sc >> 4);
    device const uint8_t* q = b->qs + 32 * (j / 4) + 8 * k;
    for (uint i = 0; i < 8; ++i) w[i] = dl * float((q[i] >> (2 * (j % 4))) & 3) - ml;
}

// Q3_K: low bits as Q2_K; the high bit is bit j of hmask[l], clear meaning -4; 6-bit scale of
// sub-block sb: low nibble sb / 8 of scales[sb % 8], high 2 bits field sb / 4 of scales[8 + sb % 4].
inline void dequant8(quant::Q3_K, device const uint8_t* row, uint u, uint k, thread float* w) {
    device const block_q3_K* b = reinterpret_cast<device const block_q3_K*>(row) + u / 8;
    const uint j = u % 8, sb = 2 * j + k / 2;
    const int lo = (b->scales[sb % 8] >> (4 * (sb / 8))) & 0xF;
    const int hi = (b->scales[8 + sb % 4] >> (2 * (sb / 4))) & 3;
    const float dl = float(b->d) * float((lo | hi << 4) - 32);
    for (uint i = 0; i < 8; ++i) {
        const uint l = 8 * k + i;
        const int q = int((b->qs[32 * (j / 4) + l] >> (2 * (j % 4))) & 3) - (((b->hmask[l] >> j) & 1) ? 0 : 4);
        w[i] = dl * float(q);
    }
}

// Q4_K / Q5_K: 6-bit scale and min of sub-block j (ggml's get_scale_min_k4).
inline void k_scale_min(device const uint8_t* s, uint j, thread int& sc, thread int& m) {
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Q4_K: nibble j % 2 of qs[32 (j / 2) + l]; x = d·sc·q - dmin·m.
inline void dequant8(quant::Q4_K, device const uint8_t* row, uint u, uint k, thread float* w) {
    device const block_q4_K* b = reinterpret_cast<device const block_q4_K*>(row) + u / 8;
    const uint j = u % 8;
    int sc, m;
    k_scale_min(b->scales, j, sc, m);
    const float dl = float(b->d) * float(sc), ml = float(b->dmin) * float(m);
    device const uint8_t* q = b->qs + 32 * (j / 2) + 8 * k;
    for (uint i = 0; i < 8; ++i) w[i] = dl * float((q[i] >> (4 * (j % 2))) & 0xF) - ml;
}

// Q5_K: Q4_K plus bit j of qh[l] as bit 4.
inline void dequant8(quant::Q5_K, device const uint8_t* row, uint u, uint k, thread float* w) {
    device const block_q5_K* b = reinterpret_cast<device const block_q5_K*>(row) + u / 8;
    const uint j = u % 8;
    int sc, m;
    k_scale_min(b->scales, j, sc, m);
    const float dl = float(b->d) * float(sc), ml = float(b->dmin) * float(m);
    device const uint8_t* q = b->qs + 32 * (j / 2) + 8 * k;
    device const uint8_t* qh = b->qh + 8 * k;
    for (uint i = 0; i < 8; ++i) w[i] = dl * float(((q[i] >> (4 * (j % 2))) & 0xF) | ((qh[i] >> j) & 1) << 4) - ml;
}

// Q6_K: half h = j / 4, s = j % 4: low nibble s / 2 of ql[64 h + 32 (s % 2) + l], high 2 bits at
// 2s of qh[32 h + l], minus 32; int8 scale of sub-block 2j + l / 16.
inline void dequant8(quant::Q6_K, device const uint8_t* row, uint u, uint k, thread float* w) {
    device const block_q6_K* b = reinterpret_cast<device const block_q6_K*>(row) + u / 8;
    const uint j = u % 8, h = j / 4, s = j % 4;
    const float dl = float(b->d) * float(b->scales[2 * j + k / 2]);
    device const uint8_t* ql = b->ql + 64 * h + 32 * (s % 2) + 8 * k;
    device const uint8_t* qh = b->qh + 32 * h + 8 * k;
    for (uint i = 0; i < 8; ++i) {
        const int q = int(((ql[i] >> (4 * (s / 2))) & 0xF) | ((qh[i] >> (2 * s)) & 3) << 4) - 32;
        w[i] = dl * float(q);
    }
}

inline void dequant8(quant::Q8_K, device const uint8_t* row, uint u, uint k, thread float* w) {
    device const block_q8_K* b = reinterpret_cast<device const block_q8_K*>(row) + u / 8;
    device const int8_t* q = b->qs + 32 * (u % 8) + 8 * k;
    for (uint i = 0; i < 8; ++i) w[i] = b->d * float(q[i]);
}

// IQ4_XS: sub-block j: 6-bit scale (low nibble j % 2 of scales_l[j / 2], high 2 bits of
// scales_h at 2j) minus 32, code-book nibbles as IQ4_NL over qs[16 j ..].
inline void dequant8(quant::IQ4_XS, device const uint8_t* row, uint u, uint k, thread float* w) {
    device const block_iq4_xs* b = reinterpret_cast<device const block_iq4_xs*>(row) + u / 8;
    const uint j = u % 8;
    const int scale = (((b->scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | ((b->scales_h >> (2 * j)) & 3) << 4) - 32;
    const float dl = float(b->d) * float(scale);
    const uint shift = 4 * (k / 2);
    device const uint8_t* q = b->qs + 16 * j + 8 * (k % 2);
    for (uint i = 0; i < 8; ++i) w[i] = dl * float(kvalues_iq4nl[(q[i] >> shift) & 0xF]);
}
