"""The CPU engine against independent references: a float64 NumPy forward pass and Hugging Face
transformers running the same GGUF file. Tolerances are stated where they are asserted."""

from __future__ import annotations

import random

import numpy as np
import pytest

from edgerunner import ContextLengthError, Model, OutOfMemoryError, _core
from edgerunner.model_builder import write_random_model
from reference_forward import ReferenceModel

# (arch, tensor type, overrides): GQA ratios 4:2, 4:1, 4:4; tied and untied heads; biases
# (qwen2); per-head Q/K norm and explicit head size (qwen3, also one of 80); RoPE scaling (linear, llama3,
# phi3's LongRoPE: n_ctx 256 > the original 64, so the long factors and the attention factor).
K = dict(dim=256, ffn_dim=512)  # rows of 256 so that k-quants are used as asked
CASES = [
    ("llama", "F32", {}),
    ("llama", "F16", dict(tied=False, n_kv_heads=1)),
    ("llama", "BF16", dict(n_kv_heads=4)),
    ("llama", "Q8_0", dict(tied=False)),
    ("llama", "Q4_0", {}),
    ("llama", "Q4_1", dict(n_kv_heads=1)),
    ("llama", "Q5_0", {}),
    ("llama", "Q5_1", {}),
    ("llama", "IQ4_NL", {}),
    ("llama", "Q2_K", K),
    ("llama", "Q3_K", K),
    ("llama", "Q4_K", dict(K, tied=False)),
    ("llama", "Q5_K", K),
    ("llama", "Q6_K", K),
    ("llama", "IQ4_XS", K),
    ("llama", "Q4_K_M", dict(K, n_layers=3)),
    ("llama", "F32", dict(rope_scaling=dict(type="linear", factor=4.0))),
    ("llama", "F32", dict(head_dim=32, rope_scaling=dict(type="llama3", factor=8.0, low_freq_factor=1.0,
                                                          high_freq_factor=4.0, original_context_length=16))),
    ("llama", "F32", dict(window=8)),  # sliding window over every layer: a circular KV cache
    ("llama", "Q8_0", dict(window=5, n_heads=2, n_kv_heads=1)),
    ("qwen2", "F32", {}),
    ("qwen2", "Q8_0", dict(n_kv_heads=1)),
    ("qwen3", "F32", {}),
    ("qwen3", "Q4_K", dict(K, tied=False)),
    ("phi3", "F32", {}),
    ("phi3", "Q8_0", dict(context_length=256, rope_scaling=dict(type="longrope", original_context_length=64))),
    ("qwen3", "F32", dict(head_dim=80)),  # per-head norms over rows of 80: not whole 32-value units
]
IDS = [f"{a}-{t}-{'-'.join(f'{k}={v}' for k, v in o.items() if k not in K) or 'base'}" for a, t, o in CASES]


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    seed = random.randrange(2**31)
    out = {}
    for i, (arch, ttype, over) in enumerate(CASES):
        path = d / f"m{i}.gguf"
        write_random_model(path, arch=arch, preset="tiny", tensor_type=ttype, seed=seed + i, **over)
        out[IDS[i]] = (path, seed + i)
    return out


def prompt(rng, n, vocab=320):
    return rng.integers(0, vocab, size=n).astype(np.int32)


@pytest.mark.parametrize("case", IDS)
def test_precise_mode_matches_float64_reference(tiny_models, case):
    """Precise mode (float32 everything) vs float64 NumPy on the same dequantized weights:
    max |Δlogit| ≤ 1e-4 (float32 rounding over two layers of tiny logits, |logit| < ~1)."""
    path, seed = tiny_models[case]
    ref = ReferenceModel(path)
    model = _core.Model.load(str(path), backend="cpu", precise=True, n_threads=2, prefill_chunk=16)
    ids = prompt(np.random.default_rng(seed), 40)
    want = ref.logits(ids)
    got = _core.Session(model).eval_all(ids)
    err = np.abs(got - want).max()
    assert err <= 1e-4, f"{case} seed {seed}: max |Δ| {err:.3g} (|logit| max {np.abs(want).max():.3g})"


# Fast mode's bound on max |Δlogit| against the float64 reference, as a fraction of max |logit|:
# int8 activation rounding costs ~0.5 % of the activation scale per matmul. Measured over 400
# seeds of the widest cases (rows of 256, untied heads): qwen3 Q4_K median 2.0 %, p99 3.0 %,
# max 3.4 %; llama Q4_K 1.9 / 2.9 / 3.0 % (a 3 % bound failed about one CI run in a hundred).
FAST_TOLERANCE = 0.045


@pytest.mark.parametrize("case", IDS)
def test_fast_mode_close_to_reference(tiny_models, case):
    """Fast mode (Q8 activations, f16 KV cache) within FAST_TOLERANCE of the logit range."""
    path, seed = tiny_models[case]
    ref = ReferenceModel(path)
    model = _core.Model.load(str(path), backend="cpu", n_threads=2, prefill_chunk=16)
    ids = prompt(np.random.default_rng(seed + 1), 40)
    want = ref.logits(ids)
    got = _core.Session(model).eval_all(ids)
    scale = np.abs(want).max()
    err = np.abs(got - want).max()
    assert err <= FAST_TOLERANCE * scale, f"{case} seed {seed}: max |Δ| {err:.3g} vs |logit| max {scale:.3g}"


@pytest.mark.parametrize("precise,kv_type", [(True, "f32"), (False, "f32"), (False, "f16"), (False, "q8_0")])
def test_modes_agree_with_one_prefill(tmp_path, precise, kv_type):
    """reset, then extend, then decode (and a rewind) give the logits of one full prefill,
    exactly: every token's arithmetic is the same whatever the chunking."""
    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q8_0", seed=5, n_heads=2, n_kv_heads=1)
    model = _core.Model.load(str(path), backend="cpu", precise=precise, kv_type=kv_type, n_threads=2, prefill_chunk=8)
    ids = prompt(np.random.default_rng(0), 30)
    full = _core.Session(model).eval_all(ids)

    s = _core.Session(model)
    assert s.eval(ids[:5]) == "reset"
    assert np.array_equal(s.logits(), full[4])
    assert s.eval(ids[:21]) == "extend"  # crosses prefill chunks
    assert np.array_equal(s.logits(), full[20])
    assert s.eval(ids[:22]) == "decode"
    assert np.array_equal(s.logits(), full[21])
    assert s.eval(ids[:22]) == "cached"
    other = ids[:30].copy()
    other[12] = (other[12] + 1) % 320
    assert s.eval(other) == "extend"  # rewound to the 12 common tokens
    s.eval(ids)  # back: rewind to 12 again, then extend to 30
    assert np.array_equal(s.logits(), full[29])
    s.rewind(10)
    s.append(int(ids[10]))
    assert np.array_equal(s.logits(), full[10])
    assert s.eval(ids[:3]) == "decode"  # a strict prefix: its last token is recomputed
    assert np.array_equal(s.logits(), full[2])


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_sliding_window_cache_is_circular_and_modes_agree(tmp_path, kv_type):
    """A window of 6 with prefill chunks of 4: the cache holds 10 slots, positions wrap many
    times over 60 tokens, and decode after extend after reset still equals one full prefill.
    A rewind into positions the ring has overwritten falls back to a full prefill (reset)."""
    path = tmp_path / "w.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q8_0", seed=9, window=6, n_heads=2, n_kv_heads=1)
    model = _core.Model.load(str(path), backend="cpu", kv_type=kv_type, n_threads=2, prefill_chunk=4, n_ctx=128)
    ids = prompt(np.random.default_rng(3), 60)
    full = _core.Session(model).eval_all(ids)
    want = ReferenceModel(path).logits(ids)
    assert np.abs(full - want).max() <= 0.03 * np.abs(want).max()
    s = _core.Session(model)
    assert s.eval(ids[:7]) == "reset"
    assert s.eval(ids[:45]) == "extend"
    assert s.eval(ids[:46]) == "decode"
    assert np.array_equal(s.logits(), full[45])
    assert s.eval(ids[:20]) == "reset"  # positions 14..19 were overwritten long ago
    assert np.array_equal(s.logits(), full[19])


def test_context_and_token_errors(tmp_path):
    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", seed=1)
    model = _core.Model.load(str(path), backend="cpu", n_ctx=16)
    s = _core.Session(model)
    with pytest.raises(ContextLengthError, match="17 tokens but the context holds 16"):
        s.eval(np.zeros(17, np.int32))
    with pytest.raises(ValueError, match="token id 320 at index 1 is outside the vocabulary"):
        s.eval(np.array([1, 320], np.int32))
    with pytest.raises(ValueError, match="empty"):
        s.eval(np.zeros(0, np.int32))
    s.eval(np.zeros(16, np.int32))
    with pytest.raises(ContextLengthError, match="context is full"):
        s.append(1)
    with pytest.raises(ValueError, match="KV cache type 'q4' is not supported"):
        _core.Model.load(str(path), backend="cpu", kv_type="q4")
    with pytest.raises(ValueError, match="q8_0 needs a head size that is a multiple of 32"):
        _core.Model.load(str(path), backend="cpu", kv_type="q8_0")  # head size 16


KV_TOO_BIG = (r"the KV cache for n_ctx=(\d+) needs ([\d.]+) GiB \((\w+), (\d+) layers, (\d+) bytes a token\); "
              r"{where}: ([\d.]+) GiB free\. Load the model with n_ctx=(\d+) or less{hint}\.$")


def check_kv_too_big(message, where, n_ctx, kv_type, n_layer, per_token, fixed=0, hint=""):
    """The KV cache's out-of-memory message: its figures are the cache's (per_token bytes a token
    of context, `fixed` bytes for windowed layers), and the n_ctx it offers fits in what it says is
    free (its GiB are rounded to 0.1)."""
    import re

    m = re.match(KV_TOO_BIG.format(where=where, hint=re.escape(hint)), message)
    assert m, message
    assert (int(m[1]), m[3], int(m[4]), int(m[5])) == (n_ctx, kv_type, n_layer, per_token)
    assert abs(float(m[2]) * 2**30 - (n_ctx * per_token + fixed)) <= 0.05 * 2**30
    free, offered = float(m[6]) * 2**30, int(m[7])
    assert 0 < offered < n_ctx and offered % 256 == 0
    assert fixed + offered * per_token <= free + 0.05 * 2**30 < fixed + (offered + 256) * per_token + 0.1 * 2**30
    return free


def available_memory():
    """MemAvailable (Linux), as the engine reads it; None elsewhere."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return None


def test_a_context_that_does_not_fit_says_which_would(tmp_path):
    """n_ctx beyond host memory: OutOfMemoryError (a MemoryError) at the session, before anything
    is allocated, naming the cache's size, the free memory and an n_ctx that fits; the load of the
    Python API fails with it too (its warm-up opens the session). Past int32 positions: refused."""
    free = available_memory()
    if free is None or free > 2**38:  # (the smallest cache below takes 512 GiB)
        pytest.skip("needs Linux and less than 256 GiB of available memory")
    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", seed=1)  # 2 layers, K and V of 32 f16 values
    big = 2**31 - 1
    with pytest.raises(OutOfMemoryError) as e:
        _core.Session(_core.Model.load(str(path), backend="cpu", n_ctx=big))
    assert isinstance(e.value, MemoryError)
    # (head size 16: no q8_0 offered)
    said = check_kv_too_big(str(e.value), r"host memory \(available\)", big, "f16", 2, 2 * 2 * 64)
    assert abs(said - available_memory()) < 2**30  # what the OS says now, within what moves meanwhile
    with pytest.raises(OutOfMemoryError) as e:  # precise: an f32 cache
        _core.Session(_core.Model.load(str(path), backend="cpu", n_ctx=big, precise=True))
    check_kv_too_big(str(e.value), r"host memory \(available\)", big, "f32", 2, 2 * 2 * 128,
                     hint=", or with kv_type='f16' and without precise=True (half the bytes)")
    events = []
    with pytest.raises(OutOfMemoryError, match=f"n_ctx={big} needs"):
        Model.load(path, n_ctx=big, on_event=events.append)
    assert events[-1].stage.value == "failed" and isinstance(events[-1].error, OutOfMemoryError)
    with pytest.raises(ValueError, match=f"n_ctx={big + 1} is more positions than the engine addresses \\(at most {big}\\)"):
        _core.Model.load(str(path), n_ctx=big + 1)

    q = tmp_path / "q.gguf"  # head size 128: q8_0 is offered
    write_random_model(q, arch="qwen3", preset="tiny", seed=1)
    with pytest.raises(OutOfMemoryError) as e:
        _core.Session(_core.Model.load(str(q), backend="cpu", n_ctx=big))
    check_kv_too_big(str(e.value), r"host memory \(available\)", big, "f16", 2, 2 * 2 * 512,
                     hint=", or with kv_type='q8_0' (about half the bytes of f16)")
    g = tmp_path / "g.gguf"  # Gemma 3: the local layers' rings (window 8 + chunk 4) do not grow with n_ctx
    write_random_model(g, arch="gemma3", preset="tiny", seed=1)
    model = _core.Model.load(str(g), backend="cpu", n_ctx=big, prefill_chunk=4)
    layers = model.config["n_layer"]
    local = sum(1 for i in range(layers) if (i + 1) % 6 != 0)  # every sixth layer global
    row = 2 * model.config["n_head_kv"] * model.config["head_dim"]
    with pytest.raises(OutOfMemoryError) as e:
        _core.Session(model)
    check_kv_too_big(str(e.value), r"host memory \(available\)", big, "f16", layers, 2 * row * (layers - local),
                     fixed=local * 2 * 12 * row, hint=", or with kv_type='q8_0' (about half the bytes of f16)")


def test_unsupported_architecture_and_type(tmp_path):
    path = tmp_path / "g.gguf"
    write_random_model(path, arch="llama", preset="tiny", seed=1)
    path.write_bytes(path.read_bytes().replace(b"llama", b"mamba"))  # an architecture we do not run
    with pytest.raises(ValueError, match="architecture 'mamba' is not supported by this build; "
                                         "supported: llama, qwen2, qwen3, gemma3, phi3"):
        _core.Model.load(str(path))


def test_generation_is_seeded_and_stops(tmp_path):
    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", seed=3)
    model = Model.load(path, threads=2)
    ids = list(range(10, 20))
    a = model.generate(ids, max_tokens=20, temperature=1.0, seed=7, ignore_eos=True)
    b = model.generate(ids, max_tokens=20, temperature=1.0, seed=7, ignore_eos=True)
    assert a == b
    pieces = list(model.generate(ids, max_tokens=20, temperature=1.0, seed=7, ignore_eos=True, stream=True))
    assert "".join(pieces) == a
    if len(a) > 3:
        stop = a[2:4]
        cut = model.generate(ids, max_tokens=20, temperature=1.0, seed=7, ignore_eos=True, stop=stop)
        assert cut == a[: a.find(stop)]
    with pytest.raises(ContextLengthError):
        model.generate(list(range(300)) * 2, max_tokens=1)


def test_gemma3_local_layers_keep_only_the_window(tmp_path):
    """Gemma 3's local layers get a circular cache of window + chunk slots (here 8 + 4) while its
    global layer keeps the whole context: reset, extend, decode still give one full prefill's
    logits exactly, and a rewind into slots the local rings overwrote falls back to reset."""
    path = tmp_path / "g.gguf"
    write_random_model(path, arch="gemma3", preset="tiny", tensor_type="Q8_0", seed=4)
    model = _core.Model.load(str(path), backend="cpu", n_threads=2, prefill_chunk=4, n_ctx=128)
    ids = prompt(np.random.default_rng(5), 60)
    full = _core.Session(model).eval_all(ids)
    s = _core.Session(model)
    assert s.eval(ids[:7]) == "reset"
    assert np.array_equal(s.logits(), full[6])
    assert s.eval(ids[:45]) == "extend"
    assert s.eval(ids[:46]) == "decode"
    assert np.array_equal(s.logits(), full[45])
    assert s.eval(ids[:20]) == "reset"
    assert np.array_equal(s.logits(), full[19])


def test_phi3_longrope_short_factors_within_the_original_context(tmp_path):
    """LongRoPE's other half: a context no longer than the original (64) uses the short factors."""
    path = tmp_path / "p.gguf"
    write_random_model(path, arch="phi3", preset="tiny", tensor_type="F32", seed=6, context_length=256,
                       rope_scaling=dict(type="longrope", original_context_length=64))
    ids = prompt(np.random.default_rng(7), 40)
    for n_ctx in (64, 256):
        model = _core.Model.load(str(path), backend="cpu", precise=True, n_threads=2, prefill_chunk=16, n_ctx=n_ctx)
        want = ReferenceModel(path, n_ctx=n_ctx).logits(ids)
        got = _core.Session(model).eval_all(ids)
        assert np.abs(got - want).max() <= 1e-4, n_ctx
    short = ReferenceModel(path, n_ctx=64).logits(ids)
    long = ReferenceModel(path, n_ctx=256).logits(ids)
    assert np.abs(short - long).max() > 1e-3  # the two factor sets really differ
