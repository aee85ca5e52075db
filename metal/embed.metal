// Embedding lookup (OpKind::Embed): x[t] = row tokens[t] of the embedding matrix, decoded from
// its raw blocks, × scale. One threadgroup per token; thread i decodes quarters i, i + 128, ...
// (8 elements each), so neighbouring threads write neighbouring floats. Thread 0 also records
// the token at its position in the history (what the penalties read: metal/sample.metal).
#include "common.h"
#include "quants.h"

template <typename T>
inline void embed(constant er_embed_args& a, constant er_step_block& step, uint3 tgid, uint tid) {
    const uint t = tgid.x;
    if (tid == 0 && a.history) a.history[step.pos0 + int(t)] = step_tokens(step)[t];
    device const uint8_t* row = a.w + uint64_t(step_tokens(step)[t]) * a.row_bytes;
    device float* x = a.x + t * a.x_stride;
    for (uint q = tid; q < a.cols / 8; q += ER_THREADS_EMBED) {
        float w[8];
        dequant8(T(), row, q / 4, q % 4, w);
        for (uint i = 0; i < 8; ++i) x[8 * q + i] = w[i] * a.scale;
    }
}

// One entry point per weight type.
kernel void embed_f32(constant er_embed_args& a [[buffer(ER_BUFFER_ARGS)]],
                      constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    embed<quant::F32>(a, step, tgid, tid);
}
kernel void embed_f16(constant er_embed_args& a [[buffer(ER_BUFFER_ARGS)]],
                      constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    embed<quant::F16>(a, step, tgid, tid);
}
kernel void embed_bf16(constant er_embed_args& a [[buffer(ER_BUFFER_ARGS)]],
                      constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    embed<quant::BF16>(a, step, tgid, tid);
}
kernel void embed_q4_0(constant er_embed_args& a [[buffer(ER_BUFFER_ARGS)]],
                      constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    embed<quant::Q4_0>(a, step, tgid, tid);
}
kernel void embed_q4_1(constant er_embed_args& a [[buffer(ER_BUFFER_ARGS)]],
                      constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    embed<quant::Q4_1>(a, step, tgid, tid);
}
kernel void embed_q5_0(constant er_embed_args& a [[buffer(ER_BUFFER_ARGS)]],
                      constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    embed<quant::Q5_0>(a, step, tgid, tid);
}
kernel void embed_q5_1(constant er_embed_args& a [[buffer(ER_BUFFER_ARGS)]],
                      constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    embed<quant::Q5_1>(a, step, tgid, tid);
}
kernel void embed_q8_0(constant er_embed_args& a [[buffer(ER_BUFFER_ARGS)]],
                      constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    embed<quant::Q8_0>(a, step, tgid, tid);
}
kernel void embed_iq4_nl(constant er_embed_args& a [[buffer(ER_BUFFER_ARGS)]],
                      constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    embed<quant::IQ4_NL>(a, step, tgid, tid);
}
kernel void embed_q2_k(constant er_embed_args& a [[buffer(ER_BUFFER_ARGS)]],
                      constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    embed<quant::Q2_K>(a, step, tgid, tid);
}
kernel void embed_q3_k(constant er_embed_args& a [[buffer(ER_BUFFER_ARGS)]],
                      constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    embed<quant::Q3_K>(a, step, tgid, tid);
}
kernel void embed_q4_k(constant er_embed_args& a [[buffer(ER_BUFFER_ARGS)]],
                      constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    embed<quant::Q4_K>(a, step, tgid, tid);
}
kernel void embed_q5_k(constant er_embed_args& a [[buffer(ER_BUFFER_ARGS)]],
                      constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    embed<quant::Q5_K>(a, step, tgid, tid);
}
kernel void embed_q6_k(constant er_embed_args& a [[buffer(ER_BUFFER_ARGS)]],
                      constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    embed<quant::Q6_K>(a, step, tgid, tid);
}
kernel void embed_q8_k(constant er_embed_args& a [[buffer(ER_BUFFER_ARGS)]],
                      constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    embed<quant::Q8_K>(a, step, tgid, tid);
}
kernel void embed_iq4_xs(constant er_embed_args& a [[buffer(ER_BUFFER_ARGS)]],
                      constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    embed<quant::IQ4_XS>(a, step, tgid, tid);
}
