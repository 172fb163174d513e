"""Chi-square and the TV null quantile (decodelab.measure.stats): right on draws from the distribution itself, sharp on
a planted difference, and clear about bad arguments. Fixed seeds."""
from collections import Counter

import pytest
import torch

from decodelab.measure.stats import chi_square_p_value, total_variation, tv_null_quantile

P = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04], dtype=torch.float64)


def draws_from(probs: torch.Tensor, n: int, seed: int) -> Counter:
    return Counter(torch.multinomial(probs, n, replacement=True, generator=torch.Generator().manual_seed(seed)).tolist())


def test_draws_from_p_pass_and_a_shifted_distribution_fails():
    counts = draws_from(P, 20_000, seed=1)
    assert chi_square_p_value(counts, dict(enumerate(P.tolist())), 20_000) > 0.01
    assert total_variation(counts, P, 20_000) < tv_null_quantile(P, 20_000, repeats=500, seed=2)
    shifted = P.clone()
    shifted[0] -= 0.02
    shifted[5] += 0.02                                     # a TV of 0.02: small, but 20,000 draws see it
    counts = draws_from(shifted, 20_000, seed=3)
    assert chi_square_p_value(counts, dict(enumerate(P.tolist())), 20_000) < 1e-6
    assert total_variation(counts, P, 20_000) > tv_null_quantile(P, 20_000, repeats=500, seed=2)


def test_the_null_quantile_shrinks_like_one_over_the_root_of_the_draws():
    small, large = tv_null_quantile(P, 1_000, repeats=500, seed=0), tv_null_quantile(P, 16_000, repeats=500, seed=0)
    assert 3.0 < small / large < 5.0                       # sqrt(16) = 4


def test_small_cells_are_pooled():
    expected = {0: 0.9, 1: 0.09, 2: 0.006, 3: 0.004}      # at 500 draws cells 2 and 3 expect 3 and 2: pooled
    counts = Counter({0: 450, 1: 45, 2: 3, 3: 2})
    assert chi_square_p_value(counts, expected, 500) > 0.5


@pytest.mark.parametrize("call, message", [
    (lambda: chi_square_p_value(Counter(), {0: 1.0}, 0), "draws must be an int >= 1"),
    (lambda: chi_square_p_value(Counter(), {0: -0.5, 1: 1.5}, 10), "expected must hold probabilities >= 0, got -0.5"),
    (lambda: chi_square_p_value(Counter({0: 3}), {0: 0.5, 1: 0.5}, 3), "no outcome expects 5 draws or more out of 3"),
    (lambda: chi_square_p_value(Counter({0: 10}), {0: 1.0}, 10), "needs two cells or more after pooling"),
    (lambda: tv_null_quantile(P, 0), "draws must be an int >= 1"),
    (lambda: tv_null_quantile(P, 10, repeats=2.5), "repeats must be an int >= 1"),
    (lambda: tv_null_quantile(P, 10, level=1.0), r"level must be in \(0, 1\), got 1.0"),
])
def test_bad_arguments_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_the_share_difference_interval_covers_at_its_level():
    # 2,000 simulated pairs of groups with the same true shares: the 95% interval should hold the true difference
    # about 95% of the time (Newcombe's method is slightly conservative); fixed seed.
    from decodelab.measure.stats import share_difference
    generator = torch.Generator().manual_seed(7)
    a = torch.binomial(torch.full((2000,), 300.0), torch.full((2000,), 0.1), generator=generator).int().tolist()
    b = torch.binomial(torch.full((2000,), 120.0), torch.full((2000,), 0.15), generator=generator).int().tolist()
    covered = sum(low <= -0.05 <= high for _, low, high in (share_difference(x, 300, y, 120) for x, y in zip(a, b)))
    assert 0.93 <= covered / 2000 <= 0.985


def test_the_share_difference_names_bad_counts():
    from decodelab.measure.stats import share_difference
    with pytest.raises(ValueError, match="successes must be <= trials"):
        share_difference(5, 4, 1, 10)
    with pytest.raises(ValueError, match="trials must be an int >= 1"):
        share_difference(0, 0, 1, 10)
