"""The Metal kernel manifest (metal/kernels.def) against plan.h, the weight types, the argument
structs and the kernels' signatures (metal/lint/check_manifest.py): consistent as checked in, and
each planted mismatch is reported."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_manifest", ROOT / "metal" / "lint" / "check_manifest.py")
check_manifest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_manifest)


def test_manifest_is_consistent():
    assert check_manifest.check(ROOT) == []


def test_manifest_covers_every_op_kind_and_weight_type():
    text = (ROOT / "metal" / "kernels.def").read_text()
    for op in ("Embed", "RmsNorm", "HeadRmsNorm", "MatMul", "Rope", "KvStore", "Attention", "SwiGLU", "GeGLU"):
        assert op in text
    for t in ("q4_0", "q8_0", "q4_k", "q6_k", "iq4_xs", "bf16", "f32"):
        for family in ("embed", "gemv", "gemm"):
            assert f"ER_KERNEL({family}_{t}," in text


@pytest.fixture
def copy_root(tmp_path) -> Path:
    shutil.copytree(ROOT / "metal", tmp_path / "metal")
    shutil.copytree(ROOT / "csrc" / "include", tmp_path / "csrc" / "include")
    (tmp_path / "csrc" / "core").mkdir()
    for f in ("plan.h", "tensor_type.cpp"):
        shutil.copy(ROOT / "csrc" / "core" / f, tmp_path / "csrc" / "core" / f)
    return tmp_path


def plant(root: Path, rel: str, old: str, new: str) -> None:
    path = root / rel
    text = path.read_text()
    assert old in text, f"{rel}: '{old}' not found (update the planted mismatch)"
    path.write_text(text.replace(old, new, 1))


# (file, text, replacement, a line the check must print)
PLANTED = {
    "a new op kind in the plan": (
        "csrc/core/plan.h", "    GeGLU,        // out = gelu_tanh(in) * UP\n", "    GeGLU,\n    Softcap,\n",
        "OpKind::Softcap (plan.h) has no Metal kernel in kernels.def"),
    "an op kind the plan does not have": (
        "metal/kernels.def", "ER_KERNEL(kv_store,           er_kv_store_args,   KvStore)",
        "ER_KERNEL(kv_store,           er_kv_store_args,   KvStore KvLoad)", "op kind KvLoad, which plan.h's OpKind does not have"),
    "a new weight type the CPU reads": (
        "csrc/core/tensor_type.cpp", '{TensorType::TQ2_0, "TQ2_0", 256, 66, false}', '{TensorType::TQ2_0, "TQ2_0", 256, 66, true}',
        "weight type TQ2_0 has no embed_tq2_0 kernel"),
    "arguments at the step block's index": (
        "metal/glu.metal", "kernel void swiglu(constant er_glu_args& a [[buffer(ER_BUFFER_ARGS)]],",
        "kernel void swiglu(constant er_glu_args& a [[buffer(ER_BUFFER_STEP)]],",
        "glu.metal: kernel swiglu: first parameter must be 'constant er_glu_args& a [[buffer(ER_BUFFER_ARGS)]]'"),
    "a kernel taking another kernel's struct": (
        "metal/gemv.metal", "kernel void gemv_q4_0(constant er_matmul_args& a", "kernel void gemv_q4_0(constant er_embed_args& a",
        "kernel gemv_q4_0: first parameter must be 'constant er_matmul_args& a"),
    "a kernel renamed in its file": (
        "metal/norm_rope.metal", "kernel void kv_store(", "kernel void kv_write(", "kernel kv_write is not in kernels.def"),
    "a kernel missing from its file": (
        "metal/norm_rope.metal", "kernel void kv_store(", "kernel void kv_write(", "kernels.def lists kv_store, but no metal/*.metal file defines it"),
    "an extra buffer binding": (
        "metal/glu.metal", "kernel void geglu(constant er_glu_args& a [[buffer(ER_BUFFER_ARGS)]],",
        "kernel void geglu(constant er_glu_args& a [[buffer(ER_BUFFER_ARGS)]], device float* extra [[buffer(2)]],",
        "kernel geglu: parameters must be (args, step, ER_THREAD_POSITION)"),
    "a struct the header does not define": (
        "metal/kernels.def", "ER_KERNEL(sample,             er_sample_args,     )", "ER_KERNEL(sample,             er_sampler_args,    )",
        "kernels.def: sample takes er_sampler_args, which kernel_args.h does not define"),
    "a struct without its size assert": (
        "csrc/include/edgerunner/kernel_args.h", "ER_ASSERT_SIZE(er_glu_args, 32);\n", "",
        "kernel_args.h: struct er_glu_args has no ER_ASSERT_SIZE"),
    "two function constants on one index": (
        "metal/common.h", "ER_FUNCTION_CONSTANT(bool, kNeox, ER_FC_NEOX);", "ER_FUNCTION_CONSTANT(bool, kNeox, ER_FC_GLU);",
        "common.h: function constants kGlu and kNeox share ER_FC_GLU"),
}


@pytest.mark.parametrize("mismatch", list(PLANTED))
def test_planted_mismatch_is_reported(copy_root, mismatch):
    rel, old, new, says = PLANTED[mismatch]
    assert check_manifest.check(copy_root) == []
    plant(copy_root, rel, old, new)
    problems = check_manifest.check(copy_root)
    assert any(says in p for p in problems), f"{mismatch}: expected '{says}' among {problems}"
