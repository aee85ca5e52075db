"""Hugging Face transformers on the same GGUF files is the oracle (float32, CPU).

(transformers' GGUF loader ignores RoPE scaling, linear or llama3 `rope_freqs`: those are
checked against the float64 NumPy reference in test_engine.py instead.)

Real models: SmolLM2-135M-Instruct Q4_1 and Gemma 3 270M Q4_K_M (from PyPI). Tiny random
models of llama, qwen2, qwen3, gemma3 and phi3 written by edgerunner.model_builder. transformers dequantizes the GGUF to float32 and
runs its own implementation, so this is independent of edgerunner's kernels and layouts.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from edgerunner import Model, _core, builtin_models  # noqa: E402
from edgerunner.model_builder import write_random_model  # noqa: E402

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Once upon a time, in a land far away, there lived a",
    "1, 2, 3, 5, 8, 13,",
    "<|im_start|>user\nWhat is the tallest mountain on Earth?<|im_end|>\n<|im_start|>assistant\n",
]


def hf_model(path):
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


def hf_logits(hf, ids):
    with torch.no_grad():
        return hf(torch.tensor(np.asarray(ids, np.int64)[None])).logits[0].numpy()


def banned_eos(hf):
    """min_new_tokens makes transformers mask its EOS ids; ours bans the same ones."""
    eos = hf.generation_config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    return {int(i): float("-inf") for i in eos}


@pytest.fixture(scope="module", params=["smollm2-135m-instruct", "gemma3-270m"])
def real(request):
    path = builtin_models.fetch(request.param)
    return path, hf_model(path)


@pytest.mark.slow
def test_real_precise_logits_equal_transformers(real):
    """Precise mode: max |Δlogit| ≤ 1e-2 at every position of every prompt."""
    path, hf = real
    model = Model.load(path, precise=True, threads=2)
    for text in PROMPTS:
        ids = model.tokenize(text)
        got = model.logits(ids, all_positions=True)
        want = hf_logits(hf, ids)
        err = np.abs(got - want).max(axis=1)
        assert err.max() <= 1e-2, f"{text!r}: max |Δ| per position {np.round(err, 4)}"
        assert (got.argmax(1) == want.argmax(1)).all()


@pytest.mark.slow
def test_real_fast_mode_within_stated_tolerance(real):
    """Fast mode (Q8_0 activations into the int8 dot products, f16 KV cache): the activation
    rounding (|err| ≤ half a step of 1/127 of each 32-block's max) compounds over the layers.
    Measured on these prompts — SmolLM2 (30 layers): mean |Δ| ≈ 0.1-0.6, max ≈ 1.3 on logits of
    rms ≈ 5-20; Gemma 3 (18 layers, larger activation outliers): mean ≤ 0.96, max ≤ 2.84 (both
    on the ChatML prompt, foreign to Gemma), rms ≈ 5-12. Asserted per model: mean |Δ| ≤ 0.75 /
    1.25, max |Δ| ≤ 2.5 / 3.5, and top-1 equal wherever the reference's top two are more than
    0.5 apart (at near-ties either token is a faithful answer)."""
    path, hf = real
    mean_bound, max_bound = (1.25, 3.5) if "gemma" in str(path) else (0.75, 2.5)
    model = Model.load(path, threads=2)
    for text in PROMPTS:
        ids = model.tokenize(text)
        got = model.logits(ids, all_positions=True)
        want = hf_logits(hf, ids)
        d = np.abs(got - want)
        assert d.mean(axis=1).max() <= mean_bound, text
        assert d.max() <= max_bound, text
        top2 = np.sort(want, axis=1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > 0.5
        assert (got.argmax(1) == want.argmax(1))[clear].all(), text


@pytest.mark.slow
def test_real_greedy_32_tokens_identical(real):
    path, hf = real
    model = Model.load(path, precise=True, threads=2)
    for text in PROMPTS:
        ids = model.tokenize(text)
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, min_new_tokens=32,
                              attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        want = out[0, len(ids):].tolist()
        s = _core.Session(model._native)
        s.eval(np.asarray(ids, np.int32))
        got = s.generate(_core.Sampler(model.n_vocab, logit_bias=banned_eos(hf)), 32, [])
        assert got == want, f"{text!r}\nours: {got}\nhf:   {want}"


TINY = [
    ("llama", "F32", {}),
    ("llama", "F16", dict(tied=False, n_kv_heads=4)),
    ("llama", "Q8_0", dict(tied=False, n_kv_heads=1)),
    ("llama", "Q4_K", dict(dim=256, ffn_dim=512)),
    ("qwen2", "F32", {}),
    ("qwen2", "Q4_0", dict(n_kv_heads=1, tied=False)),
    ("qwen3", "F32", {}),
    ("qwen3", "Q6_K", dict(dim=256, ffn_dim=512)),
    ("gemma3", "F32", {}),  # 5 local layers (window 8 < the 48-token prompt) per global one
    ("gemma3", "Q8_0", dict(n_kv_heads=2)),
    ("gemma3", "Q4_K", dict(dim=256, ffn_dim=512)),
    ("phi3", "F32", {}),  # fused attn_qkv and gate+up tensors, bound as row ranges
    ("phi3", "Q4_0", dict(n_kv_heads=2)),
]


@pytest.mark.parametrize("arch,ttype,over", TINY, ids=[f"{a}-{t}-{i}" for i, (a, t, _) in enumerate(TINY)])
def test_tiny_models_equal_transformers(tmp_path, arch, ttype, over):
    """Random-weight tiny models: precise logits within 1e-4 of transformers at every position,
    and greedy continuations identical."""
    seed = random.randrange(2**31)
    path = tmp_path / "tiny.gguf"
    write_random_model(path, arch=arch, preset="tiny", tensor_type=ttype, seed=seed, **over)
    hf = hf_model(path)
    model = _core.Model.load(str(path), precise=True, n_threads=2, prefill_chunk=16)
    ids = np.random.default_rng(seed).integers(0, 320, size=48).astype(np.int32)
    got = _core.Session(model).eval_all(ids)
    want = hf_logits(hf, ids)
    err = np.abs(got - want).max()
    assert err <= 1e-4, f"seed {seed}: max |Δ| {err:.3g}"
    with torch.no_grad():
        out = hf.generate(torch.tensor(ids[None].astype(np.int64)), max_new_tokens=16, min_new_tokens=16,
                          do_sample=False, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    s = _core.Session(model)
    s.eval(ids)
    assert s.generate(_core.Sampler(320, logit_bias=banned_eos(hf)), 16, []) == out[0, len(ids):].tolist(), f"seed {seed}"


@pytest.mark.parametrize("ttype", ["F32", "Q8_0"])
def test_sliding_window_llama_equals_transformers_mistral(tmp_path, ttype):
    """Mistral-style sliding window (every layer sees the last 8 positions) against transformers'
    Mistral: its GGUF loader builds a plain Llama (it does not carry the window), so the same
    weights go into MistralForCausalLM with sliding_window = 8. The prompt is 5× the window;
    full attention would differ by ~0.4."""
    seed = random.randrange(2**31)
    path = tmp_path / "swa.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type=ttype, seed=seed, window=8)
    llama = hf_model(path)
    keys = transformers.MistralConfig().to_dict()
    config = transformers.MistralConfig(**{k: v for k, v in llama.config.to_dict().items() if k in keys})
    config.sliding_window = 8
    hf = transformers.MistralForCausalLM(config).eval()
    hf.load_state_dict(llama.state_dict())
    model = _core.Model.load(str(path), precise=True, backend="cpu", n_threads=2, prefill_chunk=16)
    ids = np.random.default_rng(seed).integers(0, 320, size=40).astype(np.int32)
    got = _core.Session(model).eval_all(ids)
    want = hf_logits(hf, ids)
    assert np.abs(got - want).max() <= 1e-4, f"seed {seed}"
    assert np.abs(want - hf_logits(llama, ids)).max() > 1e-2  # the window really mattered
