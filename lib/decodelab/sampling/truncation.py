"""Truncating a distribution row by row: top-k, top-p, min-p and typical, each row with its own value.

The reference rules, written as transformers writes its warpers (`TopKLogitsWarper`, `TopPLogitsWarper`,
`MinPLogitsWarper`, `TypicalLogitsWarper`) but with one value per row: each takes logits `[n, K]` and a column of
per-row values `[n, 1]` and returns new logits `[n, K]` in which removed tokens are -inf. `decodelab.sampling.processors`
applies them in order; the faster routes of `decodelab.sampling.ops.fast_paths` are tested against them.

Ties: on the boundary value top-k keeps every tied token, as transformers does (the fast path keeps exactly k).

    >>> top_k_filter(torch.tensor([[1.0, 3.0, 2.0]]), torch.tensor([[2]]))
    tensor([[-inf, 3., 2.]])

Taught in: chapters/03-strategies.ipynb
"""
from __future__ import annotations

import torch

NEG_INF = float("-inf")


def all_rows(rows, num_rows: int) -> bool:
    """Whether `rows` names every one of `num_rows` rows once, in order (repeats or another order do not)."""
    return len(rows) == num_rows and list(rows) == list(range(num_rows))


def take_rows(x: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """`x[rows]` without a copy when `rows` are all rows in order (the common case), else one `index_select`."""
    if all_rows(rows, x.shape[0]):
        return x
    return x.index_select(0, torch.tensor(rows, dtype=torch.long, device=x.device))


def top_k_filter(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Keep each row's `k` largest logits (and ties with the k-th), `[n, K]` -> `[n, K]`; `k` `[n, 1]` (long), 0 keeps
    the whole row."""
    largest = int(k.max())
    if largest == 0:
        return x
    top = torch.topk(x, min(largest, x.shape[1]), dim=-1).values  # [n, k_max], descending
    kth = top.gather(1, (k.clamp(1, top.shape[1]) - 1))  # [n, 1]
    kth = kth.masked_fill(k == 0, NEG_INF)
    return x.masked_fill(x < kth, NEG_INF)


def top_p_filter(x: torch.Tensor, one_minus_p: torch.Tensor) -> torch.Tensor:
    """Keep each row's nucleus, `[n, K]` -> `[n, K]`: sort ascending and remove every token whose cumulative
    probability (itself and all less likely tokens) is <= 1 - top_p; the most likely token always stays.
    `one_minus_p` `[n, 1]` holds 1 - top_p (0 keeps the whole row)."""
    sorted_vals, sorted_idx = torch.sort(x, dim=-1)  # ascending, [n, K]
    cumulative = sorted_vals.softmax(dim=-1).cumsum(dim=-1)  # [n, K]
    remove = cumulative <= one_minus_p
    remove[:, -1] = False  # the most likely token always stays
    remove &= one_minus_p > 0
    return x.masked_fill(remove.scatter(1, sorted_idx, remove), NEG_INF)


def top_p_descending(vals: torch.Tensor, one_minus_p: torch.Tensor) -> torch.Tensor:
    """`top_p_filter` for logits already sorted descending that hold a row's whole distribution (the k best of a
    top-k row), `[n, K]` -> `[n, K]`, without a sort."""
    probs = torch.exp(vals - torch.logsumexp(vals, dim=-1, keepdim=True))  # [n, K]
    mass_from_here = probs.flip(-1).cumsum(-1).flip(-1)  # this token and all less likely ones
    remove = mass_from_here <= one_minus_p
    remove[:, 0] = False  # the most likely token always stays
    remove &= one_minus_p > 0
    return vals.masked_fill(remove, NEG_INF)


def min_p_filter(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Remove tokens whose probability is below `min_p` (`[n, 1]`) times the row's top probability, `[n, K]`."""
    probs = torch.softmax(logits, dim=-1)
    return logits.masked_fill(probs < min_p * probs.amax(-1, keepdim=True), NEG_INF)


def typical_filter(logits: torch.Tensor, typical_p: torch.Tensor) -> torch.Tensor:
    """Locally typical sampling (Meister et al. 2023) as transformers' `TypicalLogitsWarper`, `[n, K]` -> `[n, K]`;
    `typical_p` `[n, 1]`."""
    log_probs = torch.log_softmax(logits, dim=-1)
    entropy = -(log_probs * log_probs.exp()).nansum(-1, keepdim=True)  # [n, 1]
    surprise_gap = torch.abs(-log_probs - entropy)  # [n, K]
    sorted_gap, sorted_idx = torch.sort(surprise_gap, dim=-1)
    cumulative = logits.gather(-1, sorted_idx).softmax(dim=-1).cumsum(dim=-1)
    last = (cumulative < typical_p).sum(dim=1).clamp(max=logits.shape[-1] - 1)
    remove_sorted = sorted_gap > sorted_gap.gather(1, last.view(-1, 1))
    remove_sorted[:, 0] = False
    remove = remove_sorted.scatter(1, sorted_idx, remove_sorted)
    return logits.masked_fill(remove, NEG_INF)
