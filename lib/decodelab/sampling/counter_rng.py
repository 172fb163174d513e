"""Counter-based random streams: draw i of a seeded sample is a hash of (seed, i), so the draws of many rows, and many
draws ahead of each, are made in one vectorised call instead of one generator call per row and step (the idea of
Philox in cuRAND and JAX; here SplitMix64's mixer, in numpy, on the host).

A `torch.Generator` per seeded row, the default (`rng="torch"`), makes each random row draw V Exponential(1) numbers
for `argmax(p / E)`: on a CPU that is tens of nanoseconds per vocabulary entry, per row, per step. A `CounterRNG`
row draws one uniform u instead and takes the token where u falls in the cumulative distribution (the inverse CDF, as
FlashInfer's sampling kernels do): token j with probability p_j, the same distribution by another route, so the same
seed gives other tokens than with `rng="torch"`. What the course promises of a seed still holds: a row's draws depend
on its seed and on how many draws it has made, not on the batch, a preemption or the request's other samples (up to
the rounding of a top-k group's softmax, whose width is the group's largest k: a change near 1e-7 in a probability,
for either kind of stream).

    >>> rngs = [CounterRNG(7), CounterRNG(7), CounterRNG(8)]
    >>> u = batch_uniforms(rngs)                  # one float64 per row, each stream advanced by one
    >>> bool(u[0] == u[1]), bool(u[0] == u[2]), rngs[0].offset
    (True, False, 1)
    >>> probs = torch.tensor([[0.0, 0.5, 0.0, 0.5]]).expand(3, -1)   # tokens 0 and 2 removed
    >>> inverse_cdf(probs, torch.tensor([0.0, 0.4999, 0.9999], dtype=torch.float64)).tolist()
    [3, 3, 1]

Taught in: chapters/03-strategies.ipynb (the sampler's note on seeds); measured in benchmarks/serving.py
"""
from __future__ import annotations

import array
import math
from collections.abc import Sequence

import numpy as np
import torch

from decodelab.validation import check_int

RNGS = ("torch", "counter")
# The stream every entry point takes when it is not told (`make_generator`, `generate`, `Engine`,
# `speculative_generate`, `constrained_generate`, the server): a torch.Generator per seeded sample. Every stored output
# of the book and of chapters/data is made of its streams, so changing it means re-running those scripts and
# re-executing every notebook; and its draw (the race, `argmax(p / E)`) moves with a CPU's rounding of the logits far
# more rarely than the inverse CDF's, so stored sampled texts rarely change on a reader's CPU (README, "Why the default
# streams stay", measured by benchmarks/draw_rounding.py).
DEFAULT_RNG = "torch"

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)
_STREAM = np.uint64(0xD1B54A32D192ED03)  # xored into the seed before its mix, so that seed 0's key is not 0
_SMALLEST = math.ulp(0.0)  # the smallest positive double, 5e-324


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on a uint64 array (a bijection with full avalanche); wraps modulo 2**64 (numpy
    wraps integer arrays silently; only scalar arithmetic would warn, and none is done here)."""
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


def _uniforms(keys: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Draw `offsets[j]` of the stream keyed `keys[j]`, as float64 in [0, 1) with 53 random bits: output
    offsets[j] + 1 of a SplitMix64 generator whose state starts at the key (Steele, Lea and Flood 2014; Java's
    SplittableRandom), computed without stepping through the ones before."""
    h = _mix64(keys + (offsets + np.uint64(1)) * _GOLDEN)
    return (h >> _S11).astype(np.float64) * (2.0 ** -53)


class CounterRNG:
    """The random stream of one sample: `seed` (an int in [0, 2**63)) and `offset`, the draws made so far. Draw i is
    a function of (seed, i) alone. The key is a mix of the seed, so neighbouring seeds start far apart in SplitMix64's
    sequence. `device` is where the rows it draws for live (the draws are made on the host).

    The stream's next draws are hashed ahead, for every stream that ran out in one vectorised call: twice as many as
    the most any of them had, from 32 up to 256 (a long sample pays one numpy call per 256 tokens; a new sample
    refilled on its own hashes 32). A batch's draw is then one list read per row, not a dozen numpy calls per step.
    What is drawn is the same, draw i = hash(seed, i), whatever the buffer; setting `offset` moves the stream (the
    buffer is refilled from there).

    `make_generator(seed, device, rng="counter")` makes one; `sample`, the engine and speculative decoding accept it
    wherever they accept a `torch.Generator`."""

    __slots__ = ("seed", "key", "device", "_start", "_ahead", "_pos")

    def __init__(self, seed: int, device: torch.device | str = "cpu") -> None:
        self.seed = check_int(seed, "seed", low=0)
        if self.seed >= 2 ** 63:
            raise ValueError(f"seed must be an int in [0, 2**63), got {seed!r}")
        self.key = int(_mix64(np.array([self.seed], dtype=np.uint64) ^ _STREAM)[0])
        self.device = torch.device(device)
        self._start = 0                       # the offset of _ahead[0]
        self._ahead: list[float] = []         # draws _start, _start + 1, ... already hashed
        self._pos = 0                         # the next draw is _ahead[_pos] (_pos == len(_ahead): hash more)

    @property
    def offset(self) -> int:
        """The draws made so far: the next draw is draw `offset` of the stream."""
        return self._start + self._pos

    @offset.setter
    def offset(self, value: int) -> None:
        value = check_int(value, "offset", low=0)
        self._start, self._ahead, self._pos = value, [], 0     # hashed again from there when next drawn

    def __repr__(self) -> str:
        return f"CounterRNG(seed={self.seed}, offset={self.offset}, device={self.device})"

    def uniform(self) -> float:
        """The stream's next uniform in [0, 1)."""
        return next_uniforms([self])[0]


_AHEAD_MIN, _AHEAD_MAX = 32, 256


def _hash_ahead(rngs: list[CounterRNG]) -> None:
    """Hash each stream's draws from its `offset` on, twice as many as the most any of them had (32 to 256), all
    streams in one vectorised call (a prefill step's new sequences refill together)."""
    count = min(_AHEAD_MAX, max(_AHEAD_MIN, 2 * max(len(r._ahead) for r in rngs)))
    keys = np.fromiter((r.key for r in rngs), dtype=np.uint64, count=len(rngs))[:, None]           # [n, 1]
    offsets = np.fromiter((r.offset for r in rngs), dtype=np.uint64, count=len(rngs))[:, None]     # [n, 1]
    drawn = _uniforms(keys, offsets + np.arange(count, dtype=np.uint64)).tolist()                # [n, count]
    for r, ahead in zip(rngs, drawn):
        r._ahead, r._start, r._pos = ahead, r._start + r._pos, 0


def next_uniforms(rngs: Sequence[CounterRNG]) -> list[float]:
    """The next uniform of each stream, as Python floats (float64), each stream advanced by one: a list read per row,
    and one vectorised hash for the streams whose hashed draws ran out. Every row reads its stream's draw before any
    stream advances, so a stream named twice gives both rows the same draw (and advances by two), whatever the
    order of the rows."""
    try:
        out = [r._ahead[r._pos] for r in rngs]               # _pos >= 0 always: only the end raises
    except IndexError:
        # >=: a stream named twice in the last call read its last draw twice and moved past the end by two
        _hash_ahead([r for r in rngs if r._pos >= len(r._ahead)])
        out = [r._ahead[r._pos] for r in rngs]
    for r in rngs:
        r._pos += 1
    return out


def batch_uniforms(rngs: Sequence[CounterRNG]) -> np.ndarray:
    """The next uniform of each stream, float64 `[n]`; each stream advances by one."""
    return np.array(next_uniforms(rngs), dtype=np.float64)


def random_seed() -> int:
    """A seed in [0, 2**63) from torch's global RNG (an unseeded request's stream: `torch.manual_seed` repeats it)."""
    return int(torch.randint(0, 2 ** 63 - 1, (1,), dtype=torch.int64)[0])


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor | np.ndarray) -> torch.Tensor:
    """The column of each row of `probs` `[n, K]` (non-negative, any positive total) where `u` `[n]` (float64 in
    [0, 1), a tensor or the numpy array `batch_uniforms` returns) falls: the first j with cdf_j >= (1 - u) * total,
    LongTensor `[n]`. The cumulative sum is taken in float64, so a token of probability 1e-12 keeps its share.

    A removed token is never drawn: a column of probability 0 holds its left neighbour's cdf exactly, so it is never
    the first to reach a target > 0 (the target is raised to the smallest positive double when a tiny total rounds
    it to 0). On the CPU the running sum adds in order, which gives that equality; a GPU's parallel scan adds
    neighbouring prefixes in different orders, so there a zero column is set to -inf and given its left neighbour's
    value by a running maximum (two more passes, not needed on the CPU)."""
    if probs.dim() != 2 or len(u) != probs.shape[0]:
        raise ValueError(f"inverse_cdf needs probs [n, K] and one u per row, got {tuple(probs.shape)} and {len(u)}")
    inside = np.all((u >= 0.0) & (u < 1.0)) if isinstance(u, np.ndarray) else ((u >= 0) & (u < 1)).all()
    if not bool(inside):   # a NaN fails too
        raise ValueError(f"u must lie in [0, 1), got {u!r:.200}")
    # 1 - u in u's own precision for an array (float64 as `batch_uniforms` makes it), in float64 for a tensor
    rest = (1.0 - u) if isinstance(u, np.ndarray) else 1.0 - u.detach().to("cpu", torch.float64).numpy()
    return _draw_columns(probs, torch.from_numpy(rest.astype(np.float64, copy=False)))


def rests(rngs: Sequence[CounterRNG]) -> torch.Tensor:
    """1 - u for the next uniform u of each stream, a float64 CPU tensor `[n]`, each stream advanced by one: what
    `_draw_columns` takes. Made over a Python array (`torch.frombuffer`), a third of what `torch.tensor` costs on a
    list."""
    if not rngs:
        return torch.empty(0, dtype=torch.float64, device="cpu")   # (frombuffer refuses an empty buffer)
    return torch.frombuffer(array.array("d", [1.0 - u for u in next_uniforms(rngs)]), dtype=torch.float64)


def _draw_columns(probs: torch.Tensor, rest: torch.Tensor, normalized: bool = False) -> torch.Tensor:
    """`inverse_cdf` without its checks, for `rest` = 1 - u `[n]` (a float64 CPU tensor, in (0, 1], one per row by
    construction) that `rests` or the sampler's `_rests` made: the sampler's hot path, once per step, in as few
    tensor calls as it can (each pays a fixed cost, larger with the forward's data in the caches). `normalized`: each
    row of `probs` sums to about 1 (a softmax), so total * (1 - u) >= about 2**-53 cannot round to 0 and the clamp
    that guards tiny totals is skipped."""
    return _search(_cdf(probs), probs, rest, normalized)


def _cdf(probs: torch.Tensor) -> torch.Tensor:
    """The running sum of each row of `probs` `[n, K]`, float64: its last column is the row's total."""
    return probs.cumsum(dim=-1, dtype=torch.float64)


def _search(cdf: torch.Tensor, probs: torch.Tensor, rest: torch.Tensor, normalized: bool,
            totals: torch.Tensor | None = None) -> torch.Tensor:
    """The columns where `rest` (1 - u, a float64 CPU tensor `[n]`) times each row's total falls in `cdf`
    (`_cdf(probs)`; `totals`: its last column `[n, 1]`, when the caller has it). Tensor calls only: after the
    forward a numpy call costs more than a tensor call (measured inside the engine's draw, `benchmarks/serving.py`)."""
    if cdf.device.type != "cpu":
        cdf, totals = _zero_columns_flat(cdf, probs), None
        rest = rest.to(cdf.device)
    target = (cdf[:, -1:] if totals is None else totals) * rest.view(-1, 1)         # [n, 1], in (0, total]
    if not normalized:
        target.clamp_min_(_SMALLEST)
    return torch.searchsorted(cdf, target).view(-1)  # target <= the last value


def _zero_columns_flat(cdf: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """`cdf` `[n, K]` made monotone, with every column of probability 0 equal to its left neighbour (-inf before
    the first positive one), whatever order the scan added in."""
    return torch.where(probs > 0, cdf, -math.inf).cummax(dim=-1).values


def uniform(generator: torch.Generator | CounterRNG | None) -> float:
    """One uniform in [0, 1) from `generator` (a torch.Generator, a CounterRNG, or None for torch's global RNG)."""
    if isinstance(generator, CounterRNG):
        return generator.uniform()
    return float(torch.rand((), generator=generator, dtype=torch.float64))


def categorical(probs: torch.Tensor, generator: torch.Generator | CounterRNG | None) -> int:
    """One index drawn from `probs` `[V]` (non-negative, any positive total) with `generator`."""
    if isinstance(generator, CounterRNG):
        return int(_draw_columns(probs.unsqueeze(0), rests([generator]))[0])
    return int(torch.multinomial(probs, 1, generator=generator))


def check_rng(rng: str) -> str:
    """`rng` if it names a kind of stream ("torch" or "counter"), else ValueError naming it."""
    if rng not in RNGS:
        raise ValueError(f"rng must be one of {RNGS}, got {rng!r}")
    return rng


__all__ = ["DEFAULT_RNG", "RNGS", "CounterRNG", "batch_uniforms", "categorical", "check_rng", "inverse_cdf",
           "next_uniforms", "random_seed", "rests", "uniform"]
