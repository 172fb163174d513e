"""From logits to probabilities: stable softmax, log-softmax, entropy and KL divergence over the last dim.

The functions are written out (instead of calling `torch.softmax`) because chapter 01 reads them line by line.
Every function works on `[..., V]` tensors and reduces or normalises the last dimension only.

Taught in: chapters/01-logits-to-probs.ipynb, chapters/02-temperature.ipynb
"""
from __future__ import annotations

from collections.abc import Mapping

import torch


def _check_tensor(name: str, x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"{name} must have shape [..., V] with V >= 1, got shape {tuple(x.shape)}")


def softmax(logits: torch.Tensor) -> torch.Tensor:
    """exp(x - max) / sum(exp(x - max)) over the last dim, `[..., V]` -> `[..., V]`.

    Subtracting each row's max changes nothing mathematically and keeps exp() from overflowing.

    >>> softmax(torch.tensor([1000.0, 999.0])).tolist()
    [0.7310585975646973, 0.2689414322376251]
    """
    _check_tensor("logits", logits)
    shifted = logits - logits.amax(dim=-1, keepdim=True)  # [..., V], max of each row is 0
    exps = shifted.exp()
    return exps / exps.sum(dim=-1, keepdim=True)


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """x - logsumexp(x) over the last dim, computed as x - m - log(sum(exp(x - m))), `[..., V]` -> `[..., V]`.

    Unlike log(softmax(x)), it stays finite when a probability underflows to 0.

    >>> log_softmax(torch.tensor([0.0, -200.0])).tolist()
    [0.0, -200.0]
    """
    _check_tensor("logits", logits)
    row_max = logits.amax(dim=-1, keepdim=True)  # [..., 1]
    shifted = logits - row_max
    return shifted - shifted.exp().sum(dim=-1, keepdim=True).log()


def _check_probs(name: str, p: torch.Tensor) -> None:
    _check_tensor(name, p)
    if bool((p < 0).any()) or not bool(torch.isfinite(p).all()):
        raise ValueError(f"{name} must hold finite probabilities >= 0, got min {p.min().item()}")
    total = p.sum(dim=-1)
    if not torch.allclose(total, torch.ones_like(total), atol=1e-4):
        raise ValueError(f"{name} must sum to 1 over the last dim, got sums from {total.min().item()} to {total.max().item()}")


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """H(p) = -sum p log p in nats over the last dim, with 0 log 0 = 0, `[..., V]` -> `[...]`.

    >>> round(entropy(torch.tensor([0.5, 0.5, 0.0])).item(), 4)
    0.6931
    """
    _check_probs("probs", probs)
    return 0.0 - torch.xlogy(probs, probs).sum(dim=-1)  # 0.0 - x rather than -x: a certain distribution gives +0.0


def kl_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) = sum p log(p / q) in nats over the last dim, `[..., V]` x `[..., V]` -> `[...]`.

    Infinite where p puts mass on a token that q gives probability 0.

    >>> round(kl_divergence(torch.tensor([0.5, 0.5]), torch.tensor([0.9, 0.1])).item(), 4)
    0.5108
    """
    _check_probs("p", p)
    _check_probs("q", q)
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    return (torch.xlogy(p, p) - torch.xlogy(p, q)).sum(dim=-1)


def dense_probs(token_probs: Mapping[str, float], tokenizer) -> torch.Tensor:
    """A `{token: probability}` mapping (such as `ToyLanguage.next_token_probs`) as a `[V]` float32 tensor laid out
    like the tokenizer's vocabulary, zeros elsewhere, so that it sits next to a model's distribution.

    Raises ValueError for a token the tokenizer does not know.
    """
    if not isinstance(token_probs, Mapping):
        raise TypeError(f"token_probs must be a mapping token -> probability, got {type(token_probs).__name__}")
    out = torch.zeros(len(tokenizer))  # [V]
    vocab = tokenizer.get_vocab()
    for token, prob in token_probs.items():
        if token not in vocab:
            raise ValueError(f"token_probs holds {token!r}, which is not in the tokenizer's vocabulary")
        out[vocab[token]] = prob
    return out
