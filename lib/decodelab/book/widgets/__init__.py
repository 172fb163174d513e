"""Widgets for the course: one file per widget, computation in plain functions, display in a thin layer.

Nothing in the library imports this package; notebooks do.
"""
from decodelab.book.widgets.explorer import (
    DistributionExplorer,
    ExplorerContext,
    ExplorerParams,
    ExplorerState,
    explorer_state,
    make_context,
)

__all__ = [
    "DistributionExplorer",
    "ExplorerContext",
    "ExplorerParams",
    "ExplorerState",
    "explorer_state",
    "make_context",
]
