"""The GGUF reader against the gguf package's reader, and on hostile input."""

from __future__ import annotations

import random
import struct

import gguf as ggufpkg
import numpy as np
import pytest

import edgerunner
from edgerunner import gguf
from gguf_bytes import (ARRAY, BOOL, FLOAT32, INT32, KV, STRING, UINT8, UINT32, UINT64, Tensor, assemble,
                        f32_tensor, string, u32, u64, valid_file)


def flatten(value):
    if isinstance(value, list) and value and isinstance(value[0], (list, np.ndarray)):
        return [x for v in value for x in flatten(v)]
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def assert_same_as_gguf_reader(path):
    """Every key, value type, value and tensor info equals what gguf.GGUFReader reads."""
    ours = gguf.open(path)
    ref = ggufpkg.GGUFReader(path)
    ref_fields = {k: f for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert list(ours.metadata) == list(ref_fields), "keys or their order differ"
    assert ours.version == ref.fields["GGUF.version"].contents()
    for key, field in ref_fields.items():
        ref_types = [ggufpkg.GGUFValueType(t).name for t in field.types]
        our_type = ours.metadata_types[key]
        our_types = [our_type] if isinstance(our_type, str) else list(our_type)
        assert our_types == ref_types[: len(our_types)], key
        ref_value = field.contents()
        our_value = flatten(ours.metadata[key])
        assert our_value == ref_value, key  # float32 values widen to the same double on both sides
    assert ours.alignment == ref.alignment
    assert len(ours.tensors) == len(ref.tensors)
    for t, r in zip(ours.tensors, ref.tensors):
        assert t.name == r.name
        assert list(t.shape) == [int(d) for d in r.shape]
        assert t.type_id == int(r.tensor_type)
        assert ours.data_offset + t.offset == r.data_offset
        assert t.n_bytes == r.n_bytes
        assert t.n_elements == r.n_elements
    return ours, ref


def write_all_value_types(path, rng):
    w = ggufpkg.GGUFWriter(str(path), "llama")
    w.add_uint8("k.u8", int(rng.integers(0, 256)))
    w.add_int8("k.i8", int(rng.integers(-128, 128)))
    w.add_uint16("k.u16", int(rng.integers(0, 2**16)))
    w.add_int16("k.i16", int(rng.integers(-2**15, 2**15)))
    w.add_uint32("k.u32", int(rng.integers(0, 2**32)))
    w.add_int32("k.i32", int(rng.integers(-2**31, 2**31)))
    w.add_float32("k.f32", float(np.float32(rng.normal())))
    w.add_bool("k.bool", bool(rng.integers(0, 2)))
    w.add_string("k.str", "héllo wörld ✓ 漢字 🙂")
    w.add_string("k.empty", "")
    w.add_uint64("k.u64", int(rng.integers(0, 2**63)) * 2 + 1)
    w.add_int64("k.i64", -int(rng.integers(0, 2**62)))
    w.add_float64("k.f64", float(rng.normal()))
    w.add_array("k.ints", [int(x) for x in rng.integers(-1000, 1000, size=17)])
    w.add_array("k.floats", [float(np.float32(x)) for x in rng.normal(size=9)])
    w.add_array("k.strings", ["a", "", "ünïcode", "<|im_start|>"])
    w.add_array("k.bools", [True, False, True])
    w.add_array("k.nested", [[1, 2, 3], [4, 5], [6]])
    w.add_array("k.empty_array", [])
    for i, (shape, dtype) in enumerate([((3, 32), np.float32), ((64,), np.float16), ((2, 2, 32), np.float32)]):
        w.add_tensor(f"t{i}", rng.normal(size=shape).astype(dtype))
    w.add_tensor("q", rng.integers(0, 255, size=(4, 2 * 18), dtype=np.uint8),
                 raw_dtype=ggufpkg.GGMLQuantizationType.Q4_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_every_value_type_matches_gguf_reader(tmp_path):
    seed = random.randrange(2**32)
    path = tmp_path / "all.gguf"
    write_all_value_types(path, np.random.default_rng(seed))
    ours, ref = assert_same_as_gguf_reader(path)
    for r in ref.tensors:
        assert np.array_equal(ours.tensor_data(r.name), np.asarray(r.data).view(np.uint8).reshape(-1)), r.name
    assert ours.metadata["k.nested"][1].tolist() == [4, 5]
    assert isinstance(ours.metadata["k.bool"], bool)


def test_tensor_data_is_a_readonly_view_that_outlives_the_file(tmp_path):
    path = tmp_path / "v.gguf"
    write_all_value_types(path, np.random.default_rng(0))
    data = gguf.open(path).tensor_data("t0")  # the GGUFFile object is gone after this line
    assert not data.flags.writeable
    expected = np.asarray(ggufpkg.GGUFReader(path).get_tensor(0).data).view(np.uint8).reshape(-1)
    assert np.array_equal(data, expected)
    with pytest.raises(ValueError):
        data[0] = 1


def test_custom_alignment(tmp_path):
    path = tmp_path / "a.gguf"
    w = ggufpkg.GGUFWriter(str(path), "llama")
    w.data_alignment = 64
    w.add_custom_alignment(64)
    for i in range(3):
        w.add_tensor(f"t{i}", np.full((5 + i,), i, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ours, _ = assert_same_as_gguf_reader(path)
    assert ours.alignment == 64
    assert all(t.offset % 64 == 0 for t in ours.tensors)


def _write_split(folder, tensors_per_shard=2):
    """Six tensors in shards as gguf-split writes them (metadata in the first shard only)."""
    w = ggufpkg.GGUFWriter(folder / "m.gguf", "llama", split_max_tensors=tensors_per_shard)
    w.add_string("general.name", "split")
    arrays = {f"t{i}": np.full((8 + i,), i, dtype=np.float32) for i in range(6)}
    for name, array in arrays.items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sorted(folder.glob("m-*.gguf")), arrays


def test_split_model_opens_from_its_first_shard(tmp_path):
    shards, arrays = _write_split(tmp_path)
    assert [p.name for p in shards] == ["m-00001-of-00003.gguf", "m-00002-of-00003.gguf", "m-00003-of-00003.gguf"]
    f = gguf.open(shards[0])
    assert f.shards == [(str(p), p.stat().st_size) for p in shards]
    assert f.file_size == sum(p.stat().st_size for p in shards) and f.summary()["shards"] == 3
    assert [t.name for t in f.tensors] == list(arrays)
    for name, array in arrays.items():  # each tensor's bytes from its own shard's mapping
        assert np.array_equal(f.tensor_data(name).view(np.float32), array)
    assert f.metadata["general.name"] == "split"


def test_split_model_errors(tmp_path):
    shards, _ = _write_split(tmp_path)
    with pytest.raises(edgerunner.GGUFError, match="shard 2 of 3 of a split model; open the first shard, .*"
                                                   "m-00001-of-00003.gguf"):
        gguf.open(shards[1])
    renamed = tmp_path / "renamed.gguf"
    renamed.write_bytes(shards[0].read_bytes())
    with pytest.raises(edgerunner.GGUFError, match="does not end in '-00001-of-00003.gguf'"):
        gguf.open(renamed)
    shards[2].rename(tmp_path / "elsewhere.gguf")
    with pytest.raises(edgerunner.GGUFError, match=r"shard 3 of 3 \(.*m-00003-of-00003.gguf\) cannot be opened "
                                                   r"\(No such file or directory\); a split model needs all"):
        gguf.open(shards[0])
    (tmp_path / "elsewhere.gguf").rename(shards[2])
    shards[1].write_bytes(shards[0].read_bytes())  # shard 2 replaced by a copy of shard 1
    with pytest.raises(edgerunner.GGUFError, match="m-00002-of-00003.gguf is not shard 2 of 3"):
        gguf.open(shards[0])


def test_version_2_is_read():
    data, _ = assemble([KV("general.architecture", STRING, string("llama"))], [f32_tensor("t", 4, 0)],
                       b"\0" * 16, version=2)
    path = _write(data)
    assert gguf.open(path).version == 2


def test_summary(tmp_path):
    path = tmp_path / "s.gguf"
    write_all_value_types(path, np.random.default_rng(1))
    s = gguf.open(path).summary()
    assert s["architecture"] == "llama"
    assert s["tensor_types"]["Q4_0"] == {"count": 1, "bytes": 4 * 36}
    assert s["tensor_types"]["F32"]["count"] == 2
    assert s["parameters"] == 3 * 32 + 64 + 2 * 2 * 32 + 4 * 64
    assert s["chat_template"] is False


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        gguf.open(tmp_path / "nope.gguf")
    with pytest.raises(IsADirectoryError):
        gguf.open(tmp_path)


# ---------------------------------------------------------------- hostile input

_counter = [0]
_scratch: list = []  # this module's pytest temp folder, set by the fixture below


@pytest.fixture(autouse=True, scope="module")
def _scratch_dir(tmp_path_factory):
    _scratch.append(tmp_path_factory.mktemp("hostile"))
    yield
    _scratch.pop()


def _write(data: bytes) -> str:
    _counter[0] += 1
    path = _scratch[-1] / f"m{_counter[0]}.gguf"
    path.write_bytes(data)
    return str(path)


def expect_error(data: bytes, field: str, offset: int | None, message: str):
    with pytest.raises(edgerunner.GGUFError) as info:
        gguf.open(_write(data))
    err = info.value
    assert isinstance(err, ValueError)
    assert field in err.field, (err.field, str(err))
    if offset is not None:
        assert err.offset == offset, str(err)
        assert f"offset {offset}" in str(err)
    assert message in str(err), str(err)
    return err


ARCH = KV("general.architecture", STRING, string("llama"))


def test_valid_fixture_parses():
    data, layout = valid_file()
    f = gguf.open(_write(data))
    assert [t.name for t in f.tensors] == ["a", "b"]
    assert np.array_equal(f.tensor_data("b").view(np.float32), np.arange(4, dtype=np.float32))
    assert f.metadata["test.strings"] == ["a", "béta"]


def test_wrong_magic():
    data, _ = valid_file()
    expect_error(b"GGML" + data[4:], "magic", 0, "not a GGUF file")


def test_empty_file():
    expect_error(b"", "magic", 0, "truncated")


@pytest.mark.parametrize("version,message", [(1, "version 1 is obsolete"), (4, "unsupported GGUF version 4"),
                                             (0x03000000, "big-endian")])
def test_bad_version(version, message):
    data, _ = valid_file()
    expect_error(data[:4] + u32(version) + data[8:], "version", 4, message)


def test_every_truncation_raises():
    data, _ = valid_file()
    for n in range(len(data)):
        with pytest.raises(edgerunner.GGUFError):
            gguf.open(_write(data[:n]))


def test_absurd_counts():
    expect_error(assemble([ARCH], [], kv_count=2**62)[0], "metadata_kv_count", 16, "cannot fit")
    expect_error(assemble([ARCH], [], tensor_count=2**40)[0], "tensor_count", 8, "cannot fit")


def test_absurd_string_length():
    kv = KV("k", STRING, u64(2**63) + b"abc")
    data, layout = assemble([kv], [])
    expect_error(data, "metadata 'k'", layout.kv_offsets[0] + 8 + 1 + 4, "runs past the end")


def test_absurd_array_count():
    kv = KV("k", ARRAY, u32(UINT64) + u64(2**61) + u64(1))
    data, layout = assemble([kv], [])
    expect_error(data, "metadata 'k' element count", layout.kv_offsets[0] + 13 + 4, "cannot fit")


def test_unknown_value_type():
    data, layout = assemble([KV("k", 13, u32(0))], [])
    expect_error(data, "metadata 'k' type", layout.kv_offsets[0] + 9, "unknown value type 13")


def test_bool_out_of_range():
    data, layout = assemble([KV("k", BOOL, bytes([2]))], [])
    expect_error(data, "metadata 'k'", layout.kv_offsets[0] + 13, "neither 0 nor 1")


def test_nested_array_depth_limit():
    payload = b""
    for _ in range(20):
        payload += u32(ARRAY) + u64(1)
    payload += u32(UINT8) + u64(0)
    data, _ = assemble([KV("deep", ARRAY, payload)], [])
    expect_error(data, "metadata 'deep'", None, "nested deeper")


@pytest.mark.parametrize("bad", [b"\xff\xfe", b"\xc0\xaf", b"\xed\xa0\x80", b"abc\xe2\x82"])
def test_bad_utf8(bad):
    data, layout = assemble([KV(b"key" + bad, UINT8, b"\0")], [])
    expect_error(data, "metadata key #0", layout.kv_offsets[0], "not valid UTF-8")
    data, layout = assemble([KV("k", STRING, string(b"v" + bad))], [])
    expect_error(data, "metadata 'k'", layout.kv_offsets[0] + 13, "not valid UTF-8")
    data, layout = assemble([ARCH], [Tensor(b"t" + bad, [4], 0, 0)], b"\0" * 16)
    expect_error(data, "tensor #0 name", layout.tensor_offsets[0], "not valid UTF-8")


def test_duplicate_key_and_tensor():
    data, layout = assemble([ARCH, ARCH], [])
    expect_error(data, "metadata key 'general.architecture'", layout.kv_offsets[1], "duplicate key")
    data, layout = assemble([ARCH], [f32_tensor("t", 4, 0), f32_tensor("t", 4, 32)], b"\0" * 48)
    expect_error(data, "tensor 't'", layout.tensor_offsets[1], "duplicate tensor name")


@pytest.mark.parametrize("alignment_kv,message", [
    (KV("general.alignment", UINT32, u32(0)), "not a power of two"),
    (KV("general.alignment", UINT32, u32(48)), "not a power of two"),
    (KV("general.alignment", UINT64, u64(32)), "must be UINT32"),
])
def test_bad_alignment(alignment_kv, message):
    data, layout = assemble([ARCH, alignment_kv], [])
    expect_error(data, "general.alignment", layout.kv_offsets[1], message)


def test_bad_dimensions():
    for dims, message in [([], "0 dimensions"), ([1, 1, 1, 1, 1], "5 dimensions")]:
        data, layout = assemble([ARCH], [Tensor("t", dims, 0, 0)], b"\0" * 32)
        expect_error(data, "tensor 't' n_dims", layout.tensor_offsets[0] + 9, message)
    data, layout = assemble([ARCH], [Tensor("t", [4, 0], 0, 0)], b"\0" * 32)
    expect_error(data, "tensor 't' shape", layout.tensor_offsets[0] + 9 + 4 + 8, "dimension 1 is zero")


def test_shape_overflow():
    data, layout = assemble([ARCH], [Tensor("t", [2**32, 2**32, 2**8], 0, 0)], b"\0" * 32)
    expect_error(data, "tensor 't' shape", None, "overflows")
    data, layout = assemble([ARCH], [Tensor("t", [2**61, 4], 0, 0)], b"\0" * 32)
    expect_error(data, "tensor 't' shape", None, "overflows")


def test_unknown_tensor_type():
    data, layout = assemble([ARCH], [Tensor("t", [32], 99, 0)], b"\0" * 64)
    expect_error(data, "tensor 't' type", layout.tensor_offsets[0] + 9 + 4 + 8, "unknown tensor type id 99")


def test_row_not_a_block_multiple():
    data, layout = assemble([ARCH], [Tensor("t", [33], 2, 0)], b"\0" * 64)  # Q4_0 blocks are 32
    expect_error(data, "tensor 't' shape", layout.tensor_offsets[0] + 9, "not a multiple of Q4_0's block size 32")


def test_misaligned_offset():
    data, layout = assemble([ARCH], [f32_tensor("t", 4, 8)], b"\0" * 64)
    expect_error(data, "tensor 't' offset", layout.tensor_offsets[0] + 9 + 4 + 8 + 4, "not a multiple of the alignment 32")


def test_data_past_end():
    data, layout = assemble([ARCH], [f32_tensor("t", 64, 0)], b"\0" * 100)
    expect_error(data, "tensor 't' data", layout.tensor_offsets[0], "runs past the end")
    data, layout = assemble([ARCH], [f32_tensor("t", 4, 2**63)], b"\0" * 100)
    expect_error(data, "tensor 't' data", layout.tensor_offsets[0], "runs past the end")


def test_overlapping_tensors():
    data, layout = assemble([ARCH], [f32_tensor("a", 16, 0), f32_tensor("b", 16, 32)], b"\0" * 128)
    expect_error(data, "tensor 'b' data", layout.tensor_offsets[1], "overlaps tensor 'a'")


def test_data_section_missing():
    data, layout = assemble([ARCH], [f32_tensor("t", 4, 0)])
    expect_error(data[: layout.data_offset - 5], "data section", None, "before the data section")


def test_random_mutations_never_crash():
    """Byte flips, insertions and truncations of a valid file: parse or GGUFError, nothing else."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    base, _ = valid_file()
    outcomes = {"ok": 0, "error": 0}
    for _ in range(400):
        data = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            kind = rng.random()
            pos = rng.randrange(len(data))
            if kind < 0.6:
                data[pos] = rng.randrange(256)
            elif kind < 0.8:
                data[pos:pos + 8] = struct.pack("<Q", rng.choice([0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1]))
            else:
                del data[pos:]
                if not data:
                    break
        try:
            f = gguf.open(_write(bytes(data)))
            f.metadata  # noqa: B018 - converting every value must not fail either
            for t in f.tensors:
                f.tensor_data(t.name)
            outcomes["ok"] += 1
        except edgerunner.GGUFError:
            outcomes["error"] += 1
    assert outcomes["error"] > 0, f"seed {seed}"


def test_cli_info(tmp_path, capsys):
    from edgerunner.cli import main

    path = tmp_path / "cli.gguf"
    write_all_value_types(path, np.random.default_rng(2))
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "architecture  llama" in out and "Q4_0" in out and "chat template absent" in out
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\0\0\0" + b"\xff" * 16)
    assert main(["info", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "edgerunner: error:" in err and "offset" in err
