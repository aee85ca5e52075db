"""The Metal backend's kernels and programs run on the CPU (no Apple hardware here), against the
same independent references as the CPU and CUDA backends.

tests/metal_emulator compiles every metal/*.metal file as C++ against a stand-in <metal_stdlib>
whose barriers and SIMD-group functions really synchronize the threads of a threadgroup (each
thread a coroutine), and runs the Metal host's own program builder (metal/program.cpp: fusions,
argument tables, grids, the KV layout, the step block) on them. What this proves: the kernels'
arithmetic, indexing and block layouts, the reductions' collective logic, and the host's fusion
decisions and tables. What it cannot: Metal's compiler, memory model, scheduling (the emulator
runs the threads of a threadgroup in turn, so a missing barrier can go unnoticed), the
Objective-C++ host and anything about speed. The macOS workflow runs the real thing.

Tolerances: the Metal kernels multiply float activations (no int8 quantization) and keep an
f16 KV cache by default (relative rounding 2^-11 per cached value), so two layers land within
2e-3 · max(1, max|logit|) of the float64 reference; with an f32 cache within 1e-4 · max(1,
max|logit|), as the CPU's precise mode.
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgerunner import _core, quants
from edgerunner.model_builder import write_random_model
from reference_forward import ReferenceModel
from test_engine import CASES, IDS, prompt
from test_kernels import TYPES, random_row

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel emulator is built on Linux")

K_TYPES = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "Q8_K"}


@pytest.fixture(scope="session")
def emulator(cpp_build) -> Path:
    return cpp_build / "tests" / "cpp" / "metal_emulator"


def run(emulator: Path, *args) -> str:
    r = subprocess.run([str(emulator), *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def logits(emulator, path, ids, **opts) -> np.ndarray:
    out = Path(path).with_suffix(".logits")
    flags = [x for k, v in opts.items() for x in (f"--{k.replace('_', '-')}", v)]
    run(emulator, "logits", path, out, "--tokens", ",".join(map(str, ids)), *flags)
    return np.fromfile(out, np.float32).reshape(-1, _core.Model.load(str(path), backend="cpu", n_threads=1).config["n_vocab"])


@pytest.mark.parametrize("name", TYPES + ["BF16", "Q8_K"])
@pytest.mark.parametrize("kernel", ["gemv", "gemm"])
def test_matmul_kernels_equal_float64(emulator, tmp_path, name, kernel):
    """GEMV and GEMM (simdgroup matrices) over raw blocks of every weight type, odd row and token
    counts (partial tiles), against float64 on the dequantized weights: float32 products summed
    in float32, so within n · 2^-24 · Σ|w x| per output."""
    seed = random.randrange(2**32)
    rng = np.random.default_rng(seed)
    for n_rows, blocks, n_tokens in ((1, 1, 1), (37, 3, 3), (130, 2, 37 if kernel == "gemm" else 2)):
        n = blocks * (256 if name in K_TYPES else 32)
        if name == "BF16":
            w = rng.normal(0, 0.05, (n_rows, n)).astype(np.float32)
            rows = (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n_rows, -1)
        elif name == "Q8_K":
            rows = np.stack([quants.quantize_q8_k(rng.normal(0, 1, n).astype(np.float32)).reshape(-1)
                             for _ in range(n_rows)])
        else:
            rows = np.stack([random_row(name, n, rng) for _ in range(n_rows)])
        x = (rng.normal(0, 1, (n_tokens, n)) * rng.choice([0.1, 1, 10], n)).astype(np.float32)
        rows.tofile(tmp_path / "w.bin")
        x.tofile(tmp_path / "x.bin")
        run(emulator, "matmul", name, n_rows, n, n_tokens, kernel, tmp_path / "w.bin", tmp_path / "x.bin", tmp_path / "y.bin")
        y = np.fromfile(tmp_path / "y.bin", np.float32).reshape(n_tokens, n_rows)
        w = quants.dequantize(rows.reshape(-1), name).astype(np.float64).reshape(n_rows, n)
        ref = x.astype(np.float64) @ w.T
        bound = n * 2.0**-24 * (np.abs(x.astype(np.float64)) @ np.abs(w).T) + 1e-30
        assert np.all(np.abs(y - ref) <= bound), f"{name} {kernel} rows={n_rows} n={n} tokens={n_tokens} seed {seed}"


# test_engine's cases: every weight type, GQA 4:2 / 4:1 / 4:4, tied and untied heads, qwen2
# biases, qwen3 Q/K norms, RoPE scalings (linear, llama3, phi3's LongRoPE), sliding windows over a
# ring cache.
EMULATED = IDS


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    seed = random.randrange(2**31)
    out = {}
    for i, (arch, ttype, over) in enumerate(CASES):
        if IDS[i] not in EMULATED:
            continue
        path = d / f"m{i}.gguf"
        write_random_model(path, arch=arch, preset="tiny", tensor_type=ttype, seed=seed + i, **over)
        out[IDS[i]] = (path, seed + i)
    return out


@pytest.mark.parametrize("case", EMULATED)
def test_models_match_float64_reference(emulator, tiny_models, case):
    path, seed = tiny_models[case]
    ids = prompt(np.random.default_rng(seed), 40)
    want = ReferenceModel(path).logits(ids)
    got = logits(emulator, path, ids, chunk=16)
    err, scale = np.abs(got - want).max(), np.abs(want).max()
    assert err <= 2e-3 * max(1.0, scale), f"{case} seed {seed}: max |Δ| {err:.3g} (|logit| max {scale:.3g})"


@pytest.mark.parametrize("ttype", ["F32", "Q4_K_M"])
def test_gemma3_matches_cpu_precise(emulator, tmp_path, ttype):
    """Gemma 3's ops (scaled embeddings, Q/K norms, local and global layers with two RoPE bases
    and per-layer KV capacities, post-norms into the residual, GeGLU) against the CPU backend's
    precise mode, itself checked against transformers in test_hf_oracle."""
    path = tmp_path / "g.gguf"
    seed = random.randrange(2**31)
    write_random_model(path, arch="gemma3", preset="tiny", tensor_type=ttype, seed=seed,
                       **(dict(dim=256, ffn_dim=512) if ttype != "F32" else {}))
    ids = prompt(np.random.default_rng(seed), 40)
    want = _core.Session(_core.Model.load(str(path), backend="cpu", precise=True, prefill_chunk=16, n_threads=2)).eval_all(ids)
    got = logits(emulator, path, ids, chunk=16)
    err, scale = np.abs(got - want).max(), np.abs(want).max()
    assert err <= 2e-3 * max(1.0, scale), f"gemma3 {ttype} seed {seed}: max |Δ| {err:.3g} (|logit| max {scale:.3g})"


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "gemma3"])
def test_unfused_kernels(emulator, tmp_path, arch):
    """Every plan op on its own kernel (the fallbacks when an op sequence does not match a
    fusion: standalone RMSNorm and head RMSNorm, RoPE without the KV store, kv_store, SwiGLU /
    GeGLU, single-matrix matmuls) gives the fused program's logits within float32 rounding
    (measured up to 9e-5 for six Gemma 3 layers; asserted 5e-4 · max(1, max|logit|))."""
    path = tmp_path / "m.gguf"
    write_random_model(path, arch=arch, preset="tiny", tensor_type="Q8_0", seed=7)
    ids = prompt(np.random.default_rng(7), 20)
    fused = logits(emulator, path, ids, chunk=8)
    unfused = logits(emulator, path, ids, chunk=8, fuse=0)
    decode = logits(emulator, path, ids, chunk=8, fuse=0, decode_from=15)
    scale = max(1.0, np.abs(fused).max())
    assert np.abs(unfused - fused).max() <= 5e-4 * scale
    assert np.abs(decode - fused[14:]).max() <= 5e-4 * scale


@pytest.fixture(scope="module")
def k_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("k") / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q4_K_M", seed=5, n_heads=2, n_kv_heads=1,
                       dim=256, ffn_dim=512)
    return path


@pytest.mark.parametrize("kv,bound", [("f32", 1e-4), ("f16", 2e-3), ("q8_0", 3e-2)])
def test_kv_cache_types(emulator, k_model, kv, bound):
    """f32, f16 and q8_0 caches (q8_0: the CPU's quantization, d = max|x|/127 per 32 values:
    the CPU fast path's 3% bound)."""
    ids = prompt(np.random.default_rng(0), 30)
    want = ReferenceModel(k_model).logits(ids)
    got = logits(emulator, k_model, ids, chunk=8, kv=kv)
    err, scale = np.abs(got - want).max(), np.abs(want).max()
    assert err <= bound * max(1.0, scale), f"kv {kv}: max |Δ| {err:.3g} (|logit| max {scale:.3g})"


def test_decode_steps_agree_with_one_prefill(emulator, k_model):
    """Decode steps (GEMV, decode attention) after a prefill (GEMM, tiled attention) give the
    logits of one full prefill within float32 rounding: different kernels, same arithmetic up to
    summation order."""
    ids = prompt(np.random.default_rng(0), 30)
    full = logits(emulator, k_model, ids, chunk=8)
    steps = logits(emulator, k_model, ids, chunk=8, decode_from=20)
    assert steps.shape == (11, full.shape[1])
    assert np.abs(steps - full[19:]).max() <= 1e-4 * max(1.0, np.abs(full).max())


@pytest.mark.slow
def test_real_smollm2_decode_steps_match_cpu_precise(emulator):
    """The built-in SmolLM2-135M (Q4_1, 30 layers, tied embeddings, 49152 tokens), one decode
    step per token through the Metal kernels, against the CPU backend's precise mode:
    max |Δ| measured 0.015 at |logit| 27 (5.5e-4 relative); asserted within 3e-3 relative."""
    from edgerunner import Model, builtin_models

    path = builtin_models.fetch("smollm2-135m-instruct")
    cpu = Model.load(path, backend="cpu", precise=True, threads=2)
    ids = cpu.tokenize("The capital of France is")
    want = cpu.logits(ids, all_positions=True)
    got = logits(emulator, path, ids, chunk=256, n_ctx=512, decode_from=1)
    err, scale = np.abs(got - want).max(), np.abs(want).max()
    assert err <= 3e-3 * scale, f"max |Δ| {err:.3g} (|logit| max {scale:.3g})"


SAMPLING = [dict(temperature=0.0), dict(temperature=0.8), dict(temperature=1.0, top_k=20),
            dict(temperature=0.7, top_p=0.9), dict(temperature=1.2, min_p=0.05),
            dict(temperature=0.9, top_k=40, top_p=0.95, min_p=0.02)]


@pytest.mark.parametrize("params", SAMPLING, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_device_sampling_follows_the_cpu_sampler(emulator, tmp_path, params):
    """Decode steps that end with the device sampler (4 bytes back): each drawn token is the CPU
    sampler's on that step's logits, with the same step counter."""
    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q4_0", seed=11)
    ids = prompt(np.random.default_rng(4), 7)
    flags = [x for k, v in params.items() for x in (f"--{k.replace('_', '-')}", v)]
    run(emulator, "generate", path, tmp_path / "t.bin", tmp_path / "l.bin", "--tokens", ",".join(map(str, ids)),
        "--steps", 12, "--seed", 1234, *flags)
    tokens = np.fromfile(tmp_path / "t.bin", np.int32)
    step_logits = np.fromfile(tmp_path / "l.bin", np.float32).reshape(12, -1)
    sampler = _core.Sampler(step_logits.shape[1], seed=1234, **params)
    history = list(ids) + [int(tokens[0])]
    for i in range(12):
        want = sampler.sample(step_logits[i], np.asarray(history, np.int32), len(history))
        assert tokens[i + 1] == want, f"{params}: step {i}: device drew {tokens[i + 1]}, CPU sampler {want}"
        history.append(want)


@pytest.mark.parametrize("params", SAMPLING[1:], ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_sampler_kernel_on_hard_logits(emulator, tmp_path, params):
    """The sampler kernel alone on logits built to make the cuts hard: repeated values (ties go
    to the lower id), -inf (banned), a wide range, 2000 and 70000 tokens."""
    rng = np.random.default_rng(random.randrange(2**32))
    for n in (2000, 70000):
        l = rng.normal(0, 4, n).astype(np.float32)
        l[rng.integers(0, n, n // 10)] = np.float32(1.5)
        l[rng.integers(0, n, n // 20)] = -np.inf
        l.tofile(tmp_path / "l.bin")
        for seed, step in ((3, 0), (77, 41)):
            flags = [x for k, v in params.items() for x in (f"--{k.replace('_', '-')}", v)]
            got = int(run(emulator, "sample", tmp_path / "l.bin", "--seed", seed, "--step", step, *flags))
            want = _core.Sampler(n, seed=seed, **params).sample(l, [], step)
            assert got == want, f"{params} n={n} seed={seed} step={step}: kernel {got}, CPU sampler {want}"


def test_sampler_kernel_reports_no_finite_logit(emulator, tmp_path):
    np.full(100, -np.inf, np.float32).tofile(tmp_path / "l.bin")
    assert int(run(emulator, "sample", tmp_path / "l.bin", "--temperature", 0.8)) == -1
