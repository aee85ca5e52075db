// What a backend gives the session: something that runs one step of a prepared plan.
// The CPU backend's is cpu::Executable; the CUDA backend's is made by cuda::make_runner.
#pragma once

#include <cstdint>

namespace edgerunner {

// The per-step values (the "step block").
struct StepInputs {
    const int32_t* tokens = nullptr;
    int64_t n_tokens = 0;
    int64_t pos0 = 0;             // position of tokens[0]
    float* logits_out = nullptr;  // non-null: logits of every token, n_tokens × n_vocab, go here;
                                  // null: only the last token's, into logits()
};

class StepRunner {
public:
    virtual ~StepRunner() = default;
    virtual void run(const StepInputs& in) = 0;
    virtual const float* logits() const = 0;  // the last run's last-token logits (host memory)
    virtual int64_t max_tokens() const = 0;
};

}  // namespace edgerunner
