// Matrix × vector for decode and short steps (OpKind::MatMul, and what fuses into it): each
// weight is read once per token, in its raw blocks, never materialized as float.
//
// Threadgroup: 4 simdgroups, each computing ER_GEMV_ROWS rows for one token (grid: row groups ×
// tokens). Lanes 4i..4i+3 take the four quarters of unit i of 8 consecutive units, so a
// simdgroup reads 256 consecutive activations per step with one float4 pair per lane, and each
// activation quarter, once in registers, serves all the simdgroup's rows. A simd_sum per row
// ends it.
//
// Fused through function constants (the host decides, metal/program.cpp):
//   kNormIn      RMSNorm of the input on the fly (norm+QKV, final norm+LM head): the lanes also
//                sum x² as they go, and the dot products of x ∘ norm_w are scaled by 1/rms(x);
//   n_parts      Q, K and V (one type, one input) as one dispatch: rows numbered across parts;
//   kGlu         gate and up in one pass: y = act(W_gate x) · (W_up x) (gate+up+SiLU/GELU);
//   kAccumulate  y += W x: the residual add (GEMV+residual);
//   kHasBias     + bias (qwen2's Q/K/V).
#include "matmul.h"

template <typename T>
inline void gemv(constant er_matmul_args& a, constant er_step_block& step, uint3 tgid, uint sg, uint lane) {
    constexpr uint R = ER_GEMV_ROWS;
    const uint t = first_row(step, a.tail) + tgid.y;
    const uint row0 = (tgid.x * (ER_THREADS_GEMV / ER_SIMD) + sg) * R;
    if (row0 >= a.rows) return;  // a whole simdgroup leaves; no threadgroup barrier follows
    device const float* x = a.x + t * a.x_stride;

    // Each row's weights: its part's matrix (with kGlu, the same row of gate and of up).
    device const uint8_t* w[R];
    device const uint8_t* wu[R];
    uint part[R], row[R];
    for (uint i = 0; i < R; ++i) {
        uint r = min(row0 + i, a.rows - 1);
        part[i] = kGlu != ER_GLU_NONE ? 0 : part_of(a, r);
        row[i] = r;
        w[i] = a.part[part[i]].w + uint64_t(r) * a.row_bytes;
        wu[i] = kGlu != ER_GLU_NONE ? a.part[1].w + uint64_t(r) * a.row_bytes : w[i];
    }

    float sum[R], sum_u[R], ss = 0.0f;
    for (uint i = 0; i < R; ++i) sum[i] = sum_u[i] = 0.0f;
    const uint k = lane % 4;
    for (uint u = lane / 4; u < a.cols / 32; u += ER_SIMD / 4) {
        float xv[8], wv[8];
        load_x8(a, x, u, k, xv, ss);
        for (uint i = 0; i < R; ++i) {
            dequant8(T(), w[i], u, k, wv);
            sum[i] += dot8(wv, xv);
            if (kGlu != ER_GLU_NONE) {
                dequant8(T(), wu[i], u, k, wv);
                sum_u[i] += dot8(wv, xv);
            }
        }
    }
    float scale = 1.0f;
    if (kNormIn) scale = rsqrt(simd_sum(ss) / float(a.cols) + a.norm_eps);
    for (uint i = 0; i < R; ++i) {
        const float v = simd_sum(sum[i]) * scale;
        const float vu = kGlu != ER_GLU_NONE ? simd_sum(sum_u[i]) * scale : 0.0f;
        if (lane != 0 || row0 + i >= a.rows) continue;
        if (kGlu != ER_GLU_NONE) {
            a.part[0].y[t * a.part[0].y_stride + row[i]] = glu(v, vu);
        } else {
            store_row(a, part[i], row[i], t, v);
        }
    }
}

// One entry point per weight type.
kernel void gemv_f32(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    gemv<quant::F32>(a, step, tgid, sg, lane);
}
kernel void gemv_f16(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    gemv<quant::F16>(a, step, tgid, sg, lane);
}
kernel void gemv_bf16(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    gemv<quant::BF16>(a, step, tgid, sg, lane);
}
kernel void gemv_q4_0(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    gemv<quant::Q4_0>(a, step, tgid, sg, lane);
}
kernel void gemv_q4_1(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    gemv<quant::Q4_1>(a, step, tgid, sg, lane);
}
kernel void gemv_q5_0(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    gemv<quant::Q5_0>(a, step, tgid, sg, lane);
}
kernel void gemv_q5_1(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    gemv<quant::Q5_1>(a, step, tgid, sg, lane);
}
kernel void gemv_q8_0(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    gemv<quant::Q8_0>(a, step, tgid, sg, lane);
}
kernel void gemv_iq4_nl(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    gemv<quant::IQ4_NL>(a, step, tgid, sg, lane);
}
kernel void gemv_q2_k(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    gemv<quant::Q2_K>(a, step, tgid, sg, lane);
}
kernel void gemv_q3_k(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    gemv<quant::Q3_K>(a, step, tgid, sg, lane);
}
kernel void gemv_q4_k(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    gemv<quant::Q4_K>(a, step, tgid, sg, lane);
}
kernel void gemv_q5_k(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    gemv<quant::Q5_K>(a, step, tgid, sg, lane);
}
kernel void gemv_q6_k(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    gemv<quant::Q6_K>(a, step, tgid, sg, lane);
}
kernel void gemv_q8_k(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    gemv<quant::Q8_K>(a, step, tgid, sg, lane);
}
kernel void gemv_iq4_xs(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    gemv<quant::IQ4_XS>(a, step, tgid, sg, lane);
}
