"""The CUDA backend, whole model, against the float64 NumPy forward pass (skipped without a CUDA
device and a build with -C cmake.define.EDGERUNNER_CUDA=ON)."""

from __future__ import annotations

import numpy as np
import pytest

from edgerunner import _core
from reference_forward import ReferenceModel
from test_engine import FAST_TOLERANCE, IDS, check_kv_too_big, prompt, tiny_models  # noqa: F401 (fixture)

pytestmark = pytest.mark.skipif(not _core.cuda_available(), reason=_core.cuda_device())


@pytest.mark.parametrize("case", IDS)
def test_cuda_logits_close_to_float64_reference(tiny_models, case):
    """int8 activations into the quantized matmuls (as the CPU's fast path) and an fp16 KV cache:
    over two layers the logits stay within the CPU fast path's bound (FAST_TOLERANCE of the
    logit range)."""
    path, seed = tiny_models[case]
    ref = ReferenceModel(path)
    model = _core.Model.load(str(path), backend="cuda", prefill_chunk=16)
    assert model.backend == "cuda"
    ids = prompt(np.random.default_rng(seed + 2), 40)
    want = ref.logits(ids)
    got = _core.Session(model).eval_all(ids)
    scale = np.abs(want).max()
    err = np.abs(got - want).max()
    assert err <= FAST_TOLERANCE * scale, f"{case} seed {seed}: max |Δ| {err:.3g} vs |logit| max {scale:.3g}"


def test_cuda_mixed_formats_on_one_input(tmp_path, monkeypatch):
    """Q and V in Q4_0 and K in F16: three launches on one input, where V may read the copy of it
    Q's launch made (int8 for the GEMV, bf16 for the tensor-core GEMM) only if nothing came
    between. From 16 tokens on K's GEMM writes an f16 copy into the same buffer, so V makes its
    own (Runner::copy_ready). Prefill in chunks of 16 (the GEMM) and 8 (the GEMV), then decode
    steps: the logits within the CPU fast path's bound of the float64 reference."""
    from edgerunner import model_builder
    from edgerunner.model_builder import QType, write_random_model

    monkeypatch.setattr(model_builder, "mix_tensor_type", lambda mix, role, *rest: QType.F16 if role == "attn_k" else QType.Q4_0)
    path = write_random_model(tmp_path / "m.gguf", arch="llama", preset="tiny", tensor_type="Q4_K_M", seed=7)
    monkeypatch.undo()
    types = {t.name.split(".")[-2]: t.tensor_type.name for t in __import__("gguf").GGUFReader(path).tensors if t.name.startswith("blk.0.attn_")}
    assert (types["attn_q"], types["attn_k"], types["attn_v"]) == ("Q4_0", "F16", "Q4_0")
    ref = ReferenceModel(path)
    model = _core.Model.load(str(path), backend="cuda", prefill_chunk=16)
    ids = prompt(np.random.default_rng(3), 48)
    want = ref.logits(ids)
    s = _core.Session(model)
    got = [s.eval_all(ids[:40])]
    for t in range(40, 48):
        s.eval(ids[: t + 1])
        got.append(s.logits()[None])
    got = np.concatenate(got)
    scale = np.abs(want).max()
    err = np.abs(got - want).max(axis=1)
    assert np.all(err <= FAST_TOLERANCE * scale), f"max |Δ| by position {np.round(err, 4)} vs |logit| max {scale:.3g}"


# Q4_K + Q6_K super-blocks; Q4_0's and Q8_0's blocks, in groups of eight on the device (the odd
# shape's rows of 66 and 177 units padded to whole groups); an f32 cache; wide
# models, one with an odd shape, two with the 8B's attention shape, and one with a long LM head (below);
# the float formats (one-token GEMVs reading their input from shared memory, the small model's with the norm folded in)
@pytest.mark.parametrize("ttype,kv_type,shape", [("Q4_K_M", "f16", "small"), ("Q4_0", "f16", "small"), ("Q8_0", "f16", "small"),
                                                 ("Q4_0", "f32", "small"), ("Q4_0", "f16", "wide"), ("Q4_K_M", "f16", "wide"),
                                                 ("Q4_K_M", "f16", "8b_attention"), ("Q8_0", "f16", "8b_attention"), ("Q4_0", "f16", "odd"),
                                                 ("Q8_0", "f16", "long_head"), ("F32", "f16", "small"), ("F16", "f16", "wide"),
                                                 ("BF16", "f16", "8b_attention")])
def test_cuda_modes_agree_with_one_prefill(tmp_path, ttype, kv_type, shape):
    """reset, extend, decode and rewinds give the logits of one full prefill exactly: in steps
    of up to 15 tokens (chunks of 8 here) each token's kernels do the same arithmetic whatever
    the step size, including which decode attention takes it (the short path's one block per
    query head up to 160 keys at these heads of 128 in f16, 64 in f32, then runs of 32+ keys
    split over blocks; the odd model's heads of 64 stay on the short path, up to 256 keys),
    whether RoPE and the KV write are a kernel of their own (steps of several tokens) or
    done by the GEMVs of Q, K and V as they store them (one token, llama's adjacent pairs), and
    whether gate·up's int8 copy comes from the quantize kernel or from its own GEMV (one token),
    and whether a V of another format than Q and K (Q4_K_M's Q6_K layer) is its own launch or
    shares theirs (one token: StagedPair), and whether an RMSNorm's int8 copy comes from a norm
    kernel (steps of several tokens), or in one-token steps from the GEMV that adds the residual
    before it, a unit at a time, read by GEMVs that scale each unit by the row's 1/rms
    (GemvArgs::norm_out and xq_ss, where the producer's blocks take at most half the SMs or its
    weights are Q6_K or Q8_0: on an H200 every norm after the first layer's in the small, wide, odd
    and long-head shapes, the final one too; the 8B-attention model's 128 blocks of 32 rows take
    more, so its norm kernel runs after Q4_K_M's Q4_K projections, but not after its Q6_K down
    projection nor in the Q8_0 model), or
    from the one-token GEMVs that read it, each block normalizing the row itself with another
    block size (GemvArgs::norm: the small models' first norm; the wide, odd and 8B-attention models' grids
    would read more than the fold's budget); a float model's one-token GEMVs read their input from
    shared memory, each block's copy, and the small F32 model's fold the norm before them there
    (the norm kernel's bits), where the wide F16 model's (gate·up pairs, down rows loaded a step
    ahead) and the 8B-attention BF16 model's (Q·K·V rows loaded a step ahead) copy its output.
    The long-head model's 20000 short LM-head rows
    take the short-row kernel, GemvRows. The wide models (rows of 2048 values,
    heads of 128, 8192 gate·up rows: more blocks of 32 than a GPU has SMs, so their one-token
    steps quantize the down projection's input with the quantize kernel too) stream whole
    chunks of their rows through the GEMVs' rings (the down projection four a row), and their
    first norm is the norm kernel's 512 threads (the folded norm's blocks have 256); Q4_K_M's Q6_K layer runs its
    Q·K + V pair there. The odd model's rows of 66 units end in a chunk of two, and its 33 query
    heads on 3 KV heads make sets of 4, 4 and 3 per group in the decode attention. The 8B-attention
    model (rows of 4096 values, 32 heads on 8 KV heads) runs Q·K·V as one Q4_K launch in its first
    layer and as the pair in its second, whose Q6_K V rows are four chunks, one more than the ring
    holds (the last is asked for after the wait).
    (From 16 tokens on, prefill takes the tensor-core GEMM, on bf16 weights and activations,
    and the tiled attention: other arithmetic, checked against float64 and the CPU backend.)"""
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    dims = {"wide": dict(n_heads=16, n_kv_heads=4, dim=2048, ffn_dim=8192),
            "odd": dict(n_heads=33, n_kv_heads=3, dim=2112, ffn_dim=5664),
            "8b_attention": dict(n_heads=32, n_kv_heads=8, dim=4096, ffn_dim=1024)}.get(shape, dict(n_heads=2, n_kv_heads=1, dim=256, ffn_dim=512))
    if shape == "long_head":
        dims["vocab_size"] = 20000
    write_random_model(path, arch="llama", preset="tiny", tensor_type=ttype, seed=5, **dims)
    model = _core.Model.load(str(path), backend="cuda", prefill_chunk=8, kv_type=kv_type)
    ids = prompt(np.random.default_rng(0), 200)
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
    assert s.eval(ids[:150]) == "extend"  # steps of 8 from position 11: 1 to 5 runs of keys
    assert np.array_equal(s.logits(), full[149])
    for t in range(150, 200):
        s.append(int(ids[t]))
        assert np.array_equal(s.logits(), full[t])


def stepped_logits(path, ids, first: int, monkeypatch, skip_norm: bool = False) -> np.ndarray:
    """The CUDA backend's logits for ids[:first] in one step, then for each later token appended
    alone; skip_norm: with the norm kernels left out (EDGERUNNER_CUDA_SKIP=norm, read at load)."""
    if skip_norm:
        monkeypatch.setenv("EDGERUNNER_CUDA_SKIP", "norm")
    else:
        monkeypatch.delenv("EDGERUNNER_CUDA_SKIP", raising=False)
    s = _core.Session(_core.Model.load(str(path), backend="cuda"))
    s.eval(ids[:first])
    out = [s.logits().copy()]
    for t in ids[first:]:
        s.append(int(t))
        out.append(s.logits().copy())
    return np.stack(out)


def test_cuda_small_model_decode_runs_no_norm_kernel(tmp_path, monkeypatch):
    """A small llama-style model's one-token steps run no RMSNorm kernel: the first norm is folded
    into the GEMVs that read it (GemvArgs::norm), every later one is written by the GEMV that adds
    the residual (GemvArgs::norm_out), the final one too. So leaving the norm kernels out
    (EDGERUNNER_CUDA_SKIP=norm, a measurement knob) changes no logit of a generation fed one token
    at a time, while a first step of four tokens, which runs them, does change."""
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q4_0", seed=11)
    ids = prompt(np.random.default_rng(4), 10)
    assert np.array_equal(stepped_logits(path, ids, 1, monkeypatch), stepped_logits(path, ids, 1, monkeypatch, skip_norm=True))
    assert not np.array_equal(stepped_logits(path, ids, 4, monkeypatch), stepped_logits(path, ids, 4, monkeypatch, skip_norm=True))


@pytest.mark.parametrize("ttype,writes", [("Q8_0", True), ("Q4_0", False)])
def test_cuda_8b_shaped_decode_runs_the_norm_kernel_unless_q8_0(tmp_path, monkeypatch, ttype, writes):
    """The 8B's output and down projections (rows of 4096: 128 blocks of 32 rows, more than half
    the SMs) write the next RMSNorm's int8 copy where their weights are Q6_K or Q8_0, and leave it
    to the norm kernel where they are lighter (gemv_norms_out): leaving the norm kernels out
    (EDGERUNNER_CUDA_SKIP=norm) changes no logit of a Q8_0 model's one-token steps (its first norm
    is the embedding's), and changes a Q4_0 model's."""
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type=ttype, seed=12, n_heads=32, n_kv_heads=8, dim=4096, ffn_dim=1024)
    ids = prompt(np.random.default_rng(5), 6)
    assert np.array_equal(stepped_logits(path, ids, 1, monkeypatch), stepped_logits(path, ids, 1, monkeypatch, skip_norm=True)) == writes


def test_cuda_refuses_what_it_cannot_run(tmp_path, monkeypatch):
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", seed=1)
    with pytest.raises(ValueError, match="KV cache type q8_0 needs a head size that is a multiple of 32"):
        _core.Session(_core.Model.load(str(path), backend="cuda", kv_type="q8_0"))  # tiny: heads of 16
    with pytest.raises(ValueError, match="precise mode runs on the CPU backend only"):
        _core.Model.load(str(path), backend="cuda", precise=True)
    with pytest.raises(ValueError, match="unknown dispatch mode 'graphs'; choose eager, argument_buffers, recorded or auto"):
        _core.Model.load(str(path), backend="cuda", dispatch="graphs")
    assert _core.Model.load(str(path), precise=True).backend == "cpu"  # auto never picks CUDA for precise
    monkeypatch.setenv("EDGERUNNER_CUDA_SKIP", "attention,nrom")  # (a measurement knob, read at load)
    with pytest.raises(ValueError, match="EDGERUNNER_CUDA_SKIP: unknown part 'nrom'; the parts are embed, norm, quantize"):
        _core.Session(_core.Model.load(str(path), backend="cuda"))


def test_cuda_kv_cache_that_does_not_fit_says_which_would(tmp_path):
    """A KV cache beyond the GPU's free memory: OutOfMemoryError naming the GPU, its free memory
    and an n_ctx that fits, before anything is allocated; the device stays usable: a small
    context on the same file then matches the CPU backend."""
    from edgerunner import OutOfMemoryError
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "q.gguf"
    write_random_model(path, arch="qwen3", preset="tiny", seed=1)  # 2 layers, K and V of 256 f16 values
    big = 2**31 - 1
    with pytest.raises(OutOfMemoryError) as e:
        _core.Session(_core.Model.load(str(path), backend="cuda", n_ctx=big))
    print(e.value)
    check_kv_too_big(str(e.value), r"GPU \d+ \([^)]+\)", big, "f16", 2, 2 * 2 * 512,
                     hint=", or with kv_type='q8_0' (about half the bytes of f16)")
    model = _core.Model.load(str(path), backend="cuda", n_ctx=64)
    cpu = _core.Model.load(str(path), backend="cpu", n_ctx=64)
    ids = prompt(np.random.default_rng(2), 8)
    got, want = _core.Session(model).eval_all(ids), _core.Session(cpu).eval_all(ids)
    assert np.abs(got - want).max() <= FAST_TOLERANCE * np.abs(want).max()


def cuda_runtime():
    """The CUDA runtime through ctypes (another user of the GPU, beside the engine), or skip."""
    import ctypes
    import glob

    libs = sorted(glob.glob("/usr/local/cuda*/lib64/libcudart.so*") + glob.glob("/usr/local/cuda*/targets/*/lib/libcudart.so*"))
    if not libs:
        pytest.skip("no libcudart.so to reach the GPU with")
    return ctypes.CDLL(libs[0])


def test_cuda_weights_that_do_not_fit_say_so(tmp_path):
    """With all but 8 MiB of the GPU held by another allocation (the CUDA runtime through ctypes),
    loading a 37 MiB model fails with OutOfMemoryError naming the weights, their size, the GPU's
    free memory and the fix; once that memory is freed the same load runs."""
    import ctypes

    from edgerunner import OutOfMemoryError
    from edgerunner.model_builder import write_random_model

    rt = cuda_runtime()
    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="smollm2-135m", tensor_type="Q8_0", seed=1, n_layers=2)
    free, total, held = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_void_p()
    assert rt.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) == 0
    assert rt.cudaMalloc(ctypes.byref(held), ctypes.c_size_t(free.value - (8 << 20))) == 0
    try:
        with pytest.raises(OutOfMemoryError, match=r"^CUDA: out of GPU memory for the model's weights \([\d.]+ MiB\); "
                                                   r"GPU \d+ \([^)]+\): [\d.]+ MiB free\. Use a smaller quantization of "
                                                   r"the model, or backend='cpu'\.$") as e:
            _core.Model.load(str(path), backend="cuda")
        print(e.value)
    finally:
        assert rt.cudaFree(held) == 0
    cpu = _core.Model.load(str(path), backend="cpu", n_ctx=64)
    ids = prompt(np.random.default_rng(2), 8, cpu.config["n_vocab"])
    got = _core.Session(_core.Model.load(str(path), backend="cuda", n_ctx=64)).eval_all(ids)
    want = _core.Session(cpu).eval_all(ids)
    assert np.abs(got - want).max() <= FAST_TOLERANCE * np.abs(want).max()


def assert_matches_cpu(gpu, cpu, ids, rel, steps=8, label=""):
    """The GPU model's logits over `ids` (every position) and over `steps` decode steps after it
    (both fed the CPU's greedy token) within `rel` of the CPU model's logit range."""
    want = _core.Session(cpu).eval_all(ids)
    got = _core.Session(gpu).eval_all(ids)
    err, scale = np.abs(got - want).max(), np.abs(want).max()
    print(f"{label}: prompt max |Δ| {err:.4g} of |logit| max {scale:.4g}")
    assert err <= rel * scale
    a, b = _core.Session(gpu), _core.Session(cpu)
    a.eval(ids)
    b.eval(ids)
    for _ in range(steps):
        tok = int(np.argmax(b.logits()))
        a.append(tok)
        b.append(tok)
        assert np.abs(a.logits() - b.logits()).max() <= rel * np.abs(b.logits()).max()


@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("window", [0, 8])
def test_cuda_kv_cache_precisions_match_the_cpu_backend(tmp_path, kv_type, window):
    """Every KV cache precision on the GPU (the CPU's slot layouts: f32, f16, q8_0 blocks of 32)
    against the CPU backend with the same precision: a 40-token prompt (in chunks of 16, over
    a ring cache of window + chunk slots when windowed), then 8 decode steps; logits within 3%
    of the logit range (both take int8 activations; their quantization grouping differs)."""
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q8_0", seed=12, n_heads=2, n_kv_heads=1,
                       **(dict(window=window) if window else {}))
    gpu = _core.Model.load(str(path), backend="cuda", kv_type=kv_type, prefill_chunk=16)
    cpu = _core.Model.load(str(path), backend="cpu", kv_type=kv_type, prefill_chunk=16)
    assert_matches_cpu(gpu, cpu, prompt(np.random.default_rng(9), 40), 0.03, label=f"kv {kv_type} window {window}")


# (head size, query heads, KV heads): the tensor-core prefill attention takes head sizes 64 and
# 128, the shared-tile kernel the others; 18 query heads on one KV head are more than a block's 16
LONG_SHAPES = {"hd32-group18": (32, 18, 1), "hd64-group3": (64, 6, 2), "hd128-group4": (128, 8, 2)}


@pytest.mark.parametrize("shape", LONG_SHAPES)
@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("window", [0, 700])
def test_cuda_long_context_matches_the_cpu_backend(tmp_path, shape, kv_type, window):
    """A 2300-token prompt in chunks of 512 (prefill attention over up to 2300 keys, over a
    700-position window in a ring cache where windowed), then 8 decode steps at 2300+ positions,
    where a token's keys are split over many blocks (runs of 32+ keys, up to 32 runs, merged by
    the last block: 32 runs here, 22 over the window), against the CPU backend with the same KV
    precision: logits within 3 % of the logit range."""
    from edgerunner.model_builder import write_random_model

    head_dim, n_heads, n_kv_heads = LONG_SHAPES[shape]
    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q8_0", seed=21, dim=head_dim * n_heads, n_heads=n_heads,
                       n_kv_heads=n_kv_heads, context_length=4096, **(dict(window=window) if window else {}))
    gpu = _core.Model.load(str(path), backend="cuda", kv_type=kv_type, prefill_chunk=512)
    cpu = _core.Model.load(str(path), backend="cpu", kv_type=kv_type, prefill_chunk=512)
    assert_matches_cpu(gpu, cpu, prompt(np.random.default_rng(4), 2300), 0.03, label=f"{shape} kv {kv_type} window {window}")


@pytest.mark.parametrize("shape", LONG_SHAPES)
@pytest.mark.parametrize("kv_type", ["f32", "f16"])
def test_cuda_short_attention_matches_the_cpu_backend(tmp_path, shape, kv_type):
    """The decode attention's short path (one block per query head, every key in shared memory:
    up to 256 keys at heads of 32 and 64, 160 at 128 in f16, 64 in f32) over many keys: a
    200-token prompt in steps of 8 (all decode attention: tokens up to the limit take the short
    path, the others the split one), then 8 decode steps, against the CPU backend with the same
    KV precision: logits within 3 % of the logit range."""
    from edgerunner.model_builder import write_random_model

    head_dim, n_heads, n_kv_heads = LONG_SHAPES[shape]
    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q8_0", seed=23, dim=head_dim * n_heads, n_heads=n_heads,
                       n_kv_heads=n_kv_heads)
    gpu = _core.Model.load(str(path), backend="cuda", kv_type=kv_type, prefill_chunk=8)
    cpu = _core.Model.load(str(path), backend="cpu", kv_type=kv_type, prefill_chunk=8)
    assert_matches_cpu(gpu, cpu, prompt(np.random.default_rng(6), 200), 0.03, label=f"{shape} kv {kv_type}")


DISPATCH = ("eager", "argument_buffers", "recorded")


def test_cuda_dispatch_modes_give_identical_logits(tmp_path):
    """eager, argument_buffers (arguments in a device table) and recorded (CUDA graph replay)
    run the same kernels on the same step block: the prompt's and 12 greedy decode steps'
    logits are equal bit for bit, and so are 16 tokens sampled on the device."""
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    write_random_model(path, arch="qwen2", preset="tiny", tensor_type="Q4_0", seed=3)
    ids = prompt(np.random.default_rng(1), 9)
    runs, drawn = [], []
    for dispatch in DISPATCH:
        model = _core.Model.load(str(path), backend="cuda", dispatch=dispatch)
        s = _core.Session(model)
        s.eval(ids)
        out = [s.logits().copy()]
        for _ in range(12):
            s.append(int(np.argmax(out[-1])))
            out.append(s.logits().copy())
        runs.append(np.stack(out))
        s = _core.Session(model)
        s.eval(ids)
        drawn.append(s.generate(_core.Sampler(model.config["n_vocab"], seed=7, temperature=0.8), 16, []))
    for r, d in zip(runs[1:], drawn[1:]):
        assert np.array_equal(runs[0], r)
        assert d == drawn[0]


# greedy; temperature alone (every token a candidate); top-k up to 4096 (counted into histograms,
# the candidates sorted and walked as the CPU walks them) with top-p and min-p; k = 6000 (one block
# bisects top-k's candidates); top-p, min-p, both, and top-k past the vocabulary (masses into
# histograms); then bias and penalties (the penalize kernel before the sampler, over the token
# history the embedding keeps on the device: the prompt's and the draws')
SAMPLING = [dict(), dict(temperature=0.8), dict(temperature=0.8, top_k=40), dict(temperature=1.0, top_k=40, top_p=0.9, min_p=0.05),
            dict(temperature=0.7, top_k=1024), dict(temperature=1.2, top_k=1025), dict(temperature=0.9, top_k=4000, top_p=0.9),
            dict(temperature=0.9, top_p=0.8),
            dict(temperature=1.5, min_p=0.1), dict(temperature=1.1, top_p=0.7, min_p=0.02), dict(temperature=0.6, top_k=6000, top_p=0.95),
            dict(repetition_penalty=1.5),
            dict(temperature=0.9, top_k=40, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2, penalty_last_n=8),
            dict(temperature=0.8, frequency_penalty=0.5, penalty_last_n=-1, logit_bias={7: -np.inf, 100: 3.0, 5002: -1.5})]


@pytest.mark.parametrize("params", SAMPLING, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "greedy")
def test_cuda_sampling_matches_the_cpu_sampler(tmp_path, params):
    """Each token drawn on the device (at the end of a decode step, or alone from the prompt's
    logits) is the one the CPU sampler draws from that step's logits with the same seed, step and
    history: 25 draws over a vocabulary of 5003 (float4 loads and a scalar tail)."""
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q8_0", seed=21, vocab_size=5003)
    model = _core.Model.load(str(path), backend="cuda")
    sampler = _core.Sampler(5003, seed=17, **params)
    s = _core.Session(model)
    s.eval(prompt(np.random.default_rng(4), 6))
    first = sampler.sample(s.logits(), np.asarray(s.tokens, np.int32), len(s.tokens))
    assert s.sample(sampler) == first, "the draw from the prompt's logits (Session.sample: on the device)"
    token = 7
    for step in range(24):
        token = s.append_sampled(token, sampler)
        want = sampler.sample(s.logits(), np.asarray(s.tokens, np.int32), len(s.tokens))
        assert token == want, f"draw {step}: device {token}, CPU {want}"


@pytest.mark.parametrize("params", [dict(temperature=1.0), dict(temperature=0.7, top_p=0.95), dict(temperature=1.3, top_p=0.9, min_p=0.01),
                                    dict(temperature=0.8, top_k=40, top_p=0.9), dict(temperature=0.8, top_k=2000, top_p=0.95)],
                         ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_cuda_draws_match_the_cpu_sampler_at_128k(tmp_path, params):
    """Draws at Llama 3's vocabulary (128256 tokens: 126 blocks of SampleMass's histograms merged
    by atomics, SampleWalk's candidates gathered from all of them): 32 draws of a chained
    generation, each the CPU sampler's on that step's logits (a second session stepped with the
    same tokens)."""
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    n = 128256
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q8_0", seed=9, vocab_size=n)
    model = _core.Model.load(str(path), backend="cuda")
    ids = prompt(np.random.default_rng(6), 8)
    s = _core.Session(model)
    s.eval(ids)
    drawn = s.generate(_core.Sampler(n, seed=23, **params), 32, [])
    check = _core.Session(model)
    check.eval(ids)
    sampler = _core.Sampler(n, seed=23, **params)
    for step, token in enumerate(drawn):
        want = sampler.sample(check.logits(), np.asarray(check.tokens, np.int32), len(check.tokens))
        assert token == want, f"draw {step}: device {token}, CPU {want}"
        check.append(token)


def write_broken_output_model(path) -> None:
    """A tiny Q8_0 llama of 5003 tokens whose final norm's weights are NaN: every logit NaN."""
    import gguf

    from edgerunner.model_builder import write_random_model

    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q8_0", seed=2, vocab_size=5003)
    r = gguf.GGUFReader(path, "r+")
    next(t for t in r.tensors if t.name == "output_norm.weight").data[:] = np.nan
    r.data.flush()


def test_cuda_no_finite_logit_is_an_error_not_a_token(tmp_path):
    """A model whose output is broken (its final norm's weights NaN: every logit NaN): a draw on
    the device raises, as the CPU sampler does, greedy or not: one step at a time, a generation's
    first (drawn from the prompt's logits), or chained (where the next step had already read the
    -1 as its input: the embedding reads row 0 for a token outside the vocabulary, nothing out of
    bounds); the session then works on."""
    path = tmp_path / "m.gguf"
    write_broken_output_model(path)
    for dispatch in DISPATCH:
        model = _core.Model.load(str(path), backend="cuda", dispatch=dispatch)
        for params in (dict(), dict(temperature=0.8), dict(temperature=0.8, top_k=40, top_p=0.9)):
            s = _core.Session(model)
            ids = prompt(np.random.default_rng(1), 5)
            s.eval(ids)
            with pytest.raises(ValueError, match="no finite logit"):
                s.append_sampled(7, _core.Sampler(5003, seed=1, **params))
            with pytest.raises(ValueError, match="no finite logit"):  # (generate's first draw: the prompt's logits)
                s.generate(_core.Sampler(5003, seed=1, **params), 8, [])
            with pytest.raises(ValueError, match="no finite logit"):
                s.append_sampled(7, _core.Sampler(5003, seed=1, **params), 6)  # chained
            more = np.append(ids, np.int32(4)).astype(np.int32)
            s.eval(more)
            assert list(s.tokens) == list(more) and np.isnan(s.logits()).all()


def test_cuda_greedy_ties_resolve_to_the_lowest_id_across_blocks(tmp_path):
    """The greedy token is merged over blocks of 16384 logits: equal logits in different blocks
    go to the lowest id, as the CPU sampler's walk does. The LM head (Q8_0, 40000 rows, three
    blocks) has every block's scale zeroed (logit 0) but for three copies of one row (ids 4100,
    20000, 36000: one in each block) and three of its negation (4200, 20100, 36100), so 4100 or
    4200 wins each draw over equal logits in the two later blocks; a second pass zeroes those
    too, so every logit ties and id 0 must win."""
    import gguf

    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q8_0", seed=5, vocab_size=40000, tied=False)

    def patch(rows_kept):
        r = gguf.GGUFReader(path, "r+")
        w = next(t for t in r.tensors if t.name == "output.weight").data  # (rows, row bytes): 34-byte blocks, d first
        blocks = w.reshape(w.shape[0], -1, 34)
        row = blocks[4100].copy()
        blocks[:, :, :2] = 0  # d = +0
        if rows_kept:
            blocks[[4100, 20000, 36000]] = row
            row[:, 1] ^= 0x80  # d negated
            blocks[[4200, 20100, 36100]] = row
        r.data.flush()

    for rows_kept, want_ids in ((True, {4100, 4200}), (False, {0})):
        patch(rows_kept)
        model = _core.Model.load(str(path), backend="cuda")
        sampler = _core.Sampler(40000, seed=3)
        for seed in range(6):
            s = _core.Session(model)
            s.eval(prompt(np.random.default_rng(seed), 5))
            token = 7
            for step in range(4):
                token = s.append_sampled(token, sampler)
                logits = s.logits()
                assert token == sampler.sample(logits, [], len(s.tokens)) and token in want_ids, f"prompt {seed}, draw {step}: {token}"
                if rows_kept:
                    assert logits[4100] == logits[20000] == logits[36000] == -logits[4200] != 0
        del model


# a model whose one-token gate·up streams (8192 rows: more blocks than the SMs hold) in one layer:
# it hands its values to the quantize kernel as tagged words (GemvTagged), and the previous
# one-token step's words are the buffer's last (from this layer), so only the step's sequence
# number tells them apart
STREAMED_ONE_LAYER = dict(n_layers=1, n_heads=16, n_kv_heads=4, dim=2048, ffn_dim=8192)


@pytest.mark.parametrize("shape", ["tiny", "streamed"])
def test_cuda_chained_generation_equals_step_by_step(tmp_path, shape):
    """generate() with recorded dispatch keeps three decode steps in flight, each fed the previous
    one's draw on the device; eager dispatch draws on the device too but waits for each token.
    Both give the same tokens, the same cache contents (session tokens) and the same final
    logits bit for bit: over a full run, a stop token met mid-chain (steps already in flight past
    it are dropped and the last kept token's logits recomputed), and a context that fills up.
    (The streamed model: each chained step's sampler writes the next step's sequence number, the
    host each eager step's.)"""
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q4_0", seed=4, **(STREAMED_ONE_LAYER if shape == "streamed" else {}))
    ids = prompt(np.random.default_rng(2), 9)
    results = {}
    for dispatch in ("eager", "recorded"):
        model = _core.Model.load(str(path), backend="cuda", dispatch=dispatch, n_ctx=len(ids) + 12)
        runs = []
        for max_tokens, stop_mid in ((10, False), (10, True), (30, False)):
            s = _core.Session(model)
            s.eval(ids)
            stops = [runs[0][0][5]] if stop_mid else []  # the full run's sixth token
            out = s.generate(_core.Sampler(model.config["n_vocab"], seed=11, temperature=0.9), max_tokens, stops)
            runs.append((out, list(s.tokens), s.logits().copy()))
        results[dispatch] = runs
    for (a_out, a_tokens, a_logits), (b_out, b_tokens, b_logits) in zip(results["eager"], results["recorded"]):
        assert a_out == b_out
        assert a_tokens == b_tokens
        assert np.array_equal(a_logits, b_logits)
    full, stopped, filled = results["recorded"]
    assert len(full[0]) == 10 and len(full[1]) == len(ids) + 10
    assert stopped[0][-1] == full[0][5] and len(stopped[1]) == len(ids) + len(stopped[0]) - 1
    assert len(filled[1]) == len(ids) + 12  # the context is full


@pytest.mark.parametrize("dispatch", DISPATCH)
def test_cuda_gate_up_hand_off_takes_no_earlier_steps_values(tmp_path, dispatch):
    """The streamed gate·up's tagged words are read by the quantize kernel as they land, before
    gate·up's grid ends: a word another step wrote must never pass for this step's. One position
    decoded again and again with one token and then another (rewinds: same layer, same position,
    one step after the other), then steps on, gives the logits of one full prefill of those
    tokens (whose steps of several tokens quantize with the plain kernel) bit for bit."""
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q4_0", seed=8, **STREAMED_ONE_LAYER)
    model = _core.Model.load(str(path), backend="cuda", dispatch=dispatch, prefill_chunk=8)
    a = prompt(np.random.default_rng(3), 40)
    b = a.copy()
    b[20] = (a[20] + 1) % model.config["n_vocab"]
    full = {0: _core.Session(model).eval_all(a), 1: _core.Session(model).eval_all(b)}
    s = _core.Session(model)
    s.eval(a[:20])
    for k in range(8):
        s.rewind(20)
        s.append(int((a, b)[k % 2][20]))
        assert np.array_equal(s.logits(), full[k % 2][20]), f"decode {k} of position 20"
    for t in range(21, 40):
        s.append(int(b[t]))
        assert np.array_equal(s.logits(), full[1][t])


@pytest.mark.parametrize("dispatch", DISPATCH)
def test_cuda_penalties_follow_the_history_through_chains(tmp_path, dispatch):
    """generate() with bias and penalties: recorded dispatch chains the steps (three in flight,
    each penalized over a history whose last tokens were drawn on the device and never seen by
    the host in between); the others draw on the device step by step. Every token is the CPU
    sampler's on logits of the same model (eager dispatch, bit-equal to the others) with the full
    history: a prompt that repeats tokens, penalty windows of 3 and of the whole history, a bias
    that bans the greedy choice; then a second generation with other parameters on the same
    session (the bias table replaced, the chain's graphs of the penalized kind reused)."""
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q4_0", seed=9)
    model = _core.Model.load(str(path), backend="cuda", dispatch=dispatch)
    ref = _core.Model.load(str(path), backend="cuda", dispatch="eager")
    n_vocab = model.config["n_vocab"]
    ids = np.tile(prompt(np.random.default_rng(3), 6), 3)
    s, r = _core.Session(model), _core.Session(ref)
    s.eval(ids)
    r.eval(ids)
    for params in (dict(temperature=0.9, repetition_penalty=1.4, frequency_penalty=0.3, penalty_last_n=3, seed=5),
                   dict(presence_penalty=2.0, penalty_last_n=-1, logit_bias={int(np.argmax(r.logits())): -np.inf, 3: 0.5}, seed=6)):
        out = s.generate(_core.Sampler(n_vocab, **params), 20, [])
        sampler = _core.Sampler(n_vocab, **params)
        for i, token in enumerate(out):
            want = sampler.sample(r.logits(), np.asarray(r.tokens, np.int32), len(r.tokens))
            assert token == want, f"{params}: token {i}: {dispatch} drew {token}, CPU sampler {want}"
            r.append(token)
        assert list(s.tokens) == list(r.tokens)  # (generate appends every draw, the last one too)


GEMMA3 = [("F32", {}), ("Q8_0", dict(n_kv_heads=2)), ("Q4_K", dict(dim=256, ffn_dim=512))]


@pytest.mark.parametrize("ttype,over", GEMMA3, ids=[t for t, _ in GEMMA3])
def test_cuda_gemma3_matches_the_cpu_backend(tmp_path, ttype, over):
    """Gemma 3 on the GPU (scaled embeddings, GELU gate fused into the gate+up GEMV, post-norms
    into the residual, per-head Q/K norms, local layers with their own RoPE base, window and
    ring cache of window + chunk slots) against the CPU backend's precise mode (itself equal
    to transformers, test_hf_oracle): a 48-token prompt, 5 of every 6 layers windowed to 8,
    then 8 decode steps; logits within 5% of the logit range. (The int8 activations cost that
    much on these models on the CPU too: its fast path is 3.2% (Q8_0) and 3.8% (Q4_K) from its
    precise mode here.)"""
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "g.gguf"
    write_random_model(path, arch="gemma3", preset="tiny", tensor_type=ttype, seed=21, **over)
    gpu = _core.Model.load(str(path), backend="cuda", prefill_chunk=16)
    assert gpu.backend == "cuda"
    cpu = _core.Model.load(str(path), backend="cpu", precise=True, prefill_chunk=16)
    assert_matches_cpu(gpu, cpu, prompt(np.random.default_rng(5), 48), 0.05, label=f"gemma3 {ttype}")


def truncated_smollm2(tmp_path_factory):
    """SmolLM2-135M's first two layers with its real embeddings, vocabulary and head: from
    $EDGERUNNER_TRUNCATED_SMOLLM2 (a file made by `python -m edgerunner.model_builder OUT
    --truncate SmolLM2-135M-Instruct.Q4_1.gguf --layers 2`, carried to machines without the
    model), else cut here from the cached built-in model."""
    import os

    from edgerunner import builtin_models
    from edgerunner.model_builder import truncate_model

    given = os.environ.get("EDGERUNNER_TRUNCATED_SMOLLM2")
    if given:
        return given
    full = builtin_models.cached_path("smollm2-135m-instruct")
    if full is None:
        pytest.skip("SmolLM2 is not cached here and $EDGERUNNER_TRUNCATED_SMOLLM2 is not set")
    return str(truncate_model(full, tmp_path_factory.mktemp("trunc") / "smollm2-2l.gguf", 2))


def test_cuda_truncated_real_model_matches_the_cpu_backend(tmp_path_factory):
    """Real weights (SmolLM2's Q4_1 embeddings and head, its first two layers): the GPU's logits
    over a 40-token prompt within 3% of the logit range of the CPU backend's precise mode, and 24
    greedy tokens equal to the CPU's, or diverging only where the CPU's top two logits are
    within 2% of the logit range of each other (a near-tie int8 activations may flip)."""
    path = truncated_smollm2(tmp_path_factory)
    gpu = _core.Model.load(path, backend="cuda")
    cpu = _core.Model.load(path, backend="cpu", precise=True)
    ids = prompt(np.random.default_rng(8), 40, vocab=49152)
    want = _core.Session(cpu).eval_all(ids)
    got = _core.Session(gpu).eval_all(ids)
    scale = np.abs(want).max()
    err = np.abs(got - want).max()
    print(f"truncated SmolLM2: max |Δ| {err:.4g}, |logit| max {scale:.4g}")
    assert err <= 0.03 * scale
    a, b = _core.Session(gpu), _core.Session(cpu)
    a.eval(ids)
    b.eval(ids)
    for step in range(24):
        la, lb = a.logits(), b.logits()
        ta, tb = int(np.argmax(la)), int(np.argmax(lb))
        if ta != tb:
            top2 = np.sort(lb)[-2:]
            gap = top2[1] - top2[0]
            print(f"first divergence at step {step}: GPU {ta}, CPU {tb}, CPU top-2 gap {gap:.4g}")
            assert gap <= 0.02 * np.abs(lb).max()
            break
        a.append(ta)
        b.append(tb)


def test_cuda_python_generation_keeps_steps_in_flight(tmp_path):
    """Model.generate's loop (streamed or not) tells append_sampled how many more draws it may
    ask for, so with recorded dispatch the session keeps steps in flight on the device and drops
    the untaken ones when the loop stops early. The text equals eager dispatch's (one step at a
    time), to max_tokens and when a stop string cuts it; after the cut the session holds the
    same tokens and the same logits bit for bit; two streams interleaved on one model each get
    the text they get alone (each one's next call ends the other's chain, and prefills its
    tokens again: in steps of 8, whose arithmetic is a decode step's token for token; from 16
    tokens on, prefill takes the tensor-core GEMM, whose bf16 rounding is not the decode
    GEMV's int8 one, so a sampled token could differ)."""
    import edgerunner
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q4_0", seed=4)
    kw = dict(max_tokens=24, temperature=0.9, seed=5, ignore_eos=True)
    a_ids, b_ids = list(range(5, 15)), list(range(40, 52))
    results, stop = {}, None
    for dispatch in ("eager", "recorded"):
        model = edgerunner.Model.load(path, backend="cuda", dispatch=dispatch, prefill_chunk=8)
        full = model.generate(a_ids, **kw)
        streamed = "".join(model.generate(a_ids, stream=True, **kw))
        if stop is None:
            stop = full[len(full) // 2:len(full) // 2 + 2]
            assert stop.strip(), f"pick another stop string from {full!r}"
        cut = model.generate(a_ids, stop=stop, **kw)
        state = (list(model._session.tokens), model._session.logits().copy())
        b_alone = model.generate(b_ids, **kw)
        a, b = model.generate(a_ids, stream=True, **kw), model.generate(b_ids, stream=True, **kw)
        a_text, b_text = [], []
        for _ in range(40):
            a_text.append(next(a, ""))
            b_text.append(next(b, ""))
        assert "".join(a_text) == full and "".join(b_text) == b_alone
        results[dispatch] = (full, streamed, cut, state)
    (full, streamed, cut, (tokens, logits)), (r_full, r_streamed, r_cut, (r_tokens, r_logits)) = results.values()
    assert streamed == full == r_full == r_streamed
    assert cut == r_cut == full[:full.index(stop)]
    assert tokens == r_tokens and len(tokens) < len(a_ids) + kw["max_tokens"]
    assert np.array_equal(logits, r_logits)


def test_cuda_device_by_index(tmp_path):
    """backend='cuda:N' names CUDA device N ('cuda' is cuda:0, and so is 'auto''s pick); an index
    past the machine's devices is refused before anything loads, naming the devices there are."""
    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q4_0", seed=3)
    for backend in ("cuda", "cuda:0", "auto"):
        model = _core.Model.load(str(path), backend=backend, n_ctx=64)
        assert (model.backend, model.device) == ("cuda", "cuda:0")
    count = _core.cuda_device_count()
    with pytest.raises(ValueError, match=rf"^backend 'cuda:{count}': there is no CUDA device {count}; this machine has "
                                         rf"{count}: cuda:0 [^,]+ \(sm_\d+, \d+ SMs, \d+ MiB\)") as e:
        _core.Model.load(str(path), backend=f"cuda:{count}")
    print(e.value)


def gpu_free_bytes(rt, gpu):
    import ctypes

    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    assert rt.cudaSetDevice(gpu) == 0 and rt.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) == 0
    return free.value


@pytest.mark.skipif(_core.cuda_device_count() < 2, reason="needs two CUDA devices")
def test_cuda_models_on_two_gpus(tmp_path):
    """A model on cuda:1 keeps its weights and KV cache there (GPU 1's free memory falls by the
    1 GiB cache, GPU 0's does not move) and computes what the same model on cuda:0 does: bit for
    bit where the two devices are of one kind, else within the CPU comparison's bound. Models on
    both, driven from one thread (whose current device another library sets, here the CUDA
    runtime through ctypes, and which the engine leaves as it found it) step by step and by
    generate's chained steps, and from two threads at once, give the tokens each gives alone."""
    import ctypes
    import threading

    from edgerunner.model_builder import write_random_model

    rt = cuda_runtime()
    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q4_0", seed=6)
    cpu = _core.Model.load(str(path), backend="cpu", n_ctx=64)
    c = cpu.config
    n_ctx = 2**30 // (c["n_layer"] * 2 * c["n_head_kv"] * c["head_dim"] * 2)  # a 1 GiB f16 cache
    before = [gpu_free_bytes(rt, d) for d in (0, 1)]
    m1 = _core.Model.load(str(path), backend="cuda:1", n_ctx=n_ctx)
    s1 = _core.Session(m1)
    after = [gpu_free_bytes(rt, d) for d in (0, 1)]
    print(f"free MiB before {[b >> 20 for b in before]}, after {[a >> 20 for a in after]}")
    assert before[1] - after[1] >= 2**30 and abs(before[0] - after[0]) < 64 << 20
    assert (m1.backend, m1.device) == ("cuda", "cuda:1")

    m0 = _core.Model.load(str(path), backend="cuda:0", n_ctx=n_ctx)
    ids = prompt(np.random.default_rng(4), 24)
    l1 = s1.eval_all(ids)
    l0 = _core.Session(m0).eval_all(ids)
    want = _core.Session(cpu).eval_all(ids)
    assert np.abs(l1 - want).max() <= FAST_TOLERANCE * np.abs(want).max()
    if _core.cuda_device(0) == _core.cuda_device(1):
        assert np.array_equal(l0, l1)

    def greedy_alone(model, steps=12):
        s = _core.Session(model)
        s.eval(ids)
        out = []
        for _ in range(steps):
            out.append(int(np.argmax(s.logits())))
            s.append(out[-1])
        return out

    def sampled(model, seed, n=40):
        s = _core.Session(model)
        s.eval(ids)
        return s.generate(_core.Sampler(model.config["n_vocab"], seed=seed, temperature=0.9), n, [])

    alone = {d: greedy_alone(m) for d, m in ((0, m0), (1, m1))}
    drawn = {d: sampled(m, 10 + d) for d, m in ((0, m0), (1, m1))}
    # one thread, steps interleaved, the thread's current device switched by another user between them
    sessions = {0: _core.Session(m0), 1: _core.Session(m1)}
    for s in sessions.values():
        s.eval(ids)
    got = {0: [], 1: []}
    for step in range(12):
        for d in (1, 0):
            assert rt.cudaSetDevice(step % 2) == 0
            got[d].append(int(np.argmax(sessions[d].logits())))
            sessions[d].append(got[d][-1])
    assert got == alone
    assert rt.cudaSetDevice(0) == 0
    assert [sampled(m1, 11), sampled(m0, 10)] == [drawn[1], drawn[0]]
    # two threads at once, one a GPU
    results = {}
    threads = [threading.Thread(target=lambda d=d, m=m: results.__setitem__(d, sampled(m, 10 + d))) for d, m in ((0, m0), (1, m1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == drawn
    device = ctypes.c_int()
    assert rt.cudaGetDevice(ctypes.byref(device)) == 0 and device.value == 0  # as this thread left it


@pytest.mark.skipif(_core.cuda_device_count() < 2, reason="needs two CUDA devices")
def test_cuda_model_on_gpu_1_leaves_gpu_0_alone(tmp_path):
    """A process that loads and runs a model on cuda:1 (and frees it) creates no context on GPU 0:
    no memory of GPU 0 is taken by a program that asked for GPU 1 (the driver's primary context
    state, asked in a fresh process)."""
    import subprocess
    import sys

    from edgerunner.model_builder import write_random_model

    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", tensor_type="Q4_0", seed=6)
    code = f"""
import ctypes
import numpy as np
from edgerunner import _core
m = _core.Model.load({str(path)!r}, backend="cuda:1", n_ctx=64)
s = _core.Session(m)
s.eval(np.arange(1, 9, dtype=np.int32))
print(s.generate(_core.Sampler(m.config["n_vocab"]), 8, []))
del s, m
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
for ordinal in (0, 1):
    dev, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
    assert cu.cuDeviceGet(ctypes.byref(dev), ordinal) == 0
    assert cu.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active)) == 0
    print("context", ordinal, active.value)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    print(r.stdout, r.stderr)
    assert r.returncode == 0
    assert "context 0 0" in r.stdout and "context 1 1" in r.stdout
