#include "runner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "emulator.h"

namespace er_emulator {

using namespace edgerunner;

Memory::Memory(size_t bytes) : owner_(new uint8_t[bytes + 256]()) {
    base_ = owner_.get() + (256 - reinterpret_cast<uintptr_t>(owner_.get()) % 256) % 256;
}

void dispatch(const metal::Launch& l, const void* table, const void* step_block) {
    const Invoke fn = find_kernel(l.kernel.c_str());
    if (!fn) throw std::logic_error("Metal emulator: no kernel '" + l.kernel + "' in metal/kernels.def");
    const metal::Constants& k = l.constants;
    set_bool_constant(ER_FC_ACCUMULATE, k.accumulate);
    set_bool_constant(ER_FC_HAS_BIAS, k.has_bias);
    set_bool_constant(ER_FC_NORM_IN, k.norm_in);
    set_uint_constant(ER_FC_GLU, k.glu);
    set_uint_constant(ER_FC_KV_TYPE, k.kv_type);
    set_bool_constant(ER_FC_NEOX, k.neox);
    set_bool_constant(ER_FC_HEAD_NORM, k.head_norm);
    set_bool_constant(ER_FC_STORE_KV, k.store_kv);
    run_grid(fn, table, step_block, l.groups, l.threads);
}

Runner::Runner(const ModelConfig& c, const Plan& plan, const KVCache& kv, const Memory& kv_memory, bool fuse)
    : program_(metal::build_program(c, plan, kv, fuse)),
      memory_(program_.memory_bytes),
      steps_(program_.step_block_bytes * ER_STEP_SLOTS) {
    for (const auto& [offset, values] : program_.constants) std::memcpy(memory_.data() + offset, values.data(), values.size() * 4);
    metal::Addresses at;
    at.memory = memory_.address();
    at.kv = kv_memory.address();  // (the KV buffer: metal::kv_buffer_bytes)
    at.weight = [](const uint8_t* p) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)); };
    tables_ = program_.tables(at);
}

bool Runner::can_sample(const SamplingParams&) const { return true; }

void Runner::run(const StepInputs& in) {
    if (in.n_tokens < 1 || in.n_tokens > program_.max_tokens) throw std::invalid_argument("Metal emulator: step size out of range");
    if (in.sample && in.logits_out) throw std::logic_error("device sampling takes the last token's logits, not every token's");
    const bool penalized = in.sample && metal::penalized(*in.sample);
    if (penalized && in.sample->logit_bias != bias_sent_) {  // the bias table, when it changed
        n_bias_ = metal::write_bias_table(program_, in.sample->logit_bias, memory_.data());
        bias_sent_ = in.sample->logit_bias;
    }
    const uint32_t slot = next_slot_;
    next_slot_ = (next_slot_ + 1) % ER_STEP_SLOTS;
    uint8_t* block = steps_.data() + slot * program_.step_block_bytes;
    metal::write_step_block(in, slot, block, penalized ? n_bias_ : 0);
    static const bool trace = std::getenv("METAL_EMULATOR_TRACE") != nullptr;
    for (const metal::Step& s : program_.steps) {
        const metal::Launch l = s.launch(metal::Program::rows(s, in));
        dispatch(l, tables_.data() + s.table, block);
        if (trace) {  // each dispatch and the largest activation after it
            float mx = 0;
            const float* f = reinterpret_cast<const float*>(memory_.data());
            for (size_t i = 0; i < program_.memory_bytes / 4; ++i) mx = std::max(mx, std::fabs(f[i]));
            std::fprintf(stderr, "%-60s %-18s [%u %u %u] × %u  %s  max|memory| %g\n", s.label.c_str(), l.kernel.c_str(), l.groups[0],
                         l.groups[1], l.groups[2], l.threads, l.constants.key().c_str(), mx);
        }
    }
    last_row_ = in.n_tokens - 1;
    const float* logits = reinterpret_cast<const float*>(memory_.data() + program_.logits);
    if (in.sample) {
        if (penalized) dispatch(program_.penalize.launch(1), tables_.data() + program_.penalize.table, block);
        const metal::Step& sampler = penalized ? program_.sample_penalized : program_.sample;
        dispatch(sampler.launch(1), tables_.data() + sampler.table, block);
        std::memcpy(in.sampled, memory_.data() + program_.sampled + 4 * slot, 4);
        if (*in.sampled < 0) throw std::invalid_argument("no finite logit to sample from: the model output is broken");
    } else if (in.logits_out) {
        std::memcpy(in.logits_out, logits, static_cast<size_t>(in.n_tokens * program_.n_vocab) * 4);
    }
}

const float* Runner::logits() const {
    return reinterpret_cast<const float*>(memory_.data() + program_.logits) + last_row_ * program_.n_vocab;
}

}  // namespace er_emulator
