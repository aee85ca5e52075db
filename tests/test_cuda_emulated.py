"""The CUDA backend on the CPU: csrc/cuda compiled as C++ and run by tests/cuda_emulator, against
the float64 reference, the CPU sampler and NumPy, on machines without a GPU (CI among them).

tests/cuda_emulator compiles csrc/cuda against a stand-in <cuda_runtime.h> whose __syncthreads and
warp functions (shuffles, ballot, match) really synchronize the threads of a block (each thread a
coroutine, tests/lanes), and links the core's session compiled for CUDA: what runs is the
backend's own code from Model::load down (the runner's fusion decisions, step blocks, the three
dispatch modes with their argument tables and graphs, the chained decode steps, the samplers,
the device guard of backend="cuda:N"), on emulated devices of an H200's 132 SMs and compute
capability 8.0 (one, or two where a test sets EDGERUNNER_CUDA_EMULATOR_DEVICES). What this proves: the
kernels' arithmetic, indexing, block slicing, merges across blocks and the collectives' logic, and
the host's plans. What it cannot: nvcc, the GPU's memory model and scheduling (one block runs,
then the next, a block's threads in turn; streams run each operation when it is enqueued), CUDA's
math library (the host's exp and 1/sqrt run here), the Hopper-only paths (bulk copies,
programmatic dependent launch), the tensor-core GEMM and attention (prefill chunks of 16 tokens or
more: the tests keep chunks of 8) and speed. tests/test_cuda_engine.py runs the same code on a GPU.

Exactness: penalize's float32 arithmetic is the CPU sampler's rounding for rounding, so its output
equals NumPy's float32 transform bit for bit; the sampler's draw equals the CPU sampler's token
(the kernels' fixed-point masses could differ from its float64 sums only where u · S falls
within about n · 2^-47 of a token's edge: never in these draws).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgerunner import _core
from edgerunner.model_builder import write_random_model
from reference_forward import ReferenceModel
from test_engine import FAST_TOLERANCE, IDS, K, prompt, tiny_models  # noqa: F401 (fixture)
from test_cuda_engine import write_broken_output_model
from test_cuda_ops import K_TYPES, f16_scales, matmul_error, random_activations, random_weights
from test_kernels import TYPES
from test_sampler import ref_transform_f32

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel emulator is built on Linux")

SLICE = 16384  # a block's tokens in both kernels (sample.cu's kSlice)


@pytest.fixture(scope="session")
def emulator(cpp_build) -> Path:
    return cpp_build / "tests" / "cpp" / "cuda_emulator"


def draw(emulator, tmp_path, logits, params, *, history=None, step=0, penalized=None) -> int:
    """The emulated kernels' token for `logits` (float32) with the CPU sampler's keyword params."""
    logits.astype(np.float32).tofile(tmp_path / "l.bin")
    flags = ["--step", step]
    for k, v in params.items():
        if k == "logit_bias":
            flags += ["--bias", ",".join(f"{t}:{b!r}" for t, b in v.items())]
        else:
            flags += [f"--{k.replace('_', '-')}", v]
    if history is not None:
        np.asarray(history, np.int32).tofile(tmp_path / "h.bin")
        flags += ["--history", tmp_path / "h.bin"]
    if penalized is not None:
        flags += ["--penalized", penalized]
    r = subprocess.run([str(emulator), "sample", str(tmp_path / "l.bin"), *map(str, flags)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return int(r.stdout)


# greedy; temperature alone; top-k of up to 4096 candidates (counted into histograms, the candidates
# sorted: one a thread up to 1024, several past it; k = 4000 leaves room for the rest of its bucket,
# where k = 4096 would overflow into the bisection nearly always) with top-p and min-p, or with a
# min-p that ends the walk (on a warp: k <= 64; on the block); k = 4097 (SampleWalk's last block
# bisects); top-p, min-p, both, and a top-k past the vocabulary (masses into histograms)
SAMPLING = [dict(), dict(temperature=0.8), dict(temperature=1.0, top_k=40, top_p=0.9, min_p=0.05),
            dict(temperature=1.5, top_k=50, min_p=0.3), dict(temperature=2.0, top_k=300, min_p=0.2), dict(temperature=0.7, top_k=1024),
            dict(temperature=1.2, top_k=1025), dict(temperature=0.9, top_k=4000, top_p=0.9), dict(temperature=1.0, top_k=4097),
            dict(temperature=0.9, top_p=0.8), dict(temperature=1.5, min_p=0.1),
            dict(temperature=1.1, top_p=0.7, min_p=0.02), dict(temperature=0.6, top_k=100000, top_p=0.95)]


@pytest.mark.parametrize("params", SAMPLING, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "greedy")
def test_sampler_kernel_draws_as_the_cpu_sampler(emulator, tmp_path, params):
    """Random logits and logits built to make the cuts hard (repeated values, whose ties go to the
    lower id; -inf, banned), over 5003 tokens (one block; float4 loads and a scalar tail) and
    40000 (three blocks merging their greedy bests), several seeds and RNG steps."""
    seed = random.randrange(2**32)
    rng = np.random.default_rng(seed)
    for n in (5003, 40000):
        for hard in (False, True):
            l = rng.normal(0, 4, n).astype(np.float32)
            if hard:
                l[rng.integers(0, n, n // 10)] = np.float32(1.5)
                l[rng.integers(0, n, n // 20)] = -np.inf
            for s, step in ((3, 0), (77, 41)):
                got = draw(emulator, tmp_path, l, dict(params, seed=s), step=step)
                want = _core.Sampler(n, seed=s, **params).sample(l, [], step)
                assert got == want, f"{params} n={n} hard={hard} seed={s} step={step} (test seed {seed}): kernel {got}, CPU {want}"


@pytest.mark.parametrize("params", [dict(temperature=0.8, top_p=0.9), dict(temperature=1.5, top_p=0.95, min_p=0.01),
                                    dict(temperature=1.0, top_k=5000, top_p=0.9), dict(temperature=0.8, top_k=30000, min_p=0.2)],
                         ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_sampler_kernel_draws_from_flat_logits_as_the_cpu_sampler(emulator, tmp_path, params):
    """Flat logits, a random-weight model's (128256 tokens, std 0.93): top-p's cut bucket and the
    draw's range then hold 33 to ~80 candidates at T 0.8 (~60 to 200 at 1.5), which SampleWalk's
    first warp sorts and walks two or four a lane (up to 128; more take the block's path). Top-k
    past 4096: SampleWalk's last block bisects its candidates (every token from top-k's bucket up,
    thousands more than k: that bucket is crowded), drawing from their k best."""
    seed = random.randrange(2**32)
    l = np.random.default_rng(seed).normal(4.3, 0.93, 128256).astype(np.float32)
    for s in range(1, 11):
        step = 3 * s
        got = draw(emulator, tmp_path, l, dict(params, seed=s), step=step)
        want = _core.Sampler(len(l), seed=s, **params).sample(l, [], step)
        assert got == want, f"{params} seed={s} step={step} (test seed {seed}): kernel {got}, CPU {want}"


@pytest.mark.parametrize("params", [dict(temperature=1.0), dict(temperature=0.8, top_p=0.9, min_p=0.1),
                                    dict(temperature=1.0, top_k=40), dict(temperature=1.0, top_k=5000)],
                         ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_sampler_kernel_draws_only_infinite_logits_where_there_are_some(emulator, tmp_path, params):
    """+inf logits (an overflow, or a logit bias of +inf that forces a token): each weighs 1 and
    every other token 0 (a logit equal to the max is at distance 0, not inf - inf = NaN), on the
    kernels as on the CPU; top-k 5000 takes the bisection."""
    rng = np.random.default_rng(4)
    n = 40000
    l = rng.normal(0, 4, n).astype(np.float32)
    forced = [5, 30001, 39999]
    l[forced] = np.inf
    for s in range(1, 5):
        want = _core.Sampler(n, seed=s, **params).sample(l, [], s)
        assert want in forced
        got = draw(emulator, tmp_path, l, dict(params, seed=s), step=s)
        assert got == want, f"{params} seed={s}: kernel {got}, CPU {want}"


# the cuts of these land inside groups of equal logits: top-p's and the draw's (their candidates
# then overflow into the bisection of every token), top-k's past 1024 and within it (ties past the
# 4096 candidates a block sorts: the bisection of top-k's candidates)
TIES = [dict(temperature=1.0), dict(temperature=0.9, top_p=0.5), dict(temperature=1.2, top_p=0.9, min_p=0.5),
        dict(temperature=1.0, top_k=1500, top_p=0.8), dict(temperature=1.0, top_k=600)]


@pytest.mark.parametrize("params", TIES, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_sampler_kernel_walks_equal_logits_in_id_order(emulator, tmp_path, params):
    """Near-flat logits (every token weighs about the same) over 40000 tokens, 20% of them equal
    at the 99th percentile and 30% at the median: the contract walks equal logits in id order, so
    a cut inside such a group takes its lowest ids first. Every draw equals the CPU sampler's, and
    the draws do land in the groups (fixed seeds: which ones is part of the test)."""
    rng = np.random.default_rng(11)
    n = 40000
    l = rng.normal(0, 0.05, n).astype(np.float32)
    groups = [np.float32(np.quantile(l, 0.99)), np.float32(np.quantile(l, 0.5))]
    l[rng.choice(n, n // 5, replace=False)] = groups[0]
    l[rng.choice(n, 3 * n // 10, replace=False)] = groups[1]
    in_groups = 0
    for s in range(1, 9):
        want = _core.Sampler(n, seed=s, **params).sample(l, [], s)
        in_groups += l[want] in groups
        got = draw(emulator, tmp_path, l, dict(params, seed=s), step=s)
        assert got == want, f"{params} seed={s}: kernel {got}, CPU {want}"
    assert in_groups >= 2, f"{params}: only {in_groups} of 8 draws in a group of equal logits"


@pytest.mark.parametrize("k", [40, 1000, 2000])
def test_sampler_kernel_top_k_counts_from_each_blocks_floor(emulator, tmp_path, k):
    """top-k's counts skip each block's tokens below its floor (its m-th best, m = min(k, 2 k · 1024
    / 40000 + 32): 34, 83 and 134 here): the k best all in the last blocks (rising logits: the floors
    there above the k-th best, so the cut comes out lower), all in the first (falling), or one a block
    over crowded flat logits (the floors then below the cut, each block's other tokens tied in two
    buckets under it); every draw equals the CPU sampler's."""
    rng = np.random.default_rng(7)
    n = 40000  # 40 blocks of 1024 tokens (SampleMass's), the last one short
    flat = rng.normal(4.3, 0.93, n).astype(np.float32)
    spread = np.full(n, np.float32(2.0))
    spread[rng.integers(0, n, n // 2)] = np.float32(1.9990234)  # (the key bucket just under 2.0's)
    spread[np.arange(0, n, 1024)[: min(k, 40)]] = 3.0 + rng.random(min(k, 40)).astype(np.float32)
    for name, l in (("rising", np.sort(flat)), ("falling", np.sort(flat)[::-1].copy()), ("spread", spread)):
        for s in (1, 2):
            want = _core.Sampler(n, seed=s, temperature=1.0, top_k=k).sample(l, [], s)
            got = draw(emulator, tmp_path, l, dict(temperature=1.0, top_k=k, seed=s), step=s)
            assert got == want, f"{name} k={k} seed={s}: kernel {got}, CPU {want}"


@pytest.mark.parametrize("crowd,k", [(3000, 1000), (3000, 1500), (20000, 3000), (20000, 40)])
def test_sampler_kernel_top_k_cuts_a_crowded_bucket_to_the_k_best(emulator, tmp_path, crowd, k):
    """Top-k's cut bucket crowded (`crowd` distinct-ish logits in [2, 2 + 1/64), one key bucket;
    30 above it, the rest below): its candidates are cut to the k best (and ties) before the sort,
    from shared memory (3000: fewer than a block sorts) or from the global scratch (20000: more);
    every draw equals the CPU sampler's."""
    rng = np.random.default_rng(crowd + k)
    n = 40000
    l = rng.normal(0, 0.3, n).astype(np.float32)  # (none near 2)
    ids = rng.permutation(n)
    l[ids[:30]] = 2.5 + rng.random(30).astype(np.float32)
    l[ids[30:30 + crowd]] = (2.0 + rng.random(crowd) / 64).astype(np.float32)
    assert (l[ids[30:30 + crowd]] < 2.0 + 1 / 64).all()
    for s in (1, 2):
        want = _core.Sampler(n, seed=s, temperature=1.0, top_k=k).sample(l, [], s)
        got = draw(emulator, tmp_path, l, dict(temperature=1.0, top_k=k, seed=s), step=s)
        assert got == want, f"crowd={crowd} k={k} seed={s}: kernel {got}, CPU {want}"


def test_sampler_kernel_draws_minus_one_without_a_finite_logit(emulator, tmp_path):
    """Every logit -inf or NaN (over one block and over three): the kernels give -1 (the runner
    turns it into an error, as the CPU sampler raises one) for every setting, not a token."""
    for n in (5003, 40000):
        l = np.full(n, -np.inf, np.float32)
        l[::3] = np.nan
        for params in SAMPLING + [dict(temperature=1.0, top_k=40), dict(temperature=0.9, top_p=0.5, min_p=0.2)]:
            with pytest.raises(ValueError):
                _core.Sampler(n, seed=1, **params).sample(l, [], 0)
            assert draw(emulator, tmp_path, l, dict(params, seed=1)) == -1, params


def test_sampler_kernel_ties_go_to_the_lowest_id_across_blocks(emulator, tmp_path):
    """Equal maxima go to the lowest id: within a thread's run, between a warp's lanes and
    between warps (shuffles, then shared memory), and over blocks (one 64-bit atomic word); -0
    ties +0."""
    for ids in ([5, 4101, 37], [4133, 4101, 4999, 4], [3000, 2000], [4100, 4], [5002, 5001]):  # (float4 i: thread i % 1024; a tail)
        l = np.full(5003, -1.0, np.float32)
        l[ids] = 3.0
        assert draw(emulator, tmp_path, l, {}) == min(ids), ids
    l = np.full(40000, -1.0, np.float32)
    l[[36000, 20000, 4100]] = 2.0
    assert draw(emulator, tmp_path, l, {}) == 4100
    l = np.full(40000, -1.0, np.float32)
    l[20001] = -0.0
    l[36001] = 0.0
    assert draw(emulator, tmp_path, l, {}) == 20001


# penalties alone (greedy: their effect decides the token), with a window shorter than the history
# and one of all of it, with bias (bans and boosts, on block edges), and with sampling after them
PENALTIES = [dict(repetition_penalty=1.5), dict(repetition_penalty=0.7, presence_penalty=0.5, frequency_penalty=0.3, penalty_last_n=7),
             dict(frequency_penalty=0.25, penalty_last_n=-1), dict(temperature=0.9, top_k=40, repetition_penalty=1.3, presence_penalty=0.4),
             dict(temperature=1.1, frequency_penalty=0.6, penalty_last_n=200, min_p=0.02), dict(logit_bias=True),
             dict(temperature=0.8, logit_bias=True, repetition_penalty=1.2, frequency_penalty=0.1, penalty_last_n=-1),
             dict(repetition_penalty=1.0, presence_penalty=0.0, logit_bias=True, penalty_last_n=-1)]


@pytest.mark.parametrize("params", PENALTIES, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_penalize_kernel_is_the_contracts_float32(emulator, tmp_path, params):
    """penalize's logits equal NumPy's float32 transform bit for bit (every other token
    untouched), and the token drawn after it is the CPU sampler's with the same history: random
    histories whose tokens repeat (counts up to ~20), the step's own token in the window, bias
    entries on the blocks' edges (16383, 16384) and on the window's tokens, -inf bans."""
    seed = random.randrange(2**32)
    rng = np.random.default_rng(seed)
    for n in (5003, 40000):
        for trial in range(3):
            l = rng.normal(0, 3, n).astype(np.float32)
            pool = rng.integers(0, n, 12)  # a few tokens that recur, and the best logits among them
            pool[:3] = np.argsort(l)[-3:]
            history = np.where(rng.random(150) < 0.6, rng.choice(pool, 150), rng.integers(0, n, 150)).astype(np.int32)
            p = dict(params)
            if p.get("logit_bias"):
                edges = [t for t in (16383, 16384, n - 1) if t < n]
                p["logit_bias"] = {int(history[-1]): -np.inf, int(pool[4]): 2.5, **{t: float(rng.normal(0, 3)) for t in edges},
                                   int(np.argmax(l)): -1.25}
            out = tmp_path / "p.bin"
            step = int(rng.integers(0, 1000))
            got = draw(emulator, tmp_path, l, dict(p, seed=trial), history=history, step=step, penalized=out)
            want_l = ref_transform_f32(l, history, **p)
            got_l = np.fromfile(out, np.float32)
            assert np.array_equal(got_l.view(np.uint32), want_l.view(np.uint32)), \
                f"{p} n={n} (seed {seed}): tokens {np.nonzero(got_l.view(np.uint32) != want_l.view(np.uint32))[0][:8]} differ"
            want = _core.Sampler(n, seed=trial, **p).sample(l, history, step)
            assert got == want, f"{p} n={n} trial {trial} (seed {seed}): kernel {got}, CPU {want}"


def test_bias_entries_of_one_token_add_up_first(emulator, tmp_path):
    """A token's several bias entries are summed in their order, then added once (merged_bias),
    on the device as on the CPU: 1 + 2^-24 + 2^-24 in float32 is 1 added in turn, 1 + 2^-23 summed
    first. (Python's dict has one entry a token: the C++ API's vector may have more; the emulator
    takes repeats.)"""
    l = np.zeros(100, np.float32)
    l[7] = 1.0
    l[8] = np.float32(1.0 + 2.0**-23)  # what 7 reaches only when its entries are summed first
    got = draw(emulator, tmp_path, l, {"logit_bias": {}}, penalized=None)
    assert got == 8
    out = tmp_path / "p.bin"
    flags = ["--bias", "7:5.9604645e-08,7:5.9604645e-08", "--penalized", out]
    l.tofile(tmp_path / "l.bin")
    r = subprocess.run([str(emulator), "sample", str(tmp_path / "l.bin"), *map(str, flags)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert np.fromfile(out, np.float32)[7] == np.float32(1.0 + 2.0**-23)
    assert int(r.stdout) == 7  # (ties with 8: the lower id)


# ---- the whole backend ----------------------------------------------------------------------

INT8 = [t for t in TYPES if t not in ("F32", "F16", "BF16", "Q8_K")]  # the formats whose GEMVs take int8 activations


def cuda_matmul(emulator, tmp_path, name, rows, x) -> np.ndarray:
    rows.tofile(tmp_path / "w.bin")
    x.tofile(tmp_path / "x.bin")
    n_tokens, n = x.shape
    r = subprocess.run([str(emulator), "matmul", name, str(rows.shape[0]), str(n), str(n_tokens), str(tmp_path / "w.bin"),
                        str(tmp_path / "x.bin"), str(tmp_path / "y.bin")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return np.fromfile(tmp_path / "y.bin", np.float32).reshape(n_tokens, rows.shape[0])


@pytest.mark.parametrize("name", TYPES + ["BF16"])
def test_emulated_cuda_matmul_equals_float64(emulator, tmp_path, name):
    """The backend's matmul (cuda::matmul: the kernel the runner would pick) over raw blocks of every
    weight type, one token and several, odd row counts, rows of one chunk and of several, against
    float64 on the dequantized weights within tests/test_cuda_ops.py's bound (float32 sums: n ·
    2^-24 · Σ|w x|; int8 activations: doubled, plus half a quantization step per value). For the
    int8 formats the one-token GEMV's sums equal the several-token GEMV's bit for bit."""
    seed = random.randrange(2**32)
    rng = np.random.default_rng(seed)
    # (3, 100, 1): float rows of several steps of loads (F16's and BF16's each loaded ahead of the one
    # before's sums)
    for n_rows, blocks, n_tokens in ((1, 1, 1), (37, 3, 3), (130, 9, 1), (5, 70, 2), (64, 2, 8), (3, 100, 1)):
        n = blocks * (256 if name in K_TYPES else 32)
        rows, x = random_weights(name, n_rows, n, rng), random_activations(rng, n_tokens, n)
        y = cuda_matmul(emulator, tmp_path, name, rows, x)
        err = matmul_error(name, rows, x, y, "int8" if name in INT8 else "float")
        assert np.all(err <= 1), f"{name} rows={n_rows} n={n} tokens={n_tokens} seed {seed}: max err {err.max():.3g} × bound"
        if name in INT8 and n_tokens > 1:
            one = cuda_matmul(emulator, tmp_path, name, rows, x[:1])
            assert np.array_equal(one[0], y[0]), f"{name} rows={n_rows} n={n} seed {seed}: the one-token and several-token GEMVs differ"

@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_emulated_cuda_half_copy(emulator, tmp_path, kind):
    """The tensor-core GEMM's 16-bit copy of its input (half_activations): bf16 values, or f16
    ones for F16 weights after each token is divided by its power of two (f16_scales: 1 unless a
    finite value reaches 32768), which the kernel writes per token; rounded to nearest even, bit
    for bit NumPy's. Tokens of ordinary values, of values up to 4e30, at f16's edges (65504,
    32768 and just below it, its subnormals and below them), with an infinity, of zeros."""
    seed = random.randrange(2**32)
    rng = np.random.default_rng(seed)
    n_tokens, cols = 9, 1056
    x = random_activations(rng, n_tokens, cols)
    x[1] *= np.float32(1e29)
    x[2, :6] = [65504, -32768, 32767.99, 6e-8, -3e-8, 1e-9]
    x[3, :3] = [32767.99, 2.0**-24, 2.0**-25 * 3]
    x[4, 5] = np.inf
    x[5] = 0
    x[6] *= np.float32(2.0**20)
    x.tofile(tmp_path / "x.bin")
    args = [str(emulator), "half", kind, str(n_tokens), str(cols), str(tmp_path / "x.bin"), str(tmp_path / "y.bin")]
    r = subprocess.run(args + ([str(tmp_path / "s.bin")] if kind == "f16" else []), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = np.fromfile(tmp_path / "y.bin", np.uint16).reshape(n_tokens, cols)
    if kind == "f16":
        scales = f16_scales(x)
        assert np.array_equal(np.fromfile(tmp_path / "s.bin", np.float32), scales.astype(np.float32)), f"seed {seed}"
        assert scales[0] == scales[3] == scales[4] == scales[5] == 1 and scales[1] > 2.0**80 and scales[2] == 2 and scales[6] > 1
        with np.errstate(over="ignore"):
            want = (x.astype(np.float64) / scales[:, None]).astype(np.float32).astype(np.float16).view(np.uint16)
    else:
        u = x.view(np.uint32).astype(np.uint64)
        want = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    bad = np.argwhere(got != want)
    assert bad.size == 0, f"{kind} seed {seed}: {len(bad)} values differ, first at {tuple(bad[0])}: {got[tuple(bad[0])]:#06x} against {want[tuple(bad[0])]:#06x}"


DISPATCH = ("eager", "argument_buffers", "recorded")
ONE_SM = {"EDGERUNNER_CUDA_EMULATOR_SMS": "1", "EDGERUNNER_CUDA_FOLD_NORM": "0"}  # (the GEMVs of several blocks an SM stream)


def cuda_logits(emulator, path, ids, env=None, **opts) -> np.ndarray:
    """Logits from the emulated CUDA backend: every position's (one eval_all, in chunks of 8), or
    with decode_from=K the K-token prompt's last and then one append a token; env: variables for
    the emulator's process."""
    out = Path(path).with_suffix(".logits")
    flags = [x for k, v in opts.items() for x in (f"--{k.replace('_', '-')}", v)]
    env = dict(os.environ, **(env or {}))
    r = subprocess.run([str(emulator), "logits", str(path), str(out), "--tokens", ",".join(map(str, ids)), *map(str, flags)],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    n_vocab = _core.Model.load(str(path), backend="cpu", n_threads=1).config["n_vocab"]
    return np.fromfile(out, np.float32).reshape(-1, n_vocab)


@pytest.mark.parametrize("case", IDS)
def test_emulated_cuda_logits_close_to_float64_reference(emulator, tiny_models, case):
    """Every weight type and architecture of the engine tests, 40 tokens in steps of 8 (the decode
    kernels, token for token): int8 activations into the quantized matmuls and an f16 KV cache,
    within the CPU fast path's bound (FAST_TOLERANCE of the logit range), as on the GPU."""
    path, seed = tiny_models[case]
    ids = prompt(np.random.default_rng(seed + 2), 40)
    want = ReferenceModel(path).logits(ids)
    got = cuda_logits(emulator, path, ids)
    scale, err = np.abs(want).max(), np.abs(got - want).max()
    assert err <= FAST_TOLERANCE * scale, f"{case} seed {seed}: max |Δ| {err:.3g} vs |logit| max {scale:.3g}"


@pytest.mark.parametrize("ttype,kv,over", [("Q4_0", "f16", {}), ("Q4_K_M", "q8_0", dict(K, n_layers=3)), ("Q8_0", "f32", dict(window=5)),
                                           ("F16", "f16", dict(arch="qwen2")), ("Q4_0", "f16", dict(env=ONE_SM)),
                                           ("Q4_K_M", "f16", dict(K, env=ONE_SM, n_layers=3))],
                         ids=lambda v: str(v).replace(str(ONE_SM), "ONE_SM"))
def test_emulated_cuda_steps_and_dispatch_modes_agree(emulator, tmp_path, ttype, kv, over):
    """One eval_all of 30 tokens (steps of 8) and a 5-token prompt followed by 25 one-token steps
    give the same logits bit for bit, in each dispatch mode (eager launches, argument tables,
    recorded graphs): every KV precision, a sliding window over a ring cache, qwen2's biases. On
    one SM with no norm folded into a GEMV (ONE_SM) a one-token gate·up of more blocks than the
    SM holds streams (GemvStaged::stream: each warp's ring runs on through its rows), as the 1B's
    and the 8B's do on a GPU, and the quantize kernel writes its int8 copy."""
    over = dict(over)
    env = over.pop("env", None)
    path = tmp_path / "m.gguf"
    write_random_model(path, arch=over.pop("arch", "llama"), preset="tiny", tensor_type=ttype, seed=7, **over)
    ids = prompt(np.random.default_rng(1), 30)
    full = cuda_logits(emulator, path, ids, env=env, kv=kv, dispatch="eager")
    for dispatch in DISPATCH:
        steps = cuda_logits(emulator, path, ids, env=env, kv=kv, dispatch=dispatch, decode_from=5)
        assert np.array_equal(steps, full[4:]), f"{dispatch}: rows {np.nonzero((steps != full[4:]).any(1))[0]} differ"


@pytest.mark.parametrize("ttype,over,writes", [("Q8_0", {}, True), ("Q6_K", dict(dim=256, ffn_dim=512), True), ("Q4_0", {}, False)])
def test_emulated_cuda_grid_on_every_sm_writes_the_norm_for_q6_k_and_q8_0(emulator, tmp_path, ttype, over, writes):
    """On one SM every GEMV's grid takes every SM, as the 8B's output and down projections do on a
    GPU. There a Q8_0 or Q6_K projection that adds the residual still writes the next RMSNorm's int8
    copy (gemv_norms_out), so leaving the norm kernels out (EDGERUNNER_CUDA_SKIP=norm, a measurement
    knob) changes no logit of one-token steps; a Q4_0 one leaves the copy to the norm kernel, and
    leaving that out changes them. (The short-row kernel is off: on one SM, rows of 256 values
    would take it, and it writes no copy.)"""
    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type=ttype, seed=3, **over)
    ids = prompt(np.random.default_rng(2), 6)
    env = dict(ONE_SM, EDGERUNNER_CUDA_GEMV_ROWS="0")
    kept = cuda_logits(emulator, path, ids, env=env, decode_from=1)
    skipped = cuda_logits(emulator, path, ids, env=dict(env, EDGERUNNER_CUDA_SKIP="norm"), decode_from=1)
    assert np.array_equal(kept, skipped) == writes


@pytest.mark.parametrize("ttype", ["F32", "F16", "BF16"])
def test_emulated_cuda_float_decode_folds_every_norm(emulator, tmp_path, ttype):
    """A float model's one-token GEMVs (Q·K·V, gate·up, the LM head) normalize their input
    themselves (GemvArgs::norm: each block the residual's row into shared memory, by the norm
    kernel's arithmetic), so one-token steps give the logits of one eval_all (steps of 8, which
    run the norm kernel) bit for bit, and leaving the norm kernels out (EDGERUNNER_CUDA_SKIP=norm,
    a measurement knob) changes none of them; with the fold off (EDGERUNNER_CUDA_FOLD_NORM=0) the
    norm kernels run, and leaving them out does change them. With the fold off and the input read
    by every warp from memory (EDGERUNNER_CUDA_FLOAT_STAGE=0) the one-token steps are still those
    logits bit for bit."""
    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type=ttype, seed=9)
    ids = prompt(np.random.default_rng(3), 12)
    full = cuda_logits(emulator, path, ids)
    folded = cuda_logits(emulator, path, ids, decode_from=1)
    assert np.array_equal(folded, full), f"rows {np.nonzero((folded != full).any(1))[0]} differ"
    assert np.array_equal(cuda_logits(emulator, path, ids, env={"EDGERUNNER_CUDA_SKIP": "norm"}, decode_from=1), folded)
    unfolded = {"EDGERUNNER_CUDA_SKIP": "norm", "EDGERUNNER_CUDA_FOLD_NORM": "0"}
    assert not np.array_equal(cuda_logits(emulator, path, ids, env=unfolded, decode_from=1), folded)
    unstaged = {"EDGERUNNER_CUDA_FOLD_NORM": "0", "EDGERUNNER_CUDA_FLOAT_STAGE": "0"}
    assert np.array_equal(cuda_logits(emulator, path, ids, env=unstaged, decode_from=1), full)


@pytest.mark.parametrize("ttype,over", [("F32", {}), ("Q8_0", dict(n_kv_heads=2)), ("Q4_K", dict(dim=256, ffn_dim=512))],
                         ids=["F32", "Q8_0", "Q4_K"])
def test_emulated_cuda_gemma3_matches_the_cpu_backend(emulator, tmp_path, ttype, over):
    """Gemma 3 (scaled embeddings, the GELU gate in the gate+up GEMV, post-norms into the residual,
    per-head Q/K norms, local layers with their own RoPE base, window and ring cache): 40 tokens
    (steps of 8, over the 5 of 6 layers windowed to 8) and 8 one-token steps after 32 of them,
    against the CPU backend's precise mode (itself equal to transformers, test_hf_oracle), within
    5% of the logit range, as on the GPU (tests/test_cuda_engine.py)."""
    path = tmp_path / "g.gguf"
    write_random_model(path, arch="gemma3", preset="tiny", tensor_type=ttype, seed=21, **over)
    ids = prompt(np.random.default_rng(5), 40)
    want = _core.Session(_core.Model.load(str(path), backend="cpu", precise=True, prefill_chunk=8)).eval_all(ids)
    scale = np.abs(want).max()
    for got in (cuda_logits(emulator, path, ids), cuda_logits(emulator, path, ids, decode_from=32)):
        err = np.abs(got - want[-len(got):]).max()
        assert err <= 0.05 * scale, f"gemma3 {ttype}: max |Δ| {err:.3g} of |logit| max {scale:.3g}"


GENERATION = [dict(temperature=0.8, seed=3), dict(temperature=1.0, top_k=40, top_p=0.9, min_p=0.05, seed=4),
              dict(repetition_penalty=1.5, seed=1),
              dict(temperature=0.9, repetition_penalty=1.4, frequency_penalty=0.3, penalty_last_n=3, seed=5),
              dict(presence_penalty=2.0, penalty_last_n=-1, logit_bias={3: 0.5, 100: -np.inf}, seed=6),
              dict(temperature=1.0, top_k=40, frequency_penalty=0.5, penalty_last_n=-1, logit_bias={7: -np.inf, 319: 3.0}, seed=2)]


def generate(emulator, tmp_path, path, ids, *flags) -> np.ndarray:
    """The emulator's generate (see its main.cpp): the tokens, after asserting it printed "ok"."""
    r = subprocess.run([str(emulator), "generate", str(path), str(tmp_path / "t.bin"), "--tokens", ",".join(map(str, ids)),
                        *map(str, flags)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok", r.stdout
    return np.fromfile(tmp_path / "t.bin", np.int32)


@pytest.mark.parametrize("params", GENERATION, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
@pytest.mark.parametrize("dispatch", DISPATCH)
def test_emulated_cuda_generation_draws_as_the_cpu_sampler(emulator, tmp_path, params, dispatch):
    """Session::generate after a prompt that repeats itself: 24 tokens drawn on the device (recorded
    dispatch: chained steps, three in flight, each fed the last draw and penalized over a history
    the device kept), each the CPU sampler's on the logits of a second session stepping one token
    at a time, with the whole history."""
    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q4_0", seed=9)
    ids = list(prompt(np.random.default_rng(3), 6)) * 2
    flags = ["--steps", 24, "--dispatch", dispatch]
    for k, v in params.items():
        flags += ["--bias", ",".join(f"{t}:{b!r}" for t, b in v.items())] if k == "logit_bias" else [f"--{k.replace('_', '-')}", v]
    assert generate(emulator, tmp_path, path, ids, *flags).size == 24


@pytest.mark.parametrize("dispatch", DISPATCH)
def test_emulated_cuda_generation_ends_as_asked(emulator, tmp_path, dispatch):
    """A stop token met mid-chain (the steps in flight past it dropped), a context that fills up,
    and the Python layer's loop (append_sampled told how many draws may follow) instead of
    Session::generate: each draw the CPU sampler's, and the session's cache and last logits those
    of the reference session that stepped through the same tokens, bit for bit."""
    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q4_0", seed=4)
    ids = list(prompt(np.random.default_rng(2), 9))
    common = ["--dispatch", dispatch, "--temperature", 0.9, "--frequency-penalty", 0.3, "--penalty-last-n", 5, "--seed", 11]
    full = generate(emulator, tmp_path, path, ids, "--steps", 20, *common)
    assert full.size == 20
    for loop in (0, 1):
        assert generate(emulator, tmp_path, path, ids, "--steps", 20, "--loop", loop, *common).tolist() == full.tolist()
        stopped = generate(emulator, tmp_path, path, ids, "--steps", 20, "--stop", full[5], "--loop", loop, *common)
        assert stopped.tolist() == full[: list(full).index(full[5]) + 1].tolist()
        filled = generate(emulator, tmp_path, path, ids, "--steps", 20, "--n-ctx", len(ids) + 12, "--loop", loop, *common)
        assert filled.tolist() == full[:13].tolist()  # (12 appended, the 13th drawn from the full context's last logits)


@pytest.mark.parametrize("dispatch", DISPATCH)
def test_emulated_cuda_no_finite_logit_is_an_error_not_a_token(emulator, tmp_path, dispatch):
    """A model whose output is broken (its final norm's weights NaN: every logit NaN): a draw on
    the device, greedy or not, one step or chained (the steps after it read the drawn -1 as their
    input: the embedding reads row 0 for a token outside the vocabulary), raises the runner's
    error, as the CPU sampler raises one; the session then evaluates on."""
    path = tmp_path / "m.gguf"
    write_broken_output_model(path)
    for params in ([], ["--temperature", "0.8"], ["--temperature", "0.8", "--top-k", "40", "--top-p", "0.9"]):
        r = subprocess.run([str(emulator), "broken", str(path), "--tokens", "1,2,3", "--dispatch", dispatch, *params],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.strip().splitlines()
        assert lines[-1] == "ok", r.stdout
        assert len(lines) == 3 and all(x.startswith("no finite logit to sample from") for x in lines[:2]), r.stdout


def test_emulated_cuda_models_on_two_devices(emulator, tmp_path):
    """backend="cuda:N" on an emulated machine of two devices, while the thread's device is
    another: a model on cuda:1 allocates and launches nothing on device 0, the thread's device is
    as the caller left it after every call, sessions on both devices stepped in turn (the
    caller switching devices between the calls) give each the tokens it gives alone, memory is
    freed with the models, and cuda:2 is refused naming the devices there are."""
    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q4_0", seed=6)
    r = subprocess.run([str(emulator), "devices", str(path), "--tokens", "1,5,9,200,17", "--steps", "10", "--temperature", "0.8",
                        "--repetition-penalty", "1.2", "--seed", "3"],
                       capture_output=True, text=True, env=dict(os.environ, EDGERUNNER_CUDA_EMULATOR_DEVICES="2"))
    assert r.returncode == 0, r.stderr
    refusal, verdict = r.stdout.strip().splitlines()
    assert verdict == "ok", r.stdout
    assert refusal.startswith("backend 'cuda:2': there is no CUDA device 2; this machine has 2: cuda:0 ") and ", cuda:1 " in refusal


@pytest.mark.parametrize("dispatch", DISPATCH)
def test_emulated_cuda_second_generation_replaces_the_bias(emulator, tmp_path, dispatch):
    """Two generations on one session, with penalties over the whole history and another bias
    table and seed for the second (the table sent again, recorded dispatch's chain graphs of the
    penalized kind reused): every draw the CPU sampler's, the cache and logits the reference's."""
    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q4_0", seed=9)
    ids = list(prompt(np.random.default_rng(3), 6)) * 2
    tokens = generate(emulator, tmp_path, path, ids, "--steps", 12, "--dispatch", dispatch, "--temperature", 0.9, "--repetition-penalty",
                      1.3, "--penalty-last-n", -1, "--bias", "3:0.5,100:-inf", "--seed", 5, "--bias2", "7:-inf,3:-2.5,250:4.5",
                      "--seed2", 9)
    assert tokens.size == 24
