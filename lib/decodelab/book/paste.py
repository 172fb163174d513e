"""Figures the book's pages paste from a chapter (myst-nb `glue`), rounded so the stored value does not depend on
the CPU.

A float a notebook computes with torch moves in its 6th or 7th significant digit between torch's CPU kernels
(`ATEN_CPU_CAPABILITY` default, avx2, avx512), and nbval compares a glued value as text, all its digits. `rounded`
keeps 4 significant digits by default, more than any page shows (at most 3, or 6 where one asks for them), so a
page renders the same figure and the stored output is the same on every CPU. Counts, strings and values already
read from a data file pass through unchanged.

    >>> rounded(0.19036537408828735), rounded(2.4019685546106118e-11), rounded(-7.82536661164567, 6), rounded(3929)
    (0.1904, 2.402e-11, -7.82537, 3929)

Taught in: chapters/02-temperature.ipynb
"""
from __future__ import annotations

from decodelab.validation import check_int


def rounded(value, digits: int = 4):
    """`value` with `digits` significant digits if it is a float, else `value` itself (ints, bools, strings)."""
    digits = check_int(digits, "digits")
    if isinstance(value, bool) or not isinstance(value, float):
        return value
    return float(f"{value:.{digits}g}")
