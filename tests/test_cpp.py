"""The static core library from C++ alone: the embedding example and the C++ tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import gguf as ggufpkg
import numpy as np
import pytest


@pytest.fixture(scope="module")
def gguf_summary(cpp_build) -> Path:
    return cpp_build / "examples" / "gguf_summary"


def test_decode_step_allocates_nothing(cpp_build, tmp_path):
    """A counting global operator new around 32 decode steps (append + sample), fast and precise."""
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    write_random_model(path, arch="qwen2", preset="tiny", tensor_type="Q4_K_M", seed=0, dim=256, ffn_dim=512)
    r = subprocess.run([str(cpp_build / "tests" / "cpp" / "decode_no_alloc"), str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fast: allocations during 32 decode steps: 0" in r.stdout
    assert "precise: allocations during 32 decode steps: 0" in r.stdout


def test_example_prints_summary(gguf_summary, tmp_path):
    path = tmp_path / "m.gguf"
    w = ggufpkg.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_context_length(128)
    w.add_token_list(["a", "b", "c"])
    w.add_tokenizer_model("gpt2")
    w.add_tensor("tok_embd.weight", np.zeros((3, 32), dtype=np.float32))
    w.add_tensor("q", np.zeros((4, 18), dtype=np.uint8), raw_dtype=ggufpkg.GGMLQuantizationType.Q4_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = subprocess.run([str(gguf_summary), str(path)], check=True, capture_output=True, text=True).stdout
    assert "architecture: llama" in out
    assert "llama.block_count: 2" in out and "llama.context_length: 128" in out
    assert "tensors: 2, parameters: 224" in out  # 3*32 + 4*32
    assert "Q4_0" in out and "72 bytes" in out
    assert "tokenizer: gpt2, 3 tokens" in out


def test_example_reports_malformed_file(gguf_summary, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\0\0\0" + b"\xff" * 16)
    r = subprocess.run([str(gguf_summary), str(bad)], capture_output=True, text=True)
    assert r.returncode == 1
    assert "metadata_kv_count at offset 16" in r.stderr and "cannot fit" in r.stderr


def test_generate_example_runs_a_model_from_cpp(cpp_build, tmp_path):
    """examples/generate (the static core alone) loads a model, evaluates token ids and samples a
    continuation: the tokens the Python binding's session gives for the same prompt and sampler
    (greedy, and seeded at temperature 0.8); bad options and inputs are refused with the reason."""
    from edgerunner import _core
    from edgerunner.model_builder import write_random_model

    exe = cpp_build / "examples" / "generate"
    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q4_0", seed=2)
    prompt = [5, 9, 200, 17]
    model = _core.Model.load(str(path), backend="cpu")
    for flags, sampler in (([], dict()), (["--temperature", "0.8", "--seed", "7"], dict(temperature=0.8, seed=7))):
        r = subprocess.run([str(exe), str(path), "--tokens", ",".join(map(str, prompt)), "-n", "12", "--backend", "cpu", *flags],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        session = _core.Session(model)
        session.eval(np.array(prompt, dtype=np.int32))
        want = session.generate(_core.Sampler(model.config["n_vocab"], **sampler), 12, [])
        lines = dict(line.split(": ", 1) for line in r.stdout.splitlines())
        assert lines["generated"] == " ".join(map(str, want))
        assert "device: cpu" in lines["model"] and lines["pieces"].count("[") == 12
    for args, error, code in (([], "give the prompt's token ids with --tokens", 2),
                              (["--tokens", "1,x"], "--tokens: 'x' is not a token id", 2),
                              (["--tokens", "1", "--bogus", "1"], "unknown option --bogus", 2),
                              (["--tokens", "1", "-n", "2.5"], "-n: '2.5' is not a whole number", 2),
                              (["--tokens", "1", "--temperature", "-1"], "temperature must be finite and >= 0", 1),
                              (["--tokens", "100000"], "token id 100000 at index 0 is outside the vocabulary", 1),
                              (["--tokens", "1", "--backend", "tpu"], "unknown backend 'tpu'", 1)):
        r = subprocess.run([str(exe), str(path), *args], capture_output=True, text=True)
        assert r.returncode == code and error in r.stderr, r.stderr
