"""Argument checks shared across the library: one function, one wording for every error it raises.

Sits below every other module and imports nothing from decodelab, so any module can use it.
Used by every module that takes counts and sizes (block_size, max_tokens, num_beams, top_k, ...).
"""
from __future__ import annotations


class ParamError(ValueError):
    """A ValueError about one named parameter (`param`), so a caller such as the HTTP server can say which field of
    a request was wrong. Its message starts with the parameter's name.

    >>> ParamError("top_p", "top_p must be in (0, 1], got 2").param
    'top_p'
    """

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def as_scalar(value):
    """A Python number for a 0-dimensional torch tensor or a numpy scalar (`torch.tensor(0.5)`, `np.int64(3)`);
    any other value comes back unchanged, so the checks that follow name it as it was passed.

    >>> import torch
    >>> as_scalar(torch.tensor(0.5)), as_scalar(7)
    (0.5, 7)
    """
    if type(value).__module__.split(".")[0] in ("torch", "numpy") and getattr(value, "shape", None) == ():
        return value.item()
    return value


def check_int(value, name: str, low: int = 1) -> int:
    """Return `value` as an int if it is one (not a bool; a 0-d torch tensor or numpy integer is accepted) and
    >= `low`; otherwise raise ParamError (a ValueError) naming `name`.

    >>> check_int(4, "block_size")
    4
    >>> check_int(0, "block_size")
    Traceback (most recent call last):
    decodelab.validation.ParamError: block_size must be an int >= 1, got 0
    """
    value = as_scalar(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ParamError(name, f"{name} must be an int >= {low}, got {value!r}")
    return value
