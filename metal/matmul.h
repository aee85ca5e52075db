// What the GEMV (gemv.metal) and the GEMM (gemm.metal) share: one argument table
// (er_matmul_args) read the same way, the same activation loads and the same epilogue, so the
// host can pick either kernel for a step.
#pragma once

#include "common.h"
#include "quants.h"

// Which part row r (of the parts' combined rows) belongs to, and its row within that part.
inline uint part_of(constant er_matmul_args& a, thread uint& r) {
    uint p = 0;
    while (p + 1 < a.n_parts && r >= a.part[p].rows) r -= a.part[p++].rows;
    return p;
}

// The activations' quarter k of unit u: 8 floats, × norm_w when the norm is fused (their
// squares summed into ss first).
inline void load_x8(constant er_matmul_args& a, device const float* x, uint u, uint k, thread float* xv, thread float& ss) {
    device const float4* p = reinterpret_cast<device const float4*>(x + 32 * u + 8 * k);
    const float4 lo = p[0], hi = p[1];
    xv[0] = lo.x; xv[1] = lo.y; xv[2] = lo.z; xv[3] = lo.w;
    xv[4] = hi.x; xv[5] = hi.y; xv[6] = hi.z; xv[7] = hi.w;
    if (kNormIn) {
        for (uint i = 0; i < 8; ++i) {
            ss += xv[i] * xv[i];
            xv[i] *= a.norm_w[32 * u + 8 * k + i];
        }
    }
}

inline float dot8(thread const float* w, thread const float* x) {
    float s = 0.0f;
    for (uint i = 0; i < 8; ++i) s += w[i] * x[i];
    return s;
}

// The epilogue shared with the GEMM: one finished value of row r (a row of part p), token t.
inline void store_row(constant er_matmul_args& a, uint p, uint r, uint t, float v) {
    if (kHasBias) v += a.part[p].bias[r];
    device float* y = a.part[p].y + t * a.part[p].y_stride + r;
    if (kAccumulate) *y += v;
    else *y = v;
}

inline float glu(float g, float u) { return (kGlu == ER_GLU_GELU ? gelu_tanh(g) : silu(g)) * u; }
