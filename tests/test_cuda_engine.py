"""The CUDA backend, whole model, against the float64 NumPy forward pass (skipped without a CUDA
device and a build with -C cmake.define.EDGERUNNER_CUDA=ON)."""

from __future__ import annotations

import numpy as np
import pytest

from edgerunner import _core
from reference_forward import ReferenceModel
from test_engine import IDS, prompt, tiny_models  # noqa: F401 (fixture)

pytestmark = pytest.mark.skipif(not _core.cuda_available(), reason=_core.cuda_device())


@pytest.mark.parametrize("case", IDS)
def test_cuda_logits_close_to_float64_reference(tiny_models, case):
    """int8 activations into the quantized matmuls (as the CPU's fast path) and an fp16 KV cache:
    over two layers the logits stay within 3% of the logit range, the CPU fast path's bound."""
    path, seed = tiny_models[case]
    ref = ReferenceModel(path)
    model = _core.Model.load(str(path), backend="cuda", prefill_chunk=16)
    assert model.backend == "cuda"
    ids = prompt(np.random.default_rng(seed + 2), 40)
    want = ref.logits(ids)
    got = _core.Session(model).eval_all(ids)
    scale = np.abs(want).max()
    err = np.abs(got - want).max()
    assert err <= 0.03 * scale, f"{case} seed {seed}: max |Δ| {err:.3g} vs |logit| max {scale:.3g}"


def test_cuda_modes_agree_with_one_prefill(tmp_path):
    """reset, extend, decode and rewinds give the logits of one full prefill exactly: each
    token's kernels do the same arithmetic whatever the step size."""
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q4_K_M", seed=5, n_heads=2, n_kv_heads=1,
                       dim=256, ffn_dim=512)
    model = _core.Model.load(str(path), backend="cuda", prefill_chunk=8)
    ids = prompt(np.random.default_rng(0), 30)
    full = _core.Session(model).eval_all(ids)
    s = _core.Session(model)
    assert s.eval(ids[:5]) == "reset"
    assert np.array_equal(s.logits(), full[4])
    assert s.eval(ids[:21]) == "extend"
    assert np.array_equal(s.logits(), full[20])
    assert s.eval(ids[:22]) == "decode"
    assert np.array_equal(s.logits(), full[21])
    s.rewind(10)
    s.append(int(ids[10]))
    assert np.array_equal(s.logits(), full[10])


def test_cuda_refuses_what_it_cannot_run(tmp_path):
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", seed=1)
    with pytest.raises(ValueError, match="f32 is not available on the CUDA backend"):
        _core.Session(_core.Model.load(str(path), backend="cuda", kv_type="f32"))
    with pytest.raises(ValueError, match="precise mode runs on the CPU backend only"):
        _core.Model.load(str(path), backend="cuda", precise=True)
    assert _core.Model.load(str(path), precise=True).backend == "cpu"  # auto never picks CUDA for precise


def test_cuda_dispatch_modes_give_identical_logits(tmp_path):
    """eager and recorded (CUDA graph replay) run the same kernels on the same step block:
    the prompt's and 12 greedy decode steps' logits are equal bit for bit."""
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    write_random_model(path, arch="qwen2", preset="tiny", tensor_type="Q4_0", seed=3)
    ids = prompt(np.random.default_rng(1), 9)
    runs = []
    for dispatch in ("eager", "recorded"):
        s = _core.Session(_core.Model.load(str(path), backend="cuda", dispatch=dispatch))
        s.eval(ids)
        out = [s.logits().copy()]
        for _ in range(12):
            s.append(int(np.argmax(out[-1])))
            out.append(s.logits().copy())
        runs.append(np.stack(out))
    assert np.array_equal(runs[0], runs[1])


SAMPLING = [dict(temperature=0.0), dict(temperature=0.8), dict(temperature=1.0, top_k=20),
            dict(temperature=0.7, top_p=0.9), dict(temperature=1.2, min_p=0.05),
            dict(temperature=0.9, top_k=40, top_p=0.95, min_p=0.02)]


@pytest.mark.parametrize("preset,params", [(p, s) for p in ("tiny", "smollm2-135m") for s in SAMPLING])
def test_cuda_sampling_follows_the_cpu_sampler(tmp_path, preset, params):
    """Tokens drawn on the GPU (only 4 bytes come back per step) are the CPU sampler's tokens on
    the same logits, step for step: same contract, same counter-based uniform. Checked by a
    second session that fetches each step's logits and runs the CPU sampler on them."""
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset=preset, tensor_type="Q4_0", seed=11,
                       **(dict(n_layers=2) if preset != "tiny" else {}))
    model = _core.Model.load(str(path), backend="cuda", n_ctx=256)
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
    # the session that sampled on the device still gives the last logits when asked
    assert np.array_equal(drawn.logits(), check.logits())
