"""Prefill and decode speed of a model on this machine, as llama-bench measures them: ``pp``
(a prompt of N random tokens evaluated at once) and ``tg`` (M tokens generated one at a time,
greedy), each the mean ± standard deviation of its repetitions after one warm-up.
``edgerunner bench`` prints them; the repository's ``python -m bench`` sets them beside llama.cpp's.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from edgerunner import _core, gguf


def weight_bytes_per_token(f: gguf.GGUFFile) -> int:
    """Bytes a decode step reads: every matrix, the LM head; of the embedding only one row."""
    names = {t.name for t in f.tensors}
    total = 0
    for t in f.tensors:
        if t.name == "token_embd.weight" and "output.weight" in names:
            total += t.n_bytes // t.shape[1]
        else:
            total += t.n_bytes
    return total


def rss_bytes() -> int:
    """This process's resident memory (0 where /proc cannot say)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def stats(values: list[float]) -> dict[str, Any]:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "values": values}


def measure(path: str, *, pp: int = 512, tg: int = 128, depth: int = 0, reps: int = 3, threads: int = 0,
            kv_type: str = "f16", chunk: int = 512, backend: str = "auto", dispatch: str = "auto") -> dict[str, Any]:
    """pp and tg tokens/s of the model at `path` (``{"pp", "tg"}``: mean, std and each repetition's),
    with `depth` tokens already in the context when each starts (llama-bench's -d); also the
    memory the load and a 16-token warm-up took (``rss_after_load``), the KV cache's bytes, the
    device and the CPU kernels' ISA."""
    for name, value, low in (("pp", pp, 1), ("tg", tg, 1), ("depth", depth, 0), ("reps", reps, 1)):
        if value < low:
            raise ValueError(f"{name} must be at least {low}, got {value}")
    rss0 = rss_bytes()
    model = _core.Model.load(path, n_ctx=depth + max(pp, tg) + 8, n_threads=threads, kv_type=kv_type, prefill_chunk=chunk,
                             backend=backend, dispatch=dispatch)
    session = _core.Session(model)
    n_vocab = model.config["n_vocab"]
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, n_vocab, size=pp).astype(np.int32)
    context = rng.integers(0, n_vocab, size=depth).astype(np.int32)  # already there when timing starts
    session.eval(prompt[:16])  # warm-up: touches the weights and every kernel once
    rss_loaded = rss_bytes() - rss0

    def start(ids: np.ndarray) -> np.ndarray:
        """Rewind to the context (evaluated here, untimed); returns the context then `ids`, whose
        evaluation reuses the context and computes only `ids`."""
        session.rewind(0)
        if depth:
            session.eval(context)
        return np.concatenate([context, ids]) if depth else ids

    pp_rates = []
    for rep in range(reps + 1):
        ids = start(prompt)
        t0 = time.perf_counter()
        session.eval(ids)
        dt = time.perf_counter() - t0
        if rep:
            pp_rates.append(pp / dt)
    greedy = _core.Sampler(n_vocab)
    tg_rates = []
    for rep in range(reps + 1):
        session.eval(start(prompt[:1]))
        t0 = time.perf_counter()
        session.generate(greedy, tg + 1, [])  # tg decode steps (+ greedy sampling)
        dt = time.perf_counter() - t0
        if rep:
            tg_rates.append(tg / dt)
    c = model.config
    kv_bytes = c["n_layer"] * 2 * model.n_ctx * c["n_head_kv"] * c["head_dim"] * {"f32": 4, "f16": 2, "q8_0": 34 / 32}[model.kv_type]
    return {"pp": stats(pp_rates), "tg": stats(tg_rates), "rss_after_load": rss_loaded, "kv_bytes": kv_bytes,
            "device": model.device, "isa": _core.cpu_isa()}
