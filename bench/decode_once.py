"""Load a model on the GPU, run a prompt of N tokens (default 1) and one decode step (for
profilers: bench/ncu_summary.py); with SAMPLING (name=value pairs, comma-separated, as
_core.Sampler takes them), the step after the prompt and three more draw with those parameters.

    python bench/decode_once.py FILE [DISPATCH] [N] [SAMPLING]
    python bench/decode_once.py FILE eager 16 temperature=0.8,min_p=0.05
"""
import sys

import numpy as np

from edgerunner import _core

path = sys.argv[1]
dispatch = sys.argv[2] if len(sys.argv) > 2 else "eager"
n = int(sys.argv[3]) if len(sys.argv) > 3 else 1
sampling = dict(kv.split("=") for kv in sys.argv[4].split(",")) if len(sys.argv) > 4 else None
model = _core.Model.load(path, backend="cuda", dispatch=dispatch, n_ctx=n + 8, prefill_chunk=max(n, 1))
session = _core.Session(model)
session.eval(np.random.default_rng(0).integers(0, model.config["n_vocab"], size=n).astype(np.int32))
if sampling is None:
    session.append(2)
else:
    params = {k: int(v) if k in ("top_k", "seed", "penalty_last_n") else float(v) for k, v in sampling.items()}
    session.generate(_core.Sampler(model.config["n_vocab"], **params), 4, [])
