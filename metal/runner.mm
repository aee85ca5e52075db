// The Metal step runner: a prepared program (program.h) on a command queue, in one of three
// dispatch modes (metal.h). One command buffer and one serial compute encoder per step, so each
// dispatch sees the previous one's writes (serial encoders run dispatches in order; recorded
// commands carry a barrier each). Kernels reach every tensor through the device addresses in
// their argument tables, so every buffer is declared resident: per encoder (useResource) or,
// on macOS 15+, once for the queue (a residency set).
//
// Per-step values live in ER_STEP_SLOTS step-block slots, used in turn: the host writes slot
// N+1 while the GPU may still read slot N; a semaphore keeps the host from reusing a slot whose
// step has not completed. run() returns the step's results, so it waits for its own command
// buffer today; the slots make a pipelined loop (commit N+1 before reading N) safe.
//
// A sampled step with logit bias or penalties runs penalize before the sampler (the sampler then
// reads the logits after them); the bias table lives in the runner's memory and is rewritten
// when a step's bias differs from the last one written. That write is not slotted: it relies on
// no step being in flight when run() starts (true while run() waits for its own step).
#include <dispatch/dispatch.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "context.h"

namespace edgerunner::metal {
namespace {

class Runner final : public StepRunner {
    struct Pipelines {  // per step (then sample, penalize, sample_penalized): its kernel for one token, and for many
        std::string one_kernel;
        id<MTLComputePipelineState> one, many;
    };

public:
    Runner(const ModelConfig& c, const Plan& plan, std::shared_ptr<DeviceModel> weights, std::shared_ptr<DeviceKv> kv,
           Dispatch dispatch)
        : ctx_(usable_context()), weights_(std::move(weights)), kv_(std::move(kv)), dispatch_(dispatch),
          program_(build_program(c, plan, kv_->layout)) {
        @autoreleasepool {
            id<MTLDevice> device = ctx_.device;
            memory_ = [device newBufferWithLength:program_.memory_bytes options:MTLResourceStorageModeShared];
            steps_ = [device newBufferWithLength:program_.step_block_bytes * ER_STEP_SLOTS options:MTLResourceStorageModeShared];
            if (!memory_ || !steps_) throw std::runtime_error("Metal: out of memory for a runner's " + std::to_string(program_.memory_bytes >> 20) + " MiB");
            std::memset(memory_.contents, 0, memory_.length);
            for (const auto& [offset, values] : program_.constants)
                std::memcpy(static_cast<uint8_t*>(memory_.contents) + offset, values.data(), values.size() * sizeof(float));
            Addresses at;
            at.memory = address_of(memory_);
            at.kv = address_of(kv_->buffer);
            const DeviceModel* w = weights_.get();
            at.weight = [w](const uint8_t* host) { return (*w)(host); };
            tables_host_ = program_.tables(at);
            tables_ = [device newBufferWithBytes:tables_host_.data() length:std::max<size_t>(tables_host_.size(), 1)
                                         options:MTLResourceStorageModeShared];

            for (id<MTLBuffer> b : weights_->buffers) read_only_.push_back(b);
            read_write_ = {memory_, kv_->buffer, steps_, tables_};
            // Every pipeline this runner can use, now rather than on the first token: a step's
            // kernel for one token and for many (rows in between take one of the two).
            for (const Step* s : all_steps()) {
                const Launch one = s->launch(1), many = s->launch(program_.max_tokens);
                pipelines_.push_back({one.kernel, ctx_.pipeline(one), ctx_.pipeline(many)});
            }
            if (dispatch_ != Dispatch::Eager) declare_residency_once();
            if (dispatch_ == Dispatch::Recorded && program_.max_tokens == 1) record();
        }
        in_flight_ = dispatch_semaphore_create(ER_STEP_SLOTS);
    }

    ~Runner() override {
        if (@available(macOS 15.0, *)) {
            if (residency_) [ctx_.queue removeResidencySet:residency_];
        }
    }

    const float* logits() const override {
        return reinterpret_cast<const float*>(static_cast<const uint8_t*>(memory_.contents) + program_.logits) + last_row_ * program_.n_vocab;
    }
    int64_t max_tokens() const override { return program_.max_tokens; }
    bool can_sample(const SamplingParams&) const override { return true; }  // bias and penalties too (penalize)
    void fetch_logits() override {}  // shared memory: the last step's logits row is already readable

    void run(const StepInputs& in) override {
        if (in.n_tokens < 1 || in.n_tokens > program_.max_tokens) throw std::invalid_argument("Metal: step size out of range");
        if (in.sample && in.logits_out) throw std::logic_error("device sampling takes the last token's logits, not every token's");
        const bool penalized = in.sample && metal::penalized(*in.sample);
        if (penalized && in.sample->logit_bias != bias_sent_) {  // (no step in flight: run() waits for its own)
            n_bias_ = write_bias_table(program_, in.sample->logit_bias, static_cast<uint8_t*>(memory_.contents));
            bias_sent_ = in.sample->logit_bias;
        }
        const uint32_t slot = next_slot_;
        next_slot_ = (next_slot_ + 1) % ER_STEP_SLOTS;
        dispatch_semaphore_wait(in_flight_, DISPATCH_TIME_FOREVER);  // the slot's previous step has completed
        bool committed = false;
        try {
            write_step_block(in, slot, static_cast<uint8_t*>(steps_.contents) + slot * program_.step_block_bytes, penalized ? n_bias_ : 0);
            submit(in, slot, penalized, committed);
        } catch (...) {
            if (!committed) dispatch_semaphore_signal(in_flight_);  // the slot was never handed to the GPU
            throw;
        }
        last_row_ = in.n_tokens - 1;
        const uint8_t* memory = static_cast<const uint8_t*>(memory_.contents);
        if (in.sample) {
            std::memcpy(in.sampled, memory + program_.sampled + 4 * slot, 4);  // the 4-byte readback
            if (*in.sampled < 0) throw std::invalid_argument("no finite logit to sample from: the model output is broken");
        } else if (in.logits_out) {
            std::memcpy(in.logits_out, memory + program_.logits, static_cast<size_t>(in.n_tokens * program_.n_vocab) * sizeof(float));
        }
    }

private:
    // The step's command buffer: encoded, committed, waited for. penalized: a sampled step runs
    // penalize, then the sampler over its output.
    void submit(const StepInputs& in, uint32_t slot, bool penalized, bool& committed) {
        @autoreleasepool {
            id<MTLCommandBuffer> cb = [ctx_.queue commandBuffer];
            id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoderWithDispatchType:MTLDispatchTypeSerial];
            if (!residency_) declare_residency(enc);
            const bool replay = !icb_[0].empty() && in.n_tokens == 1 && !in.logits_out;
            const size_t n = program_.steps.size();
            if (replay) {  // the plain recording, or the penalized one (sampled steps with bias or penalties)
                id<MTLIndirectCommandBuffer> icb = icb_[penalized ? 1 : 0][slot];
                [enc useResource:icb usage:MTLResourceUsageRead];
                [enc executeCommandsInBuffer:icb withRange:NSMakeRange(0, n + (in.sample ? (penalized ? 2 : 1) : 0))];
            } else {
                bool bound = false;
                for (size_t i = 0; i < n; ++i) encode(enc, program_.steps[i], pipelines_[i], Program::rows(program_.steps[i], in), slot, bound);
                if (penalized) {
                    encode(enc, program_.penalize, pipelines_[n + 1], 1, slot, bound);
                    encode(enc, program_.sample_penalized, pipelines_[n + 2], 1, slot, bound);
                } else if (in.sample) {
                    encode(enc, program_.sample, pipelines_[n], 1, slot, bound);
                }
            }
            [enc endEncoding];
            dispatch_semaphore_t done = in_flight_;
            [cb addCompletedHandler:^(id<MTLCommandBuffer> finished) {
              (void)finished;
              dispatch_semaphore_signal(done);
            }];
            [cb commit];
            committed = true;
            [cb waitUntilCompleted];
            if (cb.status == MTLCommandBufferStatusError)
                throw std::runtime_error(std::string("Metal: the step failed: ") + cb.error.localizedDescription.UTF8String);
        }
    }

    // The steps, then sample, penalize, sample_penalized (pipelines_ in this order).
    std::vector<const Step*> all_steps() const {
        std::vector<const Step*> out;
        for (const Step& s : program_.steps) out.push_back(&s);
        for (const Step* s : {&program_.sample, &program_.penalize, &program_.sample_penalized}) out.push_back(s);
        return out;
    }

    // One op into the encoder: eager pushes its argument table with the command (setBytes);
    // argument_buffers points at the table written at prepare time (one binding, then offsets).
    void encode(id<MTLComputeCommandEncoder> enc, const Step& s, const Pipelines& p, int64_t rows, uint32_t slot, bool& bound) const {
        const Launch l = s.launch(rows);
        [enc setComputePipelineState:l.kernel == p.one_kernel ? p.one : p.many];
        if (dispatch_ == Dispatch::Eager) {
            [enc setBytes:tables_host_.data() + s.table length:s.table_bytes atIndex:ER_BUFFER_ARGS];
        } else if (!bound) {
            [enc setBuffer:tables_ offset:s.table atIndex:ER_BUFFER_ARGS];
            [enc setBuffer:steps_ offset:slot * program_.step_block_bytes atIndex:ER_BUFFER_STEP];
            bound = true;
        } else {
            [enc setBufferOffset:s.table atIndex:ER_BUFFER_ARGS];
        }
        if (dispatch_ == Dispatch::Eager) [enc setBuffer:steps_ offset:slot * program_.step_block_bytes atIndex:ER_BUFFER_STEP];
        [enc dispatchThreadgroups:MTLSizeMake(l.groups[0], l.groups[1], l.groups[2]) threadsPerThreadgroup:MTLSizeMake(l.threads, 1, 1)];
    }

    void declare_residency(id<MTLComputeCommandEncoder> enc) const {
        for (id<MTLResource> r : read_only_) [enc useResource:r usage:MTLResourceUsageRead];
        for (id<MTLResource> r : read_write_) [enc useResource:r usage:MTLResourceUsageRead | MTLResourceUsageWrite];
    }

    // argument_buffers and recorded: the buffers are made resident once for the queue (macOS 15+);
    // before that, run() declares them per encoder.
    void declare_residency_once() {
        if (@available(macOS 15.0, *)) {
            MTLResidencySetDescriptor* d = [MTLResidencySetDescriptor new];
            d.label = @"edgerunner runner";
            NSError* error = nil;
            id<MTLResidencySet> set = [ctx_.device newResidencySetWithDescriptor:d error:&error];
            if (!set) throw std::runtime_error(std::string("Metal: residency set: ") + error.localizedDescription.UTF8String);
            for (id<MTLResource> r : read_only_) [set addAllocation:r];
            for (id<MTLResource> r : read_write_) [set addAllocation:r];
            for (const auto& recording : icb_)
                for (id<MTLIndirectCommandBuffer> icb : recording) [set addAllocation:icb];
            [set commit];
            [set requestResidency];
            [ctx_.queue addResidencySet:set];
            residency_ = set;
        }
    }

    // The one-token step as indirect command buffers, one per step-block slot, in two recordings:
    // the steps then the sampler (icb_[0]), and the steps then penalize and the sampler over its
    // output (icb_[1], for sampled steps with bias or penalties). Each command binds its argument
    // table and the slot's block; a barrier orders it after the command before. The sampler
    // commands are run or left out by the execute range.
    void record() {
        MTLIndirectCommandBufferDescriptor* d = [MTLIndirectCommandBufferDescriptor new];
        d.commandTypes = MTLIndirectCommandTypeConcurrentDispatch;
        d.inheritBuffers = NO;
        d.inheritPipelineState = NO;
        d.maxKernelBufferBindCount = 2;
        const std::vector<const Step*> all = all_steps();
        const size_t n = program_.steps.size();
        for (int penalized = 0; penalized < 2; ++penalized) {
            std::vector<size_t> commands;  // indices into all (and pipelines_)
            for (size_t i = 0; i < n; ++i) commands.push_back(i);
            if (penalized) commands.insert(commands.end(), {n + 1, n + 2});
            else commands.push_back(n);
            for (uint32_t slot = 0; slot < ER_STEP_SLOTS; ++slot) {
                id<MTLIndirectCommandBuffer> icb = [ctx_.device newIndirectCommandBufferWithDescriptor:d maxCommandCount:commands.size()
                                                                                               options:MTLResourceStorageModeShared];
                if (!icb) throw std::runtime_error("Metal: creating an indirect command buffer failed");
                for (size_t c = 0; c < commands.size(); ++c) {
                    const size_t i = commands[c];
                    const Launch l = all[i]->launch(1);
                    id<MTLIndirectComputeCommand> cmd = [icb indirectComputeCommandAtIndex:c];
                    [cmd setComputePipelineState:pipelines_[i].one];
                    [cmd setKernelBuffer:tables_ offset:all[i]->table atIndex:ER_BUFFER_ARGS];
                    [cmd setKernelBuffer:steps_ offset:slot * program_.step_block_bytes atIndex:ER_BUFFER_STEP];
                    [cmd concurrentDispatchThreadgroups:MTLSizeMake(l.groups[0], l.groups[1], l.groups[2])
                                  threadsPerThreadgroup:MTLSizeMake(l.threads, 1, 1)];
                    [cmd setBarrier];
                }
                icb_[penalized].push_back(icb);
            }
        }
        if (residency_) {  // the command buffers join the residency set
            if (@available(macOS 15.0, *)) {
                for (const auto& recording : icb_)
                    for (id<MTLIndirectCommandBuffer> icb : recording) [residency_ addAllocation:icb];
                [residency_ commit];
            }
        }
    }

    Context& ctx_;
    std::shared_ptr<DeviceModel> weights_;
    std::shared_ptr<DeviceKv> kv_;
    Dispatch dispatch_;
    Program program_;
    id<MTLBuffer> memory_ = nil, steps_ = nil, tables_ = nil;
    std::vector<uint8_t> tables_host_;
    std::vector<id<MTLResource>> read_only_, read_write_;
    std::vector<Pipelines> pipelines_;
    std::vector<id<MTLIndirectCommandBuffer>> icb_[2];  // recorded: [penalized][slot]
    id residency_ = nil;  // id<MTLResidencySet> on macOS 15+
    dispatch_semaphore_t in_flight_ = nil;
    uint32_t next_slot_ = 0;
    int64_t last_row_ = 0;
    std::vector<std::pair<int32_t, float>> bias_sent_;  // the logit_bias whose table is in memory_
    uint32_t n_bias_ = 0;
};

// One program (of program.h's test builders) run once, eagerly, with memory laid out by the caller.
void run_once(const Program& p, id<MTLBuffer> memory, id<MTLBuffer> weights, const StepInputs& in, bool sample) {
    Context& c = usable_context();
    Addresses at;
    at.memory = address_of(memory);
    if (weights) at.weight = [weights](const uint8_t*) { return address_of(weights); };
    const std::vector<uint8_t> tables = p.tables(at);
    std::vector<uint8_t> block(p.step_block_bytes);
    write_step_block(in, 0, block.data());
    id<MTLCommandBuffer> cb = [c.queue commandBuffer];
    id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoderWithDispatchType:MTLDispatchTypeSerial];
    [enc useResource:memory usage:MTLResourceUsageRead | MTLResourceUsageWrite];
    if (weights) [enc useResource:weights usage:MTLResourceUsageRead];
    const Step& s = sample ? p.sample : p.steps.at(0);
    const Launch l = s.launch(in.n_tokens);
    [enc setComputePipelineState:c.pipeline(l)];
    [enc setBytes:tables.data() + s.table length:s.table_bytes atIndex:ER_BUFFER_ARGS];
    [enc setBytes:block.data() length:block.size() atIndex:ER_BUFFER_STEP];
    [enc dispatchThreadgroups:MTLSizeMake(l.groups[0], l.groups[1], l.groups[2]) threadsPerThreadgroup:MTLSizeMake(l.threads, 1, 1)];
    [enc endEncoding];
    [cb commit];
    [cb waitUntilCompleted];
    if (cb.status == MTLCommandBufferStatusError)
        throw std::runtime_error(std::string("Metal: ") + cb.error.localizedDescription.UTF8String);
}

}  // namespace

std::unique_ptr<StepRunner> make_runner(const ModelConfig& config, const Plan& plan, std::shared_ptr<DeviceModel> weights,
                                        std::shared_ptr<DeviceKv> kv, Dispatch dispatch) {
    return std::make_unique<Runner>(config, plan, std::move(weights), std::move(kv), dispatch);
}

std::vector<float> matmul(TensorType type, const uint8_t* rows, int64_t n_rows, size_t row_bytes, const float* x, int64_t n_tokens,
                          int64_t n, bool gemm) {
    Context& c = usable_context();
    const Program p = matmul_program(type, n_rows, row_bytes, n, n_tokens, gemm);
    @autoreleasepool {
        id<MTLBuffer> memory = [c.device newBufferWithLength:p.memory_bytes options:MTLResourceStorageModeShared];
        id<MTLBuffer> weights = [c.device newBufferWithBytes:rows length:static_cast<size_t>(n_rows) * row_bytes
                                                     options:MTLResourceStorageModeShared];
        std::memcpy(memory.contents, x, static_cast<size_t>(n_tokens * n) * sizeof(float));
        std::vector<int32_t> tokens(static_cast<size_t>(n_tokens), 0);
        float every_row = 0;
        StepInputs in;
        in.tokens = tokens.data();
        in.n_tokens = n_tokens;
        in.logits_out = &every_row;  // rows from 0 (only the step block's first_row is read)
        run_once(p, memory, weights, in, false);
        const float* y = reinterpret_cast<const float*>(static_cast<const uint8_t*>(memory.contents) + p.logits);
        return std::vector<float>(y, y + n_tokens * n_rows);
    }
}

int32_t sample(const float* logits, int64_t n_vocab, const SamplingParams& params, uint64_t step) {
    if (penalized(params))
        throw std::invalid_argument("metal::sample draws without bias or penalties (it has no token history); a runner applies them");
    Context& c = usable_context();
    const Program p = sample_program(n_vocab);
    @autoreleasepool {
        id<MTLBuffer> memory = [c.device newBufferWithLength:p.memory_bytes options:MTLResourceStorageModeShared];
        std::memcpy(static_cast<uint8_t*>(memory.contents) + p.logits, logits, static_cast<size_t>(n_vocab) * sizeof(float));
        int32_t token = 0, out = -1;
        StepInputs in;
        in.tokens = &token;
        in.n_tokens = 1;
        in.sample = &params;
        in.sample_step = step;
        in.sampled = &out;
        run_once(p, memory, nil, in, true);
        std::memcpy(&out, static_cast<const uint8_t*>(memory.contents) + p.sampled, 4);
        return out;
    }
}

}  // namespace edgerunner::metal
