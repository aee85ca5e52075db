// The CUDA backend's host interface: plain C++, no CUDA types, so the core and the bindings
// include it without nvcc. Built only with EDGERUNNER_CUDA=ON (ER_HAVE_CUDA is then defined).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <memory>

#include "../core/kv_cache.h"
#include "../core/plan.h"
#include "../core/runner.h"
#include "edgerunner/model_config.h"
#include "edgerunner/tensor_type.h"

namespace edgerunner::cuda {

// A model lives on one GPU, `gpu` (a CUDA device index: cuda:N's N). Everything made for it
// below is made there, and every call into it (and its release) runs with that device current,
// whichever device the calling thread had: models on two GPUs run from one thread.

// A model's weights in device memory, uploaded once at load: every weight the plans use.
struct DeviceModel;
std::shared_ptr<DeviceModel> upload(const std::vector<const Plan*>& plans, int gpu);

// A session's KV cache in device memory on the weights' GPU, with the layout of `layout` (its
// precision, each layer its own capacity).
struct DeviceKv;
std::shared_ptr<DeviceKv> make_kv(const KVCache& layout, const DeviceModel& weights);

// How the one-token decode step reaches the GPU (prefill steps always launch eagerly):
// "eager" encodes and launches each op every step; "argument_buffers" writes every launch's
// arguments once into a device table and launches the same kernels pointing at it each step;
// "recorded" captures the step once as a CUDA graph and replays it.
enum class Dispatch { Eager, ArgumentBuffers, Recorded };
Dispatch parse_dispatch(const std::string& name);  // eager, argument_buffers, recorded, auto (= recorded)

// What in a plan the CUDA backend cannot run yet (empty: it runs all of it).
std::string unsupported(const ModelConfig& config, const Plan& plan);

// A prepared plan on the weights' GPU: scratch allocated there, one stream, ops launched per step.
std::unique_ptr<StepRunner> make_runner(const ModelConfig& config, const Plan& plan, std::shared_ptr<DeviceModel> weights,
                                        std::shared_ptr<DeviceKv> kv, Dispatch dispatch);

// Whether a CUDA device is present and usable (false, never an error, when there is none).
bool available();
// How many CUDA devices there are (0 where none is usable). CUDA_VISIBLE_DEVICES chooses and
// numbers them.
int device_count();
// "NVIDIA H200 (sm_90, 132 SMs, 143771 MiB)" for device `gpu`, or the reason there is no device.
std::string describe(int gpu = 0);
// Why cuda:`gpu` cannot be used ("" where it can): no device at all, or no such index (the
// devices there are, named, and CUDA_VISIBLE_DEVICES where it is set).
std::string unusable(int gpu);

// Device-to-device copy bandwidth in GB/s (bytes read + written per second) of device `gpu`,
// best of `reps` copies of n_bytes: the decode roofline's denominator.
double copy_bandwidth(size_t n_bytes, int reps, int gpu = 0);

// Weight types the GEMV kernels read in their raw blocks, and those whose kernel takes int8
// activations (quantized once per step, 32 per scale) rather than floats.
bool gemv_supports(TensorType type);
bool gemv_wants_q8(TensorType type);

// Whether the tensor-core GEMM runs a matmul of this type over n_tokens tokens (16 or more, any
// format gemv_wants_q8 lists, and the float ones); it multiplies bf16 copies of the weights'
// units (made in registers) and of the activations into float sums, F16 weights as they are
// against an f16 copy of the activations, and on Hopper F32 ones in tf32 (matmul_operands).
bool gemm_takes(TensorType type, int64_t n_tokens);

// The tensor-core GEMM's two kernels: mma.sync (every GPU from sm_80) and, on Hopper with
// sm_90a code in the build, warpgroup MMA (wgmma). Auto: what the runner picks (gemm.cu).
enum class GemmKernel { Auto, MmaSync, Wgmma };
// Whether this build and device have the wgmma kernel.
bool gemm_has_wgmma();

// Y = W · X on the device, for the backend-ops tests and the kernel benchmarks: W is n_rows
// rows of row_bytes raw blocks (n columns), X is n_tokens rows of n floats, Y n_tokens rows of
// n_rows. The kernel the runner would pick for that many tokens (GEMV, or the tensor-core GEMM
// from kPrefillKernelTokens = 16 on, launch.cuh; `kernel` names one of the GEMM's). Uploads,
// runs, reads back. With `residual` (n_tokens rows of n_rows floats), Y = residual + X W^T, added
// as the runner adds a projection to its residual (GemvArgs::accumulate).
std::vector<float> matmul(TensorType type, const uint8_t* rows, int64_t n_rows, size_t row_bytes, const float* x, int64_t n_tokens,
                          int64_t n, GemmKernel kernel = GemmKernel::Auto, const float* residual = nullptr);
// The tensor-core GEMM's 16-bit copy of n_tokens rows of cols floats (half_activations), for the
// tests: bf16 values, or with f16 f16 ones and each token's scale into *scales. Uploads, runs,
// reads back.
std::vector<uint16_t> half_copy(const float* x, int64_t n_tokens, int64_t cols, bool f16, std::vector<float>* scales);
// What that matmul multiplies with: "bf16", "f16" or "tf32" where the tensor-core GEMM runs it
// (gemm.cu, gemm_operands), else "int8" (activations quantized 32 per scale) or "float".
std::string matmul_operands(TensorType type, int64_t n_rows, int64_t n, int64_t n_tokens, GemmKernel kernel = GemmKernel::Auto);

}  // namespace edgerunner::cuda
