"""CUDA backend ops against independent references (run on a machine with a CUDA device and a
build with -C cmake.define.EDGERUNNER_CUDA=ON; skipped elsewhere).

Matmuls (the one-token GEMV, the eight-token GEMV, the tensor-core GEMM): every weight type the
CPU reads, random blocks, odd row counts and column counts that are not a multiple of 256 where
the format allows, against float64 arithmetic on the
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


def random_weights(name, n_rows, n, rng):
    if name == "BF16":
        w = rng.normal(0, 0.05, (n_rows, n)).astype(np.float32)
        return (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n_rows, -1)
    return np.stack([random_row(name, n, rng) for _ in range(n_rows)])


def assert_matmul_close(name, rows, x, context):
    """Y = X W^T from the device against float64 on the dequantized weights, per element within
    the float32 bound n · 2^-24 · Σ|w x| (doubled for int8 activations) plus, where the kernel
    takes int8 activations, half a quantization step per value: Σ |w| · max|x_b| / 254."""
    type_id = quants.type_id(name)
    n_tokens, n = x.shape
    y = _core.cuda_matmul(type_id, rows, x)
    assert y.shape == (n_tokens, rows.shape[0])
    w = quants.dequantize(rows.reshape(-1), name).astype(np.float64).reshape(rows.shape[0], n)
    x64 = x.astype(np.float64)
    ref = x64 @ w.T
    bound = n * 2.0**-24 * (np.abs(x64) @ np.abs(w).T) + 1e-30
    if _core.cuda_gemv_int8(type_id):
        half_step = np.repeat(np.abs(x64.reshape(n_tokens, -1, 32)).max(axis=2) / 254.0, 32, axis=1)
        bound = 2 * bound + half_step @ np.abs(w).T
    err = np.abs(y - ref) / bound
    assert np.all(err <= 1), f"{name} {context}: max err {err.max():.3g} × bound at {np.unravel_index(err.argmax(), err.shape)}"


def random_activations(rng, n_tokens, n):
    return (rng.normal(0, 1, (n_tokens, n)) * rng.choice([0.1, 1, 10], (n_tokens, n))).astype(np.float32)


@pytest.mark.parametrize("name", TYPES + ["BF16"])
def test_gemv_equals_float64(name):
    """One token: the decode GEMV."""
    seed = random.randrange(2**32)
    rng = np.random.default_rng(seed)
    for n_rows, blocks in ((1, 1), (37, 3), (130, 9), (5, 70)):  # 70 blocks: rows in several staged chunks
        n = blocks * (256 if name in K_TYPES else 32)
        rows = random_weights(name, n_rows, n, rng)
        assert_matmul_close(name, rows, random_activations(rng, 1, n), f"rows={n_rows} n={n} seed {seed}")
    # more rows than one wave of blocks holds (blocks retire and new ones start mid-kernel; an odd
    # count leaves the last warp one row): 20011 rows drawn from 257 random ones
    n = 2 * (256 if name in K_TYPES else 32)
    rows = random_weights(name, 257, n, rng)[rng.integers(0, 257, 20011)]
    assert_matmul_close(name, rows, random_activations(rng, 1, n), f"rows=20011 n={n} seed {seed}")


@pytest.mark.parametrize("name", TYPES)
def test_prefill_matmul_equals_float64(name):
    """Several tokens: eight per weight load below 16 tokens; from 16 on the tensor-core GEMM for
    the int8 formats (Q4_0 … Q6_K), with row counts that leave its 128-row tiles partly empty,
    token counts that leave its 64-token tiles partly empty, and K tiles cut short."""
    seed = random.randrange(2**32)
    rng = np.random.default_rng(seed)
    for n_rows, blocks, n_tokens in ((37, 3, 8), (37, 3, 16), (200, 9, 77), (130, 18, 130), (8, 2, 300)):
        n = blocks * (256 if name in K_TYPES else 32)
        rows = random_weights(name, n_rows, n, rng)
        assert_matmul_close(name, rows, random_activations(rng, n_tokens, n), f"rows={n_rows} n={n} tokens={n_tokens} seed {seed}")
