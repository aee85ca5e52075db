// Bindings for the scalar reference (de)quantizers: NumPy in, NumPy out, GIL released.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "edgerunner/quant_blocks.h"
#include "edgerunner/quants.h"
#include "edgerunner/tensor_type.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using BytesIn = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using FloatsIn = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
template <typename T>
using NumpyOut = nb::ndarray<nb::numpy, T, nb::ndim<1>>;

// A fresh 1-D NumPy array of n elements that owns its buffer.
template <typename T>
NumpyOut<T> new_numpy(size_t n, T** data) {
    T* p = new T[n > 0 ? n : 1];
    nb::capsule owner(p, [](void* q) noexcept { delete[] static_cast<T*>(q); });
    *data = p;
    return NumpyOut<T>(p, {n}, owner);
}

NumpyOut<float> dequantize(int64_t type_id, const uint8_t* data, size_t nbytes, int64_t n) {
    const auto info = type_id >= 0 && type_id <= UINT32_MAX
                          ? edgerunner::tensor_type_info(static_cast<uint32_t>(type_id))
                          : std::nullopt;
    if (!info) throw std::invalid_argument("unknown tensor type id " + std::to_string(type_id));
    const std::string name(info->name);
    if (!info->dequantize)  // dequantize_row throws the message that lists the supported types
        edgerunner::dequantize_row(info->type, data, nullptr, 0);
    if (n < 0 || n % info->block_size != 0)
        throw std::invalid_argument("cannot dequantize " + std::to_string(n) + " elements of " + name +
                                    ": n must be a multiple of the block size " +
                                    std::to_string(info->block_size));
    const uint64_t blocks = static_cast<uint64_t>(n) / info->block_size;
    const uint64_t expected = blocks * info->type_size;
    if (nbytes != expected)
        throw std::invalid_argument(name + " data has " + std::to_string(nbytes) + " bytes, but " +
                                    std::to_string(n) + " elements are " + std::to_string(blocks) +
                                    " blocks of " + std::to_string(info->type_size) + " bytes = " +
                                    std::to_string(expected) + " bytes");
    float* out;
    auto result = new_numpy<float>(static_cast<size_t>(n), &out);
    {
        nb::gil_scoped_release release;
        edgerunner::dequantize_row(info->type, data, out, n);
    }
    return result;
}

template <typename Block>
NumpyOut<uint8_t> quantize(const FloatsIn& x, const char* type, int64_t block_size,
                           void (*quantize_row)(const float*, void*, int64_t)) {
    const int64_t n = static_cast<int64_t>(x.shape(0));
    if (n % block_size != 0)
        throw std::invalid_argument(std::string("cannot quantize ") + std::to_string(n) + " elements to " +
                                    type + ": the length must be a multiple of " +
                                    std::to_string(block_size));
    uint8_t* out;
    auto result = new_numpy<uint8_t>(static_cast<size_t>(n / block_size) * sizeof(Block), &out);
    {
        nb::gil_scoped_release release;
        quantize_row(x.data(), out, n);
    }
    return result;
}

}  // namespace

void bind_quants(nb::module_& m) {
    m.def(
        "dequantize",
        [](int64_t type_id, const BytesIn& data, int64_t n) {
            return dequantize(type_id, data.data(), data.shape(0), n);
        },
        "type_id"_a, "data"_a, "n"_a,
        "Decode n elements of GGUF tensor type `type_id` from raw blocks (uint8, 1-D) to float32.");
    m.def(
        "dequantize",
        [](int64_t type_id, nb::bytes data, int64_t n) {
            return dequantize(type_id, static_cast<const uint8_t*>(data.data()), data.size(), n);
        },
        "type_id"_a, "data"_a, "n"_a);
    m.def(
        "quantize_q8_0",
        [](const FloatsIn& x) { return quantize<block_q8_0>(x, "Q8_0", QK8_0, edgerunner::quantize_row_q8_0); },
        "x"_a, "Quantize float32 (1-D, length a multiple of 32) to Q8_0 blocks (uint8).");
    m.def(
        "quantize_q8_k",
        [](const FloatsIn& x) { return quantize<block_q8_K>(x, "Q8_K", QK_K, edgerunner::quantize_row_q8_K); },
        "x"_a, "Quantize float32 (1-D, length a multiple of 256) to Q8_K blocks (uint8).");
}
