"""Kernel microbenchmarks (pytest-benchmark): one thread's GEMV per weight type and kernel set,
reported as GB/s of weights read.

    python -m pytest bench/test_kernels_bench.py --benchmark-only --benchmark-columns=mean,stddev

Not part of the test suite (bench/ is not in testpaths): timings never fail a test.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgerunner import _core, quants
from edgerunner.model_builder import _random_blocks

import gguf

TYPES = ["F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"]
ROWS, COLS = 2048, 2048  # ~2-8 MB of weights: out of L2, like a decode step's matrices


@pytest.mark.parametrize("isa", _core.cpu_isas())
@pytest.mark.parametrize("name", TYPES)
def test_gemv(benchmark, name, isa):
    rng = np.random.default_rng(0)
    qtype = gguf.GGMLQuantizationType[name]
    if name == "F16":
        rows = rng.normal(0, 0.02, (ROWS, COLS)).astype(np.float16).view(np.uint8)
    else:
        block, _ = gguf.GGML_QUANT_SIZES[qtype]
        rows = np.asarray(_random_blocks(qtype, ROWS * COLS // block, rng, 0.02), np.uint8).reshape(ROWS, -1)
    x = rng.normal(0, 1, COLS).astype(np.float32)
    y = benchmark(_core.cpu_gemv, quants.type_id(name), rows, x, isa)
    assert y.shape == (ROWS,)
    benchmark.extra_info["GB/s"] = rows.nbytes / benchmark.stats["mean"] / 1e9
