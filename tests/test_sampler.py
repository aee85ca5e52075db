"""The CPU sampler against an independent NumPy float64 reference of its contract
(csrc/core/sampler.cpp): transforms, the kept set and its distribution, the RNG and the draw."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from edgerunner import _core, sampling

ROOT = Path(__file__).resolve().parents[1]
MASK64 = 2**64 - 1


# ---- the reference -----------------------------------------------------------------------------


def ref_transform(logits, history=(), *, logit_bias=None, repetition_penalty=1.0, presence_penalty=0.0,
                  frequency_penalty=0.0, penalty_last_n=64):
    """Bias, then repetition, then presence/frequency penalties, in float64."""
    x = np.asarray(logits, dtype=np.float64).copy()
    for t, b in (logit_bias or {}).items():
        x[t] += b
    h = np.asarray(history, dtype=np.int64)
    window = h if penalty_last_n == -1 else h[len(h) - min(len(h), penalty_last_n):]
    toks, counts = np.unique(window, return_counts=True)
    if toks.size:
        v = x[toks]
        v = np.where(v > 0, v / repetition_penalty, v * repetition_penalty)
        x[toks] = v - (presence_penalty * (counts > 0) + frequency_penalty * counts)
    return x


def ref_transform_f32(logits, history, *, logit_bias=None, repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
                penalty_last_n=64, **_):
    """ref_transform as the engine computes it: in float32, each operation rounded once in the
    contract's order (the device samplers' logits after penalize are compared with it bit for bit)."""
    x = logits.astype(np.float32).copy()
    for t, b in (logit_bias or {}).items():
        x[t] = np.float32(x[t] + np.float32(b))
    on = penalty_last_n != 0 and (repetition_penalty != 1.0 or presence_penalty != 0.0 or frequency_penalty != 0.0)
    h = np.asarray(history, np.int64)
    window = h if penalty_last_n == -1 else h[len(h) - min(len(h), penalty_last_n):]
    if on:
        rp, pp, fp = np.float32(repetition_penalty), np.float32(presence_penalty), np.float32(frequency_penalty)
        for t, c in zip(*np.unique(window, return_counts=True)):
            v = x[t]
            v = np.float32(v / rp) if v > 0 else np.float32(v * rp)
            x[t] = np.float32(v - np.float32(pp + np.float32(fp * np.float32(c))))
    return x


def ref_order(x):
    """Token ids by value descending, ties by id ascending."""
    return np.lexsort((np.arange(x.size), -x))


def ref_kept(x, *, temperature, top_k=0, top_p=1.0, min_p=0.0):
    """(ids in draw order, their probabilities after top-k, softmax, top-p, min-p, renormalization)."""
    order = ref_order(x)
    if 0 < top_k < x.size:
        order = order[:top_k]
    xs = x[order]
    w = np.exp((xs - xs[0]) / temperature)
    p = w / w.sum()
    if top_p < 1.0:
        reach = np.nonzero(np.cumsum(p) >= top_p)[0]
        k = reach[0] + 1 if reach.size else p.size
        order, p = order[:k], p[:k]
    keep = (p >= min_p * p[0]) & (p > 0)
    order, p = order[keep], p[keep]
    return order, p / p.sum()


def ref_distribution(x, n_vocab, **params):
    order, p = ref_kept(x, **params)
    full = np.zeros(n_vocab)
    full[order] = p
    return full


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def ref_uniform(seed, step):
    state = (mix64(seed) + (step + 1) * 0x9E3779B97F4A7C15) & MASK64
    return (mix64(state) >> 40) / 2**24


def ref_draw(x, seed, step, **params):
    order, p = ref_kept(x, **params)
    cum = np.cumsum(p)
    hit = np.nonzero(cum > ref_uniform(seed, step) * cum[-1])[0]
    return int(order[hit[0]] if hit.size else order[-1])


def f32(a):
    return np.asarray(a, dtype=np.float32)


# ---- greedy, bias, penalties -------------------------------------------------------------------


def test_greedy_is_argmax_with_ties_to_lowest_id():
    rng = np.random.default_rng(0)
    for _ in range(50):
        x = f32(rng.normal(size=1000))
        assert _core.Sampler(1000).sample(x) == int(np.argmax(x))
    x = f32([0, 5, 1, 5, 5])
    assert _core.Sampler(5).sample(x) == 1
    assert _core.Sampler(5).sample(f32([2.0] * 5)) == 0
    assert _core.Sampler(3).sample(f32([-np.inf, 1.0, np.inf])) == 2


def test_logit_bias_adds_and_bans():
    x = f32([1.0, 3.0, 2.0, 2.9])
    assert _core.Sampler(4, logit_bias={1: -np.inf}).sample(x) == 3
    assert _core.Sampler(4, logit_bias={0: 2.5}).sample(x) == 0
    assert _core.Sampler(4, logit_bias={3: 0.11}).sample(x) == 3
    assert _core.Sampler(4, logit_bias={3: 0.09}).sample(x) == 1
    # a banned token never comes out of sampling either, however high its logit
    s = _core.Sampler(4, temperature=1.0, logit_bias={1: -np.inf, 3: -np.inf}, seed=5)
    assert {s.sample(x, [], i) for i in range(2000)} == {0, 2}


# (params, history, logits): the penalized token 0 ends just above or just below token 1.
PENALTY_CASES = [
    (dict(repetition_penalty=1.25), [0], [2.0, 1.601], 1),      # 2/1.25 = 1.6 < 1.601
    (dict(repetition_penalty=1.25), [0], [2.0, 1.599], 0),
    (dict(repetition_penalty=1.25), [0, 0, 0], [2.0, 1.599], 0),  # each distinct token once
    (dict(repetition_penalty=1.25), [0], [-1.0, -1.249], 1),    # negative: -1 * 1.25 = -1.25
    (dict(repetition_penalty=1.25), [0], [-1.0, -1.251], 0),
    (dict(presence_penalty=0.5), [0, 0], [2.0, 1.501], 1),      # 2 - 0.5
    (dict(presence_penalty=0.5), [0, 0], [2.0, 1.499], 0),
    (dict(frequency_penalty=0.25), [0, 0, 0], [2.0, 1.251], 1),  # 2 - 3 * 0.25
    (dict(frequency_penalty=0.25), [0, 0, 0], [2.0, 1.249], 0),
    (dict(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25), [0, 0],
     [4.0, 1.001], 1),                                          # 4/2 - 0.5 - 0.5 = 1.0
    (dict(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25), [0, 0],
     [4.0, 0.999], 0),
    (dict(repetition_penalty=2.0, penalty_last_n=2), [0, 1, 1], [2.0, -5.0], 0),  # 0 left the window
    (dict(repetition_penalty=2.0, penalty_last_n=-1), [0] + [2] * 100, [2.0, 1.5], 1),
    (dict(repetition_penalty=2.0), [0] + [2] * 100, [2.0, 1.5], 0),  # 0 is past the default 64
    (dict(repetition_penalty=2.0, penalty_last_n=0), [0], [2.0, 1.5], 0),
    (dict(logit_bias={0: 1.0}, repetition_penalty=2.0), [0], [1.0, 0.99], 0),  # bias first: (1+1)/2
]


@pytest.mark.parametrize("params,history,logits,expected", PENALTY_CASES)
def test_penalty_thresholds(params, history, logits, expected):
    x = f32(logits + [-10.0] * 6)
    assert int(np.argmax(ref_transform(x, history, **params))) == expected
    assert _core.Sampler(x.size, **params).sample(x, np.array(history, dtype=np.int32)) == expected


def test_penalties_match_reference_on_random_inputs():
    rng = np.random.default_rng(1)
    changed = 0
    for trial in range(300):
        n = 300
        x = f32(rng.normal(scale=3.0, size=n))
        top = ref_order(x.astype(np.float64))[:4]
        history = rng.choice(np.concatenate([top, rng.integers(0, n, 10)]), size=rng.integers(0, 120))
        params = dict(
            repetition_penalty=float(rng.choice([1.0, 0.8, 1.1, 1.5])),
            presence_penalty=float(rng.choice([0.0, 0.3, -0.2])),
            frequency_penalty=float(rng.choice([0.0, 0.1, 0.4])),
            penalty_last_n=int(rng.choice([-1, 0, 1, 7, 64, 500])),
            logit_bias={int(t): float(rng.normal()) for t in rng.integers(0, n, 3)},
        )
        ref = ref_transform(x, history, **params)
        changed += int(np.argmax(ref) != np.argmax(x))
        got = _core.Sampler(n, **params).sample(x, history.astype(np.int32))
        srt = np.sort(ref)
        if srt[-1] - srt[-2] > 1e-5:  # float32 vs float64 transforms only differ on near-ties
            assert got == int(np.argmax(ref)), (trial, params)
        # the same transformed values drive sampling: the draws agree token for token
        sp = dict(temperature=0.9, top_p=0.95)
        s = _core.Sampler(n, **params, **sp, seed=trial)
        for step in range(5):
            assert s.sample(x, history.astype(np.int32), step) == ref_draw(ref, trial, step, **sp)
    assert changed > 60  # the penalties did move the argmax in many trials


# ---- the distribution --------------------------------------------------------------------------

DIST_CASES = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=10),
    dict(temperature=1.3, top_p=0.8),
    dict(temperature=1.0, min_p=0.1),
    dict(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05),
    dict(temperature=1.0, top_k=45),          # most of the vocabulary
    dict(temperature=1.0, top_k=1000),        # k > n_vocab: off
    dict(temperature=2.0, top_p=0.5, min_p=0.2),
]


@pytest.mark.parametrize("params", DIST_CASES)
def test_empirical_distribution_matches_reference(params):
    n, draws = 50, 20000
    x = f32(np.random.default_rng(2).normal(scale=1.5, size=n))
    x[7] = -np.inf
    p = ref_distribution(x.astype(np.float64), n, **params)
    s = _core.Sampler(n, **params, seed=11)
    counts = np.bincount([s.sample(x, [], step) for step in range(draws)], minlength=n)
    assert counts[p == 0].sum() == 0, "a token outside the kept set was drawn"
    freq = counts / draws
    # 5 binomial standard deviations per token (+ one count for the rarest)
    tol = 5 * np.sqrt(p * (1 - p) / draws) + 1 / draws
    assert np.all(np.abs(freq - p) <= tol), np.max(np.abs(freq - p) - tol)
    chi2 = np.sum((counts[p > 0] - draws * p[p > 0]) ** 2 / (draws * p[p > 0]))
    dof = int((p > 0).sum()) - 1
    assert chi2 < dof + 6 * math.sqrt(2 * max(dof, 1)) + 10


@pytest.mark.parametrize("params", DIST_CASES + [dict(temperature=1.0, top_p=0.999, min_p=0.001)])
@pytest.mark.parametrize("shape", ["peaked", "flat"])
def test_draws_follow_the_contract_token_for_token(params, shape):
    """The RNG and draw rule reproduced in Python give the same tokens: a large vocabulary puts
    many tokens in each bucket the no-top-k walks step over, and peaked logits many past the
    buckets' range."""
    n = 20000
    rng = np.random.default_rng(3)
    x = f32(rng.normal(size=n) * (6.0 if shape == "peaked" else 0.5))
    x[rng.integers(0, n, 50)] = -np.inf
    ref = x.astype(np.float64)
    s = _core.Sampler(n, **params, seed=99)
    for step in range(100):
        assert s.sample(x, [], step) == ref_draw(ref, 99, step, **params), step


@pytest.mark.parametrize("params", [dict(temperature=0.8), dict(temperature=0.8, top_p=0.9), dict(temperature=0.8, min_p=0.05),
                                    dict(temperature=1.1, top_p=0.7, min_p=0.02), dict(temperature=0.05, top_p=0.95),
                                    dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05), dict(temperature=3.0, top_k=2000)])
def test_draws_at_a_large_flat_vocabulary_follow_the_contract(params):
    """128256 tokens as flat as a random-weight Llama's last logits (std 0.93), a tenth of them
    tied at five quantiles, some banned: the walks without top-k end in crowded buckets of the
    distance below the largest logit (hundreds of tokens each) and inside groups of equal logits
    (walked in id order). At T = 0.05 most tokens lie past the buckets' range (d >= 40). top-k
    2000 ends inside the group tied at the 99th percentile."""
    n = 128256
    rng = np.random.default_rng(8)
    x = f32(rng.normal(4.3, 0.93, n))
    for q in (0.3, 0.5, 0.7, 0.9, 0.99):
        x[rng.choice(n, n // 50, replace=False)] = np.quantile(x, q)
    x[rng.integers(0, n, 100)] = -np.inf
    ref = x.astype(np.float64)
    order, p = ref_kept(ref, **params)
    s = _core.Sampler(n, **params, seed=5)
    tied = 0
    for step in range(40):
        u = ref_uniform(5, step)
        cum = np.cumsum(p)
        want = int(order[np.nonzero(cum > u * cum[-1])[0][0]])
        assert s.sample(x, [], step) == want, step
        tied += np.count_nonzero(x == x[want]) > 1
    if params["temperature"] > 0.5 and params.get("top_k", 2000) == 2000:
        assert tied >= 2, f"only {tied} of 40 draws landed on a tied logit"


@pytest.mark.parametrize("n", [37, 20011])
def test_top_k_keeps_the_k_best_with_ties_at_the_edge(n):
    """Logits on a coarse grid (many tied, the k-th often among them), some -inf, zeros of both
    signs: at a temperature that makes the kept tokens almost equally likely, every draw is one of
    the reference's k best (ties to the lower id) and, for small k, each of them is drawn."""
    rng = np.random.default_rng(13)
    x = f32(np.round(rng.normal(size=n) * 4) / 4)
    x[rng.integers(0, n, n // 20)] = -np.inf
    x[rng.integers(0, n, n // 20)] = -0.0
    best = ref_order(x.astype(np.float64))
    for k in [1, 2, 7, 40, 127, 128, 129, 500, 2000, n - 1]:
        if k >= n:
            continue
        kept = set(best[:k].tolist())
        s = _core.Sampler(n, temperature=1e4, top_k=k, seed=k)
        drawn = {s.sample(x, [], step) for step in range(max(300, 12 * k) if k <= 129 else 600)}
        assert drawn <= kept, (k, sorted(drawn - kept)[:5])
        if k <= 129:
            assert drawn == kept, (k, len(kept - drawn))


def test_rng_is_the_documented_splitmix64():
    for seed, step in [(0, 0), (1, 0), (0, 1), (12345, 678), (MASK64, MASK64), (2**63, 5)]:
        assert _core.Sampler.uniform(seed, step) == ref_uniform(seed, step)


# ---- determinism -------------------------------------------------------------------------------


def test_same_seed_and_step_give_the_same_token():
    x = f32(np.random.default_rng(4).normal(size=5000))
    a = _core.Sampler(5000, temperature=1.0, top_p=0.95, seed=42)
    b = _core.Sampler(5000, temperature=1.0, top_p=0.95, seed=42)
    seq_a = [a.sample(x, [], step) for step in range(200)]
    assert seq_a == [b.sample(x, [], step) for step in range(200)]
    assert seq_a[::-1] == [a.sample(x, [], step) for step in reversed(range(200))]  # no hidden state
    c = _core.Sampler(5000, temperature=1.0, top_p=0.95, seed=43)
    seq_c = [c.sample(x, [], step) for step in range(200)]
    assert seq_a != seq_c
    assert sum(u != v for u, v in zip(seq_a, seq_c)) > 150


# ---- validation --------------------------------------------------------------------------------

BAD_PARAMS = [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(min_p=-0.1), "min_p"),
    (dict(min_p=1.1), "min_p"),
    (dict(top_k=-1), "top_k"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(repetition_penalty=-1.0), "repetition_penalty"),
    (dict(presence_penalty=float("inf")), "presence_penalty"),
    (dict(penalty_last_n=-2), "penalty_last_n"),
    (dict(logit_bias={10: 1.0}), r"logit_bias token id 10 is outside the vocabulary \[0, 10\)"),
    (dict(logit_bias={-1: 1.0}), "logit_bias token id -1"),
]


@pytest.mark.parametrize("params,match", BAD_PARAMS)
def test_bad_params_are_value_errors(params, match):
    with pytest.raises(ValueError, match=match):
        _core.Sampler(10, **params)
    with pytest.raises(ValueError, match=match.split()[0]):
        sampling.sample(np.zeros(10, dtype=np.float32), **params)


def test_bad_inputs_are_value_errors():
    with pytest.raises(ValueError, match="n_vocab must be > 0"):
        _core.Sampler(0)
    s = _core.Sampler(10, repetition_penalty=1.1)
    with pytest.raises(ValueError, match="logits has 9 entries, but this sampler's vocabulary has 10"):
        s.sample(np.zeros(9, dtype=np.float32))
    with pytest.raises(ValueError, match="history token 10"):
        s.sample(np.zeros(10, dtype=np.float32), [1, 10])
    x = np.zeros(10, dtype=np.float32)
    assert s.sample(x, [1, 2]) == 0  # the failed call left no penalty state behind
    x[3] = np.nan
    for params in [dict(), dict(temperature=1.0), dict(temperature=1.0, top_k=2)]:
        with pytest.raises(ValueError, match="logit of token 3 is NaN"):
            _core.Sampler(10, **params).sample(x)
    for where in [(0,), (8,), (36,), (21, 5), (17, 18)]:  # the first NaN is named, in any lane or the tail
        y = f32(np.arange(37))
        y[list(where)] = np.nan
        for params in [dict(), dict(temperature=1.0), dict(temperature=1.0, top_p=0.5)]:
            with pytest.raises(ValueError, match=f"logit of token {min(where)} is NaN"):
                _core.Sampler(37, **params).sample(y)
    banned = np.full(10, -np.inf, dtype=np.float32)
    for params in [dict(), dict(temperature=1.0), dict(temperature=1.0, top_k=2)]:
        with pytest.raises(ValueError, match="every token has logit -inf"):
            _core.Sampler(10, **params).sample(banned)
    with pytest.raises(TypeError):
        sampling.sample(x, tempreature=1.0)
    with pytest.raises(ValueError, match="1-D"):
        sampling.sample(np.zeros((2, 5)))


# ---- edge cases --------------------------------------------------------------------------------


def test_edge_cases():
    rng = np.random.default_rng(5)
    x = f32(rng.normal(size=100))
    best = int(np.argmax(x))
    # top_p tiny keeps only the best; min_p=1 keeps only the max
    for params in [dict(top_p=1e-6), dict(min_p=1.0), dict(top_k=1)]:
        s = _core.Sampler(100, temperature=5.0, **params, seed=1)
        assert {s.sample(x, [], i) for i in range(300)} == {best}
    # all-equal logits: greedy takes id 0; sampling is uniform, min_p=1 keeps every tied max
    eq = np.zeros(8, dtype=np.float32)
    assert _core.Sampler(8).sample(eq) == 0
    for params in [dict(), dict(min_p=1.0), dict(top_k=8), dict(top_k=3)]:
        s = _core.Sampler(8, temperature=1.0, **params, seed=2)
        counts = np.bincount([s.sample(eq, [], i) for i in range(8000)], minlength=8)
        kept = params.get("top_k", 8)
        assert np.all(counts[kept:] == 0)  # top-k keeps the lowest ids among ties
        assert np.all(np.abs(counts[:kept] / 8000 - 1 / kept) < 5 * math.sqrt(1 / kept / 8000) + 1e-3)
    # -inf logits are never drawn, even at a huge temperature
    y = x.copy()
    y[::2] = -np.inf
    s = _core.Sampler(100, temperature=1e6, seed=3)
    assert all(s.sample(y, [], i) % 2 == 1 for i in range(2000))
    # +inf logits (a bias of +inf, or an overflow): only they can be drawn, evenly
    z = f32(rng.normal(size=1000))
    for params in [dict(), dict(temperature=1.0), dict(temperature=1.0, top_k=2), dict(temperature=1.0, top_k=300),
                   dict(temperature=0.7, top_p=0.9, min_p=0.1)]:
        s = _core.Sampler(1000, **params, logit_bias={17: math.inf, 900: math.inf}, seed=6)
        counts = np.bincount([s.sample(z, [], i) for i in range(400)], minlength=1000)
        assert counts.sum() == counts[17] + counts[900], params
        if params:
            assert 140 < counts[17] < 260, (params, counts[17])
    # a vocabulary of one
    for params in [dict(), dict(temperature=1.0, top_k=5, top_p=0.1, min_p=0.5)]:
        assert _core.Sampler(1, **params).sample(f32([0.3]), [0, 0], 7) == 0
    # a history given as a list, int32 or int64 array gives the same token
    s = _core.Sampler(100, temperature=1.0, repetition_penalty=1.3, seed=4)
    h = [best, best, 3]
    assert s.sample(x, h, 1) == s.sample(x, np.array(h, np.int32), 1) == s.sample(x, np.array(h, np.int64), 1)


def test_softmax_weight_is_exp_to_an_ulp():
    """The weight w = e^-d the sampler computes (branch-free, for its vectorized exp pass) against e^-d
    to 40 digits (decimal), rounded to float64: at most 1 ulp apart (subnormals: 2^-1074). d = 0 gives
    1 exactly (the top token's w); +inf and d from 745.2 give 0."""
    from decimal import Decimal, localcontext

    rng = np.random.default_rng(11)
    ds = np.concatenate([rng.uniform(0, 1, 3000), rng.uniform(0, 40, 3000), rng.uniform(40, 708, 2000),
                         rng.uniform(708, 745.13, 1000), 2.0 ** rng.uniform(-60, 0, 1000),
                         [0.0, 5e-324, 1e-300, 0.5 * math.log(2), math.log(2), 40.0, 708.39, 745.0]])
    worst = 0.0
    with localcontext() as ctx:
        ctx.prec = 40
        for d in ds:
            ref = float((-Decimal(float(d))).exp())
            got = _core.Sampler.exp_neg(float(d))
            worst = max(worst, abs(got - ref) / np.spacing(ref))
    assert worst <= 1.0, f"{worst} ulp"
    assert _core.Sampler.exp_neg(0.0) == 1.0
    for d in [745.2, 746.0, 1e5, math.inf]:
        assert _core.Sampler.exp_neg(d) == 0.0
    assert _core.Sampler.exp_neg(745.1) == 5e-324


def test_greedy_ties_across_signed_zeros_and_lanes():
    """Greedy finds the first block of 64 holding the max, then the token: sizes within one
    block, on block edges and with a tail, the max in a late block."""
    for n in [1, 7, 8, 9, 33, 64, 65, 200, 4099]:
        x = np.full(n, -np.inf, dtype=np.float32)
        x[n - 1] = 0.0
        assert _core.Sampler(n).sample(x) == n - 1
        x[n // 2] = -0.0  # equal to +0.0: the lower id wins
        assert _core.Sampler(n).sample(x) == n // 2
        y = f32(-np.arange(n) - 1.0)
        y[n - 1] = -0.5
        assert _core.Sampler(n).sample(y) == n - 1


def test_python_face():
    x = f32([0.0, 2.0, 1.0])
    assert sampling.sample(x) == 1
    assert sampling.sample(x, history=[1], repetition_penalty=4.0) == 2
    p = sampling.SamplingParams(temperature=0.5, top_k=2, seed=9)
    s = p.sampler(3)
    assert s.n_vocab == 3
    assert [s.sample(x, [], i) for i in range(20)] == [sampling.sample(x, (), i, temperature=0.5, top_k=2, seed=9)
                                                        for i in range(20)]
    with pytest.raises(ValueError, match="logit_bias token id 3"):
        sampling.SamplingParams(logit_bias={3: 1.0}).sampler(3)


# ---- no allocation in sample() -----------------------------------------------------------------

ALLOC_PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include <new>
#include <random>
#include <vector>
#include "edgerunner/sampler.h"

static long g_allocs = 0;
void* operator new(std::size_t n) { ++g_allocs; if (void* p = std::malloc(n ? n : 1)) return p; throw std::bad_alloc(); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

int main() {
    const int n = 32000;
    std::vector<float> logits(n);
    std::mt19937 gen(1);
    std::normal_distribution<float> normal(0.f, 3.f);
    for (auto& v : logits) v = normal(gen);
    std::vector<int32_t> history(500);
    for (auto& t : history) t = static_cast<int32_t>(gen() % 64);
    std::vector<edgerunner::SamplingParams> all(6);
    all[1].temperature = 0.8f; all[1].top_k = 40;
    all[2].temperature = 0.8f; all[2].top_p = 0.9f;
    all[3].temperature = 1.0f; all[3].min_p = 0.05f; all[3].repetition_penalty = 1.1f;
    all[4].temperature = 1.0f; all[4].top_k = 20000; all[4].presence_penalty = 0.5f;
    all[5].logit_bias = {{3, 1.0f}}; all[5].frequency_penalty = 0.2f; all[5].penalty_last_n = -1;
    for (auto& p : all) {
        edgerunner::Sampler s(n, p);
        const long before = g_allocs;
        for (uint64_t step = 0; step < 50; ++step) s.sample(logits.data(), history.data(), history.size(), step);
        if (g_allocs != before) { std::printf("allocated %ld times\n", g_allocs - before); return 1; }
    }
    std::printf("ok\n");
    return 0;
}
"""


def test_sample_does_not_allocate(tmp_path):
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler on PATH")
    src = tmp_path / "alloc.cpp"
    src.write_text(ALLOC_PROGRAM)
    exe = tmp_path / "alloc"
    subprocess.run([cxx, "-std=c++17", "-O1", f"-I{ROOT / 'csrc/include'}", str(src),
                    str(ROOT / "csrc/core/sampler.cpp"), "-o", str(exe)], check=True, capture_output=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr
