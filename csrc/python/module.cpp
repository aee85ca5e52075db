// The nanobind module edgerunner._core: thin bindings, no logic.
#include <nanobind/nanobind.h>

namespace nb = nanobind;

void bind_gguf(nb::module_& m);
void bind_quants(nb::module_& m);
void bind_sampler(nb::module_& m);
void bind_engine(nb::module_& m);
void bind_kernels(nb::module_& m);
void bind_bandwidth(nb::module_& m);
void bind_cuda(nb::module_& m);
void bind_metal(nb::module_& m);

NB_MODULE(_core, m) {
    m.doc() = "edgerunner native core";
    bind_gguf(m);
    bind_quants(m);
    bind_sampler(m);
    bind_engine(m);
    bind_kernels(m);
    bind_bandwidth(m);
    bind_cuda(m);
    bind_metal(m);
}
