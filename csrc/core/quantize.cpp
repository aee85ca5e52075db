// Scalar reference quantization of activations into the formats the CPU's integer dot
// products consume. Same float32 arithmetic as the references they are tested against:
// Q8_0 = gguf.quants.quantize (ggml's quantize_row_q8_0_ref), Q8_K = ggml's
// quantize_row_q8_K_ref. Compile without -ffast-math.
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "edgerunner/half.h"
#include "edgerunner/quant_blocks.h"
#include "edgerunner/quants.h"

namespace edgerunner {
namespace {

void check_whole_blocks(const char* type, int64_t n, int64_t block) {
    if (n < 0 || n % block != 0)
        throw std::invalid_argument(std::string("cannot quantize ") + std::to_string(n) +
                                    " elements to " + type + ": not a whole number of " +
                                    std::to_string(block) + "-element blocks");
}

// Round to nearest, ties to even, for |x| <= 2^22: adding 1.5 * 2^23 leaves the rounded
// integer in the low mantissa bits (ggml's nearest_int).
inline int nearest_int(float x) {
    const float biased = x + 12582912.f;
    int32_t bits;
    std::memcpy(&bits, &biased, sizeof bits);
    return (bits & 0x007FFFFF) - 0x00400000;
}

}  // namespace

// d = max|x| / 127 (stored as fp16), q = round-half-away(x * (1/d)) with the float32 d.
void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
    check_whole_blocks("Q8_0", n, QK8_0);
    auto* y = static_cast<block_q8_0*>(dst);
    for (int64_t i = 0; i < n / QK8_0; ++i, src += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; ++j) amax = std::fmax(amax, std::fabs(src[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        for (int j = 0; j < QK8_0; ++j) y[i].qs[j] = static_cast<int8_t>(std::round(src[j] * id));
    }
}

// The element of largest magnitude (first one on ties) maps to -127: iscale = -127 / max,
// q = min(127, round-half-even(iscale * x)), d = 1 / iscale. An all-zero block is all zero.
void quantize_row_q8_K(const float* src, void* dst, int64_t n) {
    check_whole_blocks("Q8_K", n, QK_K);
    auto* y = static_cast<block_q8_K*>(dst);
    for (int64_t i = 0; i < n / QK_K; ++i, src += QK_K) {
        float max = 0.0f, amax = 0.0f;
        for (int j = 0; j < QK_K; ++j) {
            const float ax = std::fabs(src[j]);
            if (ax > amax) {
                amax = ax;
                max = src[j];
            }
        }
        if (amax == 0.0f) {
            std::memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; ++j) {
            const int v = nearest_int(iscale * src[j]);
            y[i].qs[j] = static_cast<int8_t>(v < 127 ? v : 127);
        }
        for (int b = 0; b < QK_K / 16; ++b) {
            int sum = 0;
            for (int j = 0; j < 16; ++j) sum += y[i].qs[b * 16 + j];
            y[i].bsums[b] = static_cast<int16_t>(sum);
        }
        y[i].d = 1.0f / iscale;
    }
}

}  // namespace edgerunner
