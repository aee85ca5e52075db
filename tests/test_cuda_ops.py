"""CUDA backend ops against independent references (run on a machine with a CUDA device and a
build with -C cmake.define.EDGERUNNER_CUDA=ON; skipped elsewhere).

GEMV: every weight type the CPU reads, random blocks, odd row counts and column counts that
are not a multiple of 256 where the format allows, against float64 arithmetic on the
dequantized weights (gguf's own dequantizers through edgerunner.quants) and the float
activations. Types whose kernel takes int8 activations (d = max|x| / 127 per 32 values) carry
that rounding too: at most d/2 per value."""

from __future__ import annotations

import random

import numpy as np
import pytest

from edgerunner import _core, quants

from test_kernels import TYPES, random_row

pytestmark = pytest.mark.skipif(not _core.cuda_available(), reason=_core.cuda_device())

K_TYPES = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"}


@pytest.mark.parametrize("name", TYPES + ["BF16"])
def test_gemv_equals_float64(name):
    seed = random.randrange(2**32)
    rng = np.random.default_rng(seed)
    type_id = quants.type_id(name)
    for n_rows, blocks in ((1, 1), (37, 3), (130, 9), (5, 70)):  # 70 blocks: rows in several staged chunks
        n = blocks * (256 if name in K_TYPES else 32)
        if name == "BF16":
            w = rng.normal(0, 0.05, (n_rows, n)).astype(np.float32)
            rows = (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n_rows, -1)
        else:
            rows = np.stack([random_row(name, n, rng) for _ in range(n_rows)])
        x = (rng.normal(0, 1, n) * rng.choice([0.1, 1, 10], n)).astype(np.float32)
        y = _core.cuda_gemv(type_id, rows, x)
        w = quants.dequantize(rows.reshape(-1), name).astype(np.float64).reshape(n_rows, n)
        ref = w @ x.astype(np.float64)
        # float32 products summed in float32: within n · 2^-24 of Σ|w x| per row
        bound = n * 2.0**-24 * (np.abs(w) @ np.abs(x.astype(np.float64))) + 1e-30
        if _core.cuda_gemv_int8(type_id):
            # + Σ |w| · max|x_b| / 254 (half a quantization step per value); the float part is
            # doubled because the rounded activations can exceed |x| by that half step
            half_step = np.repeat(np.abs(x.reshape(-1, 32)).max(axis=1) / 254.0, 32).astype(np.float64)
            bound = 2 * bound + np.abs(w) @ half_step
        assert np.all(np.abs(y - ref) <= bound), f"{name} rows={n_rows} n={n} seed {seed}: max err {np.max(np.abs(y - ref) / bound)} × bound"
