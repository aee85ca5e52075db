"""Hand-assembled GGUF bytes for the hostile-input tests.

The gguf package's writer refuses to write most malformed files, so the tests build them
byte by byte here and record where each field starts, to check the offsets in error messages.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

# GGUF value type ids
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)


def string(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


@dataclass
class KV:
    key: str | bytes
    vtype: int
    payload: bytes  # the encoded value, after the type id

    def encode(self) -> bytes:
        return string(self.key) + u32(self.vtype) + self.payload


@dataclass
class Tensor:
    name: str | bytes
    shape: list[int]
    type_id: int
    offset: int

    def encode(self) -> bytes:
        return (string(self.name) + u32(len(self.shape)) + b"".join(u64(d) for d in self.shape)
                + u32(self.type_id) + u64(self.offset))


@dataclass
class Layout:
    """Where things start in the assembled file."""

    kv_offsets: list[int] = field(default_factory=list)
    tensor_offsets: list[int] = field(default_factory=list)
    data_offset: int = 0


def assemble(kvs: list[KV], tensors: list[Tensor], data: bytes = b"", *, alignment: int = 32,
             version: int = 3, magic: bytes = b"GGUF", tensor_count: int | None = None,
             kv_count: int | None = None) -> tuple[bytes, Layout]:
    layout = Layout()
    out = bytearray(magic + u32(version))
    out += u64(len(tensors) if tensor_count is None else tensor_count)
    out += u64(len(kvs) if kv_count is None else kv_count)
    for kv in kvs:
        layout.kv_offsets.append(len(out))
        out += kv.encode()
    for t in tensors:
        layout.tensor_offsets.append(len(out))
        out += t.encode()
    pad = (-len(out)) % alignment
    out += b"\0" * pad
    layout.data_offset = len(out)
    out += data
    return bytes(out), layout


def f32_tensor(name: str, n: int, offset: int) -> Tensor:
    return Tensor(name, [n], 0, offset)


def valid_file() -> tuple[bytes, Layout]:
    """A small well-formed file: a few metadata kinds and two F32 tensors."""
    kvs = [
        KV("general.architecture", STRING, string("llama")),
        KV("general.alignment", UINT32, u32(32)),
        KV("test.array", ARRAY, u32(INT32) + u64(3) + struct.pack("<3i", 1, -2, 3)),
        KV("test.strings", ARRAY, u32(STRING) + u64(2) + string("a") + string("béta")),
    ]
    tensors = [f32_tensor("a", 8, 0), f32_tensor("b", 4, 32)]
    data = struct.pack("<8f", *range(8)) + struct.pack("<4f", *range(4))
    return assemble(kvs, tensors, data)
