#!/bin/sh
# Type-checks .metal files on a machine without Apple's Metal compiler: clang compiles each file
# as C++ for OpenCL against the stand-in <metal_stdlib> next to this script.
#   metal/lint/check_metal.sh [file.metal ...]     (default: every metal/*.metal)
# Environment: CLANG (default: the newest clang-NN on PATH, else clang).
#
# Why these flags:
#   generic address space off: an unqualified pointer is private (MSL's `thread`), so a missing
#     or wrong `device` / `threadgroup` / `constant` is an error instead of compiling silently;
#   fp64 off (MSL has no double); pipes and device-side enqueue off (MSL has neither);
#   -cl-no-stdinc: OpenCL's built-in functions are invisible, only the shim's MSL ones exist;
#   -D__METAL_VERSION__: the shared headers (quant_blocks.h, kernel_args.h) take their Metal
#     branch, so their static_asserts check struct layouts as the kernels see them;
#   -Werror: warnings fail too; unknown attributes are the one exception ([[buffer(i)]] and
#     friends are MSL attributes clang does not know; the manifest check covers their indices).
# It is a lint, not a compiler: Apple's `xcrun metal` on a Mac is the final word (the macOS
# workflow builds the metallib with it).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

if [ -z "${CLANG:-}" ]; then
    CLANG=clang
    for v in 21 20 19 18 17 16 15 14; do
        if command -v "clang-$v" >/dev/null 2>&1; then CLANG="clang-$v"; break; fi
    done
fi
if ! command -v "$CLANG" >/dev/null 2>&1; then
    echo "check_metal.sh: $CLANG not found (install clang >= 14, or set CLANG)" >&2
    exit 2
fi
if ! echo 'kernel void k() {}' | "$CLANG" -x clcpp -cl-std=clc++2021 -target spir64 -fsyntax-only - >/dev/null 2>&1; then
    echo "check_metal.sh: $CLANG cannot compile C++ for OpenCL 2021 (-cl-std=clc++2021); clang >= 14 can" >&2
    exit 2
fi

if [ "$#" -eq 0 ]; then set -- "$root"/metal/*.metal; fi

status=0
for f in "$@"; do
    # Convention the CPU emulator of the kernels relies on (tests/metal_emulator): `threadgroup`
    # only declares arrays at kernel scope; pointers into them are `auto`.
    if grep -nE "^[^/]*\bthreadgroup\b[^;[]*\*" "$f" >/dev/null; then
        grep -nE "^[^/]*\bthreadgroup\b[^;[]*\*" "$f" | sed "s|^|$f:|;s|\$|  <- declare threadgroup arrays only; take pointers into them with auto|" >&2
        status=1
    fi
    if ! "$CLANG" -x clcpp -cl-std=clc++2021 -target spir64 \
        -Xclang -cl-ext=-__opencl_c_generic_address_space,-__opencl_c_pipes,-__opencl_c_device_enqueue,-cl_khr_fp64,-__opencl_c_fp64 \
        -cl-no-stdinc -I "$here" -I "$root/metal" -I "$root/csrc/include" \
        -D__METAL_VERSION__=300 -DER_METAL_LINT \
        -Wall -Wextra -Werror -Wno-unknown-attributes -Wno-unused-parameter -fsyntax-only "$f"; then
        status=1
    fi
done
exit $status
