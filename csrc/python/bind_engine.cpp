// Python view of Model and Session: thin, the GIL released while the engine works.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "edgerunner/engine.h"

namespace nb = nanobind;
using namespace edgerunner;

namespace {

using Tokens = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

nb::dict config_dict(const ModelConfig& c) {
    nb::dict d;
    d["arch"] = c.arch;
    d["n_vocab"] = c.n_vocab;
    d["n_embd"] = c.n_embd;
    d["n_layer"] = c.n_layer;
    d["n_head"] = c.n_head;
    d["n_head_kv"] = c.n_head_kv;
    d["head_dim"] = c.head_dim;
    d["n_ff"] = c.n_ff;
    d["n_ctx_train"] = c.n_ctx_train;
    d["norm_eps"] = c.norm_eps;
    d["rope_style"] = c.rope_style == RopeStyle::Adjacent ? "adjacent" : "neox";
    d["rope_base"] = c.rope_base;
    d["rope_linear_scale"] = c.rope_linear_scale;
    d["rope_freq_factors"] = c.rope_freq_factors;
    d["qkv_bias"] = c.qkv_bias;
    d["qk_norm"] = c.qk_norm;
    d["tied_output"] = c.tied_output;
    d["sliding_window"] = c.sliding_window;
    return d;
}

uint64_t mapped_bytes(const GGUFFile& f) {
    uint64_t n = 0;
    for (const auto& s : f.shards()) n += s.size;
    return n;
}

// Pages in [begin, end) of the model's files laid end to end (shard after shard): readahead is
// asked for, then one byte of every page is read, so the weights are resident and mapped before
// the first token instead of faulting in during it.
void touch_mapped(const GGUFFile& f, uint64_t begin, uint64_t end) {
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    uint64_t start = 0;
    for (const auto& s : f.shards()) {
        const uint64_t lo = std::max(begin, start), hi = std::min(end, start + s.size);
        if (lo < hi) {
            const uint8_t* p = s.base + (lo - start);
            const uint64_t n = hi - lo;
            const uintptr_t aligned = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
            madvise(reinterpret_cast<void*>(aligned), reinterpret_cast<uintptr_t>(p) + n - aligned, MADV_WILLNEED);
            // Volatile reads: the compiler must perform every one.
            for (uint64_t o = 0; o < n; o += page) (void)*static_cast<const volatile uint8_t*>(p + o);
            (void)*static_cast<const volatile uint8_t*>(p + n - 1);
        }
        start += s.size;
    }
}

LoadOptions load_options(int64_t n_ctx, const std::string& kv_type, bool precise, int n_threads, int64_t prefill_chunk,
                         const std::string& backend, const std::string& dispatch) {
    return LoadOptions{n_ctx, kv_type, precise, n_threads, prefill_chunk, backend, dispatch};  // (its fields' order)
}

}  // namespace

void bind_engine(nb::module_& m) {
    nb::register_exception_translator([](const std::exception_ptr& p, void*) {
        try {
            std::rethrow_exception(p);
        } catch (const std::length_error& e) {
            nb::object cls = nb::module_::import_("edgerunner.errors").attr("ContextLengthError");
            PyErr_SetString(cls.ptr(), e.what());
        } catch (const OutOfMemory& e) {
            nb::object cls = nb::module_::import_("edgerunner.errors").attr("OutOfMemoryError");
            PyErr_SetString(cls.ptr(), e.what());
        }
    });

    nb::class_<Model>(m, "Model")
        .def_static("load", [](const std::string& path, int64_t n_ctx, const std::string& kv_type, bool precise,
                               int n_threads, int64_t prefill_chunk, const std::string& backend, const std::string& dispatch) {
            const LoadOptions o = load_options(n_ctx, kv_type, precise, n_threads, prefill_chunk, backend, dispatch);
            nb::gil_scoped_release release;
            return Model::load(path, o);
        }, nb::arg("path"), nb::arg("n_ctx") = 0, nb::arg("kv_type") = "f16", nb::arg("precise") = false,
           nb::arg("n_threads") = 0, nb::arg("prefill_chunk") = 256, nb::arg("backend") = "auto", nb::arg("dispatch") = "auto")
        .def_static("check_options", [](int64_t n_ctx, const std::string& kv_type, bool precise, int n_threads, int64_t prefill_chunk,
                                        const std::string& backend, const std::string& dispatch) {
            Model::check_options(load_options(n_ctx, kv_type, precise, n_threads, prefill_chunk, backend, dispatch));
        }, nb::arg("n_ctx") = 0, nb::arg("kv_type") = "f16", nb::arg("precise") = false, nb::arg("n_threads") = 0,
           nb::arg("prefill_chunk") = 256, nb::arg("backend") = "auto", nb::arg("dispatch") = "auto",
           "Raises ValueError for options no model loads with (load's checks before it reads the file).")
        .def_prop_ro("backend", &Model::backend)
        .def_prop_ro("device", &Model::device, "'cpu', 'cuda:N' (N: the CUDA device index) or 'metal'.")
        .def_prop_ro("config", [](const Model& mo) { return config_dict(mo.config()); })
        .def_prop_ro("n_ctx", &Model::n_ctx)
        .def_prop_ro("kv_type", [](const Model& mo) { return mo.options().precise ? std::string("f32") : mo.options().kv_type; })
        .def_prop_ro("precise", [](const Model& mo) { return mo.options().precise; })
        .def_prop_ro("mapped_bytes", [](const Model& mo) { return mapped_bytes(mo.file()); },
                     "Bytes of the mapped model files (all shards of a split model).")
        .def("touch_weights", [](const Model& mo, uint64_t begin, uint64_t end) {
            nb::gil_scoped_release release;
            touch_mapped(mo.file(), begin, end);
        }, nb::arg("begin"), nb::arg("end"),
           "Page in bytes [begin, end) of the mapped files (shards end to end): load-time prewarm, in chunks.");

    nb::class_<Session>(m, "Session")
        .def(nb::init<std::shared_ptr<Model>>(), nb::arg("model"))
        .def("eval", [](Session& s, Tokens t) {
            nb::gil_scoped_release release;
            return std::string(eval_mode_name(s.eval(t.data(), t.shape(0))));
        }, nb::arg("tokens"), "Bring the cache to `tokens`; returns the mode used (cached/decode/extend/reset).")
        .def("eval_all", [](Session& s, Tokens t) {
            const size_t n = t.shape(0);
            nb::module_ np = nb::module_::import_("numpy");
            nb::object arr = np.attr("empty")(nb::make_tuple(n, s.logits_size()), "float32");
            auto view = nb::cast<nb::ndarray<float, nb::ndim<2>, nb::c_contig>>(arr);
            {
                nb::gil_scoped_release release;
                s.eval_all(t.data(), n, view.data());
            }
            return arr;
        }, nb::arg("tokens"), "Logits of every position of `tokens` (n × n_vocab), from a fresh cache.")
        .def("append", [](Session& s, int32_t token) {
            nb::gil_scoped_release release;
            s.append(token);
        }, nb::arg("token"))
        .def("append_sampled", [](Session& s, int32_t token, Sampler& sampler, int64_t ahead) {
            nb::gil_scoped_release release;
            return s.append_sampled(token, sampler, ahead);
        }, nb::arg("token"), nb::arg("sampler"), nb::arg("ahead") = 0,
           "append(token), then the next token from the sampler (drawn on the GPU where the backend can). "
           "ahead: how many more such calls may follow, each appending the previous draw (steps may then "
           "run ahead on the GPU; the session drops the untaken ones at its next call).")
        .def("rewind", &Session::rewind, nb::arg("n"))
        .def("logits", [](const Session& s) {
            const float* p = s.logits();
            size_t shape[1] = {s.logits_size()};
            float* copy = new float[shape[0]];
            std::copy(p, p + shape[0], copy);
            nb::capsule owner(copy, [](void* q) noexcept { delete[] static_cast<float*>(q); });
            return nb::ndarray<nb::numpy, float, nb::ndim<1>>(copy, 1, shape, owner);
        }, "A copy of the next-token logits.")
        .def_prop_ro("tokens", [](const Session& s) { return s.tokens(); })
        .def_prop_ro("n_ctx", &Session::n_ctx)
        .def("sample", [](const Session& s, Sampler& sampler) { return s.sample(sampler); }, nb::arg("sampler"))
        .def("generate", [](Session& s, Sampler& sampler, int64_t max_tokens, const std::vector<int32_t>& stop_ids) {
            nb::gil_scoped_release release;
            return s.generate(sampler, max_tokens, stop_ids);
        }, nb::arg("sampler"), nb::arg("max_tokens"), nb::arg("stop_ids") = std::vector<int32_t>{},
           "The native loop: sample, append, until max_tokens or a stop id; returns the new tokens.");
}
