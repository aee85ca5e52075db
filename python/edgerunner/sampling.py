"""Token sampling: the CPU sampler the engine runs on the LM head's logits.

The transforms, their order and the counter-based RNG are documented in
``csrc/core/sampler.cpp``: logit bias, repetition / presence / frequency penalties over the last
``penalty_last_n`` tokens, then greedy (``temperature=0``) or top-k, softmax, top-p, min-p and a
draw whose uniform number comes from ``(seed, step)``, so a draw is reproducible::

    from edgerunner import sampling
    params = sampling.SamplingParams(temperature=0.8, top_p=0.95, seed=7)
    sampler = params.sampler(n_vocab)           # reuse it: sample() never allocates
    token = sampler.sample(logits, history, step)

    token = sampling.sample(logits, history=ids, step=3, temperature=0.8)  # one-off, for debugging
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from edgerunner import _core

__all__ = ["SamplingParams", "sample"]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters, validated on construction (``ValueError`` names the bad field).

    ``logit_bias`` token ids are checked against the vocabulary when a sampler is made.
    """

    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off
    repetition_penalty: float = 1.0  # 1: off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64  # -1: the whole history, 0: penalties off
    logit_bias: Mapping[int, float] = field(default_factory=dict)  # -inf bans a token; +inf forces it (several: drawn among them)
    seed: int = 0

    def __post_init__(self) -> None:
        t = float(self.temperature)
        if not (t >= 0 and math.isfinite(t)):
            raise ValueError(f"temperature must be finite and >= 0 (0 = greedy), got {self.temperature}")
        if int(self.top_k) < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < float(self.top_p) <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if not 0 <= float(self.min_p) <= 1:
            raise ValueError(f"min_p must be in [0, 1] (0 = off), got {self.min_p}")
        rp = float(self.repetition_penalty)
        if not (rp > 0 and math.isfinite(rp)):
            raise ValueError(f"repetition_penalty must be finite and > 0 (1 = off), got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not math.isfinite(float(getattr(self, name))):
                raise ValueError(f"{name} must be finite, got {getattr(self, name)}")
        if int(self.penalty_last_n) < -1:
            raise ValueError(f"penalty_last_n must be >= -1 (-1 = whole history, 0 = off), got {self.penalty_last_n}")
        bias = {int(k): float(v) for k, v in dict(self.logit_bias).items()}
        for k, v in bias.items():
            if k < 0:
                raise ValueError(f"logit_bias token id {k} is negative")
            if math.isnan(v):
                raise ValueError(f"logit_bias for token {k} is NaN")
        if not 0 <= int(self.seed) < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), got {self.seed}")
        object.__setattr__(self, "logit_bias", bias)

    def sampler(self, n_vocab: int) -> _core.Sampler:
        """A native sampler for a vocabulary of ``n_vocab`` tokens with these parameters."""
        return _core.Sampler(
            int(n_vocab),
            temperature=float(self.temperature),
            top_k=int(self.top_k),
            top_p=float(self.top_p),
            min_p=float(self.min_p),
            repetition_penalty=float(self.repetition_penalty),
            presence_penalty=float(self.presence_penalty),
            frequency_penalty=float(self.frequency_penalty),
            penalty_last_n=int(self.penalty_last_n),
            logit_bias=dict(self.logit_bias),
            seed=int(self.seed),
        )


def sample(logits: np.ndarray, history: Sequence[int] | np.ndarray = (), step: int = 0, **params) -> int:
    """Sample one token from 1-D ``logits`` with :class:`SamplingParams` given as keywords.

    Builds a sampler per call: fine for tests and debugging; for generation keep one
    ``SamplingParams(...).sampler(n_vocab)`` and call its ``sample``.

    Raises:
        ValueError: bad parameters, logits that are not 1-D or contain NaN, a history token outside
            the vocabulary (when penalties are on), or every token banned.
        TypeError: an unknown parameter name.
    """
    p = SamplingParams(**params)
    x = np.ascontiguousarray(logits, dtype=np.float32)
    if x.ndim != 1:
        raise ValueError(f"logits must be 1-D (one row of the LM head), got shape {x.shape}")
    h = np.ascontiguousarray(np.asarray(history, dtype=np.int64).reshape(-1))
    if h.size and (h.min() < 0 or h.max() >= x.shape[0]):
        bad = int(h[(h < 0) | (h >= x.shape[0])][0])
        raise ValueError(f"history token {bad} is outside the vocabulary [0, {x.shape[0]})")
    return p.sampler(x.shape[0]).sample(x, h.astype(np.int32), int(step))
