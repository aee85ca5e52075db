// The Metal backend's host interface: plain C++, no Objective-C or Metal types, so the core and
// the bindings include it from .cpp files (the shape of csrc/cuda/cuda.h). Built only with
// EDGERUNNER_METAL=ON on macOS (ER_HAVE_METAL is then defined); implemented in device.mm and
// runner.mm over the program of program.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../csrc/core/kv_cache.h"
#include "../csrc/core/plan.h"
#include "../csrc/core/runner.h"
#include "edgerunner/gguf.h"
#include "edgerunner/model_config.h"
#include "edgerunner/sampler.h"
#include "edgerunner/tensor_type.h"

namespace edgerunner::metal {

// A model's weights as Metal buffers: the file's memory map wrapped without copying
// (newBufferWithBytesNoCopy over page-aligned windows); a weight no window can hold is copied.
struct DeviceModel;
std::shared_ptr<DeviceModel> wrap_weights(const GGUFFile& file, const std::vector<const Plan*>& plans);

// A session's KV cache in one buffer, with the layout (per-layer capacities, precision) of `layout`.
struct DeviceKv;
std::shared_ptr<DeviceKv> make_kv(const KVCache& layout);

// How a step reaches the GPU (one command buffer per step in every mode):
//   eager             every op encoded every step: pipeline, its argument table (setBytes),
//                     the step block, the dispatch;
//   argument_buffers  every op's argument table written once at prepare time into one buffer
//                     of device addresses (Metal 3 bindless); per op only the table's offset
//                     changes; residency declared once (a residency set on macOS 15+);
//   recorded          the one-token decode step recorded at prepare time as an indirect command
//                     buffer per step-block slot, replayed by one executeCommandsInBuffer
//                     (other steps run as argument_buffers).
enum class Dispatch { Eager, ArgumentBuffers, Recorded };
Dispatch parse_dispatch(const std::string& name);  // eager, argument_buffers, recorded, auto (= recorded)

// What in a plan the Metal backend cannot run yet (empty: it runs all of it).
std::string unsupported(const ModelConfig& config, const Plan& plan);

// A prepared plan: its program, pipelines, argument tables and (recorded) command buffers.
std::unique_ptr<StepRunner> make_runner(const ModelConfig& config, const Plan& plan, std::shared_ptr<DeviceModel> weights,
                                        std::shared_ptr<DeviceKv> kv, Dispatch dispatch);

// Whether a Metal 3 GPU is present and the kernel library loads (false, never an error, when not).
bool available();
// "Apple M2 Pro (Metal 3, 21.3 GiB working set)", or why there is no usable device.
std::string describe();

// The backend-ops tests' entry points: one matmul (y[t] = W x[t] for n_tokens rows of n floats;
// W n_rows rows of row_bytes raw blocks) with the GEMV or the GEMM kernel; one draw of the device
// sampler from n_vocab logits.
std::vector<float> matmul(TensorType type, const uint8_t* rows, int64_t n_rows, size_t row_bytes, const float* x,
                          int64_t n_tokens, int64_t n, bool gemm);
int32_t sample(const float* logits, int64_t n_vocab, const SamplingParams& params, uint64_t step);

}  // namespace edgerunner::metal
