// The CPU backend's prepared plan: kernels chosen, activation quantization placed, scratch
// laid out, RoPE tables computed, all at load. run() executes one step with no allocation.
#pragma once

#include <cstdint>
#include <vector>

#include "../core/kv_cache.h"
#include "../core/plan.h"
#include "kernels.h"
#include "thread_pool.h"

namespace edgerunner::cpu {

// The per-step values (the "step block").
struct StepInputs {
    const int32_t* tokens = nullptr;
    int64_t n_tokens = 0;
    int64_t pos0 = 0;             // position of tokens[0]
    float* logits_out = nullptr;  // non-null: logits of every token, n_tokens × n_vocab, go here;
                                  // null: only the last token's, into logits()
};

class Executable {
public:
    // precise: float32 activations everywhere (no activation quantization).
    Executable(const ModelConfig& config, Plan plan, KVCache& kv, ThreadPool& pool, bool precise);

    void run(const StepInputs& in);
    const float* logits() const { return last_logits_.data(); }
    int64_t max_tokens() const { return plan_.max_tokens; }
    size_t scratch_bytes() const;

private:
    struct Step {
        Op op;
        DotFn dot = nullptr;
        DotRowsFn dot_rows = nullptr;  // several tokens per weight row, where the type has one
        ActFormat format = ActFormat::Float;
        bool quantize_input = false;  // quantize `in` into qbuf_ first (shared by later matmuls)
    };

    void exec(const Step& s, const StepInputs& in, int ith, int nth);
    void matmul(const Step& s, const StepInputs& in, int ith, int nth);
    void attention(const Op& op, const StepInputs& in, int ith, int nth);
    void kv_store(const Op& op, const StepInputs& in, int ith, int nth);
    void rope(const Op& op, const StepInputs& in, int ith, int nth);
    float* row(Buf b, int64_t t) { return arena_.data() + offset_[static_cast<int>(b)] + t * width_[static_cast<int>(b)]; }

    const ModelConfig& c_;
    Plan plan_;
    KVCache& kv_;
    ThreadPool& pool_;
    bool precise_;
    std::vector<Step> steps_;
    size_t offset_[kBufCount] = {};
    int64_t width_[kBufCount] = {};
    std::vector<float> arena_;
    std::vector<uint8_t> qbuf_;
    size_t qbuf_row_bytes_ = 0;
    std::vector<float> scores_;  // per thread: one score per cache slot
    KvKernels kv_fn_{};
    std::vector<float> inv_freq_;
    std::vector<float> last_logits_;
};

}  // namespace edgerunner::cpu
