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

Exactness: the device sampler's tokens equal the CPU sampler's (its masses are double-floats of
float32 weights: a draw could differ only where u · S falls within float32 rounding of a token's
edge, never in these draws); penalize's float32 arithmetic is the contract's, operation for
operation, so its logits equal NumPy's float32 transform bit for bit.
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
from test_sampler import ref_transform_f32
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


def test_sampler_kernel_draws_only_infinite_logits_where_there_are_some(emulator, tmp_path):
    """+inf logits (an overflow, or a logit bias of +inf that forces a token) each weigh 1 and every
    other token 0 (a logit equal to the max weighs 1, not exp(inf - inf) = NaN), as on the CPU."""
    n = 5000
    l = np.random.default_rng(4).normal(0, 4, n).astype(np.float32)
    forced = [5, 2500, 4999]
    l[forced] = np.inf
    l.tofile(tmp_path / "l.bin")
    for params in SAMPLING[1:]:
        flags = [x for k, v in params.items() for x in (f"--{k.replace('_', '-')}", v)]
        for seed in (1, 2):
            want = _core.Sampler(n, seed=seed, **params).sample(l, [], seed)
            got = int(run(emulator, "sample", tmp_path / "l.bin", "--seed", seed, "--step", seed, *flags))
            assert want in forced and got == want, f"{params} seed={seed}: kernel {got}, CPU sampler {want}"


def test_sampler_kernel_reports_no_finite_logit(emulator, tmp_path):
    np.full(100, -np.inf, np.float32).tofile(tmp_path / "l.bin")
    assert int(run(emulator, "sample", tmp_path / "l.bin", "--temperature", 0.8)) == -1


# ---- logit bias and penalties: penalize before the sampler ------------------------------------

def flags_of(params) -> list:
    out = []
    for k, v in params.items():
        if k == "logit_bias":
            out += ["--bias", ",".join(f"{t}:{b!r}" for t, b in v.items())] if v else []
        else:
            out += [f"--{k.replace('_', '-')}", v]
    return out


def metal_penalized(params) -> bool:
    """metal::penalized: whether a step with these params runs penalize (bias, or penalties on)."""
    on = params.get("penalty_last_n", 64) != 0 and (params.get("repetition_penalty", 1.0) != 1.0 or
                                                     params.get("presence_penalty", 0.0) != 0.0 or
                                                     params.get("frequency_penalty", 0.0) != 0.0)
    return on or bool(params.get("logit_bias"))


# Penalties alone (greedy: they decide the token) with windows shorter than the history (7),
# longer (200 > 150 tokens), all of it (-1) and none (0: nothing to do, the plain sampler runs);
# bias alone (bans, boosts, on the threadgroups' slice edges) with a window of 0; both, with
# temperature, top-k, top-p and min-p after them.
PENALTIES = [dict(repetition_penalty=1.5), dict(repetition_penalty=0.7, presence_penalty=0.5, frequency_penalty=0.3, penalty_last_n=7),
             dict(frequency_penalty=0.25, presence_penalty=-0.5, penalty_last_n=-1), dict(repetition_penalty=1.3, penalty_last_n=200),
             dict(repetition_penalty=2.0, frequency_penalty=1.0, penalty_last_n=0),
             dict(logit_bias=True, repetition_penalty=1.5, penalty_last_n=0),
             dict(temperature=0.9, top_k=40, repetition_penalty=1.3, presence_penalty=0.4, logit_bias=True),
             dict(temperature=1.1, frequency_penalty=0.6, penalty_last_n=200, min_p=0.02, logit_bias=True),
             dict(temperature=0.8, top_p=0.9, repetition_penalty=1.2, frequency_penalty=0.1, penalty_last_n=-1, logit_bias=True)]


@pytest.mark.parametrize("params", PENALTIES, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_penalize_kernel_is_the_contracts_float32(emulator, tmp_path, params):
    """penalize's output equals NumPy's float32 transform bit for bit (every other token
    untouched), and the token the sampler then draws from it is the CPU sampler's with the same
    history and step: 2000 tokens (one threadgroup) and 40000 (three slices of 16384); random
    logits with ties (a tenth of them one value) and -inf; histories of 150 tokens that repeat
    (counts up to ~30), the step's own token in the window; bias entries banning (-inf) the best
    token and the step's own, boosting a tied one, on the slices' edges; an empty history."""
    seed = random.randrange(2**32)
    rng = np.random.default_rng(seed)
    runs_penalize = metal_penalized(params)
    for n in (2000, 40000):
        for trial in range(3):
            l = rng.normal(0, 3, n).astype(np.float32)
            l[rng.integers(0, n, n // 10)] = np.float32(1.5)
            l[rng.integers(0, n, n // 50)] = -np.inf
            pool = rng.integers(0, n, 12)  # tokens that recur, the best logits among them
            pool[:3] = np.argsort(l, kind="stable")[-3:]
            history = np.where(rng.random(150) < 0.6, rng.choice(pool, 150), rng.integers(0, n, 150)).astype(np.int32)
            if trial == 2:
                history = history[:0]
            p = dict(params)
            if p.get("logit_bias"):
                edges = [t for t in (16383, 16384, 32767, 32768, n - 1) if t < n]
                tied = int(np.nonzero(l == np.float32(1.5))[0][-1])
                p["logit_bias"] = {int(np.argmax(l)): -np.inf, int(pool[4]): 2.5, tied: 0.75,
                                   **{t: float(rng.normal(0, 3)) for t in edges}}
                if len(history):
                    p["logit_bias"][int(history[-1])] = -np.inf
            step = int(rng.integers(0, 1000))
            h = tmp_path / "h.bin"
            history.tofile(h)
            l.tofile(tmp_path / "l.bin")
            out = tmp_path / "p.bin"
            args = ["sample", tmp_path / "l.bin", "--history", h, "--step", step, "--seed", trial, *flags_of(p)]
            got = int(run(emulator, *args, *(["--penalized", out] if runs_penalize else [])))
            want = _core.Sampler(n, seed=trial, **p).sample(l, history, step)
            assert got == want, f"{p} n={n} trial {trial} (seed {seed}): device {got}, CPU sampler {want}"
            if runs_penalize:
                want_l = ref_transform_f32(l, history, **p)
                got_l = np.fromfile(out, np.float32)
                differ = np.nonzero(got_l.view(np.uint32) != want_l.view(np.uint32))[0]
                assert differ.size == 0, f"{p} n={n} trial {trial} (seed {seed}): tokens {differ[:8]} differ"


def test_bias_entries_of_one_token_add_up_first(emulator, tmp_path):
    """A token's several bias entries are summed in their order, then added once (merged_bias),
    on the device as on the CPU: 1 + 2^-24 + 2^-24 in float32 is 1 when added in turn, 1 + 2^-23
    when summed first. (Python's dict holds one entry a token; the emulator's --bias takes
    repeats, as the C++ API's vector does.)"""
    l = np.zeros(100, np.float32)
    l[7] = 1.0
    l[8] = np.float32(1.0 + 2.0**-23)  # what 7 reaches only when its entries are summed first
    l.tofile(tmp_path / "l.bin")
    out = tmp_path / "p.bin"
    got = int(run(emulator, "sample", tmp_path / "l.bin", "--bias", "7:5.9604645e-08,7:5.9604645e-08", "--penalized", out))
    assert np.fromfile(out, np.float32)[7] == np.float32(1.0 + 2.0**-23)
    assert got == 7  # (tied with 8: the lower id)


def test_bias_banning_every_token_reports_no_finite_logit(emulator, tmp_path):
    l = np.zeros(50, np.float32)
    l.tofile(tmp_path / "l.bin")
    bias = ",".join(f"{t}:-inf" for t in range(50))
    for temperature in (0.0, 0.8):
        assert int(run(emulator, "sample", tmp_path / "l.bin", "--bias", bias, "--temperature", temperature)) == -1


def test_bias_table_refuses_a_token_outside_the_vocabulary(emulator, tmp_path):
    """write_bias_table checks what it writes into device memory (a Sampler has checked it before
    the engine's runners see it; the table must not be the only guard, nor a silent one)."""
    np.zeros(50, np.float32).tofile(tmp_path / "l.bin")
    r = subprocess.run([str(emulator), "sample", str(tmp_path / "l.bin"), "--bias", "3:1.0,50:2.0"], capture_output=True, text=True)
    assert r.returncode == 1 and "logit_bias token id 50 is outside the vocabulary [0, 50)" in r.stderr, r.stderr


# Whole-model generations: penalties alone (greedy), windows of 3, of all the history, of none (bias
# only), longer than the history (500), bias bans and boosts, with sampling after them.
GENERATION = [dict(repetition_penalty=1.5, seed=1),
              dict(temperature=0.9, repetition_penalty=1.4, frequency_penalty=0.3, penalty_last_n=3, seed=5),
              dict(presence_penalty=2.0, penalty_last_n=-1, logit_bias={3: 0.5, 100: -np.inf}, seed=6),
              dict(temperature=1.0, top_k=40, frequency_penalty=0.5, penalty_last_n=500, logit_bias={7: -np.inf, 319: 3.0}, seed=2),
              dict(temperature=0.8, top_p=0.9, min_p=0.02, repetition_penalty=1.2, penalty_last_n=0, logit_bias={11: 2.0}, seed=8)]


@pytest.mark.parametrize("params", GENERATION, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_device_sampling_with_bias_and_penalties_follows_the_cpu_sampler(emulator, tmp_path, params):
    """Session::generate's loop on the emulated runners after a prompt that repeats itself (12
    tokens in prefill steps of 5, 5 and 2): 16 tokens drawn on the device (penalize over the
    token history the embedding kept on the device, then the sampler), then 16 more with another bias table (written over the first: fewer
    entries) and seed; each draw is the CPU sampler's on that step's logits with the whole
    history, and the penalties change at least one draw."""
    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q4_0", seed=9)
    ids = list(prompt(np.random.default_rng(3), 6)) * 2
    second = {250: 4.5, 3: -np.inf}
    run(emulator, "generate", path, tmp_path / "t.bin", tmp_path / "l.bin", "--tokens", ",".join(map(str, ids)), "--steps", 16,
        "--chunk", 5, *flags_of(params), "--bias2", ",".join(f"{t}:{b!r}" for t, b in second.items()), "--seed2", 99)
    tokens = np.fromfile(tmp_path / "t.bin", np.int32)
    step_logits = np.fromfile(tmp_path / "l.bin", np.float32).reshape(32, -1)
    n_vocab = step_logits.shape[1]
    first = _core.Sampler(n_vocab, **params)
    later = _core.Sampler(n_vocab, **dict(params, logit_bias=second, seed=99))
    plain = {k: v for k, v in params.items() if k in ("temperature", "top_k", "top_p", "min_p", "seed")}
    history = list(ids) + [int(tokens[0])]
    changed = 0
    for i in range(32):
        sampler = first if i < 16 else later
        want = sampler.sample(step_logits[i], np.asarray(history, np.int32), len(history))
        assert tokens[i + 1] == want, f"{params}: step {i}: device drew {tokens[i + 1]}, CPU sampler {want}"
        seed = plain.get("seed", 0) if i < 16 else 99
        changed += want != _core.Sampler(n_vocab, **dict(plain, seed=seed)).sample(step_logits[i], [], len(history))
        history.append(want)
    assert changed > 0, f"{params}: bias and penalties changed no draw; the test does not test them"


# greedy with a window of 8 (tokens come back once they leave it) and over the whole history with
# a bias; GENERATION's bans with presence over everything, and its sampled case (window past the
# history)
CPU_GENERATION = [dict(repetition_penalty=1.5, presence_penalty=1.0, penalty_last_n=8, seed=1),
                  dict(repetition_penalty=1.3, frequency_penalty=0.4, penalty_last_n=-1, logit_bias={228: -2.0}, seed=1),
                  GENERATION[2], GENERATION[3]]


@pytest.mark.parametrize("params", CPU_GENERATION, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_generation_with_penalties_equals_the_cpu_backend(emulator, tmp_path, params):
    """The Metal-emulated engine (f32 KV cache) generating 20 tokens with bias and penalties
    against the CPU backend's Session.generate (precise mode: f32 KV), which applies them on the
    host: the same tokens, first to last; and not the tokens of a generation without them."""
    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q8_0", seed=12)
    ids = np.asarray(list(prompt(np.random.default_rng(8), 5)) * 3, np.int32)
    run(emulator, "generate", path, tmp_path / "t.bin", tmp_path / "l.bin", "--tokens", ",".join(map(str, ids)), "--steps", 19,
        "--kv", "f32", "--n-ctx", 256, *flags_of(params))
    got = np.fromfile(tmp_path / "t.bin", np.int32).tolist()
    model = _core.Model.load(str(path), backend="cpu", precise=True, n_ctx=256, n_threads=1)
    n_vocab = model.config["n_vocab"]

    def cpu_generate(p):
        s = _core.Session(model)
        s.eval(ids)
        return list(s.generate(_core.Sampler(n_vocab, **p), 20))

    want = cpu_generate(params)
    assert got == want, f"{params}: Metal emulated {got}, CPU backend {want}"
    plain = {k: v for k, v in params.items() if k in ("temperature", "top_k", "top_p", "min_p", "seed")}
    assert cpu_generate(plain) != want, f"{params}: bias and penalties change nothing here; the test does not test them"
