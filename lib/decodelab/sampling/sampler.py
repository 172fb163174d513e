"""Per-request sampling parameters, logits processing and batched sampling: params -> processors -> draw.

One batch, one `SamplingParams` per row, as a serving engine (vLLM) does it: greedy and random requests share a batch,
every row has its own temperature, top-k, top-p, min-p, typical-p, penalties, no-repeat-n-gram size and seed, and the
maths is vectorised over rows. A call reads top to bottom:

1. the rows' parameters as tensors (`decodelab.sampling.batch.SamplingBatch`, which an engine builds once per batch);
2. `logit_bias`, the penalties and the n-gram ban over the whole row (`decodelab.sampling.penalties`), then the
   masks of `allowed_token_ids`, bad words and `min_tokens` (`decodelab.sampling.constraints`);
3. argmax rows take their argmax;
4. the other rows, in groups, through the processors in transformers' order: temperature, top-k, top-p, min-p,
   typical (`decodelab.sampling.processors`; temperature happens there and only there);
5. one draw per row.

`method="fast"` routes rows through the performance code of `decodelab.sampling.ops.fast_paths` (top-k candidates found in one
pass, top-p alone drawn by rejection); `method="sort"` is the reference. Both are exact.

    >>> logits = torch.randn(2, 100)
    >>> params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_p=0.9, seed=1)]
    >>> tokens = sample(logits, params)          # LongTensor [2]

Taught in: chapters/02-temperature.ipynb, chapters/03-strategies.ipynb
"""
from __future__ import annotations

import math
import operator
from collections.abc import Collection, Sequence

import torch

from decodelab.sampling.counter_rng import (DEFAULT_RNG, CounterRNG, check_rng, _cdf, _draw_columns, _search,
                                            random_seed, rests)
from decodelab.sampling.ops import fast_paths
from decodelab.sampling.ops.exponential import MIN_ENTRIES, exponential_noise, same_as_exponential
from decodelab.sampling.params import SamplingParams, is_int
from decodelab.sampling.penalties import add_logit_bias, apply_penalties
from decodelab.sampling.processors import RowGroup, Temperature, apply_processors, used_processors
from decodelab.sampling.batch import SamplingBatch, as_batch
from decodelab.sampling.constraints import apply_constraints
from decodelab.sampling.ops.topk import chunk_maxima
from decodelab.sampling.truncation import NEG_INF, all_rows, take_rows
from decodelab.validation import check_int

_MASK64 = (1 << 64) - 1
_DEVICE = operator.attrgetter("device")


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


def make_generator(seed: int | None, device: torch.device | str = "cpu",
                   rng: str = DEFAULT_RNG) -> torch.Generator | CounterRNG | None:
    """The random stream of one sample on `device`: with `rng="torch"` (the default) a `torch.Generator` seeded with
    `seed`, or None for an unseeded request (torch's global RNG); with `rng="counter"` a
    `decodelab.sampling.counter_rng.CounterRNG`, whose seed for an unseeded request comes from torch's global RNG.

    An engine makes one per sample and passes it to every `sample` call of that sample, so its draws come from its
    own stream whatever else shares the batch.
    """
    check_rng(rng)
    if seed is not None and not (is_int(seed) and 0 <= seed < 2**63):
        raise ValueError(f"seed must be None or an int in [0, 2**63), got {seed!r}")
    if rng == "counter":
        return CounterRNG(random_seed() if seed is None else seed, device)
    if seed is None:
        return None
    generator = torch.Generator(device=torch.device(device))
    generator.manual_seed(seed)
    return generator


def _check_logits(logits: torch.Tensor) -> None:
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dim() != 2 or logits.shape[0] < 1 or logits.shape[1] < 1:
        raise ValueError(f"logits must have shape [B, V] with B, V >= 1, got {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise TypeError(f"logits must be a floating-point tensor, got {logits.dtype}")


def _check_rows(maxima: torch.Tensor) -> None:
    """`maxima` `[B, ...]`: the logits or their chunk maxima. One host synchronisation per call (not per row): every
    row needs no NaN or +inf and one finite value. The common case is one float64 sum of everything (finite exactly
    when every entry is: float32 values cannot overflow a float64 sum of this size); only a sum that is not finite
    (a NaN, an infinity, or a legitimately masked -inf) looks at each row's maximum."""
    if math.isfinite(float(maxima.sum(dtype=torch.float64))):
        return
    row_max = maxima.amax(dim=1)  # NaN if the row holds one, +inf if it holds one, -inf if it is all -inf
    bad = ~torch.isfinite(row_max)
    if bool(bad.any()):
        raise _bad_rows(bad.nonzero().flatten().tolist())


def _bad_rows(rows: list[int]) -> ValueError:
    return ValueError(f"logits rows {rows} hold NaN or +inf, or only -inf; every row needs a finite value")


def _penalized(logits: torch.Tensor, params, output_tokens, prompt_tokens, method: str, eos_token_ids=None):
    """Steps 1-2, shared by `process_logits` and `sample`: the batch's parameters and the penalised logits `[B, V]`
    (float32, or float64 for float64 input; the input is never modified). The rows are checked once the routes are
    known: by `_checked_maxima` (on the chunk maxima when a fast route reads them, else on the logits), or, for a
    plain batch of CPU rows drawn by one uniform each whose only processor is the temperature, inside the draw
    (`_draw_checked_uniform_rows`)."""
    _check_logits(logits)
    if method not in fast_paths.METHODS:
        raise ValueError(f"method must be one of {fast_paths.METHODS}, got {method!r}")
    batch = as_batch(params, logits.shape[0], logits.device)
    x = logits if logits.dtype in (torch.float32, torch.float64) else logits.to(torch.float32)  # [B, V]
    if batch.untouched and output_tokens is None and prompt_tokens is None:
        return batch, x                                # no bias, penalty, mask or bad word in any row
    x = add_logit_bias(x, batch)  # OpenAI's logit_bias, first (vLLM's order), for argmax rows too
    if output_tokens is not None:
        x = apply_penalties(x, batch, output_tokens, prompt_tokens)  # keeps NaN, +inf and all -inf rows as they were
    elif batch.has_penalties:
        raise ValueError("output_tokens is None but some params ask for penalties; pass the tokens they see")
    elif prompt_tokens is not None:
        raise ValueError("prompt_tokens goes with output_tokens (empty lists before the first token); "
                         "pass output_tokens too")
    if batch.has_bad_word_strings:
        raise ValueError("some params hold bad_words as strings, which the sampler cannot read: Engine, generate and "
                         "the server tokenize them into bad_word_ids (decodelab.decoding.request.with_bad_word_ids); "
                         "pass bad_word_ids")
    if batch.has_constraints:  # allowed_token_ids, bad words, min_tokens: -inf masks, after the penalties
        x = apply_constraints(x, batch, output_tokens, eos_token_ids)
    return batch, x


def _checked_maxima(x: torch.Tensor, routes: fast_paths.Routes, method: str) -> torch.Tensor | None:
    """Check the rows of `x` `[B, V]` and return their chunk maxima when a fast route reads them (top-k rows, rows
    drawn by rejection; `decodelab.sampling.ops.topk`), else None. The fast path reads the logits once: the chunk
    maxima serve both this check and those routes; a batch that takes neither is checked on `x` itself."""
    needs_maxima = method == "fast" and bool(routes.top_k or routes.rejection)
    chunk_max = chunk_maxima(x) if needs_maxima else None  # [B, V / 64] or None
    _check_rows(x if chunk_max is None else chunk_max)
    return chunk_max


def _groups(x: torch.Tensor, batch: SamplingBatch, routes: fast_paths.Routes,
            chunk_max: torch.Tensor | None) -> list[RowGroup]:
    """Step 4: the random rows of the processor routes, each group through the processors."""
    groups = []
    if routes.top_k:
        groups.append(fast_paths.top_k_candidates(x, list(routes.top_k), batch, chunk_max))
    if routes.dense:
        groups.append(RowGroup.dense(list(routes.dense), take_rows(x, list(routes.dense))))
    return [apply_processors(group, batch) for group in groups]


def process_logits(logits: torch.Tensor, params: SamplingParams | Sequence[SamplingParams] | SamplingBatch,
                   output_tokens: torch.Tensor | Sequence[Sequence[int]] | None = None,
                   method: str = "fast",
                   prompt_tokens: torch.Tensor | Sequence[Sequence[int]] | None = None,
                   eos_token_ids: Collection[int] | None = None) -> torch.Tensor:
    """Apply each row's parameters to `logits` `[B, V]` and return new logits `[B, V]` (float32, or float64 for
    float64 input) in which removed tokens are -inf; softmax of the result is the distribution `sample` draws from.

    `params` is one `SamplingParams` for every row, one per row, or a `SamplingBatch`. `output_tokens` (`[B, T]`
    LongTensor with negative padding, or B lists of ids) are the tokens generated so far, required when a row sets a
    penalty; `prompt_tokens`, in the same form, the prompt. What each penalty sees is transformers' and vLLM's rule
    (`decodelab.sampling.penalties`): repetition and the n-gram ban see prompt + output, frequency and presence the output only.
    A greedy row (temperature 0, or top_k = 1) keeps only its argmax after penalties (top-k/top-p/min-p/typical do
    not apply to it, as `model.generate(do_sample=False)` ignores them), so its distribution is a point mass on the
    token greedy decoding picks, the lowest id among tied maxima. `method` is "fast" or "sort" (the reference); both
    are exact. `allowed_token_ids`, bad words and `min_tokens` mask tokens after the penalties
    (`decodelab.sampling.constraints`); min_tokens and bad words of several tokens need `output_tokens`, min_tokens
    also `eos_token_ids` (the tokens that end a sample, masked with `stop_token_ids` while the output is short).

    Taught in: chapters/03-strategies.ipynb
    """
    batch, x = _penalized(logits, params, output_tokens, prompt_tokens, method, eos_token_ids)
    routes = fast_paths.routes(batch, method, sampling=False)
    chunk_max = _checked_maxima(x, routes, method)
    out = torch.full_like(x, NEG_INF)  # [B, V]
    for group in _groups(x, batch, routes, chunk_max):
        out.index_copy_(0, torch.tensor(group.rows, device=x.device), group.to_vocabulary(x.shape[1]))
    if batch.argmax_rows:
        rows = list(batch.argmax_rows)
        greedy_x = take_rows(x, rows)  # [G, V]
        best = greedy_x.argmax(dim=-1, keepdim=True)  # [G, 1]
        out.index_copy_(0, torch.tensor(rows, device=x.device),
                        torch.full_like(greedy_x, NEG_INF).scatter(1, best, greedy_x.gather(1, best)))
    return out


def sample(logits: torch.Tensor, params: SamplingParams | Sequence[SamplingParams] | SamplingBatch,
           generators: Sequence[torch.Generator | None] | None = None,
           output_tokens: torch.Tensor | Sequence[Sequence[int]] | None = None,
           method: str = "fast",
           prompt_tokens: torch.Tensor | Sequence[Sequence[int]] | None = None,
           eos_token_ids: Collection[int] | None = None) -> torch.Tensor:
    """Draw one token per row, `[B, V]` -> LongTensor `[B]`; `params`, `output_tokens` and `prompt_tokens` as in
    `process_logits`.

    Greedy rows take the argmax of their penalised logits. Random rows with a `torch.Generator`, and off the CPU rows
    without one, draw `argmax(p / E)` with `E ~ Exponential(1)`, which picks token i with probability p_i (vLLM's and
    gpt-fast's trick: no cumulative sum, no host sync per row); other rows draw by one uniform, as below.
    With `method="fast"`, rows with top-p alone (no top-k, min-p or typical) sample their nucleus by rejection with a
    rising pivot (`decodelab.sampling.ops.rejection`), without finding the nucleus first; their draws differ from the sort path's
    for the same seed, their distribution does not.
    A row whose `generators[i]` is a `torch.Generator` draws its noise from it alone, so a seeded request gets the same
    tokens whatever else shares its batch; pass the same generator (from `make_generator`) at every step. A row whose
    generator is a `decodelab.sampling.counter_rng.CounterRNG` draws one uniform from it and takes the token where it
    falls in the cumulative distribution (one vectorised draw for all such rows; top-p rows go through the sorted
    nucleus, not rejection): the same distribution, other tokens than a torch.Generator with the same seed. A row
    with `params.seed` set but no generator gets a fresh torch.Generator from that seed for this call only
    (reproducible for one call; across steps it would repeat its noise, so engines should pass generators). Other
    rows use torch's global RNG (`torch.manual_seed` repeats them): on the CPU, where `exponential_` costs tens of
    nanoseconds per vocabulary entry, each draws one uniform from it (one `torch.rand` call per group of rows: a
    top-k group draws before the dense one) and takes the inverse CDF, as a CounterRNG row does (top-p rows alone,
    under `method="fast"`, still go by rejection); elsewhere they draw `argmax(p / E)`, the noise of a group in one
    call.

    Taught in: chapters/03-strategies.ipynb
    """
    batch, x = _penalized(logits, params, output_tokens, prompt_tokens, method, eos_token_ids)
    generators, counters, uniform = _generators(generators, batch, x.device)
    routes = fast_paths.routes(batch, method, sampling=True)
    counter_rejection = routes.rejection if counters else [i for i in routes.rejection
                                                            if isinstance(generators[i], CounterRNG)]
    if counter_rejection:
        routes = fast_paths.densify(routes, counter_rejection)
    if not (batch.argmax_rows or routes.top_k or routes.rejection):
        # a plain batch: every row random and in the one dense group; each row's draw depends on its own logits and
        # on its stream as the call found it (every row reads before any stream moves), so the group is every row
        # in order, whatever order the routes listed them in
        processors = used_processors(batch)
        checked_by_draw = uniform and x.device.type == "cpu" and all(type(p) is Temperature for p in processors)
        if not checked_by_draw:
            _checked_maxima(x, routes, method)
        group = RowGroup.dense(list(batch.rows), x)
        for processor in processors:
            processor(group, batch)
        if checked_by_draw:
            return _draw_checked_uniform_rows(group, generators)
        return _draw(group, generators, uniform)
    chunk_max = _checked_maxima(x, routes, method)
    groups = _groups(x, batch, routes, chunk_max)
    if len(groups) == 1 and not batch.argmax_rows and not routes.rejection and all_rows(groups[0].rows, len(batch)):
        return _draw(groups[0], generators, uniform)  # one group of every row in order (all top-k): its draw
    tokens = torch.empty(x.shape[0], dtype=torch.long, device=x.device)
    if batch.argmax_rows:
        rows = list(batch.argmax_rows)
        tokens[torch.tensor(rows, device=x.device)] = take_rows(x, rows).argmax(dim=-1)
    if routes.rejection:
        drawn, pending = fast_paths.draw_by_rejection(x, list(routes.rejection), batch, generators, chunk_max)
        tokens[torch.tensor(routes.rejection, device=x.device)] = drawn
        if pending:  # rare: rows the rejection rounds did not settle are drawn from their nucleus found by sorting
            groups.append(apply_processors(RowGroup.dense(pending, take_rows(x, pending)), batch))
    for group in groups:
        tokens[torch.tensor(group.rows, device=x.device)] = _draw(group, generators, uniform)
    return tokens


def _generators(generators, batch: SamplingBatch,
                device: torch.device) -> tuple[list[torch.Generator | CounterRNG | None], bool, bool]:
    """One generator or None per row (a seeded row without one gets a fresh generator from its seed); whether
    every row holds a CounterRNG on `device` (the engine's counter rows, checked in one pass); and whether every row
    draws by one uniform there (`_by_uniform`). A tuple, as the engine
    passes the streams it keeps with its batch, is checked the first time it comes with `batch` and remembered there
    (`SamplingBatch.checked_streams`), unless a row needed a fresh generator; a list is checked at every call."""
    if type(generators) is tuple and batch.checked_streams is not None:      # checked with this batch before
        held, on, checked, counters, uniform = batch.checked_streams
        if held is generators and on == device:
            return checked, counters, uniform
    size = len(batch)
    if generators is None:
        generators = [None] * size
    elif isinstance(generators, torch.Generator) or not isinstance(generators, Sequence) or len(generators) != size:
        raise ValueError(f"generators must be a sequence of {size} torch.Generator, CounterRNG or None, got "
                         f"{generators!r:.200}")
    listed = list(generators)
    # the engine's counter rows, checked by two C-level passes (a Python loop over the rows costs more)
    if set(map(type, listed)) == {CounterRNG} and set(map(_DEVICE, listed)) == {device}:
        if type(generators) is tuple:   # an engine's streams, kept with its batch: checked once per batch
            batch.checked_streams = (generators, device, listed, True, True)
        return listed, True, True
    fresh = False
    for i, g in enumerate(listed):
        if g is not None and not isinstance(g, (torch.Generator, CounterRNG)):
            raise TypeError(f"generators[{i}] must be a torch.Generator, a CounterRNG or None, got {type(g).__name__}")
        if g is not None and g.device.type != device.type:
            raise ValueError(f"generators[{i}] is on {g.device}, logits are on {device}")
        if g is None and batch.params[i].seed is not None:
            listed[i], fresh = make_generator(batch.params[i].seed, device), True     # for this call only
    on_cpu = device.type == "cpu"
    uniform = all(_by_uniform(g, on_cpu) for g in listed)
    if type(generators) is tuple and not fresh:
        batch.checked_streams = (generators, device, listed, False, uniform)
    return listed, False, uniform


def _by_uniform(generator: torch.Generator | CounterRNG | None, on_cpu: bool) -> bool:
    """Whether a row holding `generator` draws by one uniform and the inverse CDF: a CounterRNG row always, a row
    without a generator on the CPU (where `exponential_` costs tens of nanoseconds per vocabulary entry). The others
    draw `argmax(p / E)`."""
    return isinstance(generator, CounterRNG) or (generator is None and on_cpu)


def _draw(group: RowGroup, generators: list[torch.Generator | CounterRNG | None], uniform: bool = False) -> torch.Tensor:
    """Step 5: one token per row of `group`, `[n]`: the inverse CDF of one uniform for rows with a CounterRNG and,
    on the CPU, for rows with no generator (torch's global RNG; `_by_uniform`; `uniform`: every row of the batch
    does); `argmax(p / E)` with `E ~ Exponential(1)` for rows with a torch.Generator, and for rows with none off the
    CPU."""
    probs = torch.softmax(group.logits, dim=-1)  # [n, K]
    rows = [generators[i] for i in group.rows]
    on_cpu = probs.device.type == "cpu"
    by_uniform = range(len(rows)) if uniform else [j for j, g in enumerate(rows) if _by_uniform(g, on_cpu)]
    if len(by_uniform) == len(rows):  # every row by one uniform: one hash or rand, one cumulative sum, one search
        column = _draw_columns(probs, _rests(rows), normalized=True)
    elif not by_uniform:
        column = (probs / _exponential_noise(probs, rows, group.widths)).argmax(dim=-1)
    else:  # a mixed group (a caller's own list of generators): each part by its own route
        kept = set(by_uniform)
        others = [j for j in range(len(rows)) if j not in kept]
        column = torch.empty(len(rows), dtype=torch.long, device=probs.device)
        part = take_rows(probs, by_uniform)
        column[torch.tensor(by_uniform, device=probs.device)] = _draw_columns(
            part, _rests([rows[j] for j in by_uniform]), normalized=True)
        part = take_rows(probs, others)
        noise = _exponential_noise(part, [rows[j] for j in others], [group.widths[j] for j in others])
        column[torch.tensor(others, device=probs.device)] = (part / noise).argmax(dim=-1)
    if group.token_ids is None:  # column j is token j
        return column
    return group.token_ids.gather(1, column.unsqueeze(1)).squeeze(1)  # the candidates' vocabulary ids


def _draw_checked_uniform_rows(group: RowGroup, generators: list[CounterRNG | None]) -> torch.Tensor:
    """`_draw` of a group of every row of a plain batch on the CPU whose rows all draw by one uniform (a CounterRNG,
    or no generator) and saw no processor but the temperature, with the rows' check folded in: a row holding NaN or
    +inf, or only -inf, and only such a row, has a softmax that sums to NaN (the temperature keeps a finite row
    finite, `Temperature`), so the rows are checked on the cumulative sums' last column before any stream or torch's
    global RNG advances. The check on its own (`_check_rows`) costs a pass over the logits and a tensor call. Every
    step of an engine pays this draw's tensor calls whatever its batch, each dearer with the forward's data in the
    caches, so it makes few: no separate pass for the check, and no numpy call (but a stream's refill, which hashes
    with numpy at most once per 32 to 256 of its draws)."""
    probs = torch.softmax(group.logits, dim=-1)  # [B, V]
    cdf = _cdf(probs)
    totals = cdf[:, -1:]                         # [B, 1], each about 1 for a good row
    if not math.isfinite(totals.sum()):          # a sum of finite totals (at most B) is finite
        raise _bad_rows((~torch.isfinite(totals[:, 0])).nonzero().flatten().tolist())
    return _search(cdf, probs, _rests(generators), normalized=True, totals=totals)


def _rests(rows: list[CounterRNG | None]) -> torch.Tensor:
    """1 - u per row, a float64 CPU tensor `[n]` in (0, 1]: a CounterRNG row's next uniform (`rests`; its stream
    advances by one); for the rows without a generator (CPU rows only) one `torch.rand` call on torch's global CPU
    RNG, a uniform each in the order of `rows`, so `torch.manual_seed` repeats them. One uniform per row, where
    `exponential_` draws one number per vocabulary entry at tens of nanoseconds each on a CPU (`benchmarks/noise.py`)."""
    if None not in rows:                     # (compared by identity first: one C loop)
        return rests(rows)
    if rows.count(None) == len(rows):        # every row unseeded (one C loop): one uniform each, in row order
        return 1.0 - torch.rand(len(rows), dtype=torch.float64, device="cpu")   # whatever the default device
    free = [j for j, g in enumerate(rows) if g is None]
    held = [j for j, g in enumerate(rows) if g is not None]
    out = torch.empty(len(rows), dtype=torch.float64, device="cpu")
    out[free] = 1.0 - torch.rand(len(free), dtype=torch.float64, device="cpu")
    out[held] = rests([rows[j] for j in held])
    return out


def _exponential_noise(probs: torch.Tensor, generators: list[torch.Generator | None], widths: list[int]):
    """Exponential(1) noise shaped like `probs` `[n, K]`; a seeded row draws only its own `widths[j]` columns from its
    generator, so the draw does not depend on the other rows of the block. For seeded float32 rows on the CPU that
    draw `MIN_ENTRIES` entries or more, each row's uniforms and one batched logarithm
    (`decodelab.sampling.ops.exponential`): the numbers `exponential_` gives, in about 0.4 to 0.9 of its time where taken
    (`benchmarks/seeded_noise.py`)."""
    if (probs.dtype == torch.float32 and probs.device.type == "cpu" and None not in generators
            and sum(widths) >= MIN_ENTRIES and same_as_exponential()):   # (generators compare by identity)
        return exponential_noise(generators, widths, tuple(probs.shape)).clamp_min_(torch.finfo(probs.dtype).tiny)
    noise = torch.empty_like(probs)
    if any(g is None for g in generators):
        noise.exponential_()
    width = probs.shape[1]
    rows = noise.unbind(0) if any(g is not None for g in generators) else ()  # one view per row, made at once
    for j, g in enumerate(generators):
        if g is None:
            continue
        if widths[j] == width:  # a dense row: no slicing, no tail (each costs a few microseconds per row)
            rows[j].exponential_(generator=g)
        else:
            rows[j][: widths[j]].exponential_(generator=g)
            rows[j][widths[j]:] = 1.0  # these columns hold probability 0
    return noise.clamp_min_(torch.finfo(probs.dtype).tiny)  # 0 / tiny = 0: a removed token is never picked
