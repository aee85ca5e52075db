// The sampling contract's softmax weight e^-d, for a token at d = (l_max - l) / T >= 0 below the
// largest logit: one definition for the CPU sampler (csrc/core/sampler.cpp, Sampler::exp_neg) and
// the CUDA sampler (csrc/cuda/sample.cu), operation for operation and each rounded once (host
// builds have -ffp-contract=off; on the device the _rn intrinsics do not fuse), so a token weighs
// the same bits on both and the GPU's top-k walk is the CPU's, sum for sum.
//
// Cody-Waite: -d = n ln2 + r with n an integer and |r| <= ln2 / 2 (ln2's high part has 21 trailing
// zero bits, so n * hi is exact), then e^r by its Taylor series to r^13 (the next term is under
// 5e-18) times 2^n built from bits, as two normal factors so that results down to the subnormals
// round once. d is clamped at 746, where e^-d rounds to 0 (+inf too; NaN stays NaN). e^0 is 1
// exactly. No branch, so that the CPU's exp pass vectorizes; within 1 ulp of e^-d
// (tests/test_sampler.py).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define ER_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define ER_HOST_DEVICE inline
#endif

namespace edgerunner::softmax {

#if defined(__CUDA_ARCH__)
ER_HOST_DEVICE double add(double a, double b) { return __dadd_rn(a, b); }
ER_HOST_DEVICE double sub(double a, double b) { return __dsub_rn(a, b); }
ER_HOST_DEVICE double mul(double a, double b) { return __dmul_rn(a, b); }
ER_HOST_DEVICE int64_t to_bits(double d) { return __double_as_longlong(d); }
ER_HOST_DEVICE double from_bits(int64_t b) { return __longlong_as_double(b); }
ER_HOST_DEVICE double at_most(double d, double m) { return m < d ? m : d; }  // (std::min's: NaN stays NaN)
#else
ER_HOST_DEVICE double add(double a, double b) { return a + b; }
ER_HOST_DEVICE double sub(double a, double b) { return a - b; }
ER_HOST_DEVICE double mul(double a, double b) { return a * b; }
ER_HOST_DEVICE int64_t to_bits(double d) {
    int64_t b;
    std::memcpy(&b, &d, sizeof b);
    return b;
}
ER_HOST_DEVICE double from_bits(int64_t b) {
    double d;
    std::memcpy(&d, &b, sizeof d);
    return d;
}
ER_HOST_DEVICE double at_most(double d, double m) { return std::min(d, m); }
#endif

ER_HOST_DEVICE double weight(double d) {
    const double x = -at_most(d, 746.0);
    constexpr double kShifter = 0x1.8p52;  // adding it rounds to an integer, kept in the low bits
    const double k = add(mul(x, 0x1.71547652b82fep0), kShifter);  // x · log2(e)
    const double n = sub(k, kShifter);
    const double r = sub(sub(x, mul(n, 0x1.62e42feep-1)), mul(n, 0x1.a39ef35793c76p-33));
    double p = 1.0 / 6227020800.0;
    p = add(mul(p, r), 1.0 / 479001600.0);
    p = add(mul(p, r), 1.0 / 39916800.0);
    p = add(mul(p, r), 1.0 / 3628800.0);
    p = add(mul(p, r), 1.0 / 362880.0);
    p = add(mul(p, r), 1.0 / 40320.0);
    p = add(mul(p, r), 1.0 / 5040.0);
    p = add(mul(p, r), 1.0 / 720.0);
    p = add(mul(p, r), 1.0 / 120.0);
    p = add(mul(p, r), 1.0 / 24.0);
    p = add(mul(p, r), 1.0 / 6.0);
    p = add(mul(p, r), 0.5);
    p = add(mul(p, r), 1.0);
    p = add(mul(p, r), 1.0);
    const int64_t e = to_bits(k) - to_bits(kShifter);  // n, in [-1076, 0]
    const int64_t e1 = e >> 1;
    return mul(mul(p, from_bits((e1 + 1023) << 52)), from_bits((e - e1 + 1023) << 52));
}

}  // namespace edgerunner::softmax

#undef ER_HOST_DEVICE
