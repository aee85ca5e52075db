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
