"""Repetition, frequency and presence penalties over the tokens each row has seen, one value per row.

Split out of `decodelab.sampling`, which applies them first, before temperature and truncation (transformers' order).

    >>> from decodelab.sampling import SamplingParams
    >>> apply_penalties(torch.ones(1, 5), [SamplingParams(repetition_penalty=2.0)], [[1, 1]])[0, 1].item()
    0.5

Taught in: chapters/03-strategies.ipynb
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from decodelab.sampling import SamplingParams


def is_token_id(value) -> bool:
    """A Python int >= 0 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def token_counts(output_tokens, batch: int, vocab_size: int, device: torch.device) -> torch.Tensor:
    """How often each token occurs in each row's `output_tokens`, `[B, V]`; negative ids in a tensor are padding."""
    if isinstance(output_tokens, torch.Tensor):
        if output_tokens.dim() != 2 or output_tokens.shape[0] != batch or output_tokens.is_floating_point():
            raise ValueError(f"output_tokens must be an integer tensor [B={batch}, T], got "
                             f"{output_tokens.dtype} {tuple(output_tokens.shape)}")
        ids = output_tokens.to(device=device, dtype=torch.long)
    else:
        if not isinstance(output_tokens, Sequence) or len(output_tokens) != batch:
            raise ValueError(f"output_tokens must be a [B, T] tensor or {batch} lists of token ids, "
                             f"got {output_tokens!r}")
        for i, row in enumerate(output_tokens):
            if not isinstance(row, Sequence) or not all(is_token_id(t) for t in row):
                raise ValueError(f"output_tokens[{i}] must be a list of token ids >= 0, got {row!r}")
        width = max((len(row) for row in output_tokens), default=0)
        ids = torch.tensor([list(row) + [-1] * (width - len(row)) for row in output_tokens], dtype=torch.long,
                           device=device).view(batch, width)
    if ids.numel() and bool((ids >= vocab_size).any()):
        raise ValueError(f"output_tokens must hold ids < vocab size {vocab_size}, got max {int(ids.max())}")
    ids = torch.where(ids < 0, vocab_size, ids)  # padding goes to a spare column, dropped below
    counts = torch.zeros(batch, vocab_size + 1, device=device)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=counts.dtype))
    return counts[:, :vocab_size]


def apply_penalties(x: torch.Tensor, rows: Sequence[SamplingParams], output_tokens) -> torch.Tensor:
    """Repetition (divide positive logits, multiply negative ones, as transformers), then frequency and presence
    (subtract count * frequency + [count > 0] * presence, as vLLM and OpenAI)."""
    batch, vocab_size = x.shape
    counts = token_counts(output_tokens, batch, vocab_size, x.device).to(x.dtype)  # [B, V]
    seen = counts > 0
    column = lambda values: torch.tensor(values, dtype=x.dtype, device=x.device).unsqueeze(1)  # noqa: E731
    if any(r.repetition_penalty != 1.0 for r in rows):
        penalty = column([r.repetition_penalty for r in rows])
        x = torch.where(seen, torch.where(x < 0, x * penalty, x / penalty), x)
    if any(r.frequency_penalty != 0.0 or r.presence_penalty != 0.0 for r in rows):
        x = x - counts * column([r.frequency_penalty for r in rows]) - seen * column([r.presence_penalty for r in rows])
    return x
