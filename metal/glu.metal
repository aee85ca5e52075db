// Gated activations when they are not fused into the gate/up matmul (OpKind::SwiGLU and
// OpKind::GeGLU): g = act(g) · u, elementwise over each token's width values.
// Grid (ceil(width / 256), tokens).
#include "common.h"

template <uint Glu>
inline void glu_rows(constant er_glu_args& a, uint3 tgid, uint tid) {
    const uint i = tgid.x * ER_THREADS_GLU + tid, t = tgid.y;
    if (i >= a.width) return;
    device float* g = a.g + t * a.g_stride + i;
    const float u = a.u[t * a.u_stride + i];
    *g = (Glu == ER_GLU_GELU ? gelu_tanh(*g) : silu(*g)) * u;
}

kernel void swiglu(constant er_glu_args& a [[buffer(ER_BUFFER_ARGS)]],
                   constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    glu_rows<ER_GLU_SILU>(a, tgid, tid);
}

kernel void geglu(constant er_glu_args& a [[buffer(ER_BUFFER_ARGS)]],
                  constant er_step_block& step [[buffer(ER_BUFFER_STEP)]], ER_THREAD_POSITION) {
    glu_rows<ER_GLU_GELU>(a, tgid, tid);
}
