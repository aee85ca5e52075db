// Tensor element types as GGUF numbers them (ggml's type ids), with their block geometry.
// Every backend and the GGUF reader agree on this one table.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace edgerunner {

enum class TensorType : uint32_t {
    F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
    Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
    IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
    IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
    TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39, NVFP4 = 40, Q1_0 = 41,
};

struct TensorTypeInfo {
    TensorType type;
    std::string_view name;
    uint32_t block_size;  // elements per block (1 for plain scalar types)
    uint32_t type_size;   // bytes per block
    bool dequantize;      // this build has a float32 dequantizer for it
};

// The row for a GGUF type id, or nullopt when the id is not a known ggml type.
std::optional<TensorTypeInfo> tensor_type_info(uint32_t id);
TensorTypeInfo tensor_type_info(TensorType type);
std::string_view tensor_type_name(TensorType type);

// Comma-separated names of the types this build can dequantize (for error messages).
std::string_view dequantizable_type_names();

}  // namespace edgerunner
