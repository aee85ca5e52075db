// Run-time choice of the dot-product kernels for this CPU.
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels.h"

#if defined(ER_HAVE_X86_KERNELS)
#include <cpuid.h>
#endif

namespace edgerunner::cpu {

#if defined(ER_HAVE_X86_KERNELS)
namespace avx2 {
DotFn dot_fn(TensorType type);
DotRowsFn dot_rows_fn(TensorType type);
KvKernels kv_kernels(KvType type);
QuantizeFn quantize_fn(ActFormat format);
MathKernels math_kernels();
}  // namespace avx2
namespace avxvnni {
DotFn dot_fn(TensorType type);
DotRowsFn dot_rows_fn(TensorType type);
KvKernels kv_kernels(KvType type);
QuantizeFn quantize_fn(ActFormat format);
MathKernels math_kernels();
}  // namespace avxvnni
namespace avx512 {
DotFn dot_fn(TensorType type);
DotRowsFn dot_rows_fn(TensorType type);
KvKernels kv_kernels(KvType type);
QuantizeFn quantize_fn(ActFormat format);
MathKernels math_kernels();
}  // namespace avx512
#endif

namespace {

constexpr Isa kAll[] = {Isa::Scalar, Isa::Avx2, Isa::AvxVnni, Isa::Avx512};
constexpr unsigned bit(Isa isa) { return 1u << static_cast<int>(isa); }

// The set of kernel sets this CPU (and OS) runs, as bits.
unsigned detect() {
    unsigned set = bit(Isa::Scalar);
#if defined(ER_HAVE_X86_KERNELS)
    // cpuid directly: compilers differ in which names __builtin_cpu_supports knows.
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return set;
    const bool fma = c & (1u << 12), f16c = c & (1u << 29), osxsave = c & (1u << 27);
    if (!osxsave) return set;
    unsigned xcr0_lo, xcr0_hi;
    __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    if ((xcr0_lo & 6u) != 6u) return set;  // the OS does not save YMM state
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return set;
    const bool avx2 = b & (1u << 5);
    if (!(avx2 && fma && f16c)) return set;
    set |= bit(Isa::Avx2);
    const bool avx512 = (b & (1u << 16)) && (b & (1u << 17)) && (b & (1u << 30)) && (b & (1u << 31)) &&  // F DQ BW VL
                        (c & (1u << 11)) &&                                                          // VNNI
                        (xcr0_lo & 0xE0u) == 0xE0u;  // the OS saves opmask and ZMM state
    if (avx512) set |= bit(Isa::Avx512);
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4))) set |= bit(Isa::AvxVnni);
#endif
    return set;
}

unsigned cpu_isas() {
    static const unsigned set = detect();
    return set;
}

Isa cpu_isa() {
    Isa best = Isa::Scalar;
    for (Isa isa : kAll)
        if (cpu_isas() & bit(isa)) best = isa;
    return best;
}

}  // namespace

const char* isa_name(Isa isa) {
    switch (isa) {
        case Isa::Scalar: return "scalar";
        case Isa::Avx2: return "avx2";
        case Isa::AvxVnni: return "avxvnni";
        case Isa::Avx512: return "avx512";
    }
    return "?";
}

Isa parse_isa(const char* name) {
    for (Isa isa : kAll) {
        if (std::strcmp(name, isa_name(isa)) != 0) continue;
        if (!(cpu_isas() & bit(isa)))
            throw std::invalid_argument(std::string("instruction set '") + name + "' is not available on this CPU (best: " +
                                        isa_name(cpu_isa()) + ")");
        return isa;
    }
    throw std::invalid_argument(std::string("unknown instruction set '") + name + "'; known: scalar, avx2, avxvnni, avx512");
}

std::vector<Isa> available_isas() {
    std::vector<Isa> out;
    for (Isa isa : kAll)
        if (cpu_isas() & bit(isa)) out.push_back(isa);
    return out;
}

Isa best_isa() {
    static const Isa isa = [] {
        const char* env = std::getenv("EDGERUNNER_ISA");
        return env && *env ? parse_isa(env) : cpu_isa();
    }();
    return isa;
}

DotFn dot_quant_fn(TensorType type, Isa isa) {
    DotFn fn = nullptr;
#if defined(ER_HAVE_X86_KERNELS)
    if (isa == Isa::Avx512) fn = avx512::dot_fn(type);
    if (isa == Isa::AvxVnni) fn = avxvnni::dot_fn(type);
    if (isa == Isa::Avx2) fn = avx2::dot_fn(type);
#endif
    return fn ? fn : dot_quant_fn_scalar(type);
}

DotRowsFn dot_rows_fn(TensorType type, Isa isa) {
#if defined(ER_HAVE_X86_KERNELS)
    if (isa == Isa::Avx512) return avx512::dot_rows_fn(type);
    if (isa == Isa::AvxVnni) return avxvnni::dot_rows_fn(type);
    if (isa == Isa::Avx2) return avx2::dot_rows_fn(type);
#endif
    (void)type;
    return nullptr;
}

QuantizeFn quantize_fn(ActFormat format, Isa isa) {
#if defined(ER_HAVE_X86_KERNELS)
    if (isa == Isa::Avx512) return avx512::quantize_fn(format);
    if (isa == Isa::AvxVnni) return avxvnni::quantize_fn(format);
    if (isa == Isa::Avx2) return avx2::quantize_fn(format);
#endif
    (void)format;
    (void)isa;
    return nullptr;
}

int tile_rows(Isa isa) { return isa == Isa::Avx512 ? 16 : 8; }

MathKernels math_kernels(Isa isa) {
#if defined(ER_HAVE_X86_KERNELS)
    if (isa == Isa::Avx512) return avx512::math_kernels();
    if (isa == Isa::AvxVnni) return avxvnni::math_kernels();
    if (isa == Isa::Avx2) return avx2::math_kernels();
#endif
    (void)isa;
    return math_kernels_scalar();
}

KvKernels kv_kernels(KvType type, Isa isa) {
#if defined(ER_HAVE_X86_KERNELS)
    if (isa == Isa::Avx512) return avx512::kv_kernels(type);
    if (isa == Isa::AvxVnni) return avxvnni::kv_kernels(type);
    if (isa == Isa::Avx2) return avx2::kv_kernels(type);
#endif
    return kv_kernels_scalar(type);
}

}  // namespace edgerunner::cpu
