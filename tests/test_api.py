"""The Python API and the CLI as a user meets them, on the real SmolLM2 model and tiny ones."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import edgerunner
from edgerunner import Model
from edgerunner.model_builder import write_random_model
from test_engine import FAST_TOLERANCE, available_memory


@pytest.fixture(scope="module")
def smollm2():
    # Precise mode, so greedy answers are transformers' answers (fast mode may flip near-ties,
    # e.g. "The" 25.33 vs "L" 25.24 as the first token of the France answer).
    return Model.load("smollm2-135m-instruct", threads=2, precise=True)


@pytest.mark.slow
def test_chat_and_multi_turn_prefix_reuse(smollm2):
    reply = smollm2.chat([{"role": "user", "content": "What is the capital of France?"}], max_tokens=24, seed=0,
                         temperature=0)
    assert "Paris" in reply
    assert smollm2.last_generation["finish_reason"] in ("eos", "length")

    conv = smollm2.session(system="You are a concise assistant.")
    first = conv.send("Name a color.", max_tokens=16, temperature=0)
    assert conv.last_turn["mode"] == "reset"
    prompt_1 = conv.last_turn["prompt_tokens"]
    second = "".join(conv.send("Name another one.", max_tokens=16, temperature=0, stream=True))
    assert conv.last_turn["mode"] == "extend"  # the first turn's tokens were reused
    assert conv.last_turn["prompt_tokens"] > prompt_1
    assert [m["role"] for m in conv.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert conv.messages[2]["content"] == first and conv.messages[4]["content"] == second


@pytest.mark.slow
def test_streaming_equals_whole_text_and_stop_strings(smollm2):
    kw = dict(max_tokens=40, temperature=0.9, seed=11)
    whole = smollm2.generate("Write a list of fruits:\n1.", **kw)
    assert "".join(smollm2.generate("Write a list of fruits:\n1.", stream=True, **kw)) == whole
    cut = smollm2.generate("Write a list of fruits:\n1.", stop="\n", **kw)
    assert "\n" not in cut and whole.startswith(cut)


@pytest.mark.slow
def test_logits_api(smollm2):
    ids = smollm2.tokenize("Hello world")
    last = smollm2.logits(ids)
    every = smollm2.logits(ids, all_positions=True)
    assert last.shape == (smollm2.n_vocab,) and every.shape == (len(ids), smollm2.n_vocab)
    np.testing.assert_array_equal(every[-1], last)
    assert smollm2.detokenize(ids, skip_special=True) == "Hello world"


def test_devices_say_what_each_backend_gets(tmp_path):
    """edgerunner.devices() lists the CPU first, then each CUDA device as cuda:N (or one cuda entry
    saying why there is none), then Metal; backend='auto' gets the first available GPU entry, and
    every available entry loads as that device and gives the CPU backend's logits within the fast
    path's bound (FAST_TOLERANCE of the logit range)."""
    found = edgerunner.devices()
    names = [d["device"] for d in found]
    assert names[0] == "cpu" and found[0]["available"] and names[-1] == "metal"
    assert found[0]["description"].endswith(f"kernels {edgerunner._core.cpu_isa()} (this CPU runs "
                                            f"{', '.join(edgerunner._core.cpu_isas())})")
    if edgerunner._core.cuda_available():
        count = edgerunner._core.cuda_device_count()
        assert names[1:-1] == [f"cuda:{n}" for n in range(count)]
        assert [d["description"] for d in found[1:-1]] == [edgerunner._core.cuda_device(n) for n in range(count)]
    else:
        assert found[1:-1] == [{"device": "cuda", "available": False, "description": edgerunner._core.cuda_device()}]
    assert found[-1]["available"] == edgerunner._core.metal_available()
    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", seed=0)
    assert Model.load(path, n_ctx=32).device == next((d["device"] for d in found[1:] if d["available"]), "cpu")
    cpu = Model.load(path, n_ctx=32, backend="cpu")
    assert (cpu.device, cpu.backend) == ("cpu", "cpu")
    want = cpu.logits([1, 2, 3])
    for d in found[1:]:
        if d["available"]:
            model = Model.load(path, n_ctx=32, backend=d["device"])
            assert model.device == d["device"] and model.backend == d["device"].split(":")[0]
            assert np.abs(model.logits([1, 2, 3]) - want).max() <= FAST_TOLERANCE * np.abs(want).max()


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a file nor a built-in model"):
        Model.load("no-such-model")
    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", seed=0)
    model = Model.load(path, n_ctx=32)
    with pytest.raises(edgerunner.ContextLengthError, match="context holds 32"):
        model.generate(list(range(40)))
    with pytest.raises(ValueError, match="temperature"):
        model.generate("hi", temperature=-1)
    want = "cuda:0" if model.backend == "cuda" else model.backend  # (auto: the GPU where there is one)
    assert model.device == want and f"device={want}" in repr(model)
    assert model.backend == ("cuda" if edgerunner._core.cuda_available() else "cpu")
    if not edgerunner._core.cuda_available():
        for backend in ("cuda", "cuda:1"):
            for source in (path, "no-such-org/no-such-repo:Q4_0"):  # (the second: refused before a download)
                with pytest.raises(ValueError, match=f"backend '{backend}': (this build has no CUDA backend .rebuild with|no usable "
                                                     "CUDA driver .none is installed|no CUDA device)"):
                    Model.load(source, backend=backend)
    if not edgerunner._core.metal_available():
        with pytest.raises(ValueError, match="backend 'metal': "):
            Model.load(path, backend="metal")
    with pytest.raises(ValueError, match="unknown dispatch mode 'graph'"):
        Model.load(path, dispatch="graph")
    for backend in ("tpu", "cuda:", "cuda:-1", "cuda:1a", "cuda:1234567", "CUDA", "cuda: 1"):
        with pytest.raises(ValueError, match=f"unknown backend '{re.escape(backend)}'; choose cpu, cuda, cuda:N .CUDA device N., metal or auto"):
            Model.load(path, backend=backend)
        # refused before the source is looked up: nothing is fetched for a load that cannot run
        with pytest.raises(ValueError, match=f"unknown backend '{re.escape(backend)}'"):
            Model.load("no-such-org/no-such-repo:Q4_0", backend=backend)
    with pytest.raises(ValueError, match="has no .role."):
        model.chat([{"content": "no role"}])


def run_cli(*args, timeout=300):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "edgerunner", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_cli_run_with_the_default_model():
    r = run_cli("run", "What is the capital of France?", "--temperature", "0", "-n", "24", "--precise")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    assert "built-in default model" in r.stderr


@pytest.mark.slow
def test_cli_chat_keeps_the_conversation():
    r = subprocess.run([sys.executable, "-m", "edgerunner", "chat", "--temperature", "0", "-n", "16", "--precise"],
                       input="My name is Ada.\nWhat is my name?\n", capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "Ada" in r.stdout


def test_cli_errors(tmp_path):
    write_random_model(tmp_path / "bench.gguf", arch="llama", preset="tiny", seed=2)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\0\0\0" + b"\xff" * 16)
    r = run_cli("run", str(bad), "hi")
    assert r.returncode == 1 and "edgerunner: error:" in r.stderr and "offset" in r.stderr
    assert "Traceback" not in r.stderr
    free = available_memory()
    if free is not None and free < 2**37:  # (the cache below takes 238 GiB)
        tiny = tmp_path / "tiny.gguf"
        write_random_model(tiny, arch="llama", preset="tiny", seed=1)
        r = run_cli("run", str(tiny), "hi", "--n-ctx", "1000000000")
        assert r.returncode == 1 and "edgerunner: error: the KV cache for n_ctx=1000000000 needs 238.4 GiB" in r.stderr
        assert "Load the model with n_ctx=" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("run", "a", "b", "c")
    assert r.returncode != 0 and "at most a model and one prompt" in r.stderr
    # options anywhere among the model and the prompt, as between them: the same tokens either way
    between = run_cli("run", str(tmp_path / "bench.gguf"), "-n", "6", "--seed", "5", "hi")
    after = run_cli("run", str(tmp_path / "bench.gguf"), "hi", "-n", "6", "--seed", "5")
    assert between.returncode == 0 and between.stdout == after.stdout and after.returncode == 0, between.stderr
    r = run_cli("run", str(tmp_path / "bench.gguf"), "--bogus", "3", "hi")
    assert r.returncode == 2 and "unrecognized arguments: --bogus" in r.stderr
    r = run_cli("bench", str(tiny_bench := tmp_path / "bench.gguf"), "--pp", "16", "--tg", "8", "--reps", "2", "--json")
    result = json.loads(r.stdout)
    assert r.returncode == 0 and result["model"] == "bench.gguf" and result["device"] == "cpu", r.stderr
    assert all(len(result[k]["values"]) == 2 and min(result[k]["values"]) > 0 for k in ("pp", "tg"))
    r = run_cli("bench", str(tiny_bench), "--tg", "0")
    assert r.returncode == 2 and "argument --tg: 0 is less than 1" in r.stderr
    r = run_cli("devices")
    assert r.returncode == 0 and r.stdout.startswith("cpu ") and "--backend auto picks " in r.stdout
    r = run_cli("run", "a", "--backend", "cuda:x")
    assert r.returncode == 2 and "unknown backend 'cuda:x': choose auto, cpu, cuda, cuda:N (CUDA device N) or metal" in r.stderr
    r = run_cli()
    assert r.returncode == 2 and "run" in r.stdout


def test_interleaved_and_abandoned_streams(tmp_path):
    """Two streams on the same model interleave without corrupting each other, and a stream
    left unfinished does not block the next call."""
    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", seed=4)
    model = Model.load(path, threads=2)
    kw = dict(max_tokens=12, temperature=0.0, ignore_eos=True)
    a_alone = model.generate(list(range(5, 15)), **kw)
    b_alone = model.generate(list(range(40, 52)), **kw)
    a = model.generate(list(range(5, 15)), stream=True, **kw)
    b = model.generate(list(range(40, 52)), stream=True, **kw)
    a_text, b_text = [], []
    for _ in range(30):
        a_text.append(next(a, ""))
        b_text.append(next(b, ""))
    assert "".join(a_text) == a_alone and "".join(b_text) == b_alone
    unfinished = model.generate(list(range(5, 15)), stream=True, **kw)
    next(unfinished)
    assert model.generate(list(range(5, 15)), **kw) == a_alone  # no deadlock, same answer


def test_a_turn_that_cannot_start_leaves_the_conversation_unchanged(tmp_path):
    path = tmp_path / "m.gguf"
    write_random_model(path, arch="llama", preset="tiny", seed=4)
    conv = Model.load(path, n_ctx=48).session()
    conv.send("hi", max_tokens=4, temperature=0)
    before = list(conv.messages)
    with pytest.raises(edgerunner.ContextLengthError):
        conv.send("x " * 200, max_tokens=4)
    with pytest.raises(ValueError, match="temperature"):
        conv.send("hello", temperature=-1)
    assert conv.messages == before and [m["role"] for m in before] == ["user", "assistant"]
