// What a backend gives the session: something that runs one step of a prepared plan.
// The CPU backend's is cpu::Executable; the CUDA backend's is made by cuda::make_runner.
#pragma once

#include <cstdint>

#include "edgerunner/sampler.h"

namespace edgerunner {

// The per-step values (the "step block").
struct StepInputs {
    const int32_t* tokens = nullptr;
    int64_t n_tokens = 0;
    int64_t pos0 = 0;             // position of tokens[0]
    float* logits_out = nullptr;  // non-null: logits of every token, n_tokens × n_vocab, go here;
                                  // null: only the last token's, into logits()
    // Sampling on the device (runners whose can_sample() says yes): the next token is drawn
    // from the last token's logits with these params and RNG step into *sampled, and logits()
    // is not updated (fetch_logits() brings them when asked).
    const SamplingParams* sample = nullptr;
    uint64_t sample_step = 0;
    int32_t* sampled = nullptr;
};

class StepRunner {
public:
    virtual ~StepRunner() = default;
    virtual void run(const StepInputs& in) = 0;
    virtual const float* logits() const = 0;  // the last run's last-token logits (host memory)
    virtual int64_t max_tokens() const = 0;
    virtual bool can_sample(const SamplingParams&) const { return false; }
    virtual void fetch_logits() {}  // after sampled steps: the last logits into logits()
    // The next token drawn on the device (as can_sample's params allow) from the last run's
    // last-token logits, still there whether or not logits() holds a copy: the history's last
    // token at last_pos, the RNG at sample_step. False where this runner draws nothing (the
    // session then samples logits() on the host).
    virtual bool draw(const SamplingParams& /*p*/, uint64_t /*sample_step*/, int64_t /*last_pos*/, int32_t* /*token*/) { return false; }

    // Chained decode (runners whose chain_depth() > 0; params as can_sample allows): one-token
    // sampled steps whose input is the previous chained step's drawn token, fed on the device,
    // so up to chain_depth() of them are in flight while the host reads the oldest's token.
    // chain_push enqueues a step (first_token: its input, for the first step of a chain; null:
    // the previous step's draw) and returns at once; chain_pop waits for the oldest pending step
    // and returns its drawn token; chain_end waits for every pending step. The last pushed step
    // leaves its logits on the device (fetch_logits).
    virtual int chain_depth() const { return 0; }
    virtual void chain_push(int64_t /*pos*/, const SamplingParams& /*params*/, uint64_t /*sample_step*/, const int32_t* /*first_token*/) {}
    virtual int32_t chain_pop() { return 0; }
    virtual void chain_end() {}
};

}  // namespace edgerunner
