"""The distribution explorer: temperature, top-k, top-p and min-p on precomputed logits.

The browser re-normalises stored logits (as Transformer Explainer does), so the widget works live in
JupyterLab and in the static HTML book with no kernel. `explorer_state` is the computation; the ESM in
`explorer.js` mirrors it line for line, and the tests compare both with `decodelab.sampling.sampler`.

Taught in: chapters/02-temperature.ipynb, chapters/03-strategies.ipynb
"""
from __future__ import annotations

import math
import pathlib
from dataclasses import dataclass
from typing import Sequence

import anywidget
import numpy as np
import traitlets

from decodelab.validation import as_scalar, check_int

_HERE = pathlib.Path(__file__).parent

TEMPERATURE_RANGE = (0.05, 3.0)
TOP_K_MAX = 50
TOP_P_MIN = 0.05
MIN_P_MAX = 0.5


@dataclass(frozen=True)
class ExplorerParams:
    """Slider values. `top_k=0`, `top_p=1.0` and `min_p=0.0` switch a filter off."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        for name in ("temperature", "top_k", "top_p", "min_p"):  # numpy and torch scalars are numbers too
            object.__setattr__(self, name, as_scalar(getattr(self, name)))
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
            raise TypeError(f"temperature must be a number, got {type(self.temperature).__name__}")
        if not math.isfinite(self.temperature) or self.temperature <= 0:
            raise ValueError(f"temperature must be a finite number > 0, got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise TypeError(f"top_k must be an int (0 = off), got {type(self.top_k).__name__}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.min_p, bool) or not isinstance(self.min_p, (int, float)) or not 0 <= self.min_p < 1:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p!r}")


@dataclass(frozen=True)
class ExplorerState:
    """What the explorer shows for one context. Arrays are `[V]`, in vocabulary order."""

    probs: np.ndarray        # [V] softmax(logits / T), before any filter
    kept: np.ndarray         # [V] bool, True where the token survives top-k, top-p and min-p
    final_probs: np.ndarray  # [V] probs renormalised over the kept tokens, 0 elsewhere
    entropy: float           # nats, of `probs`
    final_entropy: float     # nats, of `final_probs`: what sampling actually draws from
    kept_count: int          # the nucleus size
    kept_mass: float         # sum of `probs` over the kept tokens


def _as_logits(logits: Sequence[float] | np.ndarray) -> np.ndarray:
    try:
        array = np.asarray(logits, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"logits must be a non-empty 1-D sequence of numbers [V], got {logits!r:.100}") from error
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"logits must be a non-empty 1-D sequence [V], got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError("logits must be finite (mask nothing before the explorer), got inf or nan")
    return array


def _entropy(probs: np.ndarray) -> float:
    positive = probs[probs > 0]
    return float(-(positive * np.log(positive)).sum())


def explorer_state(logits: Sequence[float] | np.ndarray, params: ExplorerParams = ExplorerParams()) -> ExplorerState:
    """Apply temperature, then top-k, top-p and min-p (the transformers order) to one row of logits.

    Top-k keeps every token tied with the k-th largest logit. Top-p keeps the smallest set of most
    likely tokens whose mass reaches p, including the token that crosses p. Min-p keeps tokens with
    probability >= min_p * max probability. At least one token always survives.

    >>> explorer_state([2.0, 1.0, 0.0], ExplorerParams(top_k=2)).kept.tolist()
    [True, True, False]
    """
    if not isinstance(params, ExplorerParams):
        raise TypeError(f"params must be an ExplorerParams, got {type(params).__name__}")
    scaled = _as_logits(logits) / params.temperature  # [V]
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    kept = np.ones_like(probs, dtype=bool)
    if 0 < params.top_k < probs.size:
        kth_largest = np.sort(scaled)[-params.top_k]
        kept &= scaled >= kth_largest
    if params.top_p < 1.0:
        filtered = np.where(kept, probs, 0.0)
        filtered /= filtered.sum()
        order = np.argsort(-filtered, kind="stable")  # most likely first
        ranked = filtered[order]
        mass_before = np.concatenate(([0.0], np.cumsum(ranked)[:-1]))  # mass of the strictly better ranked tokens
        in_nucleus = np.zeros_like(kept)
        in_nucleus[order] = mass_before < params.top_p
        in_nucleus[order[0]] = True
        kept &= in_nucleus
    if params.min_p > 0.0:
        kept &= probs >= params.min_p * probs.max()
    final_probs = np.where(kept, probs, 0.0)
    kept_mass = float(final_probs.sum())
    final_probs /= kept_mass
    return ExplorerState(
        probs=probs,
        kept=kept,
        final_probs=final_probs,
        entropy=_entropy(probs),
        final_entropy=_entropy(final_probs),
        kept_count=int(kept.sum()),
        kept_mass=kept_mass,
    )


@dataclass(frozen=True)
class ExplorerContext:
    """One context shown by the explorer: a label, the candidate tokens and their logits `[V]`."""

    label: str
    tokens: tuple[str, ...]
    logits: tuple[float, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.label, str) or not self.label:
            raise ValueError(f"label must be a non-empty str, got {self.label!r}")
        if isinstance(self.tokens, (str, bytes)) or not isinstance(self.tokens, (Sequence, np.ndarray)):
            raise TypeError(f"tokens must be a list of str, got {self.tokens!r:.100}")
        _as_logits(self.logits)
        if len(self.tokens) != len(self.logits):
            raise ValueError(
                f"tokens and logits must have the same length, got {len(self.tokens)} tokens and {len(self.logits)} logits"
            )
        if any(not isinstance(token, str) for token in self.tokens):
            raise TypeError("tokens must all be str")


def make_context(label: str, tokens: Sequence[str], logits: Sequence[float] | np.ndarray, decimals: int = 4) -> ExplorerContext:
    """Build a context, rounding logits to `decimals` so the stored widget state is small and reproducible."""
    decimals = check_int(decimals, "decimals", low=0)
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, (Sequence, np.ndarray)):
        raise TypeError(f"tokens must be a list of str, got {tokens!r:.100}")
    rounded = np.round(_as_logits(logits), decimals)
    return ExplorerContext(label=label, tokens=tuple(tokens), logits=tuple(float(x) for x in rounded))


class DistributionExplorer(anywidget.AnyWidget):
    """Sliders for temperature, top-k, top-p (and min-p) over one or two next-token distributions.

    >>> DistributionExplorer([make_context("平坦", ["的", "了"], [1.0, 0.5])], temperature=0.7)
    DistributionExplorer(contexts=['平坦'], temperature=0.7, top_k=0, top_p=1.0, min_p=0.0, use_min_p=False, lecture=False)

    Taught in: chapters/02-temperature.ipynb, chapters/03-strategies.ipynb
    """

    _esm = _HERE / "explorer.js"
    _css = _HERE / "explorer.css"

    contexts = traitlets.List(traitlets.Dict()).tag(sync=True)
    temperature = traitlets.Float(1.0).tag(sync=True)
    top_k = traitlets.Int(0).tag(sync=True)
    top_p = traitlets.Float(1.0).tag(sync=True)
    min_p = traitlets.Float(0.0).tag(sync=True)
    use_min_p = traitlets.Bool(False).tag(sync=True)
    num_bars = traitlets.Int(12).tag(sync=True)
    lecture = traitlets.Bool(False).tag(sync=True)

    def __init__(
        self,
        contexts: Sequence[ExplorerContext],
        *,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        use_min_p: bool = False,
        num_bars: int = 12,
        lecture: bool = False,
    ) -> None:
        if isinstance(contexts, (str, bytes)) or not isinstance(contexts, Sequence):
            raise TypeError(f"contexts must be a list of 1 or 2 ExplorerContext (see make_context), got {contexts!r}")
        if not 1 <= len(contexts) <= 2:
            raise ValueError(f"contexts must hold 1 or 2 ExplorerContext, got {len(contexts)}")
        for context in contexts:
            if not isinstance(context, ExplorerContext):
                raise TypeError(f"contexts must hold ExplorerContext (see make_context), got {type(context).__name__}")
        params = ExplorerParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
        temperature, top_k, top_p, min_p = params.temperature, params.top_k, params.top_p, params.min_p
        low, high = TEMPERATURE_RANGE
        if not low <= temperature <= high:
            raise ValueError(f"temperature must be in [{low}, {high}] (the slider's range), got {temperature}")
        if top_p < TOP_P_MIN:
            raise ValueError(f"top_p must be in [{TOP_P_MIN}, 1] (the slider's range), got {top_p}")
        if top_k > TOP_K_MAX:
            raise ValueError(f"top_k must be in [0, {TOP_K_MAX}] (the slider's range), got {top_k}")
        if min_p > MIN_P_MAX:
            raise ValueError(f"min_p must be in [0, {MIN_P_MAX}] (the slider's range), got {min_p}")
        num_bars = check_int(num_bars, "num_bars")
        super().__init__(
            contexts=[{"label": c.label, "tokens": list(c.tokens), "logits": list(c.logits)} for c in contexts],
            temperature=float(temperature),
            top_k=int(top_k),
            top_p=float(top_p),
            min_p=float(min_p),
            use_min_p=bool(use_min_p),
            num_bars=num_bars,
            lecture=bool(lecture),
        )

    def params(self) -> ExplorerParams:
        """The current slider values; min-p counts only while its toggle is on."""
        return ExplorerParams(
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p if self.use_min_p else 0.0,
        )

    def states(self) -> list[ExplorerState]:
        """What the browser shows right now, computed in Python: one state per context."""
        return [explorer_state(context["logits"], self.params()) for context in self.contexts]

    def __repr__(self) -> str:
        labels = [context["label"] for context in self.contexts]
        return (
            f"DistributionExplorer(contexts={labels!r}, temperature={self.temperature}, top_k={self.top_k}, "
            f"top_p={self.top_p}, min_p={self.min_p}, use_min_p={self.use_min_p}, lecture={self.lecture})"
        )
