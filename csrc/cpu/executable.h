// The CPU backend's prepared plan: kernels chosen, activation quantization placed, scratch
// laid out, RoPE tables computed, all at load. run() executes one step with no allocation.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "../core/kv_cache.h"
#include "../core/plan.h"
#include "../core/runner.h"
#include "kernels.h"
#include "thread_pool.h"

namespace edgerunner::cpu {

class Executable final : public StepRunner {
public:
    // precise: float32 activations everywhere (no activation quantization).
    Executable(const ModelConfig& config, Plan plan, KVCache& kv, ThreadPool& pool, bool precise);

    void run(const StepInputs& in) override;
    const float* logits() const override { return last_logits_.data(); }
    int64_t max_tokens() const override { return plan_.max_tokens; }

private:
    // One matrix of a (possibly fused) matmul step.
    struct MatPart {
        const Weight* weight = nullptr;
        const Weight* bias = nullptr;
        Buf out = Buf::X;
        ActFormat format = ActFormat::Float;
        DotFn dot = nullptr;
        DotRowsFn dot_rows = nullptr;  // several tokens per weight row, where the type has one
    };
    // A step: one plan op, or several fused at prepare time (so one barrier covers them):
    //   matmuls on the same input (Q/K/V) as one step, gate+up+SiLU as one "glu" step,
    //   rope(Q) + rope(K) + KV store as one step, an RMSNorm that also quantizes its output.
    struct Step {
        Op op;                    // the first op: kind, input, layer, heads, flags
        MatPart parts[3];
        int n_parts = 0;
        bool glu = false;         // parts[0] = gate, parts[1] = up: out = act(gate) * up
        bool gelu = false;        // glu with GELU (tanh) instead of SiLU
        bool rope_kv = false;     // rope Q and K in place, then store K and V
        unsigned quantize = 0;    // formats (1 << ActFormat) to quantize op.in into before the step
        unsigned norm_quantize = 0;  // RmsNorm: formats to quantize each output row into
        int index = 0;            // position in steps_ (its chunk counter)
    };

    void exec(const Step& s, const StepInputs& in, int ith, int nth);
    void matmul(const Step& s, const StepInputs& in, int nth);
    void glu(const Step& s, const StepInputs& in, int nth);
    template <typename Body>
    void for_row_chunks(const Step& s, int64_t rows, int64_t n_tokens, int nth, Body&& body);
    void attention(const Op& op, const StepInputs& in, int ith, int nth);
    void rope_kv(int32_t layer, bool local, const StepInputs& in, int ith, int nth);
    void quantize_rows(Buf b, unsigned formats, int64_t t0, int64_t t1, int64_t width);
    const uint8_t* qrow(ActFormat f, int64_t t) const { return qbuf_[static_cast<int>(f)].data() + t * qrow_bytes_[static_cast<int>(f)]; }
    float* row(Buf b, int64_t t) { return arena_.data() + offset_[static_cast<int>(b)] + t * width_[static_cast<int>(b)]; }

    const ModelConfig& c_;
    Plan plan_;
    KVCache& kv_;
    ThreadPool& pool_;
    bool precise_;
    std::vector<Step> steps_;
    std::unique_ptr<std::atomic<int64_t>[]> next_chunk_;  // per step: the next tile to hand out
    int tile_rows_ = 8;                                    // weight rows per tile (the kernel set's)
    size_t offset_[kBufCount] = {};
    int64_t width_[kBufCount] = {};
    std::vector<float> arena_;
    std::vector<uint8_t> qbuf_[3];  // quantized activations, per ActFormat (Float unused)
    size_t qrow_bytes_[3] = {};
    std::vector<float> scores_;  // per thread: one score per cache slot
    KvKernels kv_fn_{};
    MathKernels math_{};
    // RoPE per base ([0] global, [1] the local layers' where the model has one): inverse
    // frequencies, and per token of the step × rope_dim/2 the angles' cos and sin, once per step.
    std::vector<float> inv_freq_[2];
    std::vector<float> rope_cos_[2], rope_sin_[2];
    bool local_rope_ = false;
    std::vector<float> last_logits_;
};

}  // namespace edgerunner::cpu
