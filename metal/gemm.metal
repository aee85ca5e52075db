// Matrix × matrix for prefill (OpKind::MatMul over many tokens) on the simdgroup matrix units.
//
// A threadgroup computes a tile of ER_GEMM_TILE (32) weight rows × 32 tokens. Per 32-column step
// each of its 128 threads dequantizes one quarter (8 elements) of one weight row into
// threadgroup memory (dequant8, so every weight type shares this tile path) and loads one
// quarter of one token's activations; then simdgroup s multiplies its 8 rows by the four 8-token
// blocks with simdgroup_multiply_accumulate (8×8×8 per call, float accumulators). The weights
// are read once per 32 tokens instead of once per token.
//
// The same fusions as the GEMV (gemv.metal), with the same argument table, so the host picks
// GEMV or GEMM per step by its token count: the RMSNorm of the input (each token's Σx² is
// gathered while its tile loads, the 1/rms applied to its output column), Q/K/V parts, gate+up
// with the activation in the epilogue, bias and the residual add.
#include "matmul.h"

template <typename T, typename Tile, typename Column>
inline void gemm(constant er_matmul_args& a, constant er_step_block& step, uint3 tgid, uint tid, uint sg,
                 Tile wt, Tile ut, Tile xt, Tile ct, Column inv_rms) {
    constexpr uint B = ER_GEMM_TILE;
    const uint row0 = tgid.x * B;
    const uint t0 = first_row(step, a.tail) + tgid.y * B;
    const uint n_tokens = uint(step.n_tokens);

    // This thread loads quarter jk of weight row row0 + jr and of token t0 + jr.
    const uint jr = tid / 4, jk = tid % 4;
    const bool row_ok = row0 + jr < a.rows, token_ok = t0 + jr < n_tokens;
    uint r = min(row0 + jr, a.rows - 1);
    const uint p = kGlu != ER_GLU_NONE ? 0 : part_of(a, r);
    device const uint8_t* w = a.part[p].w + uint64_t(r) * a.row_bytes;
    device const uint8_t* wu = kGlu != ER_GLU_NONE ? a.part[1].w + uint64_t(r) * a.row_bytes : w;
    device const float* x = a.x + min(t0 + jr, n_tokens - 1) * a.x_stride;

    const simdgroup_float8x8 zero = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    simdgroup_float8x8 acc[4], acc_u[4];
    for (uint i = 0; i < 4; ++i) acc[i] = acc_u[i] = zero;
    float ss = 0.0f;
    for (uint u = 0; u < a.cols / 32; ++u) {
        float v[8];
        dequant8(T(), w, u, jk, v);
        for (uint i = 0; i < 8; ++i) wt[jr * B + 8 * jk + i] = row_ok ? v[i] : 0.0f;
        if (kGlu != ER_GLU_NONE) {
            dequant8(T(), wu, u, jk, v);
            for (uint i = 0; i < 8; ++i) ut[jr * B + 8 * jk + i] = row_ok ? v[i] : 0.0f;
        }
        load_x8(a, x, u, jk, v, ss);
        for (uint i = 0; i < 8; ++i) xt[jr * B + 8 * jk + i] = token_ok ? v[i] : 0.0f;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        // simdgroup sg: rows 8 sg.. of the tile × tokens 8 tb..; wt is rows × k, xt tokens × k
        // (loaded transposed: k × tokens)
        for (uint kk = 0; kk < 4; ++kk) {
            simdgroup_float8x8 mw, mu, mx;
            simdgroup_load(mw, wt + 8 * sg * B + 8 * kk, B);
            if (kGlu != ER_GLU_NONE) simdgroup_load(mu, ut + 8 * sg * B + 8 * kk, B);
            for (uint tb = 0; tb < 4; ++tb) {
                simdgroup_load(mx, xt + 8 * tb * B + 8 * kk, B, ulong2(0), true);
                simdgroup_multiply_accumulate(acc[tb], mw, mx, acc[tb]);
                if (kGlu != ER_GLU_NONE) simdgroup_multiply_accumulate(acc_u[tb], mu, mx, acc_u[tb]);
            }
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (kNormIn) {  // the four threads of token jr hold its four quarters' sums
        ss += simd_shuffle_xor(ss, ushort(1));
        ss += simd_shuffle_xor(ss, ushort(2));
        if (jk == 0) inv_rms[jr] = rsqrt(ss / float(a.cols) + a.norm_eps);
    }
    for (uint tb = 0; tb < 4; ++tb) {
        simdgroup_store(acc[tb], ct + 8 * sg * B + 8 * tb, B);
        if (kGlu != ER_GLU_NONE) simdgroup_store(acc_u[tb], ut + 8 * sg * B + 8 * tb, B);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    // Neighbouring threads write neighbouring rows of one token.
    for (uint e = tid; e < B * B; e += ER_THREADS_GEMM) {
        const uint tt = e / B, rr = e % B;
        if (t0 + tt >= n_tokens || row0 + rr >= a.rows) continue;
        const float scale = kNormIn ? inv_rms[tt] : 1.0f;
        const float v = ct[rr * B + tt] * scale;
        if (kGlu != ER_GLU_NONE) {
            a.part[0].y[(t0 + tt) * a.part[0].y_stride + row0 + rr] = glu(v, ut[rr * B + tt] * scale);
        } else {
            uint row = row0 + rr;
            const uint part = part_of(a, row);
            store_row(a, part, row, t0 + tt, v);
        }
    }
}

// One entry point per weight type; the tiles live in threadgroup memory (16.1 KB).
kernel void gemm_f32(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    threadgroup float wt[ER_GEMM_TILE * ER_GEMM_TILE], ut[ER_GEMM_TILE * ER_GEMM_TILE], xt[ER_GEMM_TILE * ER_GEMM_TILE],
        ct[ER_GEMM_TILE * ER_GEMM_TILE], inv_rms[ER_GEMM_TILE];
    gemm<quant::F32>(a, step, tgid, tid, sg, wt, ut, xt, ct, inv_rms);
}
kernel void gemm_f16(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    threadgroup float wt[ER_GEMM_TILE * ER_GEMM_TILE], ut[ER_GEMM_TILE * ER_GEMM_TILE], xt[ER_GEMM_TILE * ER_GEMM_TILE],
        ct[ER_GEMM_TILE * ER_GEMM_TILE], inv_rms[ER_GEMM_TILE];
    gemm<quant::F16>(a, step, tgid, tid, sg, wt, ut, xt, ct, inv_rms);
}
kernel void gemm_bf16(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    threadgroup float wt[ER_GEMM_TILE * ER_GEMM_TILE], ut[ER_GEMM_TILE * ER_GEMM_TILE], xt[ER_GEMM_TILE * ER_GEMM_TILE],
        ct[ER_GEMM_TILE * ER_GEMM_TILE], inv_rms[ER_GEMM_TILE];
    gemm<quant::BF16>(a, step, tgid, tid, sg, wt, ut, xt, ct, inv_rms);
}
kernel void gemm_q4_0(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    threadgroup float wt[ER_GEMM_TILE * ER_GEMM_TILE], ut[ER_GEMM_TILE * ER_GEMM_TILE], xt[ER_GEMM_TILE * ER_GEMM_TILE],
        ct[ER_GEMM_TILE * ER_GEMM_TILE], inv_rms[ER_GEMM_TILE];
    gemm<quant::Q4_0>(a, step, tgid, tid, sg, wt, ut, xt, ct, inv_rms);
}
kernel void gemm_q4_1(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    threadgroup float wt[ER_GEMM_TILE * ER_GEMM_TILE], ut[ER_GEMM_TILE * ER_GEMM_TILE], xt[ER_GEMM_TILE * ER_GEMM_TILE],
        ct[ER_GEMM_TILE * ER_GEMM_TILE], inv_rms[ER_GEMM_TILE];
    gemm<quant::Q4_1>(a, step, tgid, tid, sg, wt, ut, xt, ct, inv_rms);
}
kernel void gemm_q5_0(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    threadgroup float wt[ER_GEMM_TILE * ER_GEMM_TILE], ut[ER_GEMM_TILE * ER_GEMM_TILE], xt[ER_GEMM_TILE * ER_GEMM_TILE],
        ct[ER_GEMM_TILE * ER_GEMM_TILE], inv_rms[ER_GEMM_TILE];
    gemm<quant::Q5_0>(a, step, tgid, tid, sg, wt, ut, xt, ct, inv_rms);
}
kernel void gemm_q5_1(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    threadgroup float wt[ER_GEMM_TILE * ER_GEMM_TILE], ut[ER_GEMM_TILE * ER_GEMM_TILE], xt[ER_GEMM_TILE * ER_GEMM_TILE],
        ct[ER_GEMM_TILE * ER_GEMM_TILE], inv_rms[ER_GEMM_TILE];
    gemm<quant::Q5_1>(a, step, tgid, tid, sg, wt, ut, xt, ct, inv_rms);
}
kernel void gemm_q8_0(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    threadgroup float wt[ER_GEMM_TILE * ER_GEMM_TILE], ut[ER_GEMM_TILE * ER_GEMM_TILE], xt[ER_GEMM_TILE * ER_GEMM_TILE],
        ct[ER_GEMM_TILE * ER_GEMM_TILE], inv_rms[ER_GEMM_TILE];
    gemm<quant::Q8_0>(a, step, tgid, tid, sg, wt, ut, xt, ct, inv_rms);
}
kernel void gemm_iq4_nl(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    threadgroup float wt[ER_GEMM_TILE * ER_GEMM_TILE], ut[ER_GEMM_TILE * ER_GEMM_TILE], xt[ER_GEMM_TILE * ER_GEMM_TILE],
        ct[ER_GEMM_TILE * ER_GEMM_TILE], inv_rms[ER_GEMM_TILE];
    gemm<quant::IQ4_NL>(a, step, tgid, tid, sg, wt, ut, xt, ct, inv_rms);
}
kernel void gemm_q2_k(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    threadgroup float wt[ER_GEMM_TILE * ER_GEMM_TILE], ut[ER_GEMM_TILE * ER_GEMM_TILE], xt[ER_GEMM_TILE * ER_GEMM_TILE],
        ct[ER_GEMM_TILE * ER_GEMM_TILE], inv_rms[ER_GEMM_TILE];
    gemm<quant::Q2_K>(a, step, tgid, tid, sg, wt, ut, xt, ct, inv_rms);
}
kernel void gemm_q3_k(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    threadgroup float wt[ER_GEMM_TILE * ER_GEMM_TILE], ut[ER_GEMM_TILE * ER_GEMM_TILE], xt[ER_GEMM_TILE * ER_GEMM_TILE],
        ct[ER_GEMM_TILE * ER_GEMM_TILE], inv_rms[ER_GEMM_TILE];
    gemm<quant::Q3_K>(a, step, tgid, tid, sg, wt, ut, xt, ct, inv_rms);
}
kernel void gemm_q4_k(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    threadgroup float wt[ER_GEMM_TILE * ER_GEMM_TILE], ut[ER_GEMM_TILE * ER_GEMM_TILE], xt[ER_GEMM_TILE * ER_GEMM_TILE],
        ct[ER_GEMM_TILE * ER_GEMM_TILE], inv_rms[ER_GEMM_TILE];
    gemm<quant::Q4_K>(a, step, tgid, tid, sg, wt, ut, xt, ct, inv_rms);
}
kernel void gemm_q5_k(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    threadgroup float wt[ER_GEMM_TILE * ER_GEMM_TILE], ut[ER_GEMM_TILE * ER_GEMM_TILE], xt[ER_GEMM_TILE * ER_GEMM_TILE],
        ct[ER_GEMM_TILE * ER_GEMM_TILE], inv_rms[ER_GEMM_TILE];
    gemm<quant::Q5_K>(a, step, tgid, tid, sg, wt, ut, xt, ct, inv_rms);
}
kernel void gemm_q6_k(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    threadgroup float wt[ER_GEMM_TILE * ER_GEMM_TILE], ut[ER_GEMM_TILE * ER_GEMM_TILE], xt[ER_GEMM_TILE * ER_GEMM_TILE],
        ct[ER_GEMM_TILE * ER_GEMM_TILE], inv_rms[ER_GEMM_TILE];
    gemm<quant::Q6_K>(a, step, tgid, tid, sg, wt, ut, xt, ct, inv_rms);
}
kernel void gemm_q8_k(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    threadgroup float wt[ER_GEMM_TILE * ER_GEMM_TILE], ut[ER_GEMM_TILE * ER_GEMM_TILE], xt[ER_GEMM_TILE * ER_GEMM_TILE],
        ct[ER_GEMM_TILE * ER_GEMM_TILE], inv_rms[ER_GEMM_TILE];
    gemm<quant::Q8_K>(a, step, tgid, tid, sg, wt, ut, xt, ct, inv_rms);
}
kernel void gemm_iq4_xs(constant er_matmul_args& a [[buffer(ER_BUFFER_ARGS)]],
                     constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    threadgroup float wt[ER_GEMM_TILE * ER_GEMM_TILE], ut[ER_GEMM_TILE * ER_GEMM_TILE], xt[ER_GEMM_TILE * ER_GEMM_TILE],
        ct[ER_GEMM_TILE * ER_GEMM_TILE], inv_rms[ER_GEMM_TILE];
    gemm<quant::IQ4_XS>(a, step, tgid, tid, sg, wt, ut, xt, ct, inv_rms);
}
