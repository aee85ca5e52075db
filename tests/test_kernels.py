"""CPU kernels: every SIMD dot product equals the scalar reference on random rows, and the
scalar reference equals float64 arithmetic on the dequantized operands."""

from __future__ import annotations

import random

import gguf as ggufpkg
import numpy as np
import pytest

from edgerunner import _core, quants
from edgerunner.model_builder import _random_blocks  # random raw blocks with valid scales

TYPES = ["F32", "F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL",
         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"]


# The 32-element formats' SIMD kernels do the scalar reference's arithmetic in its order (exact
# integer block sums, one float multiply-add per block): bitwise equal, not just close.
EXACT = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"}


def available_isas():
    """The SIMD kernel sets this CPU runs (each is compared with the scalar reference)."""
    return [isa for isa in _core.cpu_isas() if isa != "scalar"]


def random_row(name, n, rng):
    qtype = ggufpkg.GGMLQuantizationType[name]
    if name == "F32":
        return rng.normal(0, 0.05, n).astype(np.float32).view(np.uint8)
    if name == "F16":
        return rng.normal(0, 0.05, n).astype(np.float16).view(np.uint8)
    block, size = ggufpkg.GGML_QUANT_SIZES[qtype]
    return np.asarray(_random_blocks(qtype, n // block, rng, 0.02), np.uint8).reshape(-1)


@pytest.mark.parametrize("name", TYPES)
def test_simd_equals_scalar_and_scalar_equals_float64(name):
    seed = random.randrange(2**32)
    rng = np.random.default_rng(seed)
    type_id = quants.type_id(name)
    block = 256 if name in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS") else 32
    for blocks in (1, 3, 17):  # odd sizes: rows not a multiple of any unrolling
        n = blocks * block
        row = random_row(name, n, rng)
        x = (rng.normal(0, 1, n) * rng.choice([0.1, 1, 10], n)).astype(np.float32)  # outliers as in real activations
        ref = _core.cpu_dot(type_id, row, x, "scalar")
        # The scalar kernel is the arithmetic of the formats: weight and activation decoded to
        # float64, dotted. It differs only by float32 rounding of per-block partial sums.
        w = quants.dequantize(row, name).astype(np.float64)
        fmt = "F32" if name in ("F32", "F16") else ("Q8_K" if block == 256 else "Q8_0")
        xq = x.astype(np.float64) if fmt == "F32" else quants.dequantize(
            (quants.quantize_q8_k if fmt == "Q8_K" else quants.quantize_q8_0)(x), fmt).astype(np.float64)
        exact = float(w @ xq)
        bound = 1e-5 * float(np.abs(w) @ np.abs(xq)) + 1e-30
        assert abs(ref - exact) <= bound, f"{name} n={n} seed {seed}: scalar {ref} vs float64 {exact}"
        for isa in available_isas():
            got = _core.cpu_dot(type_id, row, x, isa)
            if name in EXACT:
                assert np.float32(got) == np.float32(ref), f"{name} {isa} n={n} seed {seed}: {got} vs scalar {ref}"
            assert abs(got - ref) <= bound, f"{name} {isa} n={n} seed {seed}: {got} vs scalar {ref}"


def test_isa_names():
    assert _core.cpu_isa() in ("scalar", "avx2", "avxvnni", "avx512")
    with pytest.raises(ValueError, match="unknown instruction set"):
        _core.cpu_dot(0, np.zeros(128, np.uint8), np.zeros(32, np.float32), "sse9")


@pytest.mark.parametrize("name", TYPES)
def test_prefill_tiles_equal_single_token_dots_bitwise(name):
    """A token's result must not depend on how many rows or tokens shared its step: every
    (row, token) of a tile (up to 8 rows, 16 with avx512) × 1-4 tokens equals the single-token
    kernel of the same ISA exactly."""
    seed = random.randrange(2**32)
    rng = np.random.default_rng(seed)
    type_id = quants.type_id(name)
    block = 256 if name in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS") else 32
    n = 5 * block
    for isa in available_isas():
        for n_rows in (1, 2, 3, 5, 8) + ((9, 13, 16) if isa == "avx512" else ()):
            for n_tok in (1, 2, 3, 4):
                rows = np.stack([random_row(name, n, rng) for _ in range(n_rows)])
                x = rng.normal(0, 1, (n_tok, n)).astype(np.float32)
                tile = _core.cpu_dot_tile(type_id, rows, x, isa)
                if tile is None:
                    continue
                for i in range(n_rows):
                    for k in range(n_tok):
                        single = _core.cpu_dot(type_id, rows[i], x[k], isa)
                        assert np.float32(tile[i][k]) == np.float32(single), f"{name} {isa} seed {seed} ({i},{k})"


@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0"])
def test_attention_cache_kernels(kv_type):
    """The SIMD attention kernels over each cache precision equal the scalar ones (float order
    differs: within 1e-5 of the output scale), and the scalar ones equal float64 attention over
    the values as the cache stores them (f16 / q8_0 rounding included)."""
    seed = random.randrange(2**32)
    rng = np.random.default_rng(seed)
    for n_pos, hd in ((1, 64), (37, 64), (200, 128), (5, 96)):
        if kv_type == "q8_0" and hd % 32:
            continue
        k = rng.normal(0, 1, (n_pos, hd)).astype(np.float32)
        v = rng.normal(0, 1, (n_pos, hd)).astype(np.float32)
        q = rng.normal(0, 1, hd).astype(np.float32)
        stored = {"f32": lambda a: a.astype(np.float64),
                  "f16": lambda a: a.astype(np.float16).astype(np.float64),
                  "q8_0": lambda a: np.stack([quants.dequantize(quants.quantize_q8_0(r), "Q8_0") for r in a]).astype(np.float64)}[kv_type]
        ks, vs = stored(k), stored(v)
        s = ks @ q.astype(np.float64) / np.sqrt(hd)
        p = np.exp(s - s.max())
        want = (p / p.sum()) @ vs
        ref = _core.kv_attention(kv_type, k, v, q, "scalar")
        assert np.abs(ref - want).max() <= 1e-5 * max(1.0, np.abs(want).max()), f"{kv_type} seed {seed}"
        for isa in available_isas():
            got = _core.kv_attention(kv_type, k, v, q, isa)
            assert np.abs(got - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max()), f"{kv_type} {isa} seed {seed}"


@pytest.mark.parametrize("fmt", ["Q8_0", "Q8_K"])
def test_activation_quantization_is_the_reference_bytes(fmt):
    """Every kernel set quantizes activations to the scalar reference's bytes, including the
    rounding ties (x · (1/d) exactly k + 0.5, which SIMD rounding would send to even)."""
    seed = random.randrange(2**32)
    rng = np.random.default_rng(seed)
    n = 256 * 5
    x = (rng.normal(0, 1, n) * rng.choice([1e-3, 1, 30], n)).astype(np.float32)
    x[:32] = np.arange(-15.5, 16.5, 1.0, dtype=np.float32)   # ties: d = 16.5/127, but see next block
    x[32:64] = np.float32(127.0) * np.sign(rng.normal(size=32))  # d = 1: x·(1/d) = x
    x[33:63:2] = np.arange(-7.5, 7.5, 1.0, dtype=np.float32)   # exact ties at d = 1
    x[64:96] = 0.0                                              # an all-zero block
    ref = _core.cpu_quantize_act(fmt, x, "scalar")
    if fmt == "Q8_0":  # the reference's block bytes are gguf's Q8_0
        assert ref[:n // 32 * 34] == quants.quantize_q8_0(x).tobytes()
    for isa in available_isas():
        got = _core.cpu_quantize_act(fmt, x, isa)
        assert got == ref, f"{fmt} {isa} seed {seed}: first difference at byte {next(i for i in range(len(ref)) if got[i] != ref[i])}"


@pytest.mark.parametrize("isa", ["scalar"] + available_isas())
def test_math_kernels_against_float64(isa):
    """SiLU·u, GELU(tanh)·u and the softmax exponentials: within 4 float32 ulp of float64 (the SIMD exp is a
    polynomial, ≤ 2 ulp; the division and product add one rounding each), for every length
    (the vector tail is padded, not a scalar loop) and over the whole useful range."""
    seed = random.randrange(2**32)
    rng = np.random.default_rng(seed)
    for n in (1, 7, 8, 9, 33, 300):
        g = (rng.normal(0, 4, n) * rng.choice([1, 10], n)).astype(np.float32)
        u = rng.normal(0, 1, n).astype(np.float32)
        got = np.array(_core.cpu_math("silu_mul", g, u, 0.0, isa), np.float64)
        g64 = g.astype(np.float64)
        want = g64 / (1 + np.exp(-g64)) * u
        ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
        # absolute 1e-30: where the true value underflows float32 (g < -87), any tiny value is right
        assert np.all(np.abs(got - want) <= 4 * ulp + 1e-30), f"{isa} n={n} seed {seed}"
        got = np.array(_core.cpu_math("gelu_mul", g, u, 0.0, isa), np.float64)
        want = 0.5 * g64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (g64 + 0.044715 * g64**3))) * u
        ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
        # tanh through exp: 1 - 2/(e^2y + 1) loses relative accuracy where tanh ≈ -1 (g < -3),
        # but the product is tiny there: 8 ulp plus 1e-6 absolute
        assert np.all(np.abs(got - want) <= 8 * ulp + 1e-6 * np.abs(u)), f"gelu {isa} n={n} seed {seed}"
        x = rng.uniform(-80, 0, n).astype(np.float32)
        res = np.array(_core.cpu_math("exp_sum", x, x, 0.5, isa), np.float64)
        want = np.exp((x - np.float32(0.5)).astype(np.float64))  # the kernel subtracts in float32
        ulp = np.spacing(want.astype(np.float32)).astype(np.float64)
        assert np.all(np.abs(res[:n] - want) <= 2 * ulp + 1e-38), f"{isa} n={n} seed {seed}"
        assert abs(res[n] - want.sum()) <= 1e-6 * want.sum()
