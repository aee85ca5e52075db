"""The two real models from PyPI: the reader and every dequantizer against the gguf package."""

from __future__ import annotations

import gguf as ggufpkg
import numpy as np
import pytest

from edgerunner import builtin_models, gguf, quants
from test_gguf import assert_same_as_gguf_reader

pytestmark = pytest.mark.slow

REAL_MODELS = ["smollm2-135m-instruct", "gemma3-270m"]


@pytest.fixture(scope="module", params=REAL_MODELS)
def real_model(request):
    return builtin_models.fetch(request.param)


def test_reader_matches_gguf_reader(real_model):
    ours, ref = assert_same_as_gguf_reader(real_model)
    assert ours.architecture in ("llama", "gemma3")


def test_every_tensor_dequantizes_bit_exactly(real_model):
    ours = gguf.open(real_model)
    ref = ggufpkg.GGUFReader(real_model)
    seen = set()
    for r in ref.tensors:
        t = ours.tensor(r.name)
        data = ours.tensor_data(r.name)
        assert np.array_equal(data, np.asarray(r.data).view(np.uint8).reshape(-1)), r.name
        got = quants.dequantize(data, t.type_name)
        want = ggufpkg.quants.dequantize(np.asarray(r.data), r.tensor_type).reshape(-1).astype(np.float32)
        assert got.shape == want.shape, r.name
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"{r.name} ({t.type_name}) differs"
        seen.add(t.type_name)
    assert len(seen) >= 2, seen
