// The CUDA backend's test and benchmark entry points; without EDGERUNNER_CUDA they report that
// the build has no CUDA backend.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "edgerunner/tensor_type.h"
#if defined(ER_HAVE_CUDA)
#include "../cuda/cuda.h"
#endif

namespace nb = nanobind;
using namespace edgerunner;

#if defined(ER_HAVE_CUDA)
static cuda::GemmKernel gemm_kernel(const std::string& gemm) {
    if (gemm != "auto" && gemm != "mma.sync" && gemm != "wgmma") throw std::invalid_argument("gemm must be 'auto', 'mma.sync' or 'wgmma', not '" + gemm + "'");
    return gemm == "wgmma" ? cuda::GemmKernel::Wgmma : gemm == "mma.sync" ? cuda::GemmKernel::MmaSync : cuda::GemmKernel::Auto;
}
#endif

void bind_cuda(nb::module_& m) {
#if defined(ER_HAVE_CUDA)
    m.attr("cuda_built") = true;
    m.def("cuda_available", &cuda::available, "Whether this build has the CUDA backend and a CUDA device is present.");
    m.def("cuda_device", [](int gpu) {
        if (const std::string why = cuda::unusable(gpu); !why.empty()) return why;
        return cuda::describe(gpu);
    }, nb::arg("gpu") = 0, "CUDA device `gpu` in words (name, architecture, SMs, memory), or why there is none.");
    m.def("cuda_device_count", &cuda::device_count, "How many CUDA devices there are (CUDA_VISIBLE_DEVICES chooses and numbers them).");
    m.def("cuda_copy_bandwidth", [](size_t n_bytes, int reps, int gpu) {
        nb::gil_scoped_release release;
        return cuda::copy_bandwidth(n_bytes, reps, gpu);
    }, nb::arg("n_bytes") = size_t(1) << 30, nb::arg("reps") = 5, nb::arg("gpu") = 0,
       "Device-to-device copy bandwidth of CUDA device `gpu`, GB/s (read + write).");
    m.def("cuda_matmul", [](uint32_t type_id, nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig> rows,
                            nb::ndarray<const float, nb::ndim<2>, nb::c_contig> x, const std::string& gemm,
                            std::optional<nb::ndarray<const float, nb::ndim<2>, nb::c_contig>> residual) {
        auto info = tensor_type_info(type_id);
        if (!info) throw std::invalid_argument("unknown tensor type id " + std::to_string(type_id));
        const cuda::GemmKernel kernel = gemm_kernel(gemm);
        const int64_t n_tokens = static_cast<int64_t>(x.shape(0)), n = static_cast<int64_t>(x.shape(1));
        if (n_tokens < 1 || n % info->block_size != 0 || rows.shape(1) != static_cast<size_t>(n / info->block_size * info->type_size))
            throw std::invalid_argument("rows and x sizes do not match the type's blocks");
        if (residual && (residual->shape(0) != x.shape(0) || residual->shape(1) != rows.shape(0)))
            throw std::invalid_argument("residual must be tokens × rows, the shape of Y");
        std::vector<float> y;
        {
            nb::gil_scoped_release release;
            y = cuda::matmul(info->type, rows.data(), static_cast<int64_t>(rows.shape(0)), rows.shape(1), x.data(), n_tokens, n, kernel,
                             residual ? residual->data() : nullptr);
        }
        float* out = new float[y.size()];
        std::copy(y.begin(), y.end(), out);
        nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<float*>(p); });
        size_t shape[2] = {static_cast<size_t>(n_tokens), rows.shape(0)};
        return nb::ndarray<nb::numpy, float, nb::ndim<2>>(out, 2, shape, owner);
    }, nb::arg("type_id"), nb::arg("rows"), nb::arg("x"), nb::arg("gemm") = "auto", nb::arg("residual") = nb::none(),
       "Y = X W^T on the CUDA device (W in its raw blocks, X one row per token): the kernel the engine picks for that many tokens; "
       "where that is the tensor-core GEMM, gemm='mma.sync' or 'wgmma' (Hopper, cuda_gemm_has_wgmma) names its kernel. With "
       "residual (tokens × rows floats), Y = residual + X W^T, added in the kernel as the engine adds a projection to its residual.");
    m.def("cuda_gemm_has_wgmma", &cuda::gemm_has_wgmma,
          "Whether the tensor-core GEMM has its Hopper kernel here (warpgroup MMA: a compute capability 9.0 device, a build with "
          "sm_90a code, and EDGERUNNER_CUDA_WGMMA not 0).");
    m.def("cuda_gemv_int8", [](uint32_t type_id) {
        auto info = tensor_type_info(type_id);
        if (!info) throw std::invalid_argument("unknown tensor type id " + std::to_string(type_id));
        return cuda::gemv_wants_q8(info->type);
    }, nb::arg("type_id"), "Whether the CUDA GEMV of this type multiplies int8-quantized activations.");
    m.def("cuda_matmul_activations", [](uint32_t type_id, int64_t n_rows, int64_t n, int64_t n_tokens, const std::string& gemm) {
        auto info = tensor_type_info(type_id);
        if (!info) throw std::invalid_argument("unknown tensor type id " + std::to_string(type_id));
        return cuda::matmul_operands(info->type, n_rows, n, n_tokens, gemm_kernel(gemm));
    }, nb::arg("type_id"), nb::arg("n_rows"), nb::arg("n"), nb::arg("n_tokens"), nb::arg("gemm") = "auto",
       "What cuda_matmul of this type and shape (n_rows × n weights, n_tokens) multiplies with: the tensor-core GEMM's 'bf16' "
       "(weights and activations rounded to bf16), 'f16' (F16 weights as they are, the activations rounded to f16) or 'tf32' "
       "(F32 on Hopper's kernel: weights and activations cut to tf32); the GEMV's 'int8' (activations quantized 32 per scale) "
       "or 'float'.");
#else
    m.attr("cuda_built") = false;
    m.def("cuda_available", [] { return false; }, "Whether this build has the CUDA backend and a CUDA device is present.");
    m.def("cuda_device", [](int) { return std::string("this build has no CUDA backend (build with -C cmake.define.EDGERUNNER_CUDA=ON)"); },
          nb::arg("gpu") = 0);
    m.def("cuda_device_count", [] { return 0; }, "How many CUDA devices there are (CUDA_VISIBLE_DEVICES chooses and numbers them).");
#endif
}
