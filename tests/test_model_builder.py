"""Random-weight GGUF models: what the builder writes, read back with the gguf package's reader."""

from __future__ import annotations

import hashlib
import os

import gguf
import numpy as np
import pytest

from edgerunner import model_builder as mb
from gguf import GGMLQuantizationType as QType

# Row lengths that are whole K-quant super-blocks (256), so every type applies to every matrix.
K_DIMS = dict(dim=256, ffn_dim=512)


def write(tmp_path, arch="llama", tensor_type="F32", seed=0, name=None, **overrides):
    name = name or f"{arch}-{tensor_type}-{seed}.gguf"
    return mb.write_random_model(tmp_path / name, arch=arch, preset="tiny", tensor_type=tensor_type,
                                 seed=seed, **overrides)


def field(reader, key):
    return reader.fields[key].contents()


def check_against_plan(path, arch, tensor_type, **overrides):
    config = mb.model_config(arch, "tiny", **overrides)
    plan = mb.tensor_plan(arch, config, tensor_type)
    reader = gguf.GGUFReader(path)
    assert [t.name for t in reader.tensors] == [s.name for s in plan]
    for tensor, spec in zip(reader.tensors, plan):
        assert tuple(int(n) for n in tensor.shape) == spec.shape[::-1], tensor.name  # ggml order: ne0 first
        assert tensor.tensor_type == spec.qtype, tensor.name
        if spec.kind != "matrix":
            assert spec.qtype == QType.F32, tensor.name
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        assert np.isfinite(values).all(), tensor.name
        if spec.kind == "matrix":
            assert 0.01 < float(values.std()) < 0.04, tensor.name
            assert abs(float(values.mean())) < 0.005, tensor.name
    return reader, config


@pytest.mark.parametrize("arch", list(mb.ARCHITECTURES))
@pytest.mark.parametrize("tensor_type", ["F32", "F16", "Q8_0", "Q4_0", "Q4_K_M"])
def test_tiny_model_reads_back(tmp_path, arch, tensor_type):
    path = write(tmp_path, arch, tensor_type)
    reader, config = check_against_plan(path, arch, tensor_type)

    assert field(reader, "general.architecture") == arch
    for key in (gguf.Keys.LLM.CONTEXT_LENGTH, gguf.Keys.LLM.EMBEDDING_LENGTH, gguf.Keys.LLM.BLOCK_COUNT,
                gguf.Keys.LLM.FEED_FORWARD_LENGTH, gguf.Keys.Attention.HEAD_COUNT,
                gguf.Keys.Attention.HEAD_COUNT_KV, gguf.Keys.Attention.LAYERNORM_RMS_EPS,
                gguf.Keys.Rope.FREQ_BASE, gguf.Keys.Rope.DIMENSION_COUNT):
        assert key.format(arch=arch) in reader.fields, key
    assert field(reader, f"{arch}.embedding_length") == config.dim
    assert field(reader, f"{arch}.block_count") == config.n_layers
    assert field(reader, f"{arch}.attention.head_count_kv") == config.n_kv_heads
    if arch in ("qwen3", "gemma3"):
        assert field(reader, f"{arch}.attention.key_length") == config.head_size
        assert field(reader, f"{arch}.attention.value_length") == config.head_size
    if arch == "gemma3":
        assert field(reader, "gemma3.attention.sliding_window") == config.sliding_window
        assert field(reader, "gemma3.rope.freq_base_swa") == config.rope_base_swa

    assert field(reader, "tokenizer.ggml.model") == "gpt2"
    tokens = field(reader, "tokenizer.ggml.tokens")
    assert len(tokens) == config.vocab_size == len(field(reader, "tokenizer.ggml.token_type"))
    for key in ("tokenizer.ggml.pre", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
                "tokenizer.ggml.eos_token_id", "tokenizer.chat_template"):
        assert key in reader.fields, key
    assert tokens[field(reader, "tokenizer.ggml.eos_token_id")] == "<|im_end|>"


def test_arch_specific_tensors(tmp_path):
    names = {arch: {t.name for t in gguf.GGUFReader(write(tmp_path, arch)).tensors} for arch in mb.ARCHITECTURES}
    assert "blk.0.attn_q.bias" in names["qwen2"] and "blk.0.attn_v.bias" in names["qwen2"]
    assert "blk.0.attn_q.bias" not in names["llama"]
    assert {"blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight"} <= names["qwen3"]
    assert {"blk.0.post_attention_norm.weight", "blk.0.ffn_norm.weight",
            "blk.0.post_ffw_norm.weight", "blk.5.attn_k_norm.weight"} <= names["gemma3"]
    assert "blk.0.attn_qkv.weight" in names["phi3"] and "blk.0.ffn_gate.weight" not in names["phi3"]
    assert "output.weight" in names["phi3"] and "output.weight" not in names["llama"]


@pytest.mark.parametrize("qtype", [t.name for t in mb.TENSOR_TYPES])
def test_every_tensor_type(tmp_path, qtype):
    path = write(tmp_path, "llama", qtype, **K_DIMS)
    check_against_plan(path, "llama", qtype, **K_DIMS)


def test_deterministic_for_a_seed(tmp_path):
    def digest(path):
        return hashlib.sha256(path.read_bytes()).hexdigest()

    a = write(tmp_path, "qwen3", "Q4_K_M", seed=7, name="a.gguf")
    b = write(tmp_path, "qwen3", "Q4_K_M", seed=7, name="b.gguf")
    c = write(tmp_path, "qwen3", "Q4_K_M", seed=8, name="c.gguf")
    assert digest(a) == digest(b) != digest(c)


def test_float_types_share_weights(tmp_path):
    f32 = gguf.GGUFReader(write(tmp_path, "llama", "F32")).tensors
    f16 = gguf.GGUFReader(write(tmp_path, "llama", "F16")).tensors
    for a, b in zip(f32, f16):
        np.testing.assert_allclose(np.asarray(a.data, np.float32), np.asarray(b.data, np.float32), atol=1e-4)


def test_q4_k_m_mix_follows_llama_cpp(tmp_path):
    overrides = dict(K_DIMS, n_layers=8, tied=False)
    reader = gguf.GGUFReader(write(tmp_path, "llama", "Q4_K_M", **overrides))
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["output.weight"] == QType.Q6_K
    assert types["token_embd.weight"] == QType.Q4_K
    assert types["blk.0.attn_q.weight"] == QType.Q4_K
    # use_more_bits(i, 8): layers 0 and 7, and every third from 1 (layer 3, 6).
    more = {i for i in range(8) if types[f"blk.{i}.ffn_down.weight"] == QType.Q6_K}
    assert more == {0, 3, 6, 7}
    assert {i for i in range(8) if types[f"blk.{i}.attn_v.weight"] == QType.Q6_K} == more
    tied = gguf.GGUFReader(write(tmp_path, "llama", "Q4_K_M", name="tied.gguf", **dict(overrides, tied=True)))
    assert {t.name: t.tensor_type for t in tied.tensors}["token_embd.weight"] == QType.Q6_K


def test_llama3_rope_freqs(tmp_path):
    scaling = dict(type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_context_length=8192)
    reader = gguf.GGUFReader(write(tmp_path, "llama", rope_base=500000.0, rope_scaling=scaling))
    freqs = {t.name: t for t in reader.tensors}["rope_freqs.weight"]
    assert freqs.tensor_type == QType.F32 and int(freqs.shape[0]) == 16 // 2
    values = np.asarray(freqs.data)
    assert values[0] == 1.0 and values[-1] == 8.0 and np.all(np.diff(values) >= 0)


def test_tokenizer_merges_are_valid():
    tokens, merges, types = mb._bpe_vocab(2000)
    assert len(tokens) == len(set(tokens)) == len(types) == 2000
    assert len(merges) == 2000 - 256 - 3
    known = set(tokens[:256])
    for merge in merges:
        left, right = merge.split(" ")
        assert left in known and right in known
        known.add(left + right)
    assert tokens[-3:] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert types[-1] == gguf.TokenType.CONTROL and types[0] == gguf.TokenType.NORMAL


def test_presets_have_real_shapes():
    c = mb.model_config("llama", "llama-3.1-8b")
    plan = {s.name: s for s in mb.tensor_plan("llama", c, "Q4_K_M")}
    assert plan["token_embd.weight"].shape == (128256, 4096)
    assert plan["blk.31.ffn_down.weight"].shape == (4096, 14336)
    assert plan["blk.0.attn_k.weight"].shape == (1024, 4096)
    assert plan["output.weight"].qtype == QType.Q6_K
    assert plan["rope_freqs.weight"].shape == (64,)
    smol = mb.model_config("llama", "smollm2-135m", n_kv_heads=1, context_length=512)
    assert (smol.dim, smol.n_layers, smol.n_heads, smol.n_kv_heads, smol.tied) == (576, 30, 9, 1, True)
    total = sum(s.nbytes for s in mb.tensor_plan("llama", mb.model_config("llama", "llama-3.2-1b"), "F16"))
    assert 2.4e9 < total < 2.6e9  # Llama 3.2 1B in F16 is ~2.47 GB


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="unknown architecture 'gpt9'.*llama"):
        write(tmp_path, "gpt9")
    with pytest.raises(ValueError, match="unknown preset"):
        mb.write_random_model(tmp_path / "x.gguf", preset="huge")
    with pytest.raises(ValueError, match="not supported.*Q4_K_M"):
        write(tmp_path, tensor_type="Q7_Z")
    with pytest.raises(ValueError, match="unknown config field.*n_kv_head"):
        write(tmp_path, n_kv_head=1)
    with pytest.raises(ValueError, match="not a multiple of Q4_K's block of 256"):
        write(tmp_path, tensor_type="Q4_K")
    assert not list(tmp_path.iterdir())  # nothing half-written left behind


def test_cli(tmp_path, capsys):
    out = tmp_path / "cli.gguf"
    assert mb.main([str(out), "--arch", "qwen2", "--type", "Q8_0", "--seed", "3",
                    "--set", "n_kv_heads=1", "--set", "tied=false", "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    reader = gguf.GGUFReader(out)
    assert field(reader, "qwen2.attention.head_count_kv") == 1
    assert "output.weight" in {t.name for t in reader.tensors}


@pytest.mark.parametrize("arch", list(mb.ARCHITECTURES))
def test_transformers_loads_tiny_model(tmp_path, arch):
    """transformers' GGUF loader builds the model and tokenizer, with every weight from the file."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    path = write(tmp_path, arch)
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        os.fspath(tmp_path), gguf_file=path.name, dtype=torch.float32, output_loading_info=True)
    assert not any(info.values()), info
    n_file = sum(int(np.prod(t.shape)) for t in gguf.GGUFReader(path).tensors)
    assert sum(p.numel() for p in model.parameters()) == n_file
    tokenizer = transformers.AutoTokenizer.from_pretrained(os.fspath(tmp_path), gguf_file=path.name)
    ids = tokenizer("Hello world", return_tensors="pt").input_ids
    assert tokenizer.decode(ids[0]) == "Hello world"
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all()
