"""Load a model on the GPU and run two one-token steps (for profilers: bench/ncu_summary.py)."""
import sys

import numpy as np

from edgerunner import _core

model = _core.Model.load(sys.argv[1], backend="cuda", dispatch=sys.argv[2] if len(sys.argv) > 2 else "eager")
session = _core.Session(model)
session.eval(np.array([1], np.int32))
session.append(2)
