"""Quant formats: our scalar reference (de)quantizers against independent references.

Dequantization must equal ``gguf.quants.dequantize`` bit for bit; Q8_0 quantization must
equal ``gguf.quants.quantize``; Q8_K (which gguf lacks) is checked against a NumPy transcription
of ggml's ``quantize_row_q8_K_ref`` / ``dequantize_row_q8_K``. Inputs are random with a fresh
seed per run; set EDGERUNNER_TEST_SEED to replay one (every failure message prints it).
"""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

from edgerunner import _core, quants

SEED = int(os.environ.get("EDGERUNNER_TEST_SEED", np.random.SeedSequence().entropy % 2**32))

# Byte offsets of the fp16 scale fields inside one block (see quant_blocks.h).
FP16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "IQ4_NL": [0], "IQ4_XS": [0],
}
SCALAR_TYPES = ["F32", "F16", "BF16"]
ALL_TYPES = SCALAR_TYPES + list(FP16_FIELDS) + ["Q8_K"]
BLOCK_COUNTS = [1, 2, 17, 101]  # one block, a pair, primes


def rng_for(*salt: object) -> np.random.Generator:
    return np.random.default_rng([SEED, *(zlib.crc32(str(s).encode()) for s in salt)])


def ctx(*what: object) -> str:
    return f"seed={SEED} (replay: EDGERUNNER_TEST_SEED={SEED}) " + " ".join(map(str, what))


def random_fp16_bits(rng: np.random.Generator, size: int) -> np.ndarray:
    """Finite fp16 scales of sensible magnitude (2^-20 .. 2^2, so fp16 subnormals too), either sign."""
    mag = np.exp2(rng.uniform(-20, 2, size)).astype(np.float16)
    sign = np.where(rng.random(size) < 0.5, -1, 1).astype(np.float16)
    return (mag * sign).view(np.uint8).reshape(size, 2)


def random_finite_bits(rng: np.random.Generator, n: int, dtype, exp_mask: int) -> np.ndarray:
    """Random bit patterns of a float type with all-ones exponents (inf/NaN) made finite."""
    bits = rng.integers(0, np.iinfo(dtype).max, n, dtype=dtype, endpoint=True)
    nonfinite = (bits & exp_mask) == exp_mask
    bits[nonfinite] ^= dtype(exp_mask & ~(exp_mask >> 1))  # clear the top exponent bit
    return bits


def random_tensor(name: str, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """n_blocks blocks of `name` as flat uint8, with every float field finite."""
    if name == "F32":
        return random_finite_bits(rng, n_blocks, np.uint32, 0x7F800000).view(np.uint8)
    if name == "F16":
        return random_finite_bits(rng, n_blocks, np.uint16, 0x7C00).view(np.uint8)
    if name == "BF16":
        return random_finite_bits(rng, n_blocks, np.uint16, 0x7F80).view(np.uint8)
    _, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
    blocks = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    if name == "Q8_K":
        d = (rng.uniform(-1, 1, n_blocks) * np.exp2(rng.uniform(-20, 0, n_blocks))).astype(np.float32)
        blocks[:, 0:4] = d.view(np.uint8).reshape(n_blocks, 4)
    for off in FP16_FIELDS.get(name, []):
        blocks[:, off:off + 2] = random_fp16_bits(rng, n_blocks)
    return blocks.reshape(-1)


def reference_dequantize(name: str, data: np.ndarray) -> np.ndarray:
    if name == "Q8_K":  # d (float32) * q, as ggml's dequantize_row_q8_K
        blocks = data.reshape(-1, 292)
        d = blocks[:, 0:4].copy().view(np.float32)
        q = blocks[:, 4:260].view(np.int8).astype(np.float32)
        return (d * q).reshape(-1)
    return gguf_quants.dequantize(data, GGMLQuantizationType[name]).reshape(-1)


def assert_bitwise_equal(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    assert ours.dtype == np.float32 and ref.dtype == np.float32, ctx(what, ours.dtype, ref.dtype)
    assert ours.shape == ref.shape, ctx(what, ours.shape, ref.shape)
    diff = np.flatnonzero(ours.view(np.uint32) != ref.view(np.uint32))
    assert diff.size == 0, ctx(
        what, f"{diff.size} of {ours.size} elements differ; first at {diff[0]}: "
        f"ours {ours[diff[0]]!r} vs reference {ref[diff[0]]!r}")


@pytest.mark.parametrize("n_blocks", BLOCK_COUNTS)
@pytest.mark.parametrize("name", ALL_TYPES)
def test_dequantize_matches_gguf_bitwise(name: str, n_blocks: int) -> None:
    data = random_tensor(name, n_blocks, rng_for(name, n_blocks))
    ref = reference_dequantize(name, data)
    assert not np.isnan(ref).any(), ctx(name, "test input produced NaN")
    assert_bitwise_equal(quants.dequantize(data, name), ref, f"{name} x{n_blocks} blocks")


@pytest.mark.parametrize("name", ["F16", "BF16"])
def test_dequantize_every_16_bit_float(name: str) -> None:
    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    exp_mask = 0x7C00 if name == "F16" else 0x7F80
    bits = bits[(bits & exp_mask) != exp_mask]  # NaN and inf payloads aside
    data = bits.view(np.uint8)
    assert_bitwise_equal(quants.dequantize(data, name), reference_dequantize(name, data), f"all {name}")


def test_dequantize_accepts_ids_bytes_and_multidim_arrays() -> None:
    data = random_tensor("Q4_K", 3, rng_for("forms"))
    ref = reference_dequantize("Q4_K", data)
    assert_bitwise_equal(quants.dequantize(data, GGMLQuantizationType.Q4_K), ref, "by enum")
    assert_bitwise_equal(quants.dequantize(data, 12), ref, "by id")
    assert_bitwise_equal(quants.dequantize(data.tobytes(), "q4_k"), ref, "bytes, lower-case name")
    assert_bitwise_equal(quants.dequantize(data.reshape(3, 144), "Q4_K"), ref, "2-D rows")
    assert_bitwise_equal(_core.dequantize(12, data.tobytes(), 768), ref, "_core with bytes")


def test_every_dequantizable_type_is_tested() -> None:
    assert sorted(quants.dequantizable_types()) == sorted(ALL_TYPES)


# ---- Q8_0 ---------------------------------------------------------------------------------


def q8_0_inputs(rng: np.random.Generator, n_blocks: int) -> np.ndarray:
    scales = np.exp2(rng.uniform(-24, 12, (n_blocks, 1)))  # d from fp16-subnormal to large
    x = (rng.standard_normal((n_blocks, 32)) * scales).astype(np.float32)
    if n_blocks >= 3:
        x[1] = 0.0                                       # all-zero block: d = 0
        x[2] = np.arange(-15.5, 16.5, dtype=np.float32)  # x * (1/d) lands on .5 ties
        x[2, 0] = 127.0
    return x.reshape(-1)


@pytest.mark.parametrize("n_blocks", BLOCK_COUNTS)
def test_quantize_q8_0_matches_gguf_bitwise(n_blocks: int) -> None:
    x = q8_0_inputs(rng_for("q8_0", n_blocks), n_blocks)
    ours = quants.quantize_q8_0(x)
    ref = gguf_quants.quantize(x, GGMLQuantizationType.Q8_0).reshape(-1)
    assert ours.dtype == np.uint8 and ours.shape == ref.shape, ctx(ours.shape, ref.shape)
    diff = np.flatnonzero(ours != ref)
    assert diff.size == 0, ctx(f"Q8_0 x{n_blocks}: {diff.size} bytes differ, first at byte {diff[0]} "
                               f"(block {diff[0] // 34})")


def test_quantize_q8_0_rounds_scale_to_fp16_like_numpy() -> None:
    # d = amax / 127 is exact when amax = 127 * t, so t can sit exactly halfway between two
    # fp16 values: every such tie (subnormal, normal, and 65520, which rounds to inf).
    h = np.arange(0, 0x7BFF, dtype=np.uint16)
    lo = h.view(np.float16).astype(np.float32)
    hi = (h + 1).view(np.float16).astype(np.float32)
    ties = np.concatenate([(lo + hi) / 2, lo, [65504, 65519.996, 65520, 1e-9]]).astype(np.float32)
    rng = rng_for("q8_0_ties")
    x = (rng.uniform(-1, 1, (ties.size, 32)) * ties[:, None]).astype(np.float32)
    x[:, 0] = np.float32(127) * ties * np.where(rng.random(ties.size) < 0.5, -1, 1)
    x = x.reshape(-1)
    ours = quants.quantize_q8_0(x)
    with np.errstate(over="ignore"):
        ref = gguf_quants.quantize(x, GGMLQuantizationType.Q8_0).reshape(-1)
    diff = np.flatnonzero(ours != ref)
    assert diff.size == 0, ctx(f"Q8_0 ties: {diff.size} bytes differ, first in block {diff[0] // 34}: "
                               f"amax {abs(x[diff[0] // 34 * 32])!r}")


# ---- Q8_K ---------------------------------------------------------------------------------


def reference_quantize_q8_k(x: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q8_K_ref in float32 NumPy."""
    out = []
    for b in x.astype(np.float32).reshape(-1, 256):
        mx = b[np.argmax(np.abs(b))]  # the first element of largest magnitude, with its sign
        if mx == 0:
            out.append(np.zeros(292, np.uint8))
            continue
        iscale = np.float32(-127.0) / mx
        q = np.minimum(np.rint(iscale * b), 127).astype(np.int8)  # rint: ties to even
        bsums = q.reshape(16, 16).astype(np.int16).sum(axis=1, dtype=np.int16)
        d = np.float32(1.0) / iscale
        out.append(np.frombuffer(d.tobytes() + q.tobytes() + bsums.astype("<i2").tobytes(), np.uint8))
    return np.concatenate(out)


def rounding_traps(rng: np.random.Generator) -> np.ndarray:
    """A Q8_K block whose products iscale * x round *up* in float32 to an odd k + 0.5 (which
    then rounds to even, away from k) while the exact product is below k + 0.5: a fused
    multiply-add in nearest_int (FMA contraction) would give k instead of k + 1."""
    amax = np.float32(rng.uniform(50, 200))
    iscale = np.float32(-127) / amax
    traps = []
    for k in range(-125, 126, 2):  # odd k: k + 0.5 rounds (to even) up to k + 1
        lo = hi = np.float32((k + 0.5) / float(iscale))
        candidates = [lo]
        for _ in range(128):
            lo, hi = np.nextafter(lo, np.float32(-np.inf)), np.nextafter(hi, np.float32(np.inf))
            candidates += [lo, hi]
        for c in candidates:
            if np.float32(iscale * c) == k + 0.5 and float(iscale) * float(c) < k + 0.5:
                traps.append(c)
                break
    assert len(traps) >= 20, ctx("too few rounding traps found", len(traps))
    block = np.resize(np.array(traps, np.float32), 256)
    block[0] = amax
    return block


def q8_k_inputs(rng: np.random.Generator, n_blocks: int) -> np.ndarray:
    scales = np.exp2(rng.uniform(-30, 30, (n_blocks, 1)))
    x = (rng.standard_normal((n_blocks, 256)) * scales).astype(np.float32)
    if n_blocks >= 4:
        x[1] = 0.0
        x[2] = np.round(rng.uniform(-126, 126, 256)) + 0.5  # ties, resolved to even
        x[2, 5], x[2, 9] = -127.0, 127.0                     # first max is negative: iscale = +1
        x[3] = rounding_traps(rng)
    return x.reshape(-1)


@pytest.mark.parametrize("n_blocks", BLOCK_COUNTS)
def test_quantize_q8_k_matches_reference(n_blocks: int) -> None:
    x = q8_k_inputs(rng_for("q8_k", n_blocks), n_blocks)
    ours = quants.quantize_q8_k(x)
    ref = reference_quantize_q8_k(x)
    assert ours.dtype == np.uint8 and ours.shape == ref.shape, ctx(ours.shape, ref.shape)
    diff = np.flatnonzero(ours != ref)
    assert diff.size == 0, ctx(f"Q8_K x{n_blocks}: {diff.size} bytes differ, first at byte {diff[0]} "
                               f"(block {diff[0] // 292}, offset {diff[0] % 292})")


@pytest.mark.parametrize("n_blocks", BLOCK_COUNTS)
def test_quantize_q8_k_round_trip(n_blocks: int) -> None:
    x = q8_k_inputs(rng_for("q8_k_rt", n_blocks), n_blocks)
    y = quants.dequantize(quants.quantize_q8_k(x), "Q8_K")
    amax = np.abs(x.reshape(-1, 256)).max(axis=1, keepdims=True)
    err = np.abs(y.reshape(-1, 256) - x.reshape(-1, 256))
    # half a quantization step (amax/127), plus float32 rounding of iscale, d = 1/iscale and
    # d*q (each ~6e-8 relative, scaled by |q| <= 127 steps)
    assert (err <= amax / 127 * (0.5 + 1e-4)).all(), ctx(
        "Q8_K round trip: worst error in steps", (err * 127 / np.maximum(amax, 1e-30)).max())


def test_q8_0_round_trip_through_our_dequantizer() -> None:
    x = q8_0_inputs(rng_for("q8_0_rt"), 17)
    ours = quants.dequantize(quants.quantize_q8_0(x), "Q8_0")
    ref = gguf_quants.dequantize(gguf_quants.quantize(x, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0)
    assert_bitwise_equal(ours, ref.reshape(-1), "Q8_0 round trip")


# ---- errors -------------------------------------------------------------------------------


def test_wrong_length_names_type_and_sizes() -> None:
    with pytest.raises(ValueError, match=r"Q4_K data has 100 bytes.*144-byte blocks"):
        quants.dequantize(np.zeros(100, np.uint8), "Q4_K")
    with pytest.raises(ValueError, match=r"Q4_K data has 144 bytes, but 512 elements are 2 blocks of 144 bytes = 288"):
        _core.dequantize(12, np.zeros(144, np.uint8), 512)
    with pytest.raises(ValueError, match=r"100 elements of Q4_K.*block size 256"):
        _core.dequantize(12, np.zeros(144, np.uint8), 100)


@pytest.mark.parametrize("tensor_type", ["IQ2_XXS", 16])
def test_unsupported_type_is_named(tensor_type: str | int) -> None:
    with pytest.raises(ValueError, match=r"IQ2_XXS.*supported: F32, F16, Q4_0.*Q4_K.*IQ4_XS"):
        quants.dequantize(np.zeros(66, np.uint8), tensor_type)


def test_unknown_type() -> None:
    with pytest.raises(ValueError, match=r"unknown tensor type 'Q9_9'; known: F32, F16"):
        quants.dequantize(np.zeros(4, np.uint8), "Q9_9")
    with pytest.raises(ValueError, match=r"unknown tensor type id 99"):
        quants.dequantize(np.zeros(4, np.uint8), 99)
    with pytest.raises(ValueError, match=r"unknown tensor type id 99"):
        _core.dequantize(99, np.zeros(4, np.uint8), 1)


def test_quantize_wrong_length() -> None:
    with pytest.raises(ValueError, match=r"33 values to Q8_0.*multiple of 32"):
        quants.quantize_q8_0(np.zeros(33, np.float32))
    with pytest.raises(ValueError, match=r"255 values to Q8_K.*multiple of 256"):
        quants.quantize_q8_k(np.zeros(255, np.float32))
    with pytest.raises(ValueError, match=r"33 elements to Q8_0.*multiple of 32"):
        _core.quantize_q8_0(np.zeros(33, np.float32))
