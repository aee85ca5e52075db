"""Decode speed through the Python API against the native loop, on one GGUF file:

    python3 bench/stream_speed.py MODEL.gguf [--backend cuda] [--dispatch recorded] [--tokens 128]

Four loops draw the same tokens from the same 16-token prompt (ignore_eos), greedy unless
--temperature (with --top-k, --top-p, --min-p; seed 0) says otherwise:
  Model.generate        the Python loop (text pieces, stop strings checked per token), telling
                        the session how many draws may follow (so steps run ahead on the GPU)
  ... one step at a time   the same loop with the session told nothing (each draw waited for)
  bare session calls    append_sampled(token, sampler) in a bare loop (no text, no stop checks)
  Session.generate      the native loop
Tokens per second, best of --reps runs (each includes one decode step for the prompt's last token).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from edgerunner import Model, _core


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--dispatch", default="recorded")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--min-p", type=float, default=0.0)
    args = ap.parse_args()
    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p)
    model = Model.load(args.model, backend=args.backend, dispatch=args.dispatch)
    ids, n = list(range(5, 21)), args.tokens
    ids32 = np.asarray(ids, np.int32)
    session = model._session

    def python_loop() -> None:
        model.generate(ids, max_tokens=n, ignore_eos=True, seed=0, **sampling)

    class OneStep:  # the session, with append_sampled told nothing of the draws to come
        def __getattr__(self, name: str) -> object:
            return getattr(session, name)

        def append_sampled(self, token: int, sampler: object, ahead: int = 0) -> int:
            return session.append_sampled(token, sampler)

    def python_loop_one_step() -> None:
        model._session = OneStep()
        try:
            python_loop()
        finally:
            model._session = session

    def step_at_a_time() -> None:
        sampler = _core.Sampler(model.n_vocab, seed=0, **sampling)
        session.eval(ids32)
        token = session.sample(sampler)
        for _ in range(n - 1):
            token = session.append_sampled(token, sampler)

    def native_loop() -> None:
        session.eval(ids32)
        session.generate(_core.Sampler(model.n_vocab, seed=0, **sampling), n, [])

    print(f"{args.model} ({model.backend}, {args.dispatch}), {n} tokens, {sampling}:")
    for name, run in (("Model.generate", python_loop), ("... one step at a time", python_loop_one_step),
                      ("bare session calls", step_at_a_time), ("Session.generate", native_loop)):
        run()  # warm-up (records the graphs)
        best = 1e30
        for _ in range(args.reps):
            start = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - start)
        print(f"  {name:24s} {n / best:8.1f} tok/s")


if __name__ == "__main__":
    main()
