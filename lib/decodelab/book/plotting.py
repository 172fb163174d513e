"""Matplotlib set-up for figures with Chinese labels, and small shared plotting helpers.

Importing this module registers Noto Sans SC from the PyPI package `pylopdf-fonts-zh-cn`, so token labels
render on a fresh machine of any OS without a system CJK font.

Taught in: chapters/01-logits-to-probs.ipynb (the first figure with Chinese token labels)
"""
from __future__ import annotations

from typing import Sequence

import matplotlib
from matplotlib import font_manager

CJK_FONT = "Noto Sans SC"


def use_cjk_font() -> str:
    """Register Noto Sans SC and put it first in `font.sans-serif`; safe to call many times. Returns the name."""
    from pylopdf_fonts_zh_cn import sans_path

    path = str(sans_path())
    if path not in {f.fname for f in font_manager.fontManager.ttflist}:
        font_manager.fontManager.addfont(path)
    families = [f for f in matplotlib.rcParams["font.sans-serif"] if f != CJK_FONT]
    matplotlib.rcParams["font.sans-serif"] = [CJK_FONT, *families]
    matplotlib.rcParams["font.family"] = "sans-serif"
    return CJK_FONT


def bar_probs(ax, labels: Sequence[str], probs: Sequence[float], title: str | None = None, color: str = "C0"):
    """A bar chart of a next-token distribution: one bar per (Chinese) token label, probabilities on y."""
    if len(labels) != len(probs):
        raise ValueError(f"labels and probs must have the same length, got {len(labels)} and {len(probs)}")
    if any(p < 0 for p in probs):
        raise ValueError(f"probs must be non-negative, got {min(probs)}")
    bars = ax.bar(range(len(probs)), probs, color=color)
    ax.set_xticks(range(len(labels)), [str(label) for label in labels])
    ax.set_ylabel("概率")
    if title:
        ax.set_title(title)
    return bars


use_cjk_font()
