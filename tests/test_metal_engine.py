"""The Metal backend, whole models, against the float64 forward pass and the CPU backend
(a macOS build on a Metal 3 GPU; skipped elsewhere — tests/test_metal_emulated.py runs the same
kernels and programs on the CPU there). Tolerances as stated there: float activations, an f16
KV cache: within 2e-3 · max(1, max|logit|) of float64 over two layers."""

from __future__ import annotations

import numpy as np
import pytest

from edgerunner import _core
from reference_forward import ReferenceModel
from test_engine import IDS, prompt, tiny_models  # noqa: F401 (fixture)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _core.metal_available(), reason=_core.metal_device())]

DISPATCH = ["eager", "argument_buffers", "recorded"]


@pytest.mark.parametrize("case", IDS)
def test_metal_logits_close_to_float64_reference(tiny_models, case):
    path, seed = tiny_models[case]
    model = _core.Model.load(str(path), backend="metal", prefill_chunk=16)
    assert model.backend == "metal"
    ids = prompt(np.random.default_rng(seed + 2), 40)
    want = ReferenceModel(path).logits(ids)
    got = _core.Session(model).eval_all(ids)
    err, scale = np.abs(got - want).max(), np.abs(want).max()
    assert err <= 2e-3 * max(1.0, scale), f"{case} seed {seed}: max |Δ| {err:.3g} vs |logit| max {scale:.3g}"


@pytest.mark.parametrize("ttype", ["F32", "Q4_K_M"])
def test_metal_gemma3_matches_cpu_precise(tmp_path, ttype):
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "g.gguf"
    write_random_model(path, arch="gemma3", preset="tiny", tensor_type=ttype, seed=3,
                       **(dict(dim=256, ffn_dim=512) if ttype != "F32" else {}))
    ids = prompt(np.random.default_rng(1), 40)
    want = _core.Session(_core.Model.load(str(path), backend="cpu", precise=True, prefill_chunk=16)).eval_all(ids)
    got = _core.Session(_core.Model.load(str(path), backend="metal", prefill_chunk=16)).eval_all(ids)
    assert np.abs(got - want).max() <= 2e-3 * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("kv,bound", [("f32", 1e-4), ("f16", 2e-3), ("q8_0", 3e-2)])
def test_metal_kv_cache_types(tmp_path, kv, bound):
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q4_K_M", seed=5, n_heads=2, n_kv_heads=1,
                       dim=256, ffn_dim=512)
    ids = prompt(np.random.default_rng(0), 30)
    want = ReferenceModel(path).logits(ids)
    got = _core.Session(_core.Model.load(str(path), backend="metal", kv_type=kv, prefill_chunk=8)).eval_all(ids)
    assert np.abs(got - want).max() <= bound * max(1.0, np.abs(want).max())


def test_metal_modes_agree_with_one_prefill(tmp_path):
    """reset, extend, decode and rewinds against one full prefill: extend runs the same kernels
    (equal bit for bit), decode the one-token ones (GEMV, decode attention: within float32
    rounding)."""
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q4_K_M", seed=5, n_heads=2, n_kv_heads=1,
                       dim=256, ffn_dim=512)
    model = _core.Model.load(str(path), backend="metal", prefill_chunk=8)
    ids = prompt(np.random.default_rng(0), 30)
    full = _core.Session(model).eval_all(ids)
    tol = 1e-4 * max(1.0, np.abs(full).max())
    s = _core.Session(model)
    assert s.eval(ids[:5]) == "reset"
    assert np.abs(s.logits() - full[4]).max() <= tol
    assert s.eval(ids[:21]) == "extend"
    assert np.abs(s.logits() - full[20]).max() <= tol
    assert s.eval(ids[:22]) == "decode"
    assert np.abs(s.logits() - full[21]).max() <= tol
    s.rewind(10)
    s.append(int(ids[10]))
    assert np.abs(s.logits() - full[10]).max() <= tol


def test_metal_refuses_what_it_cannot_run(tmp_path):
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", seed=1)
    with pytest.raises(ValueError, match="precise mode runs on the CPU backend only"):
        _core.Model.load(str(path), backend="metal", precise=True)
    assert _core.Model.load(str(path), precise=True).backend == "cpu"
    with pytest.raises(ValueError, match="unknown dispatch mode"):
        _core.Model.load(str(path), backend="metal", dispatch="graph")


def test_metal_dispatch_modes_give_identical_logits(tmp_path):
    """eager, argument_buffers and recorded (indirect command buffer replay) run the same
    kernels on the same argument tables and step block: the prompt's and 12 greedy decode steps'
    logits are equal bit for bit."""
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    write_random_model(path, arch="qwen2", preset="tiny", tensor_type="Q4_0", seed=3)
    ids = prompt(np.random.default_rng(1), 9)
    runs = []
    for dispatch in DISPATCH:
        s = _core.Session(_core.Model.load(str(path), backend="metal", dispatch=dispatch))
        s.eval(ids)
        out = [s.logits().copy()]
        for _ in range(12):
            s.append(int(np.argmax(out[-1])))
            out.append(s.logits().copy())
        runs.append(np.stack(out))
    assert np.array_equal(runs[0], runs[1]) and np.array_equal(runs[0], runs[2])


SAMPLING = [dict(temperature=0.0), dict(temperature=0.8), dict(temperature=1.0, top_k=20),
            dict(temperature=0.7, top_p=0.9), dict(temperature=1.2, min_p=0.05),
            dict(temperature=0.9, top_k=40, top_p=0.95, min_p=0.02),
            # bias and penalties (penalize before the sampler): a window of 8, all the history, none
            dict(repetition_penalty=1.5, presence_penalty=0.5, penalty_last_n=8),
            dict(temperature=0.9, top_k=40, frequency_penalty=0.4, penalty_last_n=-1, logit_bias={3: -np.inf, 17: 2.5}),
            dict(temperature=0.8, repetition_penalty=1.3, penalty_last_n=0, logit_bias={5: 1.5})]


@pytest.mark.parametrize("dispatch", DISPATCH)
@pytest.mark.parametrize("preset,params", [(p, s) for p in ("tiny", "smollm2-135m") for s in SAMPLING])
def test_metal_sampling_follows_the_cpu_sampler(tmp_path, preset, params, dispatch):
    """Tokens drawn on the GPU (4 bytes back per step; bias and penalties applied there over the
    device's token history) are the CPU sampler's tokens on the same logits, step for step, in
    every dispatch mode."""
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset=preset, tensor_type="Q4_0", seed=11,
                       **(dict(n_layers=2) if preset != "tiny" else {}))
    model = _core.Model.load(str(path), backend="metal", n_ctx=256, dispatch=dispatch)
    n_vocab = model.config["n_vocab"]
    ids = prompt(np.random.default_rng(4), 7, vocab=min(n_vocab, 1000))
    sampler = _core.Sampler(n_vocab, seed=1234, **params)
    drawn = _core.Session(model)
    drawn.eval(ids)
    tokens = drawn.generate(sampler, 24, [])
    assert len(tokens) == 24

    check = _core.Session(model)
    check.eval(ids)
    history = list(ids)
    for tok in tokens:
        want = sampler.sample(check.logits(), np.asarray(history, np.int32), len(history))
        assert tok == want, f"{params}: step {len(history)}: GPU drew {tok}, CPU sampler {want}"
        check.append(tok)
        history.append(tok)
    assert np.array_equal(drawn.logits(), check.logits())


@pytest.mark.parametrize("dispatch", DISPATCH)
def test_metal_second_generation_replaces_the_bias(tmp_path, dispatch):
    """Two generations on one session with penalties over the whole history and another bias
    table (fewer entries) and seed for the second: the table is rewritten, every draw the CPU
    sampler's."""
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q4_0", seed=9)
    model = _core.Model.load(str(path), backend="metal", n_ctx=256, dispatch=dispatch)
    n_vocab = model.config["n_vocab"]
    ids = np.asarray(list(prompt(np.random.default_rng(3), 6)) * 2, np.int32)
    common = dict(temperature=0.9, repetition_penalty=1.3, penalty_last_n=-1)
    samplers = [_core.Sampler(n_vocab, logit_bias={3: 0.5, 100: -np.inf, 250: 1.0}, seed=5, **common),
                _core.Sampler(n_vocab, logit_bias={7: -np.inf}, seed=9, **common)]
    drawn = _core.Session(model)
    drawn.eval(ids)
    tokens = [t for sampler in samplers for t in drawn.generate(sampler, 12, [])]
    check = _core.Session(model)
    check.eval(ids)
    history = list(ids)
    for i, tok in enumerate(tokens):  # (generate appends its last draw: the second one goes on from there)
        sampler = samplers[i // 12]
        want = sampler.sample(check.logits(), np.asarray(history, np.int32), len(history))
        assert tok == want, f"{dispatch}: draw {i}: GPU {tok}, CPU sampler {want}"
        check.append(tok)
        history.append(tok)


@pytest.mark.slow
def test_metal_smollm2_logits_close_to_cpu_precise():
    """The real SmolLM2-135M (Q4_1, 30 layers, the built-in model) on the GPU against the CPU
    backend's precise mode (itself within 1e-2 of transformers)."""
    from edgerunner import Model

    gpu = Model.load("smollm2-135m-instruct", backend="metal")
    cpu = Model.load("smollm2-135m-instruct", backend="cpu", precise=True)
    ids = gpu.tokenize("The capital of France is")
    a = gpu.logits(ids)
    b = cpu.logits(ids)
    assert np.abs(a - b).max() <= 3e-3 * np.abs(b).max()  # the emulated kernels: 5.5e-4
