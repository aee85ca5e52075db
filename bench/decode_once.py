"""Load a model on the GPU, run a prompt of N tokens (default 1) and one decode step (for
profilers: bench/ncu_summary.py).

    python bench/decode_once.py FILE [DISPATCH] [N]
"""
import sys

import numpy as np

from edgerunner import _core

path = sys.argv[1]
dispatch = sys.argv[2] if len(sys.argv) > 2 else "eager"
n = int(sys.argv[3]) if len(sys.argv) > 3 else 1
model = _core.Model.load(path, backend="cuda", dispatch=dispatch, n_ctx=n + 8, prefill_chunk=max(n, 1))
session = _core.Session(model)
session.eval(np.random.default_rng(0).integers(0, model.config["n_vocab"], size=n).astype(np.int32))
session.append(2)
