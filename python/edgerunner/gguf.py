"""Read GGUF files: ``edgerunner.gguf.open(path)``.

The parsing and every bounds check happen in C++ (``csrc/core/gguf.cpp``); this module gives
the result Python shapes and a human summary. Malformed files raise
:class:`edgerunner.GGUFError` naming the field and byte offset. A split model
(``x-00001-of-0000N.gguf`` ...) opens from its first shard as one file.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from edgerunner import _core
from edgerunner.errors import GGUFError

__all__ = ["GGUFFile", "TensorInfo", "open", "GGUFError"]


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's record. ``shape`` is in GGUF order: ``shape[0]`` is the contiguous row."""

    name: str
    shape: tuple[int, ...]
    type_id: int
    type_name: str
    offset: int  # relative to the data section
    n_bytes: int
    n_elements: int


class GGUFFile:
    """A memory-mapped, validated GGUF file. Tensor data is never copied."""

    def __init__(self, native: Any):
        self._native = native

    @property
    def path(self) -> str:
        return self._native.path

    @property
    def version(self) -> int:
        return self._native.version

    @property
    def alignment(self) -> int:
        return self._native.alignment

    @property
    def data_offset(self) -> int:
        """Byte offset of the data section (tensor offsets are relative to it)."""
        return self._native.data_offset

    @property
    def file_size(self) -> int:
        """Bytes of the model: every shard of a split model."""
        return sum(size for _, size in self.shards)

    @property
    def shards(self) -> list[tuple[str, int]]:
        """``(path, size)`` of each mapped file: one for an ordinary file, every shard of a split
        model (opened from its first shard) in order."""
        return self._native.shards

    @cached_property
    def metadata(self) -> dict[str, Any]:
        """Key -> value in file order. Numeric arrays are read-only numpy views."""
        return self._native.metadata()

    @cached_property
    def metadata_types(self) -> dict[str, Any]:
        """Key -> GGUF value type name, or ``("ARRAY", element type name)``."""
        return self._native.metadata_types()

    @cached_property
    def tensors(self) -> list[TensorInfo]:
        out = []
        for name, shape, type_id, offset, n_bytes, n_elements in self._native.tensors():
            type_name = _core.tensor_type_info(type_id)[0]
            out.append(TensorInfo(name, tuple(shape), type_id, type_name, offset, n_bytes, n_elements))
        return out

    def tensor(self, name: str) -> TensorInfo:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(f"no tensor named {name!r} in {self.path}")

    def tensor_data(self, name: str) -> np.ndarray:
        """The tensor's raw bytes (its blocks as stored) as a read-only uint8 view."""
        return self._native.tensor_data(name)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str | None:
        return self.metadata.get("general.architecture")

    def summary(self) -> dict[str, Any]:
        """What ``edgerunner info`` prints: architecture, sizes, tensor types, tokenizer."""
        md = self.metadata
        arch = self.architecture
        hyper = {}
        for field in ("context_length", "embedding_length", "block_count", "feed_forward_length",
                      "attention.head_count", "attention.head_count_kv", "rope.freq_base",
                      "attention.sliding_window"):
            key = f"{arch}.{field}"
            if key in md:
                value = md[key]
                hyper[field] = value.tolist() if isinstance(value, np.ndarray) else value
        types: Counter[str] = Counter()
        type_bytes: Counter[str] = Counter()
        for t in self.tensors:
            types[t.type_name] += 1
            type_bytes[t.type_name] += t.n_bytes
        tokens = md.get("tokenizer.ggml.tokens")
        return {
            "path": self.path,
            "file_size": self.file_size,
            "shards": len(self.shards),
            "gguf_version": self.version,
            "architecture": arch,
            "name": md.get("general.name"),
            "parameters": sum(t.n_elements for t in self.tensors),
            "tensor_count": len(self.tensors),
            "tensor_bytes": sum(t.n_bytes for t in self.tensors),
            "hyperparameters": hyper,
            "tensor_types": {k: {"count": types[k], "bytes": type_bytes[k]} for k in sorted(types)},
            "tokenizer": {
                "model": md.get("tokenizer.ggml.model"),
                "pre": md.get("tokenizer.ggml.pre"),
                "vocab_size": len(tokens) if tokens is not None else None,
            },
            "chat_template": "tokenizer.chat_template" in md,
        }


def open(path: str | os.PathLike[str]) -> GGUFFile:  # noqa: A001 - mirrors builtins.open on purpose
    """Map and validate a GGUF file. Raises :class:`GGUFError` if it is malformed,
    :class:`FileNotFoundError` if it does not exist."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such file: {path}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a directory; give the path of a .gguf file")
    return GGUFFile(_core.GGUFFile.open(path))
