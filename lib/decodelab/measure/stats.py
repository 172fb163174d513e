"""Tests of a sampled distribution against an exact one: Pearson's chi-square, and the total variation distance that
sampling noise alone gives at the same number of draws (so a measured TV is read against its null, not against 0);
and the difference of two independent shares with Newcombe's score interval (for two groups that are not paired).

    >>> from collections import Counter
    >>> p = {0: 0.5, 1: 0.3, 2: 0.2}
    >>> round(chi_square_p_value(Counter({0: 520, 1: 290, 2: 190}), p, 1000), 3)
    0.442
    >>> round(tv_null_quantile(torch.tensor([0.5, 0.3, 0.2]), draws=1000, repeats=2000, seed=0), 3)
    0.035
    >>> [round(v, 3) for v in share_difference(95, 1019, 44, 346)]    # 9.3% against 12.7%
    [-0.034, -0.076, 0.003]

Taught in: chapters/07b-speculative-decoding.ipynb
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

from decodelab.measure.constrained import wilson_interval
from decodelab.validation import check_int


def chi_square_p_value(counts: Mapping, expected: Mapping, draws: int) -> float:
    """p-value of Pearson's chi-square of `counts` (outcome -> draws) against `expected` (outcome -> probability) over
    `draws` draws. Cells expecting fewer than 5 draws are pooled into one; a pooled rest still under 5 joins the
    largest cell."""
    draws = check_int(draws, "draws")
    if any(prob < 0 for prob in expected.values()):
        raise ValueError(f"expected must hold probabilities >= 0, got {min(expected.values())}")
    big = [cell for cell, prob in expected.items() if prob * draws >= 5]
    if not big:
        raise ValueError(f"no outcome expects 5 draws or more out of {draws}: take more draws")
    observed = [counts.get(cell, 0) for cell in big] + [draws - sum(counts.get(cell, 0) for cell in big)]
    wanted = [expected[cell] * draws for cell in big] + [draws * (1 - sum(expected[cell] for cell in big))]
    if wanted[-1] < 5:  # the pooled rest is too small to test on its own: fold it into the largest cell
        largest = max(range(len(big)), key=lambda j: wanted[j])
        observed[largest] += observed.pop()
        wanted[largest] += wanted.pop()
    if len(wanted) < 2:
        raise ValueError("the chi-square test needs two cells or more after pooling; take more draws")
    stat = sum((o - w) ** 2 / w for o, w in zip(observed, wanted))
    return float(torch.special.gammaincc(torch.tensor((len(wanted) - 1) / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def total_variation(counts: Mapping, p: torch.Tensor, draws: int) -> float:
    """TV between the empirical distribution of `counts` (token id -> draws, out of `draws`) and `p` `[V]`."""
    freq = torch.zeros_like(p, dtype=torch.float64)
    for token, n in counts.items():
        freq[token] = n / draws
    return 0.5 * float((freq - p.double()).abs().sum())


def tv_null_quantile(p: torch.Tensor, draws: int, repeats: int = 1000, seed: int = 0, level: float = 0.95) -> float:
    """The `level` quantile of TV(empirical, p) when `draws` tokens are drawn from `p` itself, over `repeats`
    simulated samples (fixed seed): a measured TV above it is more than sampling noise at that many draws."""
    draws, repeats = check_int(draws, "draws"), check_int(repeats, "repeats")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    p = p.double() / p.double().sum()
    generator = torch.Generator().manual_seed(seed)
    samples = torch.multinomial(p.expand(repeats, -1), draws, replacement=True, generator=generator)   # [R, draws]
    freq = torch.zeros(repeats, p.numel(), dtype=torch.float64).scatter_add_(
        1, samples, torch.ones_like(samples, dtype=torch.float64)) / draws
    return float(torch.quantile(0.5 * (freq - p).abs().sum(dim=1), level))



def share_difference(successes_a: int, trials_a: int, successes_b: int, trials_b: int) -> tuple[float, float, float]:
    """(difference, low, high): share a minus share b of two independent groups, with Newcombe's hybrid score 95%
    interval (his method 10, built from each share's Wilson interval; sound near 0% and 100%, unlike the normal
    approximation). For two measurements on the same cases use a paired interval instead."""
    a, b = wilson_interval(successes_a, trials_a), wilson_interval(successes_b, trials_b)
    diff = a.value - b.value
    low = diff - ((a.value - a.low) ** 2 + (b.high - b.value) ** 2) ** 0.5
    high = diff + ((a.high - a.value) ** 2 + (b.value - b.low) ** 2) ** 0.5
    return diff, low, high
