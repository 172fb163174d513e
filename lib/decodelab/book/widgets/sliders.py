"""Sliders that refuse a constructor value outside their range instead of clamping it silently.

ipywidgets moves a value outside [min, max] to the nearest end, so `StepperWidget(temperature=5)` used to run at 3
without a word. Every widget builds its sliders through `slider`, which raises instead.

Used by the widgets of chapters/03-strategies.ipynb and chapters/04-autoregressive.ipynb.
"""
from __future__ import annotations

import ipywidgets as widgets

from decodelab.validation import as_scalar


def slider(kind: type, name: str, value: float, low: float, high: float, **options) -> widgets.Widget:
    """`kind(value=value, min=low, max=high, **options)` after checking that `value` is a number (an int for an
    IntSlider; numpy and 0-d torch scalars too) in [low, high].

    >>> slider(widgets.IntSlider, "top_k", 60, 0, 50)
    Traceback (most recent call last):
    ValueError: top_k must be in [0, 50] (the slider's range), got 60
    """
    value = as_scalar(value)
    kinds = int if issubclass(kind, widgets.IntSlider) else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        allowed = "an int" if kinds is int else "a number"
        raise ValueError(f"{name} must be {allowed} in [{low}, {high}] (the slider's range), got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}] (the slider's range), got {value!r}")
    return kind(value=value, min=low, max=high, **options)
