// The tensor-core GEMM (csrc/cuda/gemm.cu) is not emulated: its kernels are mma / wgmma PTX. The
// runner then never takes it (gemm_takes: no), and prefill chunks under kPrefillKernelTokens
// keep the emulated tests off the tensor-core attention too.
#include <stdexcept>

#include "../../csrc/cuda/gemv.cuh"
#include "edgerunner/tensor_type.h"

namespace edgerunner::cuda {

bool gemm_takes(TensorType, int64_t) { return false; }
bool gemm_has_wgmma() { return false; }
Launch gemm(TensorType, const GemvArgs&, GemmKernel) { throw std::logic_error("the CUDA emulator runs no tensor-core GEMM"); }
GemmOperands gemm_operands(TensorType, const GemvArgs&, GemmKernel) { throw std::logic_error("the CUDA emulator runs no tensor-core GEMM"); }

}  // namespace edgerunner::cuda
