// The CPU emulator of the Metal kernels (tests/metal_emulator): the pieces the kernels' stand-in
// <metal_stdlib>, the scheduler (tests/lanes), the kernel table (registry.cpp) and the step runner
// (runner.cpp) share. Plain C++: no Metal and no MSL macros here.
#pragma once

#include <cstdint>

#include "lanes.h"

namespace er_emulator {

// A kernel of metal/kernels.def (an Invoke whose second pointer is the step block).
Invoke find_kernel(const char* name);  // null when the manifest has no such kernel
void set_bool_constant(int index, bool value);
void set_uint_constant(int index, uint32_t value);

}  // namespace er_emulator
