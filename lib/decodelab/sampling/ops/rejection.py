"""Exact top-p sampling without sorting: rejection sampling with a rising pivot (FlashInfer's idea), over many rows.

The sort-based rule (transformers' `TopPLogitsWarper`) sorts a row ascending and removes every token whose cumulative
probability, itself and all less likely tokens, is <= 1 - top_p; the most likely token always stays. Call that
cumulative mass `below(j) = sum of p_i over the tokens with p_i <= p_j`. `below` grows with p_j, so the nucleus N,
the tokens kept, is every token more likely than some threshold, and we never need to find the threshold:

1. Draw a token j from p restricted to the tokens with p_i > pivot (the pivot starts at 0: the whole distribution).
2. Accept j if below(j) > 1 - top_p, or if j is the most likely token: j is in N.
3. Otherwise j, and every token no more likely than j, is outside N: raise the pivot to p_j and go back to 1.

Why the accepted token is distributed exactly as p renormalised over N: the pivot only ever rises to the probability
of a rejected token, so every token with p_i <= pivot is outside N, and the candidates S = {i : p_i > pivot} contain
N. A draw from p restricted to S, conditioned on landing in N, is token i of N with probability
(p_i / p(S)) / (p(N) / p(S)) = p_i / p(N), whatever S is. Each round draws with fresh randomness, so given the whole
history of rejections (which fixes S), the token accepted next is distributed as p_i / p(N); a mixture over histories
of one distribution is that distribution. A row still pending after `max_rounds` can be handed to the sort-based path,
which draws from p_i / p(N) as well, so the hand-over keeps the result exact.

Cost: the first draw is accepted with probability top_p and every rejection removes the mass below the pivot, so with
top_p = 0.9 about 90% of rows finish in one round whatever the size of their nucleus: flat logits (a nucleus of half
the vocabulary) cost what peaked ones cost. A round is a few passes over the pending rows and one host
synchronisation (which rows are still pending), never one per row. On a CPU the passes that follow each other over
the same rows (shift and exponentiate; compare, multiply and sum) run over blocks of rows of about half a megabyte,
which stay in a core's L2 cache between passes instead of streaming the whole batch from memory for each. A draw is
an inverse transform in two levels (pick a chunk of `DRAW_CHUNK` columns by the chunks' masses, then a column inside
it) with two float64 uniforms per row: no sort, no top-k, one pass over the row, and cumulative sums short enough
that rounding never starves a small token.

Ties: a token tied with the boundary value is kept with its whole tied group when below() of the group exceeds
1 - top_p; transformers keeps the members of the group its sort happens to put last. Real logits rarely tie.

Not taught in a chapter: performance code behind `sample(method="fast")`, tested against the sort-based reference
and measured in benchmarks/sampling.py.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from decodelab.validation import check_int

MAX_ROUNDS = 32  # as FlashInfer; rows still pending after this many rounds go back to the caller
DRAW_CHUNK = 256  # columns per chunk of the two-level inverse transform
CACHE_BLOCK_BYTES = 1 << 19  # rows per pass on a CPU: about this many bytes, which stay in a core's L2 cache


def _uniforms(generators: Sequence[torch.Generator | None], device: torch.device) -> torch.Tensor:
    """Two float64 uniforms in [0, 1) per row, `[m, 2]`; row j draws its own from `generators[j]` when that is a
    generator, so a seeded row consumes two numbers per round from its stream whatever else shares the batch."""
    out = torch.empty(len(generators), 2, dtype=torch.float64, device=device)
    if any(g is None for g in generators):
        out.uniform_()
    for j, g in enumerate(generators):
        if g is not None:
            out[j].uniform_(generator=g)
    return out


def _invert(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Per row of non-negative `weights` `[m, K]` with a positive entry, the first column whose float64 cumulative
    weight exceeds `uniform` `[m, 1]` times the total: column i with probability w_i / total. A column of weight 0
    is never returned: its cumulative weight equals its left neighbour's, which exceeds the target first."""
    cumulative = weights.to(torch.float64).cumsum(dim=-1)  # [m, K]
    total = cumulative[:, -1:]  # [m, 1]
    target = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))  # u * total may round up
    return torch.searchsorted(cumulative, target, right=True)  # [m, 1]


def _draw(chunks: torch.Tensor, chunk_mass: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One column per row of `chunks` `[m, C, DRAW_CHUNK]` (weights), given their sums `chunk_mass` `[m, C]` and
    `uniforms` `[m, 2]`."""
    chunk = _invert(chunk_mass, uniforms[:, :1])  # [m, 1]
    inside = chunks.gather(1, chunk.unsqueeze(2).expand(-1, 1, DRAW_CHUNK)).squeeze(1)  # [m, DRAW_CHUNK]
    return chunk * DRAW_CHUNK + _invert(inside, uniforms[:, 1:])


def _row_blocks(x: torch.Tensor) -> list[slice]:
    """Slices of the rows of `x` `[m, K]`: on a CPU, blocks of about `CACHE_BLOCK_BYTES`, so that a run of passes
    over one block (compare, multiply, sum) finds it in cache; elsewhere one block of all rows."""
    m = x.shape[0]
    if x.device.type != "cpu":
        return [slice(0, m)]
    rows = max(1, CACHE_BLOCK_BYTES // max(1, x.shape[1] * x.element_size()))
    return [slice(start, min(start + rows, m)) for start in range(0, m, rows)]


def _mass_at_most(weights: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """Per row of `weights` `[m, K]`, the sum of the weights <= that row's `bound` `[m, 1]`, `[m, 1]`."""
    out = torch.empty(weights.shape[0], 1, dtype=weights.dtype, device=weights.device)
    blocks = _row_blocks(weights)
    scratch = torch.empty(blocks[0].stop, weights.shape[1], dtype=weights.dtype, device=weights.device)
    for block in blocks:
        w = weights[block]
        # a comparison writing a 0/1 float mask, then an in-place product, is several times faster on CPU than
        # torch.where
        mask = torch.le(w, bound[block], out=scratch[: w.shape[0]])
        out[block] = mask.mul_(w).sum(dim=-1, keepdim=True)
    return out


def top_p_rejection(logits: torch.Tensor, top_p: Sequence[float], generators: Sequence[torch.Generator | None],
                    max_rounds: int = MAX_ROUNDS, overwrite: bool = False,
                    row_max: torch.Tensor | None = None) -> tuple[torch.Tensor, list[int]]:
    """Draw one token per row of `logits` (`[n, V]`, already divided by each row's temperature) from its top-p
    nucleus, by rejection with a rising pivot. With `overwrite` the caller hands `logits` over as scratch space
    (float32 or float64 only), which saves a copy of `[n, V]`. `row_max` `[n, 1]`, when the caller knows it, must be
    each row's exact maximum (it saves a pass over the logits).

    Returns `(tokens, pending)`: tokens `[n]` (LongTensor) and the rows still undecided after `max_rounds`, whose
    entries in `tokens` are meaningless; the caller draws those another exact way (the sort-based path).
    `generators[j]` (a `torch.Generator` or None for torch's global RNG) feeds row j; a seeded row takes as many
    rounds as its own draws need, so its tokens and its generator's state do not depend on the other rows.

        >>> tokens, pending = top_p_rejection(torch.randn(4, 1000) * 3, [0.9] * 4, [None] * 4)

    """
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point tensor [n, V], got {logits!r:.80}")
    n, vocab_size = logits.shape
    if len(top_p) != n or not all(isinstance(v, float) and 0.0 < v <= 1.0 for v in top_p):
        raise ValueError(f"top_p must hold {n} floats in (0, 1], got {list(top_p)!r:.200}")
    if isinstance(generators, torch.Generator) or not isinstance(generators, Sequence) or len(generators) != n:
        raise ValueError(f"generators must be a sequence of {n} torch.Generator or None, got {generators!r:.200}")
    for i, g in enumerate(generators):
        if g is not None and not isinstance(g, torch.Generator):
            raise TypeError(f"generators[{i}] must be a torch.Generator or None, got {type(g).__name__}")
    check_int(max_rounds, "max_rounds")
    device = logits.device
    if row_max is None:
        row_max = logits.amax(dim=-1, keepdim=True)  # [n, 1]
    elif not isinstance(row_max, torch.Tensor) or tuple(row_max.shape) != (n, 1):
        raise ValueError(f"row_max must be None or a tensor [{n}, 1], got {row_max!r:.80}")
    if not bool(torch.isfinite(row_max).all()):
        raise ValueError("logits rows must each hold a finite maximum (no NaN, no +inf, not all -inf)")
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    # [n, V']: V rounded up to whole chunks, the padding -inf (weight 0: never drawn). In place when allowed: on a
    # CPU every fresh [n, V] buffer costs page faults as well as a pass
    if vocab_size % DRAW_CHUNK:
        weights = F.pad(logits.to(dtype), (0, -vocab_size % DRAW_CHUNK), value=float("-inf"))
    elif overwrite and logits.dtype == dtype:
        weights = logits
    else:
        weights = logits.to(dtype, copy=True)
    chunk_mass = torch.empty(n, weights.shape[1] // DRAW_CHUNK, dtype=dtype, device=device)  # [n, C]
    for block in _row_blocks(weights):  # probabilities times the row's normaliser; the most likely token gets 1
        w = weights[block].sub_(row_max[block]).exp_()
        chunk_mass[block] = w.view(w.shape[0], -1, DRAW_CHUNK).sum(dim=-1)
    normaliser = chunk_mass.sum(dim=-1, keepdim=True)  # [n, 1]
    # 1 - p in double precision, then cast, as the sort path and transformers compare with the float 1 - top_p
    one_minus_p = torch.tensor([1.0 - v for v in top_p], dtype=weights.dtype, device=device).unsqueeze(1)  # [n, 1]
    threshold = one_minus_p * normaliser  # [n, 1]: below(j) above this means j is in the nucleus
    pivot = torch.zeros(n, 1, dtype=weights.dtype, device=device)  # [n, 1]; weights <= pivot are outside
    tokens = torch.zeros(n, dtype=torch.long, device=device)
    pending = list(range(n))
    for round_ in range(max_rounds):
        index = torch.tensor(pending, device=device)  # [m]
        if len(pending) == n:  # every row: no copies (the first round, and whenever none has finished)
            w, row_pivot, row_threshold = weights, pivot, threshold
        else:
            w, row_pivot, row_threshold = (t.index_select(0, index) for t in (weights, pivot, threshold))
        candidates = weights if round_ == 0 else w * (w > row_pivot)  # [m, V']; at first the pivot is 0
        mass = chunk_mass if candidates is weights else candidates.view(len(pending), -1, DRAW_CHUNK).sum(dim=-1)
        choice = _draw(candidates.view(len(pending), -1, DRAW_CHUNK), mass,
                       _uniforms([generators[i] for i in pending], device))  # [m, 1]
        chosen_weight = w.gather(1, choice)  # [m, 1]
        below = _mass_at_most(w, chosen_weight)  # [m, 1]: the mass of the tokens no more likely than the choice
        accept = (below > row_threshold) | (chosen_weight >= 1.0)  # the most likely token always stays
        tokens.index_copy_(0, index, choice.squeeze(1))  # rejected rows are overwritten in a later round
        pivot.index_copy_(0, index, torch.maximum(row_pivot, chosen_weight))
        accepted = accept.squeeze(1).tolist()  # the round's one host synchronisation
        pending = [i for i, ok in zip(pending, accepted) if not ok]
        if not pending:
            break
    return tokens, pending
