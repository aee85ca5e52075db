// Test hooks for the CPU kernels: one row dot product through a chosen instruction set, so the
// SIMD kernels can be compared with the scalar reference from Python.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "../cpu/kernels.h"
#include "../cpu/thread_pool.h"

namespace nb = nanobind;
using namespace edgerunner;

void bind_kernels(nb::module_& m) {
    m.def("cpu_isa", [] { return std::string(cpu::isa_name(cpu::best_isa())); },
          "The instruction set the CPU kernels use here (EDGERUNNER_ISA may lower it).");
    m.def("cpu_isas", [] {
        std::vector<std::string> names;
        for (cpu::Isa isa : cpu::available_isas()) names.emplace_back(cpu::isa_name(isa));
        return names;
    }, "Every instruction set this CPU can run the kernels with, scalar first.");
    m.def("cpu_quantize_act", [](const std::string& format, nb::ndarray<const float, nb::ndim<1>, nb::c_contig> x,
                                 const std::string& isa) {
        if (format != "Q8_0" && format != "Q8_K")
            throw std::invalid_argument("activation format must be Q8_0 or Q8_K, not '" + format + "'");
        const cpu::ActFormat f = format == "Q8_0" ? cpu::ActFormat::Q8_0 : cpu::ActFormat::Q8_K;
        const int64_t n = static_cast<int64_t>(x.shape(0)), block = f == cpu::ActFormat::Q8_0 ? 32 : 256;
        if (n % block != 0) throw std::invalid_argument("x must be a whole number of " + std::to_string(block) + "-element blocks");
        std::string out(cpu::act_bytes(f, n), '\0');
        cpu::quantize_act(f, x.data(), out.data(), n, cpu::parse_isa(isa.c_str()));
        return nb::bytes(out.data(), out.size());
    }, nb::arg("format"), nb::arg("x"), nb::arg("isa"),
       "Activations as the kernels see them (blocks, then the per-block sums), with the given kernel set.");
    m.def("cpu_math", [](const std::string& fn, nb::ndarray<const float, nb::ndim<1>, nb::c_contig> x,
                         nb::ndarray<const float, nb::ndim<1>, nb::c_contig> u, float shift, const std::string& isa) {
        // The elementwise kernels: "silu_mul" / "gelu_mul" return act(x) · u, "exp_sum" returns e^(x - shift)
        // with its sum appended.
        const cpu::MathKernels k = isa == "scalar" ? cpu::math_kernels_scalar() : cpu::math_kernels(cpu::parse_isa(isa.c_str()));
        const size_t n = x.shape(0);
        std::vector<float> y(x.data(), x.data() + n);
        if (fn == "silu_mul" || fn == "gelu_mul") {
            if (u.shape(0) != n) throw std::invalid_argument("x and u differ in length");
            (fn == "silu_mul" ? k.silu_mul : k.gelu_mul)(y.data(), u.data(), static_cast<int64_t>(n));
        } else if (fn == "exp_sum") {
            y.push_back(k.exp_sum(y.data(), static_cast<int64_t>(n), shift));
        } else {
            throw std::invalid_argument("unknown math kernel '" + fn + "' (silu_mul, gelu_mul, exp_sum)");
        }
        return y;
    }, nb::arg("fn"), nb::arg("x"), nb::arg("u"), nb::arg("shift"), nb::arg("isa"));
    m.def("cpu_dot", [](uint32_t type_id, nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig> row,
                        nb::ndarray<const float, nb::ndim<1>, nb::c_contig> x, const std::string& isa) {
        auto info = tensor_type_info(type_id);
        if (!info || !info->dequantize) throw std::invalid_argument("no kernel for tensor type id " + std::to_string(type_id));
        const int64_t n = static_cast<int64_t>(x.shape(0));
        if (n % info->block_size != 0 || row.shape(0) != static_cast<size_t>(n / info->block_size * info->type_size))
            throw std::invalid_argument("row and x sizes do not match the type's blocks");
        const cpu::ActFormat format = cpu::act_format_for(info->type);
        std::vector<uint8_t> q(cpu::act_bytes(format, n));
        cpu::quantize_act(format, x.data(), q.data(), n);
        cpu::DotFn fn = isa == "scalar" ? cpu::dot_quant_fn_scalar(info->type) : cpu::dot_quant_fn(info->type, cpu::parse_isa(isa.c_str()));
        return fn(row.data(), q.data(), n);
    }, nb::arg("type_id"), nb::arg("row"), nb::arg("x"), nb::arg("isa") = "scalar",
       "dot(weight row in its raw blocks, x quantized to the type's activation format) with the given kernels.");
}

// Read bandwidth of this machine: each of n_threads threads sums its slice of a buffer of
// n_bytes (already touched), best of `reps`; GB/s. The decode roofline is weight bytes per
// token divided by this.
void bind_bandwidth(nb::module_& m);

// The bandwidth probe's read loops: 64-bit scalar, and 4 × 32-byte loads per step where the CPU
// has AVX2 (a scalar loop under-reads memory that wide vector loads can pull).
static uint64_t sum_u64(const uint64_t* p, size_t n) {
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += p[i];
        s1 += p[i + 1];
        s2 += p[i + 2];
        s3 += p[i + 3];
    }
    for (; i < n; ++i) s0 += p[i];
    return s0 + s1 + s2 + s3;
}

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx2"))) static uint64_t sum_avx2(const uint64_t* p, size_t n) {
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_add_epi64(s0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
        s1 = _mm256_add_epi64(s1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
        s2 = _mm256_add_epi64(s2, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
        s3 = _mm256_add_epi64(s3, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
    }
    alignas(32) uint64_t lanes[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3)));
    return lanes[0] + lanes[1] + lanes[2] + lanes[3] + sum_u64(p + i, n - i);
}
#else
static uint64_t sum_avx2(const uint64_t* p, size_t n) { return sum_u64(p, n); }
#endif

// The prefill tile kernel for `rows` (n_rows × row bytes) against `x` (n_tok × n floats):
// an (n_rows, n_tok) array, or None where the type has no tile kernel for this ISA.
static nb::object cpu_dot_tile(uint32_t type_id, nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig> rows,
                               nb::ndarray<const float, nb::ndim<2>, nb::c_contig> x, const std::string& isa) {
    auto info = tensor_type_info(type_id);
    if (!info || !info->dequantize) throw std::invalid_argument("no kernel for tensor type id " + std::to_string(type_id));
    const int n_rows = static_cast<int>(rows.shape(0)), n_tok = static_cast<int>(x.shape(0));
    const int64_t n = static_cast<int64_t>(x.shape(1));
    const cpu::Isa set = cpu::parse_isa(isa.c_str());
    if (n_rows < 1 || n_rows > cpu::tile_rows(set) || n_tok < 1 || n_tok > cpu::kTileTokens)
        throw std::invalid_argument("a tile is 1-" + std::to_string(cpu::tile_rows(set)) + " rows × 1-4 tokens with " + isa);
    if (n % info->block_size != 0 || rows.shape(1) != static_cast<size_t>(n / info->block_size * info->type_size))
        throw std::invalid_argument("rows and x sizes do not match the type's blocks");
    cpu::DotRowsFn fn = cpu::dot_rows_fn(info->type, set);
    if (!fn) return nb::none();
    const cpu::ActFormat format = cpu::act_format_for(info->type);
    const size_t qbytes = cpu::act_bytes(format, n);
    std::vector<uint8_t> q(qbytes * n_tok);
    for (int t = 0; t < n_tok; ++t) cpu::quantize_act(format, x.data() + t * n, q.data() + t * qbytes, n);
    float out[cpu::kMaxTileRows * cpu::kTileTokens];
    fn(rows.data(), rows.shape(1), n_rows, q.data(), qbytes, n_tok, n, out);
    nb::list result;
    for (int i = 0; i < n_rows; ++i) {
        nb::list r;
        for (int k = 0; k < n_tok; ++k) r.append(out[i * 4 + k]);
        result.append(r);
    }
    return result;
}

void bind_bandwidth(nb::module_& m) {
    m.def("kv_attention", [](const std::string& kv_type, nb::ndarray<const float, nb::ndim<2>, nb::c_contig> k,
                             nb::ndarray<const float, nb::ndim<2>, nb::c_contig> v, nb::ndarray<const float, nb::ndim<1>, nb::c_contig> q,
                             const std::string& isa) {
        // One head's attention through the cache kernels: K and V rows (positions × head size)
        // are stored in the cache precision, then scores = q·k / √d and out = Σ softmax · v.
        const KvType type = parse_kv_type(kv_type);
        const int64_t n_pos = static_cast<int64_t>(k.shape(0)), hd = static_cast<int64_t>(k.shape(1));
        KVCache cache(type, 1, n_pos, 1, hd, false);
        for (int64_t p = 0; p < n_pos; ++p) {
            cpu::store_kv_row(type, k.data() + p * hd, cache.k(0, p), hd);
            cpu::store_kv_row(type, v.data() + p * hd, cache.v(0, p), hd);
        }
        const cpu::KvKernels fn = isa == "scalar" ? cpu::kv_kernels_scalar(type) : cpu::kv_kernels(type, cpu::parse_isa(isa.c_str()));
        std::vector<float> scores(static_cast<size_t>(n_pos));
        fn.scores(cache.k(0, 0), cache.row_bytes, cache.capacity, 0, n_pos, q.data(), hd, 1.0f / std::sqrt(static_cast<float>(hd)), scores.data());
        float mx = -INFINITY, sum = 0;
        for (float x : scores) mx = std::max(mx, x);
        for (float& x : scores) sum += (x = std::exp(x - mx));
        for (float& x : scores) x /= sum;
        float* out = new float[static_cast<size_t>(hd)]();
        fn.values(cache.v(0, 0), cache.row_bytes, cache.capacity, 0, n_pos, scores.data(), hd, out);
        nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<float*>(p); });
        size_t shape[1] = {static_cast<size_t>(hd)};
        return nb::ndarray<nb::numpy, float, nb::ndim<1>>(out, 1, shape, owner);
    }, nb::arg("kv_type"), nb::arg("k"), nb::arg("v"), nb::arg("q"), nb::arg("isa"));
    m.def("cpu_gemv", [](uint32_t type_id, nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig> rows,
                         nb::ndarray<const float, nb::ndim<1>, nb::c_contig> x, const std::string& isa) {
        auto info = tensor_type_info(type_id);
        if (!info || !info->dequantize) throw std::invalid_argument("no kernel for tensor type id " + std::to_string(type_id));
        const int64_t n = static_cast<int64_t>(x.shape(0));
        if (n % info->block_size != 0 || rows.shape(1) != static_cast<size_t>(n / info->block_size * info->type_size))
            throw std::invalid_argument("rows and x sizes do not match the type's blocks");
        const cpu::ActFormat format = cpu::act_format_for(info->type);
        std::vector<uint8_t> q(cpu::act_bytes(format, n));
        cpu::quantize_act(format, x.data(), q.data(), n);
        cpu::DotFn fn = isa == "scalar" ? cpu::dot_quant_fn_scalar(info->type) : cpu::dot_quant_fn(info->type, cpu::parse_isa(isa.c_str()));
        // As a decode step runs it: 8-row tiles against one token where the type has them.
        cpu::DotRowsFn tile = isa == "scalar" ? nullptr : cpu::dot_rows_fn(info->type, cpu::parse_isa(isa.c_str()));
        const size_t tile_rows = isa == "scalar" ? 1 : static_cast<size_t>(cpu::tile_rows(cpu::parse_isa(isa.c_str())));
        const size_t n_rows = rows.shape(0), row_bytes = rows.shape(1);
        float* y = new float[n_rows];
        {
            nb::gil_scoped_release release;
            for (size_t r = 0; r < n_rows;) {
                if (tile) {
                    const int nr = static_cast<int>(std::min(tile_rows, n_rows - r));
                    float out[cpu::kMaxTileRows * cpu::kTileTokens];
                    tile(rows.data() + r * row_bytes, row_bytes, nr, q.data(), 0, 1, n, out);
                    for (int i = 0; i < nr; ++i) y[r + i] = out[i * cpu::kTileTokens];
                    r += static_cast<size_t>(nr);
                } else {
                    y[r] = fn(rows.data() + r * row_bytes, q.data(), n);
                    ++r;
                }
            }
        }
        nb::capsule owner(y, [](void* p) noexcept { delete[] static_cast<float*>(p); });
        size_t shape[1] = {n_rows};
        return nb::ndarray<nb::numpy, float, nb::ndim<1>>(y, 1, shape, owner);
    }, nb::arg("type_id"), nb::arg("rows"), nb::arg("x"), nb::arg("isa"),
       "One thread's matrix-vector product with the given kernels (for the kernel microbenchmarks).");
    m.def("cpu_dot_tile", &cpu_dot_tile, nb::arg("type_id"), nb::arg("rows"), nb::arg("x"), nb::arg("isa"));
    m.def("read_bandwidth", [](size_t n_bytes, int n_threads, int reps) {
        nb::gil_scoped_release release;
        const size_t n = n_bytes / sizeof(uint64_t);
        std::unique_ptr<uint64_t[]> buf(new uint64_t[n]);
        for (size_t i = 0; i < n; ++i) buf[i] = i;
        cpu::ThreadPool pool(n_threads);
        const bool wide = cpu::best_isa() != cpu::Isa::Scalar;
        std::vector<uint64_t> sinks(static_cast<size_t>(n_threads) * 8, 0);
        double best = 0;
        for (int r = 0; r < reps; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            pool.run([&](int ith, int nth) {
                const size_t a = n * ith / nth, b = n * (ith + 1) / nth;
                sinks[static_cast<size_t>(ith) * 8] = wide ? sum_avx2(buf.get() + a, b - a) : sum_u64(buf.get() + a, b - a);
            });
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            best = std::max(best, static_cast<double>(n * sizeof(uint64_t)) / s / 1e9);
        }
        return best;
    }, nb::arg("n_bytes"), nb::arg("n_threads"), nb::arg("reps") = 5);
}
