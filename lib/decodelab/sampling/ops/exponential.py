"""Exponential(1) noise from each row's own torch.Generator: the float32 numbers `Tensor.exponential_` gives, with the
same streams, in a third of its time on a CPU.

A seeded row draws its token as `argmax(p / E)` (`decodelab.sampling.sampler`), V numbers from its generator per
token. On a CPU `exponential_(generator=g)` makes each entry from a uniform u (53 bits of two 32-bit words of the
generator's Mersenne Twister) as -log1p(-u), one entry at a time (torch's `cpu_serial_kernel`), about 20 ns per entry.
`uniform_(generator=g)` on a float64 tensor takes the same two words per entry and makes the same u (both are
torch's `uniform_real_distribution<double>`), about 6 ns per entry, and leaves the generator where `exponential_`
leaves it. The logarithm is then one vectorised call for the whole batch:

    u[j, :width_j].uniform_(generator=g_j)      # per seeded row: the generator's uniforms
    e = -log1p(-u)                              # one call for every row, then float32

Exactness. The serial kernel computes log1p with the C library; the vectorised one (SLEEF, under AVX2 or AVX-512)
differs from it in the last bit of the double for about 8% of entries. Rounded to float32 both give the same number
unless the double lies within a few of its ulps of a midpoint between two float32 values (a chance of about 1e-8 per
entry); `_exact_float32` finds those entries and recomputes them with the C library's log1p (Python's `math.log1p`),
so every float32 number equals what `exponential_` gives. The tests compare the two on millions of entries, under
the portable, AVX2 and AVX-512 kernels, and on numbers built next to a midpoint.

Below `MIN_ENTRIES` entries drawn (the rows' widths summed) the fixed cost of the batched calls is more than what
they save, and rows draw with `exponential_` directly: the same numbers either way. CUDA keeps `exponential_` (its kernel makes its uniforms
another way).

    noise = exponential_noise(generators, widths, (n, V))   # float32 [n, V]; row j's first widths[j] columns drawn

Taught in: chapters/03-strategies.ipynb
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

# entries from which the batched logarithm is the cheaper way: with tiny-zh's 473 columns both ways cost the same at
# 3 rows (1,419 entries), and from 4 rows (1,892) it is cheaper; one row of 32,000 takes it at 0.42x
# (benchmarks/seeded_noise.py)
MIN_ENTRIES = 1500
_LOW_BITS = (1 << 29) - 1  # a float64's mantissa bits that rounding to float32 drops
_HALF = 1 << 28            # those bits at a midpoint between two float32 values
_NEAR = 8                  # ulps of the double from a midpoint within which the rounding is recomputed
_FILL = 0.5                # u of the columns past a row's width (probability 0 there: any positive noise will do)


def exponential_noise(generators: Sequence[torch.Generator], widths: Sequence[int], shape: tuple[int, int]) -> torch.Tensor:
    """float32 Exponential(1) noise `[n, K]` on the CPU: row j's first `widths[j]` columns are the numbers
    `exponential_(generator=generators[j])` would give them, in order, and the generator ends where it would; the
    columns after hold a positive placeholder (the caller's probabilities there are 0)."""
    n, width = shape
    if len(generators) != n or len(widths) != n:
        raise ValueError(f"need one generator and one width per row: {n} rows, got {len(generators)} generators and "
                         f"{len(widths)} widths")
    if set(map(type, generators)) != {torch.Generator} or {g.device.type for g in generators} != {"cpu"}:
        raise ValueError(f"generators must be CPU torch.Generators, got {list(generators)!r:.200}")
    if not all(type(w) is int and 0 < w <= width for w in widths):
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
