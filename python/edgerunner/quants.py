"""Tensor quant formats: decode GGUF blocks to float32, encode activations to Q8_0 / Q8_K.

These are the scalar reference implementations from ``csrc/core`` (bit-exact with
``gguf.quants.dequantize``), meant for inspecting weights and for testing kernels::

    from edgerunner import quants
    w = quants.dequantize(gguf_file.tensor_data("blk.0.attn_q.weight"), "Q4_K")
"""

from __future__ import annotations

import numpy as np

from edgerunner import _core

__all__ = ["dequantize", "quantize_q8_0", "quantize_q8_k", "type_id", "dequantizable_types"]


def type_id(tensor_type: str | int) -> int:
    """The ggml/GGUF type id for a name such as ``"Q4_K"`` (any case) or an id (returned as is).

    Raises:
        ValueError: the name or id is not a known ggml type.
    """
    if isinstance(tensor_type, str):
        names = _core.tensor_type_names()
        tid = names.get(tensor_type.upper())
        if tid is None:
            raise ValueError(f"unknown tensor type {tensor_type!r}; known: {', '.join(names)}")
        return tid
    tid = int(tensor_type)  # also takes gguf.GGMLQuantizationType members
    if _core.tensor_type_info(tid) is None:
        raise ValueError(f"unknown tensor type id {tid}")
    return tid


def dequantizable_types() -> list[str]:
    """Names of the types :func:`dequantize` supports in this build."""
    names = _core.tensor_type_names()
    return [name for name, tid in names.items() if _core.tensor_type_info(tid)[3]]


def dequantize(data: np.ndarray | bytes, tensor_type: str | int) -> np.ndarray:
    """Decode raw tensor bytes of ``tensor_type`` to a 1-D float32 array.

    Args:
        data: the tensor's bytes (a uint8 array, any contiguous array viewed as bytes, or
            ``bytes``); the length must be a whole number of blocks.
        tensor_type: a type name (``"Q4_K"``) or ggml/GGUF type id (``12``).

    Returns:
        float32 array of ``len(data) // type_size * block_size`` elements, in storage order.

    Raises:
        ValueError: unknown or non-dequantizable type, or a length that is not whole blocks.
    """
    tid = type_id(tensor_type)
    name, block_size, type_size, _ = _core.tensor_type_info(tid)
    if isinstance(data, (bytes, bytearray, memoryview)):
        raw = np.frombuffer(data, dtype=np.uint8)
    else:
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if raw.size % type_size != 0:
        raise ValueError(
            f"{name} data has {raw.size} bytes, which is not a whole number of "
            f"{type_size}-byte blocks ({block_size} elements each)"
        )
    return _core.dequantize(tid, raw, raw.size // type_size * block_size)


def _as_float32_row(x: np.ndarray, block_size: int, name: str) -> np.ndarray:
    row = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if row.size % block_size != 0:
        raise ValueError(f"cannot quantize {row.size} values to {name}: the length must be a multiple of {block_size}")
    return row


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """Quantize float values (flattened; length a multiple of 32) to Q8_0 blocks, as uint8.

    Bit-exact with ``gguf.quants.quantize(x, GGMLQuantizationType.Q8_0)``.
    """
    return _core.quantize_q8_0(_as_float32_row(x, 32, "Q8_0"))


def quantize_q8_k(x: np.ndarray) -> np.ndarray:
    """Quantize float values (flattened; length a multiple of 256) to Q8_K blocks, as uint8.

    Same arithmetic as ggml's ``quantize_row_q8_K_ref``: per 256 values, the one of largest
    magnitude maps to -127; the block holds ``d`` (float32), 256 int8 quants and 16 int16 sums.
    """
    return _core.quantize_q8_k(_as_float32_row(x, 256, "Q8_K"))
