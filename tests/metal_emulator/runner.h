// A StepRunner that runs a prepared Metal program (metal/program.h) on the emulated kernels:
// the Metal host's logic (argument tables, step-block slots, grids per step size, the sampler
// steps with penalize before them when a step has bias or penalties, the bias table written when
// it changes, logits out) with host memory standing in for MTLBuffers and device addresses being
// host addresses.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "program.h"

namespace er_emulator {

// Device memory: a 256-byte aligned host allocation.
class Memory {
public:
    explicit Memory(size_t bytes);
    uint8_t* data() const { return base_; }
    uint64_t address() const { return reinterpret_cast<uintptr_t>(base_); }
private:
    std::unique_ptr<uint8_t[]> owner_;
    uint8_t* base_ = nullptr;
};

// Runs one dispatch of the program: kernel, function constants, grid.
void dispatch(const edgerunner::metal::Launch& launch, const void* table, const void* step_block);

class Runner final : public edgerunner::StepRunner {
public:
    // kv_memory: metal::kv_buffer_bytes(kv), zero (the cache slots, then the token history).
    Runner(const edgerunner::ModelConfig& c, const edgerunner::Plan& plan, const edgerunner::KVCache& kv, const Memory& kv_memory,
           bool fuse = true);
    void run(const edgerunner::StepInputs& in) override;
    const float* logits() const override;
    int64_t max_tokens() const override { return program_.max_tokens; }
    bool can_sample(const edgerunner::SamplingParams& p) const override;
    void fetch_logits() override {}

private:
    edgerunner::metal::Program program_;
    Memory memory_, steps_;
    std::vector<uint8_t> tables_;
    uint32_t next_slot_ = 0;
    int64_t last_row_ = 0;
    std::vector<std::pair<int32_t, float>> bias_sent_;  // the logit_bias whose table is in memory
    uint32_t n_bias_ = 0;
};

}  // namespace er_emulator
