"""What the sampler's statistical tests share (tests/sampling/test_sampler.py, tests/sampling/test_counter_rng.py): a
chi-square critical value and a peaked distribution with a long tail."""
import math

import torch


def chi_square_critical(dof: int, quantile_z: float = 3.09) -> float:
    """Upper 0.999 quantile of chi-square with `dof` degrees of freedom (Wilson-Hilferty approximation)."""
    h = 2.0 / (9.0 * dof)
    return dof * (1.0 - h + quantile_z * math.sqrt(h)) ** 3


def peaked_logits(vocab_size: int) -> torch.Tensor:
    """Eight likely tokens spread over the vocabulary and a long unlikely tail, [1, V]."""
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(1, vocab_size, generator=gen) - 12.0
    logits[0, torch.arange(8) * (vocab_size // 8) + 3] = torch.tensor([3.0, 2.6, 2.2, 1.9, 1.5, 1.0, 0.4, 0.0])
    return logits
