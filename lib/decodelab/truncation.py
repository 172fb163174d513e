"""Truncating a distribution row by row: top-k, top-p, min-p and typical, each row with its own values.

Two exact paths for top-k/top-p, chosen by `method`:

- ``"sort"``, the reference: one ascending sort of the whole vocabulary and the same operations as transformers'
  `TopKLogitsWarper` and `TopPLogitsWarper`.
- ``"fast"``: no sort of the vocabulary. A top-k (`decodelab.topk`, one pass over the row) takes each row's candidates (its k tokens when top-k is set,
  otherwise a power of two from 256 up, started from an estimate read off a strided sample of the row and doubled while
  the nucleus does not fit) and top-p runs on those candidates only. A row whose nucleus is wider than a quarter of
  the vocabulary (flat logits) goes to the sort path, so the result is exact either way. Deciding costs one host
  synchronisation per round of widening, never one per row.

`process_logits` needs the kept set itself and uses these paths; `sample(method="fast")` only needs one token from the
nucleus, so rows with top-p alone (no top-k, min-p or typical) skip truncation there and are drawn by rejection
(`decodelab.rejection`).

Results come back as `RowGroup`s (groups of rows sharing one layout; not KV blocks): dense (column j is token j) or
candidate columns with their token ids, so that the sampler draws its noise over a few hundred candidates instead of the whole vocabulary.

Ties: on the boundary value the sort path keeps every tied token, as transformers does; the fast path keeps exactly k
candidates for top-k (top-p keeps ties in both). Real logits rarely tie; the tests use logits without ties.

Taught in: chapters/03-strategies.ipynb
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from decodelab.topk import topk

NEG_INF = float("-inf")
CANDIDATE_WIDTHS = tuple(2**e for e in range(8, 16))  # 256 ... 32768, for rows with top-p alone
METHODS = ("fast", "sort")


@dataclass
class RowGroup:
    """Rows of a batch that share one layout of columns."""

    rows: list[int]  # batch rows held by this block, in order
    logits: torch.Tensor  # [n, K] processed logits; removed tokens are -inf
    token_ids: torch.Tensor | None  # [n, K] vocabulary id of each column; None: column j is token j
    widths: list[int]  # per row, how many leading columns can hold kept tokens

    def dense(self, vocab_size: int) -> torch.Tensor:
        """The block's logits laid out over the whole vocabulary, `[n, V]`."""
        if self.token_ids is None:
            return self.logits
        out = torch.full((len(self.rows), vocab_size), NEG_INF, dtype=self.logits.dtype, device=self.logits.device)
        return out.scatter(1, self.token_ids, self.logits)


def take_rows(x: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """`x[rows]` without a copy when `rows` are all rows in order (the common case), else one `index_select`."""
    if rows == list(range(x.shape[0])):
        return x
    return x.index_select(0, torch.tensor(rows, device=x.device))


def top_k_top_p(x: torch.Tensor, rows: list[int], top_k: list[int], top_p: list[float], method: str,
                temperature: torch.Tensor | None = None, chunk_max: torch.Tensor | None = None) -> list[RowGroup]:
    """Apply top-k then top-p to `x` (`[n, V]`, the logits of batch rows `rows`); 0 / 1.0 switch a filter off.

    `temperature` (`[n, 1]`, rows with top-k only) divides `x` first; the fast path divides only each row's k
    candidates, which are the same since dividing by a positive number keeps the order. `chunk_max` (`[n, V / 64]`,
    `decodelab.topk.chunk_maxima` of x or of x before a temperature) lets the fast path read only the best chunks.
    """
    if temperature is not None and not all(k > 0 for k in top_k):
        raise ValueError(f"temperature is for rows that all set top_k, got top_k={top_k}")
    if method == "sort":
        x = x if temperature is None else x / temperature
        return [RowGroup(rows, top_k_top_p_sort(x, top_k, top_p), None, [x.shape[1]] * len(rows))]
    return _top_k_top_p_fast(x, rows, top_k, top_p, temperature, chunk_max)


def top_k_top_p_sort(x: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """The sort-based reference: transformers' top-k then top-p rule with per-row values, `[n, V]` -> `[n, V]`."""
    n, vocab_size = x.shape
    k = torch.tensor(top_k, device=x.device)  # [n]
    sorted_vals, sorted_idx = torch.sort(x, dim=-1)  # ascending, [n, V]
    if any(v > 0 for v in top_k):
        kth_largest = sorted_vals.gather(1, (vocab_size - k.clamp(1, vocab_size)).unsqueeze(1))  # [n, 1]
        kth_largest = kth_largest.masked_fill((k == 0).unsqueeze(1), NEG_INF)
        sorted_vals = sorted_vals.masked_fill(sorted_vals < kth_largest, NEG_INF)
    if any(v < 1.0 for v in top_p):
        # 1 - p in double precision, then cast, as transformers compares with the Python float 1 - top_p
        one_minus_p = torch.tensor([1.0 - v for v in top_p], dtype=x.dtype, device=x.device)
        cumulative = sorted_vals.softmax(dim=-1).cumsum(dim=-1)  # [n, V]
        remove = cumulative <= one_minus_p.unsqueeze(1)
        remove[:, -1] = False  # the most likely token always stays
        remove &= torch.tensor([v < 1.0 for v in top_p], device=x.device).unsqueeze(1)
        sorted_vals = sorted_vals.masked_fill(remove, NEG_INF)
    return torch.empty_like(x).scatter_(1, sorted_idx, sorted_vals)


def _candidate_width(k: int, bound: float, vocab_size: int) -> int | None:
    """How many candidates a row needs (at least `bound`), or None when only a full sort is cheaper."""
    if k > 0:
        return min(k, vocab_size)
    for width in CANDIDATE_WIDTHS:
        if width >= bound and 4 * width <= vocab_size:
            return width
    return None


def _top_k_top_p_fast(x: torch.Tensor, rows: list[int], top_k: list[int], top_p: list[float],
                      temperature: torch.Tensor | None, chunk_max: torch.Tensor | None) -> list[RowGroup]:
    n, vocab_size = x.shape
    p_only = [k == 0 and p < 1.0 for k, p in zip(top_k, top_p)]
    bounds = [0.0] * n
    if any(p_only) and 4 * CANDIDATE_WIDTHS[0] <= vocab_size:
        # a strided sample of each row estimates the nucleus size: where to start, or (flat logits, a nucleus wider
        # than a quarter of the vocabulary) that a full sort is cheaper. Only a guess: coverage is checked below.
        stride = max(1, vocab_size // 512)
        sample = torch.sort(x[:, ::stride], dim=-1, descending=True).values  # [n, ~512]
        p = torch.tensor(top_p, dtype=x.dtype, device=x.device).unsqueeze(1)  # [n, 1]
        bounds = (1.25 * stride * ((sample.softmax(dim=-1).cumsum(dim=-1) < p).sum(dim=-1) + 1)).tolist()
    elif any(p_only):
        bounds = [math.inf] * n  # a vocabulary this small is sorted at once
    widths = [_candidate_width(k, b, vocab_size) for k, b in zip(top_k, bounds)]
    needs_norm = any(p_only[i] and widths[i] is not None for i in range(n))
    log_norm = torch.logsumexp(x, dim=-1) if needs_norm else None  # [n], for top-p alone over candidates
    pending = list(range(n))
    to_sort: list[int] = []
    blocks = []
    while pending:  # each round, rows whose nucleus outgrew their candidates try twice as many
        to_sort += [i for i in pending if widths[i] is None]
        retry = []
        groups = [[i for i in pending if top_k[i] > 0]]  # top-k rows share one topk call
        for group_width in sorted({widths[i] for i in pending if widths[i] is not None and top_k[i] == 0}):
            groups.append([i for i in pending if widths[i] == group_width and top_k[i] == 0])
        for group in filter(None, groups):
            block, uncovered = _candidate_block(x, rows, group, [widths[i] for i in group], top_k, top_p, log_norm,
                                                temperature, chunk_max)
            blocks += [block] if block is not None else []
            retry += uncovered
        for i in retry:
            widths[i] = _candidate_width(0, widths[i] + 1, vocab_size)
        pending = sorted(retry)
    if to_sort:
        to_sort.sort()
        dense = top_k_top_p_sort(take_rows(x, to_sort), [top_k[i] for i in to_sort], [top_p[i] for i in to_sort])
        blocks.append(RowGroup([rows[i] for i in to_sort], dense, None, [vocab_size] * len(to_sort)))
    return blocks


def _candidate_block(x: torch.Tensor, rows: list[int], group: list[int], widths: list[int], top_k: list[int],
                     top_p: list[float], log_norm: torch.Tensor | None, temperature: torch.Tensor | None = None,
                     chunk_max: torch.Tensor | None = None) -> tuple[RowGroup | None, list[int]]:
    """Top-k/top-p on the `widths` best candidates of rows `group`; returns the covered rows' block and the rest."""
    width = torch.tensor(widths, device=x.device)  # [m]
    vals, ids = topk(take_rows(x, group), max(widths),
                     None if chunk_max is None else take_rows(chunk_max, group))  # [m, K], descending
    if temperature is not None:
        vals = vals / take_rows(temperature, group)
    columns = torch.arange(vals.shape[1], device=x.device)
    vals = vals.masked_fill(columns.unsqueeze(0) >= width.unsqueeze(1), NEG_INF)
    covered = [True] * len(group)
    if any(top_p[i] < 1.0 for i in group):
        vals, covered = _top_p_on_candidates(vals, width, [top_k[i] for i in group], [top_p[i] for i in group],
                                             take_rows(log_norm, group) if log_norm is not None else None)
    keep = [j for j in range(len(group)) if covered[j]]
    block = None
    if keep:
        if len(keep) < len(group):
            index = torch.tensor(keep, device=x.device)
            vals, ids = vals.index_select(0, index), ids.index_select(0, index)
        block = RowGroup([rows[group[j]] for j in keep], vals, ids, [widths[j] for j in keep])
    return block, [group[j] for j in range(len(group)) if not covered[j]]


def _top_p_on_candidates(vals: torch.Tensor, width: torch.Tensor, top_k: list[int], top_p: list[float],
                         log_norm: torch.Tensor | None) -> tuple[torch.Tensor, list[bool]]:
    """Top-p over descending candidates `[m, K]`; returns them and, per row, whether the nucleus fits inside."""
    has_k = torch.tensor([k > 0 for k in top_k], device=vals.device)  # [m]
    norm = torch.logsumexp(vals, dim=-1)  # after top-k the candidates are the whole distribution
    if log_norm is not None:
        norm = torch.where(has_k, norm, log_norm)  # top-p alone: normalise over the whole vocabulary
    probs = torch.exp(vals - norm.unsqueeze(1))  # [m, K]
    tail = torch.where(has_k, torch.zeros_like(norm), (1.0 - probs.sum(dim=-1)).clamp_min(0.0))  # mass outside
    mass_from_here = probs.flip(-1).cumsum(-1).flip(-1) + tail.unsqueeze(1)  # this token and all less likely ones
    one_minus_p = torch.tensor([1.0 - v for v in top_p], dtype=vals.dtype, device=vals.device)
    remove = mass_from_here <= one_minus_p.unsqueeze(1)
    remove[:, 0] = False
    remove &= torch.tensor([v < 1.0 for v in top_p], device=vals.device).unsqueeze(1)
    # a row with top-p alone is exact only if its last candidate was removed: the nucleus ends inside
    last_removed = remove.gather(1, (width - 1).unsqueeze(1)).squeeze(1)
    covered = has_k | last_removed | torch.tensor([v >= 1.0 for v in top_p], device=vals.device)
    return vals.masked_fill(remove, NEG_INF), covered.tolist()


def min_p_filter(logits: torch.Tensor, min_p: list[float]) -> torch.Tensor:
    """Remove tokens whose probability is below `min_p` times the top probability, `[n, K]` -> `[n, K]`."""
    probs = torch.softmax(logits, dim=-1)
    scale = torch.tensor(min_p, dtype=logits.dtype, device=logits.device).unsqueeze(1)  # [n, 1]
    threshold = scale * probs.amax(-1, keepdim=True)
    return logits.masked_fill(probs < threshold, NEG_INF)


def typical_filter(logits: torch.Tensor, typical_p: list[float]) -> torch.Tensor:
    """Locally typical sampling (Meister et al. 2023) as transformers' `TypicalLogitsWarper`, `[n, K]` -> `[n, K]`."""
    log_probs = torch.log_softmax(logits, dim=-1)
    entropy = -(log_probs * log_probs.exp()).nansum(-1, keepdim=True)  # [n, 1]
    surprise_gap = torch.abs(-log_probs - entropy)  # [n, K]
    sorted_gap, sorted_idx = torch.sort(surprise_gap, dim=-1)
    cumulative = logits.gather(-1, sorted_idx).softmax(dim=-1).cumsum(dim=-1)
    mass = torch.tensor(typical_p, dtype=logits.dtype, device=logits.device).unsqueeze(1)
    last = (cumulative < mass).sum(dim=1).clamp(max=logits.shape[-1] - 1)
    remove_sorted = sorted_gap > sorted_gap.gather(1, last.view(-1, 1))
    remove_sorted[:, 0] = False
    remove = remove_sorted.scatter(1, sorted_idx, remove_sorted)
    return logits.masked_fill(remove, NEG_INF)
