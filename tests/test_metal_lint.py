"""The Metal type-check lint (metal/lint/check_metal.sh): every .metal file passes, and planted
mistakes fail it. Needs clang >= 14 (C++ for OpenCL 2021); skipped without one."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = ROOT / "metal" / "lint" / "check_metal.sh"


def _lint_available() -> bool:
    if not shutil.which("sh"):
        return False
    r = subprocess.run(["sh", str(LINT), "/dev/null"], capture_output=True, text=True)
    return r.returncode != 2  # 2: no usable clang


pytestmark = pytest.mark.skipif(not _lint_available(), reason="no clang with C++ for OpenCL 2021 (clang >= 14)")


def lint(root: Path, *files: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(root / "metal" / "lint" / "check_metal.sh"), *[str(root / f) for f in files]],
                          capture_output=True, text=True)


def test_every_metal_file_type_checks():
    r = lint(ROOT, *[str(p.relative_to(ROOT)) for p in sorted((ROOT / "metal").glob("*.metal"))])
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture
def copy_root(tmp_path) -> Path:
    """The Metal sources and the shared headers, copied so that a mutation stays in tmp_path."""
    shutil.copytree(ROOT / "metal", tmp_path / "metal")
    shutil.copytree(ROOT / "csrc" / "include", tmp_path / "csrc" / "include")
    return tmp_path


def plant(root: Path, rel: str, old: str, new: str) -> None:
    path = root / rel
    text = path.read_text()
    assert text.count(old) >= 1, f"{rel}: '{old}' not found (update the planted mistake)"
    path.write_text(text.replace(old, new, 1))


# (file to mutate, text, replacement, file to lint, what the error must say)
PLANTED = {
    "device pointer into a thread pointer": (
        "metal/gemv.metal", "    device const float* x = a.x + t * a.x_stride;", "    const float* x = a.x + t * a.x_stride;",
        "metal/gemv.metal", "__global"),
    "missing device on a helper's parameter": (
        "metal/quants.h", "inline void dequant8(quant::Q8_0, device const uint8_t* row,",
        "inline void dequant8(quant::Q8_0, const uint8_t* row,", "metal/gemm.metal", "dequant8"),
    "threadgroup array passed as device memory": (
        "metal/norm_rope.metal", "    ss = threadgroup_sum(ss, partials,", "    ss = threadgroup_sum(ss, a.y,",
        "metal/norm_rope.metal", "partials"),
    "double precision": (
        "metal/glu.metal", "    const float u = a.u[t * a.u_stride + i];", "    const double u = a.u[t * a.u_stride + i];",
        "metal/glu.metal", "double"),
    "CUDA intrinsic": (
        "metal/attention.metal", "        s = simd_sum(s) * a.scale;", "        s = __shfl_xor_sync(0xFFFFFFFFu, s, 16) * a.scale;",
        "metal/attention.metal", "__shfl_xor_sync"),
    "function MSL does not have": (
        "metal/sample.metal", "    c = simd_sum(c);", "    c = simd_add(c);", "metal/sample.metal", "simd_add"),
    "OpenCL built-in": (
        "metal/common.h", "inline float silu(float g) { return g / (1.0f + exp(-g)); }",
        "inline float silu(float g) { return g / (1.0f + native_exp(-g)); }", "metal/glu.metal", "native_exp"),
    "threadgroup variable outside kernel scope": (
        "metal/matmul.h", "inline float dot8(thread const float* w, thread const float* x) {\n    float s = 0.0f;",
        "inline float dot8(thread const float* w, thread const float* x) {\n    threadgroup float tile[8];\n    float s = tile[0];",
        "metal/gemv.metal", "tile"),
    "shared struct layout changed": (
        "csrc/include/edgerunner/kernel_args.h", "    uint32_t n_head;\n    uint32_t n_head_kv;\n    uint32_t head_dim;\n    uint32_t rope_dim;",
        "    uint32_t n_head_kv;\n    uint16_t n_head;\n    uint32_t head_dim;\n    uint32_t rope_dim;",
        "metal/norm_rope.metal", "er_rope_args"),
    "threadgroup pointer (emulator convention)": (
        "metal/norm_rope.metal", "    const uint r = first_row(step, a.tail) * a.rows_per_token + tgid.x;",
        "    threadgroup float* p = partials;\n    const uint r = first_row(step, a.tail) * a.rows_per_token + tgid.x + uint(p[0]);",
        "metal/norm_rope.metal", "declare threadgroup arrays only"),
}


@pytest.mark.parametrize("mistake", list(PLANTED))
def test_planted_mistake_fails_the_lint(copy_root, mistake):
    rel, old, new, target, says = PLANTED[mistake]
    assert lint(copy_root, target).returncode == 0  # the unmutated copy passes
    plant(copy_root, rel, old, new)
    r = lint(copy_root, target)
    assert r.returncode == 1, f"{mistake}: the lint passed\n{r.stdout}{r.stderr}"
    assert says in r.stdout + r.stderr, f"{mistake}: expected '{says}' in\n{r.stdout}{r.stderr}"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel emulator is built on Linux")
def test_runtime_compile_source_type_checks(cpp_build, tmp_path):
    """The development fallback compiles one source: every .metal file with its includes expanded
    (metal::library_source). It must stand alone: no include left, no name defined twice."""
    out = tmp_path / "metal" / "all.metal"
    out.parent.mkdir()
    shutil.copytree(ROOT / "metal" / "lint", tmp_path / "metal" / "lint")
    r = subprocess.run([str(cpp_build / "tests" / "cpp" / "metal_emulator"), "source", str(ROOT), str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    manifest = [line for line in (ROOT / "metal" / "kernels.def").read_text().splitlines() if line.startswith("ER_KERNEL(")]
    assert '#include "' not in text and text.count("kernel void ") == len(manifest)
    r = lint(tmp_path, "metal/all.metal")  # no csrc/include or metal/*.h beside it: it must not need them
    assert r.returncode == 0, r.stdout + r.stderr


def host_check(root: Path, *files: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(root / "metal" / "lint" / "check_host.sh"), *[str(root / f) for f in files]],
                          capture_output=True, text=True)


HOST_CHECK = pytest.mark.skipif(not sys.platform.startswith("linux") or not shutil.which("clang++"),
                                reason="needs clang++ on Linux (on a Mac the real SDK compiles the host)")


@HOST_CHECK
def test_objective_c_host_parses():
    """metal/*.mm against declarations transcribed from the SDK (metal/lint/objc): C++ and
    Objective-C (ARC) errors of the host, not whether the SDK has those exact signatures."""
    r = host_check(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


HOST_PLANTED = {
    "ARC: a reference to an object pointer without ownership": (
        "metal/device.mm", "__strong id<MTLBuffer>& b = windows[start];", "id<MTLBuffer>& b = windows[start];",
        "no explicit ownership"),
    "a program field that does not exist": (
        "metal/runner.mm", "slot * program_.step_block_bytes atIndex:ER_BUFFER_STEP];\n                    [cmd concurrent",
        "slot * program_.step_bytes atIndex:ER_BUFFER_STEP];\n                    [cmd concurrent", "step_bytes"),
    "a buffer where a resource list is typed": (
        "metal/runner.mm", "for (id<MTLResource> r : read_write_) [set addAllocation:r];",
        "for (id<MTLBuffer> r : read_write_) [set addAllocation:r];", "incompatible pointer types"),
}


@HOST_CHECK
@pytest.mark.parametrize("mistake", list(HOST_PLANTED))
def test_planted_host_mistake_fails(copy_root, mistake):
    for rel in ("csrc/core",):
        shutil.copytree(ROOT / rel, copy_root / rel)
    rel, old, new, says = HOST_PLANTED[mistake]
    plant(copy_root, rel, old, new)
    r = host_check(copy_root, rel)
    assert r.returncode == 1 and says in r.stdout + r.stderr, f"{mistake}:\n{r.stdout}{r.stderr}"
