"""Per-request sampling parameters, logits processing and batched sampling.

One batch, one `SamplingParams` per row, as a serving engine (vLLM) does it: greedy and random requests share a batch,
every row has its own temperature, top-k, top-p, min-p, typical-p, penalties, no-repeat-n-gram size and seed, and the
maths is vectorised over rows. The order of processing is transformers': penalties and the n-gram ban, temperature,
top-k, top-p, min-p, typical.

    >>> logits = torch.randn(2, 100)
    >>> params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_p=0.9, seed=1)]
    >>> tokens = sample(logits, params)          # LongTensor [2]

Taught in: chapters/02-temperature.ipynb, chapters/03-strategies.ipynb
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from decodelab.params import SamplingParams, is_int
from decodelab.penalties import apply_penalties
from decodelab.rejection import top_p_rejection
from decodelab.topk import chunk_maxima
from decodelab.truncation import (METHODS, NEG_INF, RowGroup, min_p_filter, take_rows, top_k_top_p, top_k_top_p_sort,
                                  typical_filter)
from decodelab.validation import check_int

_MASK64 = (1 << 64) - 1


def sample_seed(seed: int | None, index: int) -> int | None:
    """The seed of sample `index` of a request seeded with `seed` (n > 1, or one row per sample).

    Sample 0 keeps `seed`, so a request with n = 1 draws what `generate` draws with the same seed; later samples get a
    SplitMix64 mix of (seed, index), so neighbouring seeds never share a stream (with `seed + index`, seed 0's sample 1
    was seed 1's sample 0).

    >>> sample_seed(7, 0), sample_seed(0, 1) == sample_seed(1, 0), sample_seed(None, 3)
    (7, False, None)
    """
    check_int(index, "index", low=0)
    if seed is None or index == 0:
        return seed
    x = (seed + index * 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) & ((1 << 63) - 1)


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A generator seeded with `seed` on `device`, or None for an unseeded request.

    An engine makes one per seeded request and passes it to every `sample` call of that request, so the request's
    noise comes from its own stream whatever else shares the batch.
    """
    if seed is None:
        return None
    if not (is_int(seed) and 0 <= seed < 2**63):
        raise ValueError(f"seed must be None or an int in [0, 2**63), got {seed!r}")
    generator = torch.Generator(device=torch.device(device))
    generator.manual_seed(seed)
    return generator


def _rows_of(params: SamplingParams | Sequence[SamplingParams], batch: int) -> list[SamplingParams]:
    if isinstance(params, SamplingParams):
        return [params] * batch
    if isinstance(params, (str, bytes)) or not isinstance(params, Sequence):
        raise TypeError(f"params must be a SamplingParams or a sequence of {batch}, got {type(params).__name__}")
    if len(params) != batch:
        raise ValueError(f"params must hold one SamplingParams per row: {batch} rows, got {len(params)}")
    for i, row in enumerate(params):
        if not isinstance(row, SamplingParams):
            raise TypeError(f"params[{i}] must be a SamplingParams, got {type(row).__name__}")
    return list(params)


def _check_logits(logits: torch.Tensor) -> None:
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dim() != 2 or logits.shape[0] < 1 or logits.shape[1] < 1:
        raise ValueError(f"logits must have shape [B, V] with B, V >= 1, got {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise TypeError(f"logits must be a floating-point tensor, got {logits.dtype}")


def _check_rows(maxima: torch.Tensor) -> None:
    """`maxima` `[B, ...]`: the logits or their chunk maxima. One host synchronisation per call (not per row): every
    row needs no NaN or +inf and one finite value."""
    row_max = maxima.amax(dim=1)  # NaN if the row holds one, +inf if it holds one, -inf if it is all -inf
    bad = ~torch.isfinite(row_max)
    if bool(bad.any()):
        rows = bad.nonzero().flatten().tolist()
        raise ValueError(f"logits rows {rows} hold NaN or +inf, or only -inf; every row needs a finite value")


def _process(logits: torch.Tensor, params, output_tokens, method: str, defer_top_p: bool = False,
             prompt_tokens=None):
    """Shared by `process_logits` and `sample`: returns the penalised logits `x` (not yet tempered), the rows' params,
    greedy rows, the blocks, (with `defer_top_p`) the rows with top-p alone, left for rejection sampling, and the
    rows' temperatures `[B, 1]` (None when all are 1)."""
    _check_logits(logits)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    batch, _ = logits.shape
    rows = _rows_of(params, batch)
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    x = logits.to(dtype)  # [B, V]; every step below is out of place, so the input is never modified
    if output_tokens is not None:
        x = apply_penalties(x, rows, output_tokens, prompt_tokens)  # keeps NaN, +inf and all -inf rows as they were
    elif any(r.has_penalties for r in rows):
        raise ValueError("output_tokens is None but some params ask for penalties; pass the tokens they see")
    elif prompt_tokens is not None:
        raise ValueError("prompt_tokens goes with output_tokens (empty lists before the first token); "
                         "pass output_tokens too")
    # the fast path reads the logits once: the chunk maxima serve both this check and top-k (decodelab.topk)
    chunk_max = chunk_maxima(x) if method == "fast" else None  # [B, V / 64] or None
    _check_rows(x if chunk_max is None else chunk_max)
    # top_k = 1 keeps one token: the argmax, ties to the lowest id, exactly as temperature 0 (a threshold at the k-th
    # value would keep every tied token and draw among them)
    argmax_only = [r.greedy or r.top_k == 1 for r in rows]
    greedy = [i for i, only in enumerate(argmax_only) if only]
    random_rows = [i for i, only in enumerate(argmax_only) if not only]
    temperature = None  # [B, 1]
    if any(rows[i].temperature != 1.0 for i in random_rows):
        temperature = torch.tensor([1.0 if only else r.temperature for r, only in zip(rows, argmax_only)], dtype=dtype,
                                   device=x.device).unsqueeze(1)

    def tempered(group: list[int]) -> torch.Tensor:  # [len(group), V]
        part = take_rows(x, group)
        return part if temperature is None else part / take_rows(temperature, group)

    top_p_alone = [i for i in random_rows if defer_top_p and rows[i].top_p < 1.0 and rows[i].top_k == 0
                   and rows[i].min_p == 0.0 and rows[i].typical_p == 1.0]
    deferred = set(top_p_alone)  # built once: a set per row made this quadratic in the batch size
    truncate = [i for i in random_rows if (rows[i].top_k > 0 or rows[i].top_p < 1.0) and i not in deferred]
    untouched = [i for i in random_rows if rows[i].top_k == 0 and rows[i].top_p == 1.0]
    # the fast top-k route divides only each row's k candidates: dividing by a temperature keeps the order
    top_k_first = [i for i in truncate if method == "fast" and rows[i].top_k > 0]
    first = set(top_k_first)
    truncate = [i for i in truncate if i not in first]
    blocks: list[RowGroup] = []
    if top_k_first:
        blocks += top_k_top_p(take_rows(x, top_k_first), top_k_first, [rows[i].top_k for i in top_k_first],
                              [rows[i].top_p for i in top_k_first], method,
                              None if temperature is None else take_rows(temperature, top_k_first),
                              None if chunk_max is None else take_rows(chunk_max, top_k_first))
    if truncate:  # a temperature keeps each row's order, so the chunk maxima still pick the right chunks
        blocks += top_k_top_p(tempered(truncate), truncate, [rows[i].top_k for i in truncate],
                              [rows[i].top_p for i in truncate], method, None,
                              None if chunk_max is None else take_rows(chunk_max, truncate))
    if untouched:
        blocks.append(RowGroup(untouched, tempered(untouched), None, [x.shape[1]] * len(untouched)))
    for block in blocks:
        _min_p_and_typical(block, rows)
    return x, rows, greedy, blocks, top_p_alone, temperature


def _min_p_and_typical(block: RowGroup, rows: list[SamplingParams]) -> None:
    min_p = [rows[i].min_p for i in block.rows]
    if any(v > 0 for v in min_p):
        block.logits = min_p_filter(block.logits, min_p)
    typical = [j for j, i in enumerate(block.rows) if rows[i].typical_p < 1.0]
    if typical:  # a sort, so only for the rows that ask for it
        index = torch.tensor(typical, device=block.logits.device)
        filtered = typical_filter(block.logits.index_select(0, index), [rows[block.rows[j]].typical_p for j in typical])
        block.logits = block.logits.index_copy(0, index, filtered)


def process_logits(logits: torch.Tensor, params: SamplingParams | Sequence[SamplingParams],
                   output_tokens: torch.Tensor | Sequence[Sequence[int]] | None = None,
                   method: str = "fast",
                   prompt_tokens: torch.Tensor | Sequence[Sequence[int]] | None = None) -> torch.Tensor:
    """Apply each row's parameters to `logits` `[B, V]` and return new logits `[B, V]` (float32, or float64 for
    float64 input) in which removed tokens are -inf; softmax of the result is the distribution `sample` draws from.

    `params` is one `SamplingParams` for every row or one per row. `output_tokens` (`[B, T]` LongTensor with negative
    padding, or B lists of ids) are the tokens generated so far, required when a row sets a penalty; `prompt_tokens`,
    in the same form, the prompt. What each penalty sees is transformers' and vLLM's rule (`decodelab.penalties`):
    repetition and the n-gram ban see prompt + output, frequency and presence the output only.
    A greedy row (temperature 0, or top_k = 1) keeps only its argmax after penalties (top-k/top-p/min-p/typical do
    not apply to it, as `model.generate(do_sample=False)` ignores them), so its distribution is a point mass on the
    token greedy decoding picks, the lowest id among tied maxima. `method` is "fast" (no sort of the vocabulary) or "sort" (the reference); both are exact.

    Taught in: chapters/03-strategies.ipynb
    """
    x, _, greedy, blocks, _, _ = _process(logits, params, output_tokens, method, prompt_tokens=prompt_tokens)
    out = torch.full_like(x, NEG_INF)  # [B, V]
    for block in blocks:
        out.index_copy_(0, torch.tensor(block.rows, device=x.device), block.dense(x.shape[1]))
    if greedy:
        index = torch.tensor(greedy, device=x.device)
        greedy_x = take_rows(x, greedy)  # [G, V]
        best = greedy_x.argmax(dim=-1, keepdim=True)  # [G, 1]
        out.index_copy_(0, index, torch.full_like(greedy_x, NEG_INF).scatter(1, best, greedy_x.gather(1, best)))
    return out


def sample(logits: torch.Tensor, params: SamplingParams | Sequence[SamplingParams],
           generators: Sequence[torch.Generator | None] | None = None,
           output_tokens: torch.Tensor | Sequence[Sequence[int]] | None = None,
           method: str = "fast",
           prompt_tokens: torch.Tensor | Sequence[Sequence[int]] | None = None) -> torch.Tensor:
    """Draw one token per row, `[B, V]` -> LongTensor `[B]`; `output_tokens` and `prompt_tokens` as in
    `process_logits`.

    Greedy rows take the argmax of their penalised logits. Random rows draw `argmax(p / E)` with `E ~ Exponential(1)`,
    which picks token i with probability p_i (vLLM's and gpt-fast's trick: no cumulative sum, no host sync per row).
    With `method="fast"`, rows with top-p alone (no top-k, min-p or typical) sample their nucleus by rejection with a
    rising pivot (`decodelab.rejection`), without finding the nucleus first; their draws differ from the sort path's
    for the same seed, their distribution does not.
    A row whose `generators[i]` is a `torch.Generator` draws its noise from it alone, so a seeded request gets the same
    tokens whatever else shares its batch; pass the same generator (from `make_generator`) at every step. A row with
    `params.seed` set but no generator gets a fresh generator from that seed for this call only (reproducible for one
    call; across steps it would repeat its noise, so engines should pass generators). Other rows use torch's global RNG.

    Taught in: chapters/03-strategies.ipynb
    """
    x, rows, greedy, blocks, top_p_alone, temperature = _process(logits, params, output_tokens, method,
                                                                 method == "fast", prompt_tokens)
    batch = x.shape[0]
    if generators is None:
        generators = [None] * batch
    elif isinstance(generators, torch.Generator) or not isinstance(generators, Sequence) or len(generators) != batch:
        raise ValueError(f"generators must be a sequence of {batch} torch.Generator or None, got {generators!r}")
    generators = list(generators)
    for i, g in enumerate(generators):
        if g is not None and not isinstance(g, torch.Generator):
            raise TypeError(f"generators[{i}] must be a torch.Generator or None, got {type(g).__name__}")
        if g is not None and g.device.type != x.device.type:
            raise ValueError(f"generators[{i}] is on {g.device}, logits are on {x.device}")
        if g is None and rows[i].seed is not None:
            generators[i] = make_generator(rows[i].seed, x.device)
    tokens = torch.empty(batch, dtype=torch.long, device=x.device)
    if greedy:
        index = torch.tensor(greedy, device=x.device)
        tokens[index] = take_rows(x, greedy).argmax(dim=-1)
    if top_p_alone:
        drawn, pending = top_p_rejection(take_rows(x, top_p_alone), [rows[i].top_p for i in top_p_alone],
                                         [generators[i] for i in top_p_alone],
                                         temperature=[rows[i].temperature for i in top_p_alone])
        tokens[torch.tensor(top_p_alone, device=x.device)] = drawn
        if pending:  # rare: rows the rejection rounds did not settle are drawn from the sorted nucleus
            late = [top_p_alone[j] for j in pending]
            late_x = take_rows(x, late) if temperature is None else take_rows(x, late) / take_rows(temperature, late)
            nucleus = top_k_top_p_sort(late_x, [0] * len(late), [rows[i].top_p for i in late])
            blocks.append(RowGroup(late, nucleus, None, [x.shape[1]] * len(late)))
    for block in blocks:
        probs = torch.softmax(block.logits, dim=-1)  # [n, K]
        noise = _exponential_noise(probs, [generators[i] for i in block.rows], block.widths)
        column = (probs / noise).argmax(dim=-1, keepdim=True)  # [n, 1]
        chosen = column if block.token_ids is None else block.token_ids.gather(1, column)
        tokens[torch.tensor(block.rows, device=x.device)] = chosen.squeeze(1)
    return tokens


def _exponential_noise(probs: torch.Tensor, generators: list[torch.Generator | None], widths: list[int]):
    """Exponential(1) noise shaped like `probs` `[n, K]`; a seeded row draws only its own `widths[j]` columns from its
    generator, so the draw does not depend on the other rows of the block."""
    noise = torch.empty_like(probs)
    if any(g is None for g in generators):
        noise.exponential_()
    for j, g in enumerate(generators):
        if g is not None:
            noise[j, : widths[j]].exponential_(generator=g)
            noise[j, widths[j]:] = 1.0  # these columns hold probability 0
    return noise.clamp_min_(torch.finfo(probs.dtype).tiny)  # 0 / tiny = 0: a removed token is never picked
