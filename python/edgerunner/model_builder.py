"""Random-weight GGUF models of any supported architecture, size and tensor type.

Tests use tiny ones (checked against Hugging Face `transformers` loading the same file);
benchmarks use real shapes. Everything is written with `gguf.GGUFWriter`, one tensor at a
time, so an 8B shape needs memory for one tensor, not for the model.

    write_random_model("tiny.gguf", arch="qwen3", preset="tiny", tensor_type="F32", seed=0)
    python -m edgerunner.model_builder OUT.gguf --arch llama --preset llama-3.2-1b --type Q4_K_M

What the files hold:

- Tensor names, shapes and metadata keys are llama.cpp's (taken from the gguf package), so
  llama.cpp-style loaders and transformers' GGUF loader read them.
- Float weights are N(0, 0.02); norm weights 1 + N(0, 0.1); biases N(0, 0.02); all F32
  except the 2-D matrices, which take the requested type.
- Quantized matrices are random raw blocks, not quantized floats (fast at any size): random
  quant bits and sub-scales, and per-block fp16 scales drawn so the dequantized weights have
  std ~0.02 and mean ~0 (types with a per-block minimum get min = mid-code * scale).
- Q4_K_M / Q5_K_M follow llama.cpp's `llama_tensor_get_type`: see `mix_tensor_type`.
- A byte-level BPE vocabulary (GPT-2 style, `tokenizer.ggml.model = "gpt2"`) of the requested
  size: 256 byte tokens, synthetic merges, then `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`;
  plus a ChatML chat template.
- Every tensor's values come from a generator seeded by (seed, tensor name): the same seed
  gives the same file, and the same float weights whatever the float type.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import shutil
import sys
import tempfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QType
from gguf import MODEL_ARCH, MODEL_TENSOR

from edgerunner.tokenizer import gpt2_byte_alphabet

__all__ = [
    "ARCHITECTURES",
    "MIXES",
    "PRESETS",
    "TENSOR_TYPES",
    "ModelConfig",
    "TensorSpec",
    "model_config",
    "tensor_plan",
    "write_random_model",
]

WEIGHT_STD = 0.02

ARCHITECTURES: dict[str, MODEL_ARCH] = {
    "llama": MODEL_ARCH.LLAMA,
    "qwen2": MODEL_ARCH.QWEN2,
    "qwen3": MODEL_ARCH.QWEN3,
    "gemma3": MODEL_ARCH.GEMMA3,
    "phi3": MODEL_ARCH.PHI3,
}

# Types a matrix can be written in (block layouts known to `_random_blocks`).
TENSOR_TYPES: tuple[QType, ...] = (
    QType.F32, QType.F16, QType.BF16,
    QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1, QType.Q8_0,
    QType.Q2_K, QType.Q3_K, QType.Q4_K, QType.Q5_K, QType.Q6_K,
    QType.IQ4_NL, QType.IQ4_XS,
)

# llama.cpp file-type mixes: (base type, type for "more bits" tensors, type for attn_qkv).
MIXES: dict[str, tuple[QType, QType, QType]] = {
    "Q4_K_M": (QType.Q4_K, QType.Q6_K, QType.Q5_K),
    "Q5_K_M": (QType.Q5_K, QType.Q6_K, QType.Q6_K),
}


@dataclass(frozen=True)
class ModelConfig:
    """Shape and hyper-parameters of a decoder-only transformer (llama.cpp's meaning)."""

    dim: int  # embedding_length
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int  # feed_forward_length (phi3's ffn_up holds 2 * ffn_dim rows: gate then up)
    vocab_size: int
    head_dim: int | None = None  # None: dim // n_heads
    tied: bool = True  # no output.weight; the LM head reuses token_embd
    rope_base: float = 10000.0
    # {"type": "llama3", "factor", "low_freq_factor", "high_freq_factor", "original_context_length"}
    # writes a rope_freqs tensor; {"type": "linear", "factor"} writes rope.scaling metadata;
    # {"type": "longrope", "original_context_length"} (phi3) writes rope_factors_long/short and
    # the attention factor for context_length / original_context_length.
    rope_scaling: dict[str, Any] | None = None
    context_length: int = 2048
    rms_eps: float = 1e-5
    sliding_window: int = 512  # gemma3 only: window of its local layers (5 of every 6)
    window: int = 0  # other archs: Mistral-style sliding window over every layer (0: full attention)
    rope_base_swa: float = 10000.0  # gemma3 only: rope base of the local layers
    name: str = "random"

    @property
    def head_size(self) -> int:
        return self.head_dim if self.head_dim is not None else self.dim // self.n_heads


PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=320, context_length=256),
    "smollm2-135m": dict(
        dim=576, n_layers=30, n_heads=9, n_kv_heads=3, ffn_dim=1536, vocab_size=49152,
        tied=True, rope_base=100000.0, context_length=8192,
    ),
    "llama-3.2-1b": dict(
        dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192, vocab_size=128256,
        tied=True, rope_base=500000.0, context_length=131072,
        rope_scaling=dict(type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_context_length=8192),
    ),
    "llama-3.1-8b": dict(
        dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab_size=128256,
        tied=False, rope_base=500000.0, context_length=131072,
        rope_scaling=dict(type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_context_length=8192),
    ),
}

# Per-architecture changes to the tiny preset, so tiny models keep what the real ones have and
# what transformers assumes (its GGUF loader takes Qwen3's head_dim as 128 and Gemma 3's
# query scale as 1/sqrt(256) without reading them from the file). Gemma 3 gets 6 layers so that
# one of them (the 6th) is a global-attention layer.
_TINY_BY_ARCH: dict[str, dict[str, Any]] = {
    "qwen3": dict(head_dim=128),
    "gemma3": dict(head_dim=256, n_layers=6, n_kv_heads=1, sliding_window=8, rope_base=1000000.0, rms_eps=1e-6),
    "phi3": dict(tied=False),
}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the file: GGUF name, numpy-order shape (rows, row length) and type."""

    name: str
    shape: tuple[int, ...]
    qtype: QType
    kind: str  # "matrix", "norm", "bias" or "rope_freqs": what its random values look like

    @property
    def nbytes(self) -> int:
        block, size = gguf.GGML_QUANT_SIZES[self.qtype]
        return math.prod(self.shape[:-1]) * self.shape[-1] // block * size


def model_config(arch: str = "llama", preset: str = "tiny", **overrides: Any) -> ModelConfig:
    """The config of `preset` for `arch`, with any field replaced by keyword."""
    _check_arch(arch)
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known presets: {', '.join(PRESETS)}")
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown config field(s) {', '.join(unknown)}; fields: {', '.join(sorted(fields))}")
    values = dict(PRESETS[preset], name=f"random-{arch}-{preset}")
    if preset == "tiny":
        values.update(_TINY_BY_ARCH.get(arch, {}))
    values.update(overrides)
    config = ModelConfig(**values)
    if config.n_heads % config.n_kv_heads:
        raise ValueError(f"n_heads={config.n_heads} is not a multiple of n_kv_heads={config.n_kv_heads}")
    if config.head_dim is None and config.dim % config.n_heads:
        raise ValueError(f"dim={config.dim} is not a multiple of n_heads={config.n_heads}; set head_dim")
    if config.vocab_size < 256 + len(_SPECIAL_TOKENS):
        raise ValueError(f"vocab_size={config.vocab_size} is below the {256 + len(_SPECIAL_TOKENS)} "
                         "tokens the byte-level vocabulary needs")
    return config


def _check_arch(arch: str) -> MODEL_ARCH:
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; supported: {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[arch]


def _parse_tensor_type(tensor_type: str | QType) -> QType | str:
    """A QType for a single-type file, or the name of a mix in MIXES."""
    if isinstance(tensor_type, str) and tensor_type.upper() in MIXES:
        return tensor_type.upper()
    if isinstance(tensor_type, QType):
        qtype: QType | None = tensor_type
    else:
        qtype = QType.__members__.get(tensor_type.upper())
    if qtype not in TENSOR_TYPES:
        known = ", ".join([t.name for t in TENSOR_TYPES] + list(MIXES))
        raise ValueError(f"tensor type {tensor_type!r} is not supported; supported: {known}")
    return qtype


def _use_more_bits(i: int, n: int) -> bool:
    # llama.cpp's choice of layers that get more bits: first and last eighth, every third between.
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _k_quant_fallback(qtype: QType, row: int) -> QType:
    # llama.cpp's fallback when a row is not a whole number of 256-wide super-blocks.
    if row % 256 == 0:
        return qtype
    return {QType.Q4_K: QType.Q5_0, QType.Q5_K: QType.Q5_1, QType.Q6_K: QType.Q8_0}.get(qtype, qtype)


def mix_tensor_type(mix: str, role: str, layer: int, n_layers: int, row: int, tied: bool) -> QType:
    """Type of one matrix in a llama.cpp mix (`llama_tensor_get_type`, dense models).

    Q4_K_M / Q5_K_M: base Q4_K / Q5_K; Q6_K for output.weight (or token_embd when tied, since
    it is then the LM head), for attn_v and ffn_down of the `_use_more_bits` layers (the first
    and last eighth and every third layer between: about half); fused attn_qkv gets Q5_K / Q6_K.
    Rows not a multiple of 256 fall back to Q5_0 / Q5_1 / Q8_0 as llama.cpp does.
    """
    base, more, qkv = MIXES[mix]
    if role == "output" or (role == "token_embd" and tied):
        chosen = QType.Q6_K
    elif role in ("attn_v", "ffn_down") and _use_more_bits(layer, n_layers):
        chosen = more
    elif role == "attn_qkv":
        chosen = qkv
    else:
        chosen = base
    return _k_quant_fallback(chosen, row)


def tensor_plan(arch: str, config: ModelConfig, tensor_type: str | QType = "F32") -> list[TensorSpec]:
    """Every tensor the file will hold, in write order."""
    model_arch = _check_arch(arch)
    wanted = _parse_tensor_type(tensor_type)
    names = gguf.TENSOR_NAMES
    allowed = set(gguf.MODEL_TENSORS[model_arch])
    c = config
    hd = c.head_size
    q_rows, kv_rows = c.n_heads * hd, c.n_kv_heads * hd

    plan: list[TensorSpec] = []

    def add(kind: MODEL_TENSOR, suffix: str, shape: tuple[int, ...], layer: int = 0) -> None:
        assert kind in allowed, f"{kind.name} is not a {arch} tensor"
        name = names[kind].format(bid=layer) + "." + suffix
        role = names[kind].rsplit(".", 1)[-1]
        if suffix == "bias":
            plan.append(TensorSpec(name, shape, QType.F32, "bias"))
        elif len(shape) == 1:
            kind_1d = role if role in ("rope_freqs", "rope_factors_long", "rope_factors_short") else "norm"
            plan.append(TensorSpec(name, shape, QType.F32, kind_1d))
        else:
            if isinstance(wanted, str):
                qtype = mix_tensor_type(wanted, role, layer, c.n_layers, shape[-1], c.tied)
            else:
                qtype = wanted
                block = gguf.GGML_QUANT_SIZES[qtype][0]
                if shape[-1] % block:
                    raise ValueError(
                        f"tensor {name} has rows of {shape[-1]} values, not a multiple of {qtype.name}'s "
                        f"block of {block}; choose dim/ffn_dim/head_dim multiples of {block} "
                        f"(e.g. dim=256, ffn_dim=512) or a mix such as Q4_K_M, which falls back per tensor"
                    )
            plan.append(TensorSpec(name, shape, qtype, "matrix"))

    add(MODEL_TENSOR.TOKEN_EMBD, "weight", (c.vocab_size, c.dim))
    if c.rope_scaling and c.rope_scaling.get("type") == "llama3":
        add(MODEL_TENSOR.ROPE_FREQS, "weight", (hd // 2,))
    if c.rope_scaling and c.rope_scaling.get("type") == "longrope":  # Phi-3 128k: per-pair factors
        add(MODEL_TENSOR.ROPE_FACTORS_LONG, "weight", (hd // 2,))
        add(MODEL_TENSOR.ROPE_FACTORS_SHORT, "weight", (hd // 2,))
    for i in range(c.n_layers):
        add(MODEL_TENSOR.ATTN_NORM, "weight", (c.dim,), i)
        if arch == "phi3":
            add(MODEL_TENSOR.ATTN_QKV, "weight", (q_rows + 2 * kv_rows, c.dim), i)
        else:
            add(MODEL_TENSOR.ATTN_Q, "weight", (q_rows, c.dim), i)
            add(MODEL_TENSOR.ATTN_K, "weight", (kv_rows, c.dim), i)
            add(MODEL_TENSOR.ATTN_V, "weight", (kv_rows, c.dim), i)
        if arch == "qwen2":
            add(MODEL_TENSOR.ATTN_Q, "bias", (q_rows,), i)
            add(MODEL_TENSOR.ATTN_K, "bias", (kv_rows,), i)
            add(MODEL_TENSOR.ATTN_V, "bias", (kv_rows,), i)
        if arch in ("qwen3", "gemma3"):
            add(MODEL_TENSOR.ATTN_Q_NORM, "weight", (hd,), i)
            add(MODEL_TENSOR.ATTN_K_NORM, "weight", (hd,), i)
        add(MODEL_TENSOR.ATTN_OUT, "weight", (c.dim, q_rows), i)
        if arch == "gemma3":
            add(MODEL_TENSOR.ATTN_POST_NORM, "weight", (c.dim,), i)
            add(MODEL_TENSOR.FFN_PRE_NORM, "weight", (c.dim,), i)
        else:
            add(MODEL_TENSOR.FFN_NORM, "weight", (c.dim,), i)
        if arch == "phi3":
            add(MODEL_TENSOR.FFN_UP, "weight", (2 * c.ffn_dim, c.dim), i)  # gate rows, then up rows
        else:
            add(MODEL_TENSOR.FFN_GATE, "weight", (c.ffn_dim, c.dim), i)
            add(MODEL_TENSOR.FFN_UP, "weight", (c.ffn_dim, c.dim), i)
        add(MODEL_TENSOR.FFN_DOWN, "weight", (c.dim, c.ffn_dim), i)
        if arch == "gemma3":
            add(MODEL_TENSOR.FFN_POST_NORM, "weight", (c.dim,), i)
    add(MODEL_TENSOR.OUTPUT_NORM, "weight", (c.dim,))
    if not c.tied:
        add(MODEL_TENSOR.OUTPUT, "weight", (c.vocab_size, c.dim))
    return plan


# ---- random tensor data ------------------------------------------------------------------

def _set_f16(blocks: np.ndarray, offset: int, values: np.ndarray) -> None:
    blocks[:, offset:offset + 2] = values.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _random_blocks(qtype: QType, n_blocks: int, rng: np.random.Generator, scale: float) -> np.ndarray:
    """`n_blocks` random blocks of `qtype` (uint8, one row per block); fp16 scales ~ `scale`.

    Offsets follow ggml's block structs (ggml-common.h). Quant bits and sub-scales are random
    bytes; the per-block fp16 fields are overwritten with finite values: d = scale * U(0.5, 1.5)
    (varied so a kernel reading the wrong block's scale shows), and a minimum, where the type
    has one, that centres the block's values on zero.
    """
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    blocks = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    d = scale * rng.uniform(0.5, 1.5, n_blocks).astype(np.float32)
    if qtype in (QType.Q4_0, QType.Q5_0, QType.Q8_0, QType.IQ4_NL, QType.IQ4_XS):
        _set_f16(blocks, 0, d)  # d first; signed codes, no minimum
    elif qtype in (QType.Q4_1, QType.Q5_1):
        mid = 7.5 if qtype == QType.Q4_1 else 15.5  # value = q * d + m, q in [0, 2^bits)
        _set_f16(blocks, 0, d)
        _set_f16(blocks, 2, -mid * d)
    elif qtype == QType.Q2_K:
        # scales[16] (low nibble scale, high nibble min), qs[64], d, dmin.
        # value = d * sc * q - dmin * mn, q in 0..3: with mn == sc and dmin = 1.5 d, centred.
        nibble = blocks[:, 0:16] & 0x0F
        blocks[:, 0:16] = nibble | (nibble << 4)
        _set_f16(blocks, 80, d)
        _set_f16(blocks, 82, 1.5 * d)
    elif qtype == QType.Q3_K:
        _set_f16(blocks, 108, d)  # hmask[32], qs[64], scales[12] (6-bit, signed by -32), d
    elif qtype in (QType.Q4_K, QType.Q5_K):
        # d, dmin, scales[12], (qh[32]), qs: eight 6-bit (scale, min) pairs packed in 12 bytes.
        # Bytes 4..7 := bytes 0..3 and equal nibbles in bytes 8..11 make every min equal its
        # scale; dmin = mid * d then centres each sub-block.
        blocks[:, 8:12] = blocks[:, 4:8]
        nibble = blocks[:, 12:16] & 0x0F
        blocks[:, 12:16] = nibble | (nibble << 4)
        _set_f16(blocks, 0, d)
        _set_f16(blocks, 2, (7.5 if qtype == QType.Q4_K else 15.5) * d)
    elif qtype == QType.Q6_K:
        _set_f16(blocks, 208, d)  # ql[128], qh[64], scales[16] (int8), d
    else:
        raise ValueError(f"no random block layout for {qtype.name}")
    return blocks


_UNIT_STD: dict[QType, float] = {}


def _unit_std(qtype: QType) -> float:
    """Std of dequantized random blocks with scale 1 (measured once with gguf's dequantizer)."""
    if qtype not in _UNIT_STD:
        block = gguf.GGML_QUANT_SIZES[qtype][0]
        sample = _random_blocks(qtype, 65536 // block, np.random.default_rng(0), 1.0)
        _UNIT_STD[qtype] = float(gguf.quants.dequantize(sample.reshape(1, -1), qtype).std())
    return _UNIT_STD[qtype]


def _llama3_rope_factors(config: ModelConfig) -> np.ndarray:
    # As llama.cpp's convert_hf_to_gguf writes rope_freqs for Llama 3.1+ (one factor per pair).
    s = config.rope_scaling or {}
    factor = float(s.get("factor", 8.0))
    low, high = float(s.get("low_freq_factor", 1.0)), float(s.get("high_freq_factor", 4.0))
    old_ctx = float(s.get("original_context_length", 8192))
    hd = config.head_size
    freqs = 1.0 / config.rope_base ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    wavelen = 2 * np.pi / freqs
    smooth = (old_ctx / wavelen - low) / (high - low)
    factors = np.where(wavelen < old_ctx / high, 1.0,
                       np.where(wavelen > old_ctx / low, factor, 1.0 / ((1 - smooth) / factor + smooth)))
    return factors.astype(np.float32)


def _tensor_data(spec: TensorSpec, config: ModelConfig, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
    if spec.kind == "rope_freqs":
        return _llama3_rope_factors(config)
    if spec.kind in ("rope_factors_long", "rope_factors_short"):  # as Phi-3's: ~1 short, up to tens long
        n = config.head_size // 2
        top = 20.0 if spec.kind == "rope_factors_long" else 1.5
        return np.geomspace(1.0, top, n).astype(np.float32)
    if spec.kind == "norm":
        return (1.0 + 0.1 * rng.standard_normal(spec.shape, dtype=np.float32)).astype(np.float32)
    if spec.kind == "bias" or spec.qtype in (QType.F32, QType.F16, QType.BF16):
        values = rng.standard_normal(spec.shape, dtype=np.float32)
        values *= WEIGHT_STD
        if spec.qtype == QType.F16:
            return values.astype(np.float16)
        if spec.qtype == QType.BF16:
            return gguf.quants.quantize(values, QType.BF16)  # uint8, byte shape
        return values
    block = gguf.GGML_QUANT_SIZES[spec.qtype][0]
    rows, row = spec.shape
    blocks = _random_blocks(spec.qtype, rows * row // block, rng, WEIGHT_STD / _unit_std(spec.qtype))
    return blocks.reshape(rows, -1)


# ---- tokenizer ---------------------------------------------------------------------------

_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _bpe_vocab(vocab_size: int) -> tuple[list[str], list[str], list[int]]:
    """(tokens, merges, token types) of a synthetic byte-level BPE vocabulary.

    Tokens 0..255 are the bytes (GPT-2 spelling); then one token per merge; the special tokens
    last. Merges join tokens in order of a priority alphabet (space, lowercase, uppercase,
    digits, punctuation, other bytes): first all pairs of its first k characters for growing k,
    then longer tokens extended by one character. Every merge's parts precede its result.
    """
    b2u = gpt2_byte_alphabet()
    tokens = [b2u[b] for b in range(256)]
    order = (b" " + bytes(range(ord("a"), ord("z") + 1)) + bytes(range(ord("A"), ord("Z") + 1))
             + bytes(range(ord("0"), ord("9") + 1)))
    order += bytes(b for b in range(33, 127) if b not in order)
    order += bytes(b for b in range(256) if b not in order)
    alphabet = [b2u[b] for b in order]
    n_merges = vocab_size - 256 - len(_SPECIAL_TOKENS)
    merges: list[str] = []
    seen = set(tokens)

    def extend(lefts: Sequence[str]) -> list[str]:
        made: list[str] = []
        # (i, j) ordered by max(i, j): the first k*k merges use only the first k left/right parts.
        for k in range(max(len(lefts), len(alphabet))):
            pairs = [(i, k) for i in range(min(k + 1, len(lefts)))] if k < len(alphabet) else []
            pairs += [(k, j) for j in range(min(k, len(alphabet)))] if k < len(lefts) else []
            for i, j in pairs:
                if len(merges) == n_merges:
                    return made
                left, right = lefts[i], alphabet[j]
                token = left + right
                if token not in seen:
                    seen.add(token)
                    merges.append(f"{left} {right}")
                    made.append(token)
        return made

    frontier = alphabet
    while len(merges) < n_merges:
        frontier = extend(frontier)
    tokens += [m.replace(" ", "") for m in merges]
    tokens += list(_SPECIAL_TOKENS)
    n_normal = vocab_size - len(_SPECIAL_TOKENS)
    types = [int(gguf.TokenType.NORMAL)] * n_normal + [int(gguf.TokenType.CONTROL)] * len(_SPECIAL_TOKENS)
    return tokens, merges, types


# ---- writer ------------------------------------------------------------------------------

def _file_type(tensor_type: QType | str) -> int | None:
    if isinstance(tensor_type, str):
        return int(gguf.LlamaFileType[f"MOSTLY_{tensor_type}"])
    by_name = {"F32": "ALL_F32", "Q3_K": "MOSTLY_Q3_K_M", "Q4_K": "MOSTLY_Q4_K_S", "Q5_K": "MOSTLY_Q5_K_S"}
    name = by_name.get(tensor_type.name, f"MOSTLY_{tensor_type.name}")
    return int(gguf.LlamaFileType[name]) if name in gguf.LlamaFileType.__members__ else None


def _write_metadata(writer: gguf.GGUFWriter, arch: str, config: ModelConfig, wanted: QType | str) -> None:
    c = config
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(c.name)
    file_type = _file_type(wanted)
    if file_type is not None:
        writer.add_file_type(file_type)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_context_length(c.context_length)
    writer.add_embedding_length(c.dim)
    writer.add_block_count(c.n_layers)
    writer.add_feed_forward_length(c.ffn_dim)
    writer.add_head_count(c.n_heads)
    writer.add_head_count_kv(c.n_kv_heads)
    writer.add_layer_norm_rms_eps(c.rms_eps)
    writer.add_rope_freq_base(c.rope_base)
    writer.add_rope_dimension_count(c.head_size)
    writer.add_vocab_size(c.vocab_size)
    if arch in ("qwen3", "gemma3") or c.head_size * c.n_heads != c.dim:
        writer.add_key_length(c.head_size)
        writer.add_value_length(c.head_size)
    if arch == "gemma3":
        writer.add_sliding_window(c.sliding_window)
        writer.add_float32(gguf.Keys.Rope.FREQ_BASE_SWA.format(arch=arch), c.rope_base_swa)
    elif c.window:
        writer.add_sliding_window(c.window)
    scaling = c.rope_scaling or {}
    if scaling.get("type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(scaling["factor"]))
    elif scaling.get("type") == "longrope":
        orig = int(scaling["original_context_length"])
        factor = c.context_length / orig
        writer.add_uint32(gguf.Keys.Rope.SCALING_ORIG_CTX_LEN.format(arch=arch), orig)
        writer.add_float32(gguf.Keys.Rope.SCALING_ATTN_FACTOR.format(arch=arch),
                           float(np.sqrt(1 + np.log(factor) / np.log(orig))) if factor > 1 else 1.0)
    elif scaling and scaling.get("type") != "llama3":
        raise ValueError(f"rope_scaling type {scaling.get('type')!r} is not supported; use 'llama3', 'linear' or 'longrope'")

    tokens, merges, types = _bpe_vocab(c.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2" if arch.startswith("qwen") else "llama-bpe")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    special = {t: tokens.index(t, c.vocab_size - len(_SPECIAL_TOKENS)) for t in _SPECIAL_TOKENS}
    writer.add_bos_token_id(special["<|endoftext|>"])
    writer.add_eos_token_id(special["<|im_end|>"])
    writer.add_pad_token_id(special["<|endoftext|>"])
    writer.add_add_bos_token(False)
    writer.add_chat_template(_CHAT_TEMPLATE)


def write_random_model(
    path: str | os.PathLike[str],
    arch: str = "llama",
    preset: str = "tiny",
    tensor_type: str | QType = "F32",
    seed: int = 0,
    *,
    split_max_tensors: int = 0,
    progress: Callable[[str], None] | None = None,
    **overrides: Any,
) -> pathlib.Path:
    """Write a random-weight GGUF model and return its path.

    `arch`: one of ARCHITECTURES; `preset`: one of PRESETS (shapes of real models, or "tiny");
    `tensor_type`: a type name from TENSOR_TYPES (every matrix in it) or a mix from MIXES;
    `overrides`: any ModelConfig field, e.g. ``n_kv_heads=1, tied=False``.
    `split_max_tensors` > 0 writes a split model as llama.cpp's gguf-split does
    (``<stem>-00001-of-0000N.gguf`` ..., at most that many tensors per shard) and returns the
    first shard's path. Files are written in a temporary folder and moved in when complete.
    """
    config = model_config(arch, preset, **overrides)
    wanted = _parse_tensor_type(tensor_type)
    plan = tensor_plan(arch, config, wanted)
    target = pathlib.Path(path)
    work = pathlib.Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    partial = work / target.name

    writer = gguf.GGUFWriter(partial, gguf.MODEL_ARCH_NAMES[ARCHITECTURES[arch]], split_max_tensors=split_max_tensors)
    _write_metadata(writer, arch, config, wanted)
    for spec in plan:
        if spec.qtype in (QType.F32, QType.F16):
            dtype = np.float32 if spec.qtype == QType.F32 else np.float16
            writer.add_tensor_info(spec.name, spec.shape, np.dtype(dtype), spec.nbytes)
        else:  # raw blocks: pass the byte shape, the writer derives the element shape
            byte_shape = gguf.quant_shape_to_byte_shape(spec.shape, spec.qtype)
            writer.add_tensor_info(spec.name, byte_shape, np.dtype(np.uint8), spec.nbytes, raw_dtype=spec.qtype)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for i, spec in enumerate(plan):
            if progress:
                progress(f"[{i + 1}/{len(plan)}] {spec.name} {spec.qtype.name} {list(spec.shape)}")
            writer.write_tensor_data(_tensor_data(spec, config, seed))
        writer.close()
        written = sorted(work.iterdir())
        for file in written:
            os.replace(file, target.with_name(file.name))
    finally:
        writer.close()
        shutil.rmtree(work, ignore_errors=True)
    return target.with_name(written[0].name)


def truncate_model(src: str | os.PathLike[str], path: str | os.PathLike[str], n_layers: int) -> pathlib.Path:
    """Copy the GGUF `src` keeping only its first `n_layers` blocks (metadata, vocabulary,
    embeddings, output norm and head unchanged; block_count rewritten): a real model small
    enough to carry, for tests that compare backends on real weights.
    """
    reader = gguf.GGUFReader(src)
    arch = str(reader.fields["general.architecture"].contents())
    count_key = f"{arch}.block_count"
    have = int(reader.fields[count_key].contents())
    if not 1 <= n_layers <= have:
        raise ValueError(f"{src} has {have} layers; n_layers must be between 1 and {have}, got {n_layers}")
    target = pathlib.Path(path)
    partial = target.with_name(target.name + ".partial")
    writer = gguf.GGUFWriter(partial, arch)
    try:
        for name, field in reader.fields.items():
            if name.startswith("GGUF.") or name == "general.architecture":
                continue
            vtype = field.types[0]
            value = n_layers if name == count_key else field.contents()
            sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(name, value, vtype, sub_type=sub_type)
        for t in reader.tensors:
            parts = t.name.split(".")
            if parts[0] == "blk" and int(parts[1]) >= n_layers:
                continue
            raw = t.tensor_type not in (QType.F32, QType.F16)
            writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type if raw else None)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(partial, target)
    except BaseException:
        writer.close()
        partial.unlink(missing_ok=True)
        raise
    return target


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m edgerunner.model_builder",
        description="Write a random-weight GGUF model (or a real one cut to its first layers).",
    )
    parser.add_argument("out", type=pathlib.Path, help="output .gguf path")
    parser.add_argument("--arch", default="llama", choices=list(ARCHITECTURES))
    parser.add_argument("--preset", default="tiny", choices=list(PRESETS))
    parser.add_argument("--type", dest="tensor_type", default="F32",
                        help=f"one of {', '.join([t.name for t in TENSOR_TYPES] + list(MIXES))}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split-max-tensors", type=int, default=0, metavar="N",
                        help="write a split model (<stem>-00001-of-0000K.gguf ...) with at most N tensors per shard")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a config field (JSON value), e.g. --set n_kv_heads=1 --set tied=false")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--truncate", type=pathlib.Path, metavar="SRC",
                        help="instead of random weights: copy the GGUF SRC keeping its first --layers blocks")
    parser.add_argument("--layers", type=int, default=2, help="blocks kept by --truncate (default 2)")
    args = parser.parse_args(argv)
    if args.truncate:
        try:
            print(truncate_model(args.truncate, args.out, args.layers))
        except (OSError, ValueError) as exc:
            parser.error(str(exc))
        return 0
    overrides = {}
    for item in args.overrides:
        field, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set needs FIELD=VALUE, got {item!r}")
        overrides[field] = _parse_value(value)
    progress = None if args.quiet else (lambda line: print(line, file=sys.stderr))
    try:
        path = write_random_model(args.out, args.arch, args.preset, args.tensor_type, args.seed,
                                  split_max_tensors=args.split_max_tensors, progress=progress, **overrides)
    except ValueError as exc:
        parser.error(str(exc))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
