"""The softmax explorer: drag one logit (or shift them all) and watch softmax and log-softmax move.

`softmax_state` is the computation, the numerically stable form chapter 01 teaches (subtract the max, then exp);
the ESM (`softmax_explorer.js` after the shared prelude) repeats it line for line, so the explorer works live in
JupyterLab and in the static HTML book with no kernel. The shift slider adds one constant to every logit: the
logits move, the bars do not (softmax is shift invariant).

Taught in: chapters/01-logits-to-probs.ipynb
"""
from __future__ import annotations

import math
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass

import anywidget
import numpy as np
import traitlets

from decodelab.validation import as_scalar
from decodelab.book.widgets.esm import ESM_PRELUDE

_HERE = pathlib.Path(__file__).parent

LOGIT_RANGE = (-10.0, 10.0)   # each logit's slider
SHIFT_RANGE = (-5.0, 5.0)     # the slider that adds one constant to every logit
STEP = 0.1                    # both sliders' step; logits are stored rounded to it
MAX_TOKENS = 12


@dataclass(frozen=True)
class SoftmaxState:
    """What the explorer shows. Arrays are `[V]`, in the order the tokens were given."""

    logits: np.ndarray     # [V] the given logits plus the shift
    probs: np.ndarray      # [V] softmax(logits)
    log_probs: np.ndarray  # [V] log_softmax(logits), finite even where probs underflow to 0
    log_sum_exp: float     # log sum_j exp(logits_j): probs = exp(logits - log_sum_exp)


def softmax_state(logits: Sequence[float] | np.ndarray, shift: float = 0.0) -> SoftmaxState:
    """Softmax and log-softmax of `logits + shift`, computed as chapter 01 teaches: m = max, exp(z - m).

    >>> state = softmax_state([2.0, 1.0, 0.0])
    >>> [round(p, 3) for p in state.probs.tolist()]
    [0.665, 0.245, 0.09]
    >>> bool(np.allclose(softmax_state([2.0, 1.0, 0.0], shift=5.0).probs, state.probs))
    True

    Taught in: chapters/01-logits-to-probs.ipynb
    """
    try:
        values = np.asarray(logits, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"logits must be a non-empty 1-D sequence of numbers [V], got {logits!r:.100}") from error
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"logits must be a non-empty 1-D sequence of numbers [V], got shape {values.shape}")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"logits must be finite, got {values.tolist()!r:.100}")
    shift = as_scalar(shift)
    if isinstance(shift, bool) or not isinstance(shift, (int, float)) or not math.isfinite(shift):
        raise ValueError(f"shift must be a finite number, got {shift!r}")
    shifted = values + shift                       # [V]
    row_max = shifted.max()
    exps = np.exp(shifted - row_max)               # [V], the largest is exp(0) = 1
    total = exps.sum()
    log_sum_exp = float(row_max + np.log(total))
    return SoftmaxState(logits=shifted, probs=exps / total, log_probs=shifted - log_sum_exp, log_sum_exp=log_sum_exp)


def _on_grid(value: float, name: str, low: float, high: float) -> float:
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}] (the slider's range), got {value}")
    return round(round(value / STEP) * STEP, 1)


# A blank line between the shared prelude and this widget's own view (softmax_explorer.js).
_ESM = ESM_PRELUDE + "\n" + (_HERE / "softmax_explorer.js").read_text(encoding="utf-8")


class SoftmaxExplorer(anywidget.AnyWidget):
    """One slider per logit and one that shifts them all; bars for softmax and log-softmax, redrawn in the browser.

    >>> SoftmaxExplorer(["家", "村", "海"], [2.0, 1.0, -1.0])
    SoftmaxExplorer(tokens=['家', '村', '海'], shift=0.0, lecture=False)

    Taught in: chapters/01-logits-to-probs.ipynb
    """

    _esm = _ESM

    tokens = traitlets.List(traitlets.Unicode()).tag(sync=True)
    logits = traitlets.List(traitlets.Float()).tag(sync=True)
    shift = traitlets.Float(0.0).tag(sync=True)
    logit_range = traitlets.List(traitlets.Float(), default_value=list(LOGIT_RANGE)).tag(sync=True)
    shift_range = traitlets.List(traitlets.Float(), default_value=list(SHIFT_RANGE)).tag(sync=True)
    step = traitlets.Float(STEP).tag(sync=True)
    lecture = traitlets.Bool(False).tag(sync=True)

    def __init__(self, tokens: Sequence[str], logits: Sequence[float] | np.ndarray, *, shift: float = 0.0,
                 lecture: bool = False) -> None:
        if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence) \
                or not all(isinstance(token, str) and token for token in tokens):
            raise TypeError(f"tokens must be a list of non-empty str, got {tokens!r:.100}")
        if not 2 <= len(tokens) <= MAX_TOKENS:
            raise ValueError(f"tokens must hold 2 to {MAX_TOKENS} tokens (one slider each), got {len(tokens)}")
        state = softmax_state(logits, shift)  # checks logits and shift
        if state.logits.size != len(tokens):
            raise ValueError(f"tokens and logits must have the same length, got {len(tokens)} tokens and "
                             f"{state.logits.size} logits")
        values = [_on_grid(float(x), "each logit", *LOGIT_RANGE) for x in np.asarray(logits, dtype=np.float64)]
        super().__init__(tokens=list(tokens), logits=values, shift=_on_grid(float(as_scalar(shift)), "shift",
                         *SHIFT_RANGE), lecture=bool(lecture))

    def state(self) -> SoftmaxState:
        """What the browser shows now, computed in Python."""
        return softmax_state(self.logits, self.shift)

    def __repr__(self) -> str:
        # no logits: a notebook's stored repr must not move with the last digits of a model's logits (nbval)
        return f"SoftmaxExplorer(tokens={self.tokens!r}, shift={self.shift}, lecture={self.lecture})"
