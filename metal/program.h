// A step plan prepared for the Metal kernels, in plain C++ (no Metal API): which kernels run in
// which order with which function constants, each one's argument table, the grid for a step of
// n tokens, and the layout of the runner's device memory. The Objective-C++ host (runner.mm)
// turns it into command buffers; the CPU emulator of the kernels (tests/metal_emulator) runs
// the very same program on Linux, so everything here is tested without a Mac.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "../csrc/core/kv_cache.h"
#include "../csrc/core/plan.h"
#include "../csrc/core/runner.h"
#include "edgerunner/kernel_args.h"
#include "edgerunner/model_config.h"

namespace edgerunner::metal {

// Values for the function constants of metal/common.h (indices ER_FC_*). With the kernel name
// they key the pipeline cache.
struct Constants {
    bool accumulate = false, has_bias = false, norm_in = false, neox = false, head_norm = false, store_kv = false;
    uint32_t glu = ER_GLU_NONE;
    uint32_t kv_type = ER_KV_F16;
    bool operator==(const Constants& o) const;
    std::string key() const;  // e.g. "acc=1 bias=0 norm=1 glu=0 kv=1 neox=0 hnorm=0 store=0"
};

// One dispatch: threadgroups × threads (1-D threadgroups).
struct Launch {
    std::string kernel;  // a name in metal/kernels.def
    Constants constants;
    uint32_t groups[3] = {1, 1, 1};
    uint32_t threads = 32;
};

// Where things are on the device when the argument tables are written.
struct Addresses {
    uint64_t memory = 0;  // the runner's buffer (Program::memory_bytes)
    uint64_t kv = 0;      // the session's KV cache buffer (KVCache::bytes())
    std::function<uint64_t(const uint8_t*)> weight;  // a mapped weight's bytes → device address
};

// One dispatch of the prepared step: a plan op, or several fused.
struct Step {
    std::string label;   // what it runs, for errors: "layer 3: rms_norm + matmul Q,K (Q4_K)"
    bool tail = false;   // covers tokens [first_row, n) instead of [0, n)
    size_t table = 0;    // its argument table: offset in the tables buffer, and size
    size_t table_bytes = 0;
    std::function<void(const Addresses&, void* table)> write_table;
    std::function<Launch(int64_t rows)> launch;  // rows: the tokens it covers this step
};

struct Program {
    std::vector<Step> steps;  // in order; every one reads what the previous ones wrote
    // After the steps when a run samples: the device sampler over the last logits row (sample),
    // or, when the step has logit bias or penalties (penalized()), penalize writing that row
    // after them to penalized_logits and the sampler reading it there (sample_penalized).
    Step sample, penalize, sample_penalized;
    int64_t max_tokens = 0, n_vocab = 0;
    size_t tables_bytes = 0;
    // The runner's device memory: activations (one region per plan buffer, max_tokens rows),
    // the RoPE inverse frequencies, the sampler's scratch, penalize's buffers and the sampler's
    // output.
    size_t memory_bytes = 0;
    size_t logits = 0;   // offset of the logits rows (max_tokens × n_vocab floats)
    size_t sampled = 0;  // offset of the sampler's output: ER_STEP_SLOTS int32
    size_t penalized_logits = 0;  // n_vocab floats: the last row after bias and penalties
    size_t counts = 0;            // n_vocab int32, zero (penalize leaves them zero)
    size_t bias_tokens = 0;       // the bias table (write_bias_table): n_vocab int32 of room,
    size_t bias_values = 0;       // and n_vocab floats
    size_t history = 0;  // sample_program only: its token history (a model's is in the KV buffer)
    std::vector<std::pair<size_t, std::vector<float>>> constants;  // written into memory once
    size_t step_block_bytes = 0;  // one step-block slot: er_step_block + max_tokens ids, 256-aligned

    // Every table (steps, then sample, penalize, sample_penalized), each at its Step::table offset.
    std::vector<uint8_t> tables(const Addresses& at) const;
    // Rows a step covers: n_tokens, or n_tokens - first_row for tail steps.
    static int64_t rows(const Step& s, const StepInputs& in);
};

// Fuses and lowers `plan` (see program.cpp for the fusions; fuse = false: every op on its own
// kernel, which the tests use to run the unfused kernels). Throws std::invalid_argument for
// what the Metal kernels cannot run (see unsupported()).
Program build_program(const ModelConfig& c, const Plan& plan, const KVCache& kv, bool fuse = true);

// What in a plan the Metal backend cannot run (empty: all of it).
std::string unsupported(const ModelConfig& c, const Plan& plan);

// The session's KV buffer: the cache slots (KVCache::bytes()), then the token history, n_ctx
// int32: the token at each position, written by the embedding, read by penalize.
size_t kv_history_offset(const KVCache& kv);
size_t kv_buffer_bytes(const KVCache& kv);

// Whether a sampled step with p runs penalize before the sampler: logit bias, or penalties on.
bool penalized(const SamplingParams& p);

// The bias table of logit_bias (merged_bias: tokens rising, one entry each) into a runner's
// memory (host-visible, at Program::bias_tokens and bias_values); returns its entries, the step
// block's n_bias. Throws std::invalid_argument for a token outside the vocabulary. Called when
// the bias changes, not per step (it allocates).
uint32_t write_bias_table(const Program& p, const std::vector<std::pair<int32_t, float>>& logit_bias, uint8_t* memory);

// The step's values into one slot (Program::step_block_bytes at dst); n_bias: the entries of the
// bias table in memory (penalized steps).
void write_step_block(const StepInputs& in, uint32_t slot, void* dst, uint32_t n_bias = 0);

// One matmul of `type` (the backend-ops tests): W (rows × row_bytes, cols) at weight address
// `w`, x at memory offset 0 (n_tokens × cols floats), y at Program::logits (n_tokens × rows).
// gemm: the simdgroup-matrix kernel, else the GEMV.
Program matmul_program(TensorType type, int64_t rows, size_t row_bytes, int64_t cols, int64_t n_tokens, bool gemm);

// The device sampler alone (the backend-ops tests): logits (one row of n_vocab floats) at memory
// offset Program::logits, the token at Program::sampled + 4 · slot; with penalize, the token
// history (n_history int32, the step's token its last: pos0 = n_history - 1) at Program::history
// and the bias table written by write_bias_table.
Program sample_program(int64_t n_vocab, int64_t n_history = 0);

// Development fallback (EDGERUNNER_METAL_RUNTIME_COMPILE): every metal/*.metal under root_dir as
// one MSL source, quoted includes expanded once each (metal/, then csrc/include/), for the
// runtime compiler (newLibraryWithSource), which cannot resolve includes itself.
std::string library_source(const std::string& root_dir);

// The kernel names of metal/kernels.def, and whether `name` is one taking `args_bytes` of arguments.
const std::vector<std::string>& kernel_names();
bool kernel_takes(const std::string& name, size_t args_bytes);

}  // namespace edgerunner::metal
