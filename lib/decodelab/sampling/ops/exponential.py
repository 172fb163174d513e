"""Exponential(1) noise from each row's own torch.Generator: the float32 numbers `Tensor.exponential_` gives, with the
same streams, in less time on a CPU.

A seeded row draws its token as `argmax(p / E)` (`decodelab.sampling.sampler`), V numbers from its generator per
token. On a CPU `exponential_(generator=g)` makes each entry from a uniform u (53 bits of two 32-bit words of the
generator's Mersenne Twister) as -log1p(-u), one entry at a time (torch's `cpu_serial_kernel`). `uniform_(generator=g)`
on a float64 tensor takes the same two words per entry and makes the same u (both are torch's
`uniform_real_distribution<double>`), and leaves the generator where `exponential_` leaves it. The logarithm is then
one vectorised call for the whole batch:

    u[j, :width_j].uniform_(generator=g_j)      # per seeded row: the generator's uniforms
    e = -log1p(-u)                              # one call for every row, then float32

`benchmarks/seeded_noise.py` times both: about 19 ns per entry one by one, about 7.5 ns by uniforms and the batched
logarithm, for one row of 151,936 columns (CPU, AVX-512, one thread).

Exactness. The serial kernel computes log1p with the C library; the vectorised one (SLEEF, under AVX2 or AVX-512)
differs from it in the last bit of the double for some entries (the benchmark counts them). Rounded to float32 both
give the same number unless the double lies within a few of its ulps of a midpoint between two float32 values (each
is within 1 ulp of the exact value, so they differ by at most 2); `_exact_float32` recomputes the entries within
`_NEAR` ulps of one (about 3e-8 of them) with the C library's log1p (Python's `math.log1p`), so every float32 number
equals what `exponential_` gives. `same_as_exponential()` checks once per process that this torch's `uniform_` and
`exponential_` share their words (older builds with MKL drew `exponential_` another way); where they do not, the
sampler keeps `exponential_`.

Below `MIN_ENTRIES` entries drawn (the rows' widths summed) the fixed cost of the batched calls is more than what
they save, and rows draw with `exponential_` directly: the same numbers either way. CUDA keeps `exponential_` (its
kernel makes its uniforms another way).

    noise = exponential_noise(generators, widths, (n, V))   # float32 [n, V]; row j's first widths[j] columns drawn

Taught in: chapters/03-strategies.ipynb
"""
from __future__ import annotations

import functools
import math
import operator
from collections.abc import Sequence

import torch

# entries from which the batched logarithm is the cheaper way (benchmarks/seeded_noise.py, CPU, AVX-512, one thread):
# with tiny-zh's 473 columns both ways cost the same at 3 rows (1,419 entries), and from 4 rows (1,892) it is cheaper;
# one row of 32,000 columns takes 0.42 of the time
MIN_ENTRIES = 1500
_LOW_BITS = (1 << 29) - 1  # a float64's mantissa bits that rounding to float32 drops
_HALF = 1 << 28            # those bits at a midpoint between two float32 values
_NEAR = 8                  # ulps of the double from a midpoint within which the rounding is recomputed
_FILL = 0.5                # u of the columns past a row's width (probability 0 there: any positive noise will do)
_DEVICE_TYPE = operator.attrgetter("device.type")


def exponential_noise(generators: Sequence[torch.Generator], widths: Sequence[int], shape: tuple[int, int]) -> torch.Tensor:
    """float32 Exponential(1) noise `[n, K]` on the CPU: row j's first `widths[j]` columns are the numbers
    `exponential_(generator=generators[j])` would give them, in order, and the generator ends where it would; the
    columns after hold a positive placeholder (the caller's probabilities there are 0). Bad input raises ValueError
    before any generator moves."""
    if (not isinstance(shape, tuple) or len(shape) != 2 or not all(type(d) is int and d >= 1 for d in shape)):
        raise ValueError(f"shape must be a tuple (rows, columns) of ints >= 1, got {shape!r}")
    n, width = shape
    if len(generators) != n or len(widths) != n:
        raise ValueError(f"need one generator and one width per row: {n} rows, got {len(generators)} generators and "
                         f"{len(widths)} widths")
    # (C-level passes over the rows: an engine's batch is checked on every step)
    if ((set(map(type, generators)) != {torch.Generator}
         and not all(isinstance(g, torch.Generator) for g in generators))
            or set(map(_DEVICE_TYPE, generators)) != {"cpu"}):
        raise ValueError(f"generators must be CPU torch.Generators, got {list(generators)!r:.200}")
    if set(map(type, widths)) != {int} or min(widths) < 1 or max(widths) > width:
        raise ValueError(f"widths must be ints in [1, {width}], got {list(widths)!r:.200}")
    u = torch.empty(n, width, dtype=torch.float64)
    rows = u.unbind(0)
    for row, g, w in zip(rows, generators, widths):
        if w == width:
            row.uniform_(generator=g)
        else:
            row[:w].uniform_(generator=g)
            row[w:] = _FILL
    e64 = u.neg().log1p_().neg_()                   # -log1p(-u), exponential_'s own formula (its rate is 1)
    return _exact_float32(e64, u)


def _exact_float32(e64: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """`e64` (-log1p(-u), computed by torch's vectorised log1p) rounded to float32 as if each entry had been computed
    with the C library's log1p: entries whose double lies within `_NEAR` ulps of a float32 midpoint, where a last-bit
    difference could change the rounding, are recomputed from their uniform with `math.log1p`. `e64` is consumed
    (its bits are reused for the check)."""
    e32 = e64.to(torch.float32)
    # (low bits - midpoint + _NEAR) mod 2**29: at most 2 * _NEAR exactly for the entries within _NEAR ulps of one
    # (e64 >= +0, so the sign bit is clear; the mask makes a carry into the exponent harmless)
    bits = e64.view(torch.int64).add_(_NEAR - _HALF).bitwise_and_(_LOW_BITS)
    if int(bits.min()) > 2 * _NEAR:                                              # (nearly always)
        return e32
    flat_e32, flat_u = e32.view(-1), u.reshape(-1)                              # (any shape)
    for i in (bits.view(-1) <= 2 * _NEAR).nonzero().flatten().tolist():
        flat_e32[i] = _libm_exponential(float(flat_u[i]))
    return e32


def _libm_exponential(u: float) -> float:
    """-log1p(-u) by the C library, rounded to float32 (what `exponential_`'s serial kernel stores)."""
    return float(torch.tensor(-math.log1p(-u), dtype=torch.float64).to(torch.float32))


@functools.cache
def same_as_exponential() -> bool:
    """Whether this torch's CPU `exponential_` is what this module reproduces: 64 entries each way from the same
    seed, the same numbers and the generator in the same state after. Checked once per process."""
    a, b = torch.Generator().manual_seed(2024), torch.Generator().manual_seed(2024)
    expected = torch.empty(2, 32).exponential_(generator=a)
    got = exponential_noise([b, b], [32, 32], (2, 32))
    return torch.equal(expected, got) and torch.equal(a.get_state(), b.get_state())
