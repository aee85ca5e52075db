// The Metal backend's test entry points; without EDGERUNNER_METAL (every build but macOS) they
// report that the build has no Metal backend.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "edgerunner/sampler.h"
#include "edgerunner/tensor_type.h"
#if defined(ER_HAVE_METAL)
#include "../../metal/metal.h"
#endif

namespace nb = nanobind;
using namespace edgerunner;

void bind_metal(nb::module_& m) {
#if defined(ER_HAVE_METAL)
    m.attr("metal_built") = true;
    m.def("metal_available", &metal::available, "Whether this build has the Metal backend, a Metal 3 GPU is present and the kernel library loads.");
    m.def("metal_device", &metal::describe);
    m.def("metal_matmul", [](uint32_t type_id, nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig> rows,
                             nb::ndarray<const float, nb::ndim<2>, nb::c_contig> x, bool gemm) {
        auto info = tensor_type_info(type_id);
        if (!info) throw std::invalid_argument("unknown tensor type id " + std::to_string(type_id));
        const int64_t n_tokens = static_cast<int64_t>(x.shape(0)), n = static_cast<int64_t>(x.shape(1));
        if (n % 32 != 0 || rows.shape(1) != static_cast<size_t>(n / info->block_size * info->type_size))
            throw std::invalid_argument("rows and x sizes do not match the type's blocks (or n is not a multiple of 32)");
        std::vector<float> y;
        {
            nb::gil_scoped_release release;
            y = metal::matmul(info->type, rows.data(), static_cast<int64_t>(rows.shape(0)), rows.shape(1), x.data(), n_tokens, n, gemm);
        }
        float* out = new float[y.size()];
        std::copy(y.begin(), y.end(), out);
        nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<float*>(p); });
        size_t shape[2] = {static_cast<size_t>(n_tokens), rows.shape(0)};
        return nb::ndarray<nb::numpy, float, nb::ndim<2>>(out, 2, shape, owner);
    }, nb::arg("type_id"), nb::arg("rows"), nb::arg("x"), nb::arg("gemm") = false,
       "Y = X Wᵀ on the Metal GPU (W in its raw blocks, X n_tokens × n): the GEMV kernel, or the simdgroup-matrix GEMM.");
    m.def("metal_sample", [](nb::ndarray<const float, nb::ndim<1>, nb::c_contig> logits, float temperature, int32_t top_k,
                             float top_p, float min_p, uint64_t seed, uint64_t step) {
        SamplingParams p;
        p.temperature = temperature;
        p.top_k = top_k;
        p.top_p = top_p;
        p.min_p = min_p;
        p.seed = seed;
        nb::gil_scoped_release release;
        return metal::sample(logits.data(), static_cast<int64_t>(logits.shape(0)), p, step);
    }, nb::arg("logits"), nb::arg("temperature") = 0.0f, nb::arg("top_k") = 0, nb::arg("top_p") = 1.0f, nb::arg("min_p") = 0.0f,
       nb::arg("seed") = 0, nb::arg("step") = 0, "One draw of the device sampler (the CPU sampler's contract, no bias or penalties).");
#else
    m.attr("metal_built") = false;
    m.def("metal_available", [] { return false; }, "Whether this build has the Metal backend, a Metal 3 GPU is present and the kernel library loads.");
    m.def("metal_device", [] { return std::string("this build has no Metal backend (macOS arm64 builds it by default)"); });
#endif
}
