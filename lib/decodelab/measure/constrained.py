"""Measuring constrained decoding against the truth: validity rates, and the KL from the masked sampler q to the
model's distribution conditioned on validity, p(x | valid) = p(x) 1[valid] / Z with Z = P(valid).

    KL(q || p(. | valid)) = E_q[log q(x) - log p(x)] + log Z,

and every sample of q is valid, so each term is exact per sample (`ConstrainedCompletion.log_q`, `.log_p`). Z comes
from one of two places: the share of valid samples among unconstrained ones (`valid=`), or importance sampling with
q's own samples, Z = E_q[p(x) / q(x)] (q covers every valid x that p can produce). The second needs no extra samples
but fails quietly when q and the conditional differ by many nats (its weights then hang on one sample; `ess` says so).
Where the grammar's language is small, `enumerate_grammar` lists it and `kl_exact` gives the KL with no sampling.
Intervals are 95%: Wilson's for a rate, percentile bootstrap (fixed seed) for the rest.

    >>> from decodelab.measure.constrained import wilson_interval
    >>> rate = wilson_interval(97, 100)
    >>> rate.value, round(rate.low, 3), round(rate.high, 3)
    (0.97, 0.915, 0.99)

Taught in: chapters/07d-constrained-decoding.ipynb
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from decodelab.grammar.backends import Grammar
from decodelab.validation import ParamError, check_int

Z95 = 1.959964  # the normal quantile of a two-sided 95% interval


@dataclass(frozen=True)
class Interval:
    """An estimate and its 95% interval."""

    value: float
    low: float
    high: float


@dataclass(frozen=True)
class KLEstimate:
    """KL(q || p(. | valid)) in nats, log Z = log P(valid) (both with intervals), and the effective sample size of
    the importance weights p / q (n when q equals the conditional; near 1 when one weight carries the estimate)."""

    kl: Interval
    log_z: Interval
    ess: float


def wilson_interval(successes: int, trials: int) -> Interval:
    """The share `successes / trials` with Wilson's 95% score interval (sound at 0% and 100%).

    >>> wilson_interval(100, 100).low > 0.96
    True
    """
    trials = check_int(trials, "trials")
    successes = check_int(successes, "successes", low=0)
    if successes > trials:
        raise ParamError("successes", f"successes must be <= trials ({trials}), got {successes}")
    rate = successes / trials
    centre = (rate + Z95**2 / (2 * trials)) / (1 + Z95**2 / trials)
    half = Z95 / (1 + Z95**2 / trials) * math.sqrt(rate * (1 - rate) / trials + Z95**2 / (4 * trials**2))
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact bounds at 0% and 100%, not 1 - 1e-16
    return Interval(rate, low, 1.0 if successes == trials else min(1.0, centre + half))


def _log_probs(values, name: str, allow_neg_inf: bool = False) -> np.ndarray:
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)) or len(values) == 0:
        raise ParamError(name, f"{name} must be a non-empty list of log-probabilities, got {values!r}")
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or np.isnan(array).any() or (array > 1e-9).any() or np.isposinf(array).any() \
            or (not allow_neg_inf and np.isneginf(array).any()):
        raise ParamError(name, f"{name} must hold log-probabilities (<= 0{', finite' if not allow_neg_inf else ''}), "
                               f"got {array[:5].tolist()}...")
    return array


def _bools(values, name: str) -> np.ndarray:
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)) or len(values) == 0 \
            or not all(isinstance(v, (bool, np.bool_)) for v in values):
        raise ParamError(name, f"{name} must be a non-empty list of bools, got {values!r}")
    return np.asarray(values, dtype=bool)


def _pair(log_q, log_p) -> tuple[np.ndarray, np.ndarray]:
    q, p = _log_probs(log_q, "log_q"), _log_probs(log_p, "log_p")
    if q.shape != p.shape:
        raise ParamError("log_p", f"log_q and log_p must pair up, got {len(q)} and {len(p)}")
    return q, p


def _log_mean_exp(x: np.ndarray, axis=-1) -> np.ndarray:
    top = x.max(axis=axis, keepdims=True)
    return (top + np.log(np.exp(x - top).mean(axis=axis, keepdims=True))).squeeze(axis)


def _percentiles(draws: np.ndarray, value: float) -> Interval:
    low, high = np.nanpercentile(draws, [2.5, 97.5])  # a resample with no valid sample has log Z = nan
    return Interval(float(value), float(low), float(high))


def kl_to_conditional(log_q, log_p, valid=None, draws: int = 1000, seed: int = 0) -> KLEstimate:
    """KL(q || p(. | valid)) from samples of q (their exact log q and log p). With `valid` (one bool per
    unconstrained sample of p: did it satisfy the grammar?) Z is that share; without it, Z is estimated by importance
    sampling from the same q samples. The bootstrap resamples the q samples (and the p samples) `draws` times.

    >>> kl_to_conditional([-1.0, -2.0], [-1.0, -2.0]).kl.value     # q = p: nothing was masked
    0.0
    """
    q, p = _pair(log_q, log_p)
    draws = check_int(draws, "draws")
    rng = np.random.default_rng(check_int(seed, "seed", low=0))
    rows = rng.integers(0, len(q), size=(draws, len(q)))  # [draws, n]
    gap, boot_gap = float(np.mean(q - p)), (q - p)[rows].mean(axis=1)  # [draws]
    weights = p - q  # log of p / q
    ess = float(np.exp(2 * _log_mean_exp(weights) - _log_mean_exp(2 * weights)) * len(q))
    if valid is None:
        log_z, boot_z = float(_log_mean_exp(weights)), _log_mean_exp(weights[rows])
    else:
        ok = _bools(valid, "valid")
        if not ok.any():
            raise ParamError("valid", f"none of the {len(ok)} unconstrained samples is valid: Z = 0 cannot be estimated")
        shares = ok[rng.integers(0, len(ok), size=(draws, len(ok)))].mean(axis=1)
        log_z = math.log(ok.mean())
        boot_z = np.log(np.where(shares > 0, shares, np.nan))
    kl = gap + log_z
    return KLEstimate(_percentiles(boot_gap + boot_z, kl), _percentiles(boot_z, log_z), ess)


def mean_log_ratio(log_a, log_b, draws: int = 1000, seed: int = 0) -> Interval:
    """E[log a(x) - log b(x)] over samples x of a, with a bootstrap interval: KL(a || b) when x ~ a (for example
    a = the truth, b = q, scored on sentences drawn from the toy language). -inf in `log_b` gives +inf.

    >>> mean_log_ratio([-1.0, -1.0], [-2.0, -2.0]).value
    1.0
    """
    a, b = _log_probs(log_a, "log_a"), _log_probs(log_b, "log_b", allow_neg_inf=True)
    if a.shape != b.shape:
        raise ParamError("log_b", f"log_a and log_b must pair up, got {len(a)} and {len(b)}")
    rng = np.random.default_rng(check_int(seed, "seed", low=0))
    diff = a - b
    boot = diff[rng.integers(0, len(diff), size=(check_int(draws, "draws"), len(diff)))].mean(axis=1)
    return _percentiles(boot, float(diff.mean()))


def kl_exact(log_q, log_p) -> tuple[float, float]:
    """(KL(q || p(. | valid)), log Z) over a whole finite language: `log_q`, `log_p` of every string the grammar
    allows (`enumerate_grammar`, scored by `score_sequences`). q must sum to 1 (else the list is incomplete).

    >>> kl, log_z = kl_exact([math.log(0.5), math.log(0.5)], [math.log(0.1), math.log(0.1)])   # q = the conditional
    >>> round(kl, 6), round(math.exp(log_z), 6)   # Z = 0.2
    (0.0, 0.2)
    """
    q, p = _pair(log_q, log_p)
    total = float(np.exp(q).sum())
    if abs(total - 1.0) > 1e-6:
        raise ParamError("log_q", f"q must sum to 1 over the whole language, got {total:.6f}: the list of strings is "
                                  "incomplete (raise max_tokens in enumerate_grammar?)")
    log_z = float(_log_mean_exp(p) + math.log(len(p)))
    return float(np.sum(np.exp(q) * (q - p + log_z))), log_z


def enumerate_grammar(grammar: Grammar, max_tokens: int = 32, limit: int = 10_000) -> list[list[int]]:
    """Every token sequence (EOS included) of at most `max_tokens` tokens that `grammar` allows, depth first in
    token-id order; more than `limit` of them is an error (the language is too large to list).

    >>> from decodelab.grammar import LLGuidanceGrammar
    >>> [tokenizer.decode(s) for s in enumerate_grammar(LLGuidanceGrammar.regex("小(明|红)。", tokenizer))]
    ['小明。</s>', '小红。</s>']
    """
    if not isinstance(grammar, Grammar):
        raise ParamError("grammar", f"grammar must be a Grammar, got {type(grammar).__name__}")
    max_tokens, limit = check_int(max_tokens, "max_tokens"), check_int(limit, "limit")
    done: list[list[int]] = []
    stack: list[list[int]] = [[]]
    while stack:
        prefix = stack.pop()
        allowed = grammar.mask(prefix).nonzero().flatten().tolist()
        for token in reversed(allowed):
            if token == grammar.eos_token_id:
                done.append(prefix + [token])
                if len(done) > limit:
                    raise ParamError("limit", f"the grammar allows more than limit={limit} sequences")
            elif len(prefix) + 2 <= max_tokens:  # room for this token and an EOS
                stack.append(prefix + [token])
    return sorted(done)
