"""CUDA backend ops against independent references (run on a machine with a CUDA device and a
build with -C cmake.define.EDGERUNNER_CUDA=ON; skipped elsewhere).

Matmuls (the one-token GEMV, the eight-token GEMV, the tensor-core GEMM): every weight type the
CPU reads, random blocks, odd row counts and column counts that are not a multiple of 256 where
the format allows (Q4_0's and Q8_0's rows then end in a group of eight blocks padded on the
device), against float64 arithmetic on the
dequantized weights (gguf's own dequantizers through edgerunner.quants) and the float
activations. Types whose kernel takes int8 activations (d = max|x| / 127 per 32 values) carry
that rounding too: at most d/2 per value; the tensor-core GEMM rounds weights and activations to
bf16 (8 significant bits)."""

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


# Formats whose weights are s·q + m: the byte holding the sign of their offset's f16 scale (m,
# or dmin) in each block, and the block's size
OFFSET_SIGN = {"Q4_1": (3, 20), "Q5_1": (3, 24), "Q2_K": (83, 84), "Q4_K": (3, 144), "Q5_K": (3, 176)}


def scale_and_offset_magnitude(name, rows, w):
    """|s·q| + |m| per weight (|w| where there is no offset): with the offset's sign flipped the
    weights are s·q − m, and |a| + |b| = max(|a + b|, |a − b|)."""
    if name not in OFFSET_SIGN:
        return np.abs(w)
    byte, size = OFFSET_SIGN[name]
    flipped = rows.copy().reshape(rows.shape[0], -1, size)
    flipped[:, :, byte] ^= 0x80
    w2 = quants.dequantize(flipped.reshape(-1), name).astype(np.float64).reshape(w.shape)
    return np.maximum(np.abs(w), np.abs(w2))


# The tensor-core GEMM's kernels this device has: mma.sync, and on Hopper warpgroup MMA (both
# tested on every shape, whichever the engine would pick there)
GEMM_KERNELS = ["mma.sync"] + (["wgmma"] if _core.cuda_available() and _core.cuda_gemm_has_wgmma() else [])


def assert_matmul_close(name, rows, x, context, gemm="auto"):
    """Y = X W^T from the device against float64 on the dequantized weights, per element within
    the float32 bound n · 2^-24 · Σ|w x| (doubled for int8 activations) plus, where the kernel
    takes int8 activations, half a quantization step per value: Σ |w| · max|x_b| / 254. The
    tensor-core GEMM's bf16 operands: an activation within 2^-8 of itself, a weight within
    2^-8 (|s·q| + |m|) + 2^-8 |w| (its scale and offset rounded, then s·q + m once), float sums
    rounded at most an ulp per addition: Σ |x| (2^-8 (|s·q| + |m|) + 2^-7 |w|) + n · 2^-23 · Σ|w x|,
    all (1 + 2^-6). Its f16 operands (F16 weights, exact): an activation divided by its token's
    scale 2^e (f16_scales) within 2^-11 of itself or, below f16's normal range, 2^-25:
    Σ (2^-11 |x| + 2^-25 · 2^e) |w|. Its tf32 operands (F32 on Hopper's kernel): a weight and
    an activation each within 2^-10 of itself, Σ 2^-9 |w x|."""
    type_id = quants.type_id(name)
    y = _core.cuda_matmul(type_id, rows, x, gemm)
    err = matmul_error(name, rows, x, y, _core.cuda_matmul_activations(type_id, rows.shape[0], x.shape[1], x.shape[0], gemm))
    assert np.all(err <= 1), f"{name} {context}: max err {err.max():.3g} × bound at {np.unravel_index(err.argmax(), err.shape)}"


def f16_scales(x):
    """Per token, what the f16 copy of the activations divides its values by: 2^e, e >= 0 the
    least that brings them under 2^15 (1 unless a finite value reaches 32768)."""
    m = np.abs(x.astype(np.float64)).max(axis=1)
    e = np.where((m >= 32768) & np.isfinite(m), np.frexp(np.where(np.isfinite(m), m, 1.0))[1] - 15, 0)
    return np.ldexp(1.0, e)


def matmul_error(name, rows, x, y, activations):
    """|Y − X W^T| over assert_matmul_close's bound, per element, for a matmul that multiplied
    with `activations` ('float', 'int8', 'bf16', 'f16' or 'tf32'); <= 1 passes
    (tests/test_cuda_emulated.py too)."""
    n_tokens, n = x.shape
    assert y.shape == (n_tokens, rows.shape[0])
    w = quants.dequantize(rows.reshape(-1), name).astype(np.float64).reshape(rows.shape[0], n)
    x64 = x.astype(np.float64)
    ref = x64 @ w.T
    bound = n * 2.0**-24 * (np.abs(x64) @ np.abs(w).T) + 1e-30
    if activations == "bf16":
        magnitude = scale_and_offset_magnitude(name, rows, w)
        bound = (1 + 2.0**-6) * (2 * bound + np.abs(x64) @ (2.0**-8 * magnitude + 2.0**-7 * np.abs(w)).T)
    elif activations == "f16":
        assert name == "F16"
        x_err = 2.0**-11 * np.abs(x64) + 2.0**-25 * f16_scales(x)[:, None]
        bound = (1 + 2.0**-6) * (2 * bound + x_err @ np.abs(w).T)
    elif activations == "tf32":
        bound = (1 + 2.0**-6) * (2 * bound + 2.0**-9 * (np.abs(x64) @ np.abs(w).T))
    elif activations == "int8":
        half_step = np.repeat(np.abs(x64.reshape(n_tokens, -1, 32)).max(axis=2) / 254.0, 32, axis=1)
        bound = 2 * bound + half_step @ np.abs(w).T
    return np.abs(y - ref) / bound


def random_activations(rng, n_tokens, n):
    return (rng.normal(0, 1, (n_tokens, n)) * rng.choice([0.1, 1, 10], (n_tokens, n))).astype(np.float32)


@pytest.mark.parametrize("name", TYPES + ["BF16"])
def test_gemv_equals_float64(name):
    """One token: the decode GEMV. For the int8 formats also equal bit for bit to the eight-token
    GEMV's sums for the same token (a second token beside it), which add the same units in the
    same order from the raw blocks: the one-token kernel packs its chunks before its wait where its
    grid is one wave and its rows fit in three chunks (the smaller cases below)."""
    seed = random.randrange(2**32)
    rng = np.random.default_rng(seed)

    def check(rows, n, context):
        x = random_activations(rng, 2, n)
        assert_matmul_close(name, rows, x[:1], context)
        if name in INT8_TYPES:
            one = _core.cuda_matmul(quants.type_id(name), rows, x[:1], "auto")
            two = _core.cuda_matmul(quants.type_id(name), rows, x, "auto")
            assert np.array_equal(one[0], two[0]), f"{name} {context}: the one-token and eight-token GEMVs differ"

    # 70 and 250 blocks: rows in several staged chunks (250: more than three, so never packed); F16's
    # and BF16's rows in several steps of loads, each step's loaded ahead of the one before's sums
    for n_rows, blocks in ((1, 1), (37, 3), (130, 9), (5, 70), (3, 250)):
        n = blocks * (256 if name in K_TYPES else 32)
        check(random_weights(name, n_rows, n, rng), n, f"rows={n_rows} n={n} seed {seed}")
    # more rows than one wave of blocks holds (blocks retire and new ones start mid-kernel; an odd
    # count leaves the last warp one row): 20011 rows drawn from 257 random ones
    n = 2 * (256 if name in K_TYPES else 32)
    check(random_weights(name, 257, n, rng)[rng.integers(0, 257, 20011)], n, f"rows=20011 n={n} seed {seed}")
    if name in INT8_TYPES:
        # Each row the bits of the same row in a launch of 17 blocks (checked against float64):
        # 20011 rows of 5120 values, several waves of blocks with rows of several chunks (the
        # streamed kernel: a grid of what the SMs hold, each warp's ring running on from one pair of
        # rows into the next); 4001 rows of 8192, one wave of about two blocks an SM on an H200
        # whose rows stream more chunks than three (a deeper ring of four or six chunks)
        for n_rows, n in ((20011, 5120), (4001, 8192)):
            unique, picks = random_weights(name, 257, n, rng), rng.integers(0, 257, n_rows)
            x = random_activations(rng, 1, n)
            assert_matmul_close(name, unique, x, f"rows=257 n={n} seed {seed}")
            small = _core.cuda_matmul(quants.type_id(name), unique, x, "auto")
            large = _core.cuda_matmul(quants.type_id(name), unique[picks], x, "auto")
            assert np.array_equal(large[0], small[0][picks]), f"{name} rows={n_rows} n={n} seed {seed}: differs from the same rows' launch of 17 blocks"


# the formats whose GEMV takes int8 activations; the tensor-core GEMM takes them and the float
# formats (F16 in f16, F32 in bf16 on mma.sync and tf32 on wgmma, BF16 as it is), on each kernel
INT8_TYPES = [t for t in TYPES if t not in ("F32", "F16", "BF16", "Q8_K")]
FLOAT_GEMM_TYPES = ["F32", "F16", "BF16"]
GEMM_TYPES = INT8_TYPES + FLOAT_GEMM_TYPES


def gemm_kernels(name):
    return GEMM_KERNELS


@pytest.mark.parametrize("name", INT8_TYPES)
def test_gemv_many_short_rows(name):
    """An LM head of many short rows (SmolLM2's shape: 49153 rows of 576 values, 512 for the
    K-quants; an odd count leaves the last pair one row), which the one-token GEMV of the int8
    formats walks in row pairs with a grid of the blocks the SMs hold at once (GemvRows): within
    the float64 bound, and equal bit for bit to the eight-token GEMV's sums for the same token
    (a second token beside it), which add the same units in the same order."""
    seed = random.randrange(2**32)
    rng = np.random.default_rng(seed)
    n = 512 if name in K_TYPES else 576
    rows = random_weights(name, 257, n, rng)[rng.integers(0, 257, 49153)]
    x = random_activations(rng, 2, n)
    assert_matmul_close(name, rows, x[:1], f"rows=49153 n={n} seed {seed}")
    one = _core.cuda_matmul(quants.type_id(name), rows, x[:1], "auto")
    two = _core.cuda_matmul(quants.type_id(name), rows, x, "auto")
    assert np.array_equal(one[0], two[0]), f"{name} seed {seed}: the one-token and eight-token GEMVs differ"


# (Q8_K has no GEMM: once)
@pytest.mark.parametrize("name,gemm", [(t, g) for t in TYPES + ["BF16"] for g in (gemm_kernels(t) if t in GEMM_TYPES else ["auto"])])
def test_prefill_matmul_equals_float64(name, gemm):
    """Several tokens: eight per weight load below 16 tokens; from 16 on the tensor-core GEMM for
    the int8 formats (Q4_0 … IQ4_XS) and the float ones (F32, F16, BF16), with row counts that leave its 128-row tiles partly empty,
    token counts that leave its 64- or 128-token tiles partly empty, and K tiles cut short (3 and
    9 blocks of 32: a last tile of 3 or 1 units); each of the GEMM's kernels."""
    seed = random.randrange(2**32)
    rng = np.random.default_rng(seed)
    for n_rows, blocks, n_tokens in ((37, 3, 8), (37, 3, 16), (200, 9, 77), (130, 18, 130), (8, 2, 300)):
        n = blocks * (256 if name in K_TYPES else 32)
        rows = random_weights(name, n_rows, n, rng)
        context = f"rows={n_rows} n={n} tokens={n_tokens} gemm={gemm} seed {seed}"
        assert_matmul_close(name, rows, random_activations(rng, n_tokens, n), context, gemm if n_tokens >= 16 else "auto")


@pytest.mark.parametrize("name,gemm", [(t, g) for t in GEMM_TYPES for g in gemm_kernels(t)])
def test_prefill_matmul_wide_grid(name, gemm):
    """Grids of 303 blocks (101 row tiles, the last partly empty, × 3 token tiles): the mma.sync
    kernel's four-warp blocks (chosen from 1.5 blocks per SM: any GPU of up to 202 SMs), where the
    small shapes above take its eight-warp ones; the wgmma kernel's blocks retiring and new ones
    starting. 12837 rows drawn from 257 random ones, K of 512."""
    seed = random.randrange(2**32)
    rng = np.random.default_rng(seed)
    n = 512
    rows = random_weights(name, 257, n, rng)[rng.integers(0, 257, 12837)]
    assert_matmul_close(name, rows, random_activations(rng, 130, n), f"rows=12837 n={n} tokens=130 gemm={gemm} seed {seed}", gemm)


@pytest.mark.parametrize("name", GEMM_TYPES)
def test_prefill_matmul_engine_shape(name):
    """The kernel the engine picks on a shape where Hopper takes wgmma (K of 1056: 8.25 tiles of
    128; 45 blocks of 128 rows × 128 tokens; rows of 33 blocks, for the 32-element formats not on
    16-byte boundaries), and the other kernel on the same inputs."""
    seed = random.randrange(2**32)
    rng = np.random.default_rng(seed)
    n = 1056 if name not in K_TYPES else 1280
    rows = random_weights(name, 257, n, rng)[rng.integers(0, 257, 1100)]
    x = random_activations(rng, 600, n)
    for gemm in ["auto"] + gemm_kernels(name):
        assert_matmul_close(name, rows, x, f"rows=1100 n={n} tokens=600 gemm={gemm} seed {seed}", gemm)


@pytest.mark.parametrize("name,gemm", [(t, g) for t in ("Q4_0", "Q6_K", "F16", "BF16", "F32") for g in GEMM_KERNELS])
def test_prefill_matmul_adds_to_its_residual(name, gemm):
    """The tensor-core GEMM adding its sums to the values already in its output (the output and
    down projections' residual, GemvArgs::accumulate; store_sums loads them all before its
    stores): Y = R + X W^T equals, bit for bit, float32 R plus the same GEMM's X W^T without R,
    which is itself within assert_matmul_close's bound of float64. Tiles partly empty in rows and
    tokens; a random R of another scale than the sums, so a lost, doubled or misplaced value shows."""
    seed = random.randrange(2**32)
    rng = np.random.default_rng(seed)
    type_id = quants.type_id(name)
    for n_rows, blocks, n_tokens in ((200, 9, 77), (130, 18, 130)):
        n = blocks * (256 if name in K_TYPES else 32)
        rows = random_weights(name, n_rows, n, rng)
        x = random_activations(rng, n_tokens, n)
        context = f"{name} rows={n_rows} n={n} tokens={n_tokens} gemm={gemm} seed {seed}"
        assert_matmul_close(name, rows, x, context, gemm)
        plain = _core.cuda_matmul(type_id, rows, x, gemm)
        residual = (rng.standard_normal((n_tokens, n_rows)) * 100).astype(np.float32)
        added = _core.cuda_matmul(type_id, rows, x, gemm, residual=residual)
        want = residual + plain
        bad = np.argwhere(added.view(np.uint32) != want.view(np.uint32))
        assert bad.size == 0, f"{context}: {len(bad)} sums differ, first at {tuple(bad[0])}: {added[tuple(bad[0])]!r} against {want[tuple(bad[0])]!r}"


@pytest.mark.parametrize("gemm", GEMM_KERNELS)
def test_prefill_f16_scales_activations_past_its_range(gemm):
    """F16 weights multiply an f16 copy of the activations, whose range ends at 65504: a token
    whose values reach 2^15 is divided by a power of two first, its sums multiplied back. With
    |x| up to 20000 (no scale) and the same x times 2^20 (scale 2^20: the same f16 values), the
    second's sums are the first's times 2^20 bit for bit, and both within the f16 bound; a
    token of values up to 10^30 beside tokens of ordinary ones, within it too (its scale is its
    own)."""
    seed = random.randrange(2**32)
    rng = np.random.default_rng(seed)
    n = 1056
    rows = random_weights("F16", 257, n, rng)[rng.integers(0, 257, 300)]
    x = random_activations(rng, 130, n)
    x = (x * (20000.0 / np.abs(x).max(axis=1, keepdims=True))).astype(np.float32)
    big = (x * np.float32(2.0**20)).astype(np.float32)
    context = f"gemm={gemm} seed {seed}"
    assert_matmul_close("F16", rows, x, context, gemm)
    assert_matmul_close("F16", rows, big, context + " (x 2^20)", gemm)
    y, y_big = (_core.cuda_matmul(quants.type_id("F16"), rows, v, gemm) for v in (x, big))
    assert np.array_equal(y_big, (y.astype(np.float64) * 2.0**20).astype(np.float32)), context
    mixed = random_activations(rng, 40, n)
    mixed[7] *= np.float32(1e29)
    assert_matmul_close("F16", rows, mixed, context + " (one token of 1e30)", gemm)
