"""Wall-clock timing that waits for the GPU, shared by the benchmarks and the scripts that measure chapter data.

CUDA kernels run asynchronously: a call returns once its work is queued. Timing it honestly means waiting for the
queue to drain before starting the clock and again before stopping it.

Used by benchmarks/sampling.py, benchmarks/attention.py and scripts/ch06_timing.py, whose measurements
chapters/06-prefill-decode-kv-cache.ipynb shows.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import torch


def synced_seconds(fn: Callable[[], object], device: str | torch.device) -> float:
    """Seconds of one call of `fn()`, measured with `time.perf_counter`; on a CUDA device the GPU's queue is
    drained before the clock starts and before it stops, so the time covers the kernels `fn` launched.

    >>> from decodelab.measure.timing import synced_seconds
    >>> seconds = synced_seconds(lambda: torch.randn(256, 256) @ torch.randn(256, 256), "cpu")   # about 0.0004
    >>> seconds > 0                    # a float of seconds; how many depends on the machine
    True
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    try:
        is_cuda = torch.device(device).type == "cuda"
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device must be a torch device such as 'cpu' or 'cuda', got {device!r}") from error
    if is_cuda:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if is_cuda:
        torch.cuda.synchronize(device)
    return time.perf_counter() - start
