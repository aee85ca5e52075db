// The kernel table, from metal/kernels.def: each entry calls one kernel (compiled as C++ from
// its .metal file) for one thread. Compiled with the emulator's <metal_stdlib>.
#include <metal_stdlib>

#include "edgerunner/kernel_args.h"

#define ER_KERNEL(name, args, ops) void name(const args&, const er_step_block&, uint3, uint, uint, uint);
#include "kernels.def"
#undef ER_KERNEL

namespace er_emulator {
namespace {

struct Entry {
    const char* name;
    Invoke invoke;
};

#define ER_KERNEL(name, args, ops)                                                                              \
    {#name, [](const void* a, const void* s, uint32_t x, uint32_t y, uint32_t z, uint32_t tid) {                   \
         ::name(*static_cast<const args*>(a), *static_cast<const er_step_block*>(s), uint3{x, y, z}, tid, tid / 32, \
                tid % 32);                                                                                          \
     }},
const Entry kEntries[] = {
#include "kernels.def"
};
#undef ER_KERNEL

}  // namespace

Invoke find_kernel(const char* name) {
    for (const Entry& e : kEntries)
        if (std::strcmp(e.name, name) == 0) return e.invoke;
    return nullptr;
}

void set_bool_constant(int index, bool value) { constant_slot<bool>(index) = value; }
void set_uint_constant(int index, uint32_t value) { constant_slot<uint>(index) = value; }

}  // namespace er_emulator
