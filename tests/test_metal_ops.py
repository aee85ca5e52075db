"""Metal backend ops on the GPU against independent references (a macOS build on a Metal 3 GPU;
skipped elsewhere — tests/test_metal_emulated.py runs the same kernels on the CPU there).

GEMV and GEMM (simdgroup matrices): every weight type the CPU reads, random blocks, odd row and
token counts (partial tiles), against float64 on the dequantized weights (gguf's dequantizers
through edgerunner.quants): float activations, float32 products summed in float32, so within
n · 2^-24 · Σ|w x| per output. The device sampler: the CPU sampler's token on hard logits (ties,
-inf, 2000 and 70000 tokens)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from edgerunner import _core, quants

from test_kernels import TYPES, random_row

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _core.metal_available(), reason=_core.metal_device())]

K_TYPES = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "Q8_K"}


@pytest.mark.parametrize("name", TYPES + ["BF16", "Q8_K"])
@pytest.mark.parametrize("gemm", [False, True], ids=["gemv", "gemm"])
def test_matmul_equals_float64(name, gemm):
    seed = random.randrange(2**32)
    rng = np.random.default_rng(seed)
    for n_rows, blocks, n_tokens in ((1, 1, 1), (37, 3, 3), (130, 9, 37 if gemm else 2)):
        n = blocks * (256 if name in K_TYPES else 32)
        if name == "BF16":
            w = rng.normal(0, 0.05, (n_rows, n)).astype(np.float32)
            rows = (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n_rows, -1)
        elif name == "Q8_K":
            rows = np.stack([quants.quantize_q8_k(rng.normal(0, 1, n).astype(np.float32)).reshape(-1) for _ in range(n_rows)])
        else:
            rows = np.stack([random_row(name, n, rng) for _ in range(n_rows)])
        x = (rng.normal(0, 1, (n_tokens, n)) * rng.choice([0.1, 1, 10], n)).astype(np.float32)
        y = _core.metal_matmul(quants.type_id(name), rows, x, gemm)
        w = quants.dequantize(rows.reshape(-1), name).astype(np.float64).reshape(n_rows, n)
        ref = x.astype(np.float64) @ w.T
        bound = n * 2.0**-24 * (np.abs(x.astype(np.float64)) @ np.abs(w).T) + 1e-30
        assert np.all(np.abs(y - ref) <= bound), f"{name} rows={n_rows} n={n} tokens={n_tokens} seed {seed}: max err {np.max(np.abs(y - ref) / bound)} × bound"


SAMPLING = [dict(temperature=0.8), dict(temperature=1.0, top_k=20), dict(temperature=0.7, top_p=0.9),
            dict(temperature=1.2, min_p=0.05), dict(temperature=0.9, top_k=40, top_p=0.95, min_p=0.02)]


@pytest.mark.parametrize("params", SAMPLING, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_sampler_follows_the_cpu_sampler(params):
    rng = np.random.default_rng(random.randrange(2**32))
    for n in (2000, 70000):
        l = rng.normal(0, 4, n).astype(np.float32)
        l[rng.integers(0, n, n // 10)] = np.float32(1.5)
        l[rng.integers(0, n, n // 20)] = -np.inf
        for seed, step in ((3, 0), (77, 41), (5, 1000)):
            want = _core.Sampler(n, seed=seed, **params).sample(l, [], step)
            assert _core.metal_sample(l, seed=seed, step=step, **params) == want, f"{params} n={n} seed={seed} step={step}"
    assert _core.metal_sample(l, temperature=0.0) == int(np.argmax(l))
