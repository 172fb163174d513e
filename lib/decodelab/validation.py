"""Argument checks shared across the library: one function, one wording for every error it raises.

Sits below every other module and imports nothing from decodelab, so any module can use it.
Used by every module that takes counts and sizes (block_size, max_tokens, num_beams, top_k, ...).
"""
from __future__ import annotations


def check_int(value, name: str, low: int = 1) -> int:
    """Return `value` if it is an int (not a bool) >= `low`; otherwise raise ValueError naming `name`.

    >>> check_int(4, "block_size")
    4
    >>> check_int(0, "block_size")
    Traceback (most recent call last):
    ValueError: block_size must be an int >= 1, got 0
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value
