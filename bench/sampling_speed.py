"""Decode speed by sampling setting, through the native loop, on GGUF files:

    python3 bench/sampling_speed.py MODEL.gguf... [--backend cuda] [--dispatch recorded] [--tokens 256] [--reps 3]

Session.generate after a 16-token prompt (recorded dispatch: chained steps, each drawn on the
device), for each sampling setting below: greedy; a temperature alone, with top-p, with min-p (the
whole-vocabulary draw); with top-k 40 (top-k's sorted walk); with top-k 2000 (its 2000-odd
candidates sorted); with top-k 5000 (past the sort: SampleWalk's last block bisects its candidates);
with penalties. Each generation runs twice, 32 and 32 + --tokens tokens long (best of --reps
each): tok/s is --tokens over the difference (what a token costs in the loop), "first" the rest of
the short run's time (the prompt, the first token's draw on the host from the prompt's logits,
the chain filling and settling), in ms. Run it under two builds (PYTHONPATH) in one device call
for an A/B.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from edgerunner import _core

SHORT = 32  # the short run's tokens

SETTINGS = {
    "greedy": {},
    "T 0.8": dict(temperature=0.8),
    "T 0.8, top-p 0.9": dict(temperature=0.8, top_p=0.9),
    "T 0.8, min-p 0.05": dict(temperature=0.8, min_p=0.05),
    "T 0.8, top-k 40, top-p 0.9, min-p 0.05": dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05),
    "T 0.8, top-k 2000": dict(temperature=0.8, top_k=2000),
    "T 0.8, top-k 5000": dict(temperature=0.8, top_k=5000),
    "T 0.8, repetition 1.1, last 64": dict(temperature=0.8, repetition_penalty=1.1, penalty_last_n=64),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--dispatch", default="recorded")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    prompt = np.arange(5, 21, dtype=np.int32)
    for path in args.models:
        model = _core.Model.load(path, backend=args.backend, dispatch=args.dispatch)
        n_vocab = model.config["n_vocab"]
        print(f"{path} ({model.backend}, {args.dispatch}), {args.tokens} tokens:")
        for name, params in SETTINGS.items():
            session = _core.Session(model)

            def run(tokens: int) -> float:
                start = time.perf_counter()
                session.rewind(0)
                session.eval(prompt)
                session.generate(_core.Sampler(n_vocab, seed=1, **params), tokens, [])
                return time.perf_counter() - start

            run(SHORT)  # warm-up (records the graphs)
            short = min(run(SHORT) for _ in range(args.reps))
            long = min(run(SHORT + args.tokens) for _ in range(args.reps))
            per_token = (long - short) / args.tokens
            first = short - SHORT * per_token
            print(f"  {name:40s} {1 / per_token:8.1f} tok/s   first {first * 1e3:6.2f} ms", flush=True)
            del session


if __name__ == "__main__":
    main()
