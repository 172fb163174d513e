"""Argument checks shared across the library: one function, one wording for every error it raises.

Sits below every other module and imports nothing from decodelab, so any module can use it.
Used by every module that takes counts and sizes (block_size, max_tokens, num_beams, top_k, ...) or a model.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence


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


def as_int_list(values) -> list[int] | None:
    """`values` as a list of Python ints, or None when it is not one: a sequence of ints (numpy and 0-d torch
    integers too) or a 1-D integer numpy array or torch tensor. A string, a bool, a float or a 2-D array gives None.

    >>> import numpy as np
    >>> as_int_list(np.array([3, 4])), as_int_list([np.int64(5), 6]), as_int_list([1.0]), as_int_list("ab")
    ([3, 4], [5, 6], None, None)
    """
    if type(values).__module__.split(".")[0] in ("torch", "numpy"):
        if getattr(values, "ndim", None) != 1:
            return None
        values = values.tolist()  # Python ints for an integer dtype; floats and bools are refused below
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        return None
    items = [as_scalar(v) for v in values]
    return items if all(isinstance(v, int) and not isinstance(v, bool) for v in items) else None


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


def check_model(model, call: str, name: str = "model") -> int:
    """Return the vocabulary size of `model` if it is a transformers causal LM (callable, with `parameters()` and a
    config that gives `vocab_size`); otherwise raise ParamError naming `name`. A tokenizer in its place (the
    arguments swapped) is named as such; `call` is the call to write instead, as the message shows it.

    >>> check_model(None, "generate(model, tokenizer, ...)")
    Traceback (most recent call last):
    decodelab.validation.ParamError: model must be a transformers causal LM, got NoneType
    """
    if callable(getattr(model, "encode", None)) and callable(getattr(model, "decode", None)):
        raise ParamError(name, f"got a tokenizer where the {name} goes: call {call}")
    vocab_size = as_scalar(getattr(getattr(model, "config", None), "vocab_size", None))
    if not (callable(model) and callable(getattr(model, "parameters", None)) and isinstance(vocab_size, int)):
        raise ParamError(name, f"{name} must be a transformers causal LM, got {type(model).__name__}")
    return vocab_size


def check_index(value, name: str, size: int, what: str = "") -> int:
    """Return `value` as an int in [0, `size`) (not a bool; numpy and 0-d torch integers too); otherwise raise
    ParamError naming `name`, with `what` (" (the steps of case 'x')") saying what it indexes.

    >>> check_index(3, "index", 3)
    Traceback (most recent call last):
    decodelab.validation.ParamError: index must be an int in [0, 3), got 3
    """
    checked = as_scalar(value)
    if isinstance(checked, bool) or not isinstance(checked, int) or not 0 <= checked < size:
        raise ParamError(name, f"{name} must be an int in [0, {size}){what}, got {value!r}")
    return checked


def check_records(records, name: str, source: str) -> list:
    """Return `records` (a widget's recorded runs or frames) as a list if it is a sequence of dicts; otherwise raise
    ParamError naming `name` and `source`, the function that records them. An empty list passes: the widget says
    what it needs.

    >>> check_records(None, "runs", "best_of_n_frames")
    Traceback (most recent call last):
    decodelab.validation.ParamError: runs must be a list of the dicts best_of_n_frames returns, got None
    """
    if (isinstance(records, (str, bytes)) or not isinstance(records, Sequence)
            or not all(isinstance(record, Mapping) for record in records)):
        raise ParamError(name, f"{name} must be a list of the dicts {source} returns, got {records!r:.100}")
    return list(records)
