"""Top-k of each row of large logits with a single pass over them: the maximum of every chunk of 64 tokens first.

The k largest values of a row lie in the k chunks with the largest maxima (the k-th largest chunk maximum is a value
that at least k tokens reach, so no token below it is among the k largest). So one pass computes the chunk maxima,
`[n, V / 64]`; a small `torch.topk` picks k chunks, and a second `torch.topk` runs over their k × 64 tokens only. The
same chunk maxima give each row's maximum, which the sampler checks for NaN and inf, so that check costs no extra
pass either. On a CPU the logits of a 32k vocabulary are larger than the cache: every pass over them counts.

Ties on the k-th value are broken arbitrarily, as `torch.topk` does.

Taught in: chapters/03-strategies.ipynb
"""
from __future__ import annotations

import torch

MAXIMA_CHUNK = 64


def chunk_maxima(x: torch.Tensor) -> torch.Tensor | None:
    """The maximum of each chunk of `MAXIMA_CHUNK` columns, `[n, V]` -> `[n, V / MAXIMA_CHUNK]`; None when V is not
    a multiple of it."""
    n, vocab_size = x.shape
    if vocab_size % MAXIMA_CHUNK:
        return None
    return x.reshape(n, vocab_size // MAXIMA_CHUNK, MAXIMA_CHUNK).amax(dim=2)


def topk(x: torch.Tensor, k: int, chunk_max: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.topk(x, k, dim=-1)` for `x` `[n, V]`, reading only the best chunks when `chunk_max` (from
    `chunk_maxima(x)`, or of any per-row positive rescaling of x) is given and the k best chunks are a small part of
    the row. Returns (values, indices), both `[n, k]`, values descending.

    Example:
        values, ids = topk(logits, 50, chunk_maxima(logits))   # same as torch.topk(logits, 50) without ties
    """
    n, vocab_size = x.shape
    if chunk_max is None or 4 * k * MAXIMA_CHUNK > vocab_size:
        return torch.topk(x, k, dim=-1)
    if chunk_max.shape != (n, vocab_size // MAXIMA_CHUNK):
        raise ValueError(f"chunk_max must have shape [{n}, {vocab_size // MAXIMA_CHUNK}], got {tuple(chunk_max.shape)}")
    chunks = x.reshape(n, vocab_size // MAXIMA_CHUNK, MAXIMA_CHUNK)  # [n, C, MAXIMA_CHUNK]
    best = torch.topk(chunk_max, k, dim=-1).indices                                  # [n, k]
    candidates = chunks.gather(1, best.unsqueeze(2).expand(-1, -1, MAXIMA_CHUNK)).reshape(n, k * MAXIMA_CHUNK)
    values, position = torch.topk(candidates, k, dim=-1)                             # [n, k]
    chunk_of = best.gather(1, torch.div(position, MAXIMA_CHUNK, rounding_mode="floor"))
    return values, chunk_of * MAXIMA_CHUNK + position % MAXIMA_CHUNK
