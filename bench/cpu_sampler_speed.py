"""The CPU sampler's time a draw, by sampling setting (greedy; T 0.8 alone or with the
cuts named), on logits shaped like a model's:

    python3 bench/cpu_sampler_speed.py [--draws 50]

What the CPU backend pays every token (and a Metal generation for its first token, drawn on the
host from the prompt's logits). Logits: as flat as a random-weight Llama's last ones (normal,
std 0.93) at 49152 (SmolLM2), 128256 (Llama 3) and 262144 (Gemma 3) tokens, and peaked (std 4) at
128256. Median ms a draw over --draws RNG steps; run it under two builds (PYTHONPATH) for an A/B.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from edgerunner import _core

SETTINGS = {
    "greedy": dict(temperature=0.0),
    "T 0.8": dict(temperature=0.8),
    "+ top-p 0.9": dict(temperature=0.8, top_p=0.9),
    "+ min-p 0.05": dict(temperature=0.8, min_p=0.05),
    "+ k 40, p, m": dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05),
    "+ top-k 2000": dict(temperature=0.8, top_k=2000),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draws", type=int, default=50)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    shapes = {f"flat {n}": rng.normal(4.3, 0.93, n).astype(np.float32) for n in (49152, 128256, 262144)}
    shapes["peaked 128256"] = rng.normal(0.0, 4.0, 128256).astype(np.float32)
    print(f"{'logits':16s} " + " | ".join(f"{name:>12s}" for name in SETTINGS) + "   (ms a draw, median)")
    for shape, logits in shapes.items():
        row = []
        for params in SETTINGS.values():
            sampler = _core.Sampler(logits.size, seed=1, **params)
            sampler.sample(logits, [], 0)
            times = []
            for step in range(args.draws):
                start = time.perf_counter()
                sampler.sample(logits, [], step)
                times.append(time.perf_counter() - start)
            row.append(f"{np.median(times) * 1e3:12.3f}")
        print(f"{shape:16s} " + " | ".join(row), flush=True)


if __name__ == "__main__":
    main()
