"""Seeded rows' Exponential noise, drawn on another thread while the model runs.

With the default streams (`rng="torch"`) a seeded row draws its token as `argmax(p / E)`, E ~ Exponential(1): V numbers
from its own `torch.Generator` per token (`decodelab.sampling.sampler`). On a CPU `exponential_` computes them one by
one, about 20 ns each (tiny-zh's 473 entries: about 10 µs per row), and in an engine step that time fell after the
forward, on the step's critical path. None of it depends on the logits, so it can be drawn before they exist: just
before the forward, the engine hands the step's seeded dense rows (`decodelab.sampling.sampler.exponential_rows`) to
a worker thread, which draws each row's noise from its generator while the model runs on the engine's thread, and
the draw waits for it after the forward. vLLM overlaps a step's host work with the GPU's forward for the same reason.

The worker is one daemon thread per process, fed by a queue. Its task is one call of a TorchScript function
(`_fill`, every row of the job), which runs in C++ without Python's GIL; the worker holds the GIL only to take a task
and to mark it done. A loop of `exponential_` calls in Python would need the GIL between its calls, and each time
the worker held it, the engine's thread, coming back from one of the forward's small torch calls, would wait for it.
(An earlier version started the task with `torch.jit.fork` instead: about 40-60 µs per start on a 2-core VM.)
TorchScript is deprecated in torch 2.x but present in the versions this course runs (2.11, 2.13); where it cannot
compile, `available()` is False and an engine draws after the forward, as before.

The tokens do not change. A generator gives the same numbers whichever thread asks, and nothing else touches a job's
generators until the draw has waited for it. What a generator gave stays with its sequence (`SequenceState.noise`)
until a draw uses it, so a step whose forward or draw raises, or a sequence preempted before its draw, leaves every
stream where its next draw expects it. Numbers are drawn in float64: `exponential_` computes each in double precision
and rounds it to the tensor's dtype, so a float32 row rounded from them holds what a float32 draw holds.

    job = NoiseJob.start(seqs, vocab_size)   # before the forward
    ...                                      # the forward, on this thread
    job.wait()                               # each seq.noise is now a [V] float64 tensor; re-raises the task's error

Taught in: chapters/07-paged-attention.ipynb
"""
from __future__ import annotations

import functools
import os
import queue
import threading
import warnings
from collections.abc import Sequence
from typing import List

import torch

from decodelab.validation import check_int


def _fill(buffer: torch.Tensor, generators: List[torch.Generator]) -> torch.Tensor:  # noqa: UP006 (TorchScript)
    """Row i of `buffer` from `generators[i]`, in order (TorchScript: it runs without the GIL)."""
    for i in range(len(generators)):
        buffer[i].exponential_(1.0, generator=generators[i])
    return buffer


@functools.cache
def _scripted_fill():
    """`_fill` compiled, once per process; None where TorchScript cannot compile it. Called from the worker thread,
    a scripted function runs without the GIL, so the engine's thread runs the forward meanwhile."""
    try:
        with warnings.catch_warnings():       # torch >= 2.10 warns that torch.jit.script is deprecated
            warnings.simplefilter("ignore", DeprecationWarning)
            return torch.jit.script(_fill)
    except Exception:                         # noqa: BLE001 (any failure means: draw after the forward)
        return None


class _Task:
    """One call of the scripted fill, run by the worker; `wait` blocks on a lock the worker releases (an event)."""
    __slots__ = ("_fill", "_buffer", "_generators", "_done", "_error")

    def __init__(self, fill, buffer: torch.Tensor, generators: list) -> None:
        self._fill, self._buffer, self._generators, self._error = fill, buffer, generators, None
        self._done = threading.Lock()
        self._done.acquire()

    def run(self) -> None:
        try:
            self._fill(self._buffer, self._generators)
        except BaseException as error:      # noqa: BLE001 (handed to the waiting thread)
            self._error = error
        finally:
            self._done.release()

    def wait(self) -> None:
        self._done.acquire()
        self._done.release()                 # a second wait returns at once
        if self._error is not None:
            raise self._error


def _serve(tasks: queue.SimpleQueue) -> None:
    torch.set_grad_enabled(False)
    with torch.inference_mode():             # the buffers are the engine's inference tensors
        while True:
            tasks.get().run()


@functools.cache
def _worker() -> queue.SimpleQueue:
    """The process's one worker thread (a daemon) and its queue of tasks, run in order."""
    tasks = queue.SimpleQueue()
    threading.Thread(target=_serve, args=(tasks,), name="decodelab-noise-ahead", daemon=True).start()
    return tasks


def available() -> bool:
    """Whether this torch can run the task (TorchScript compiles `_fill`)."""
    return _scripted_fill() is not None


def spare_core() -> bool:
    """Whether this process may run on more CPU cores than torch's intra-op threads use, so that the task does not
    take a core from the forward."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:                    # not Linux
        cores = os.cpu_count() or 1
    return cores > torch.get_num_threads()


class NoiseJob:
    """One step's noise being drawn: `start` launches it, `wait` blocks until it is done and hands each sequence its
    row."""
    __slots__ = ("_seqs", "_buffer", "_future")

    def __init__(self, seqs: tuple, buffer: torch.Tensor, future) -> None:
        self._seqs, self._buffer, self._future = seqs, buffer, future

    @classmethod
    def start(cls, seqs: Sequence, width: int) -> NoiseJob:
        """Launch the noise of `seqs` (sequences whose `generator` is a CPU torch.Generator and whose `noise` is None):
        `width` Exponential(1) numbers each, from its own generator."""
        check_int(width, "width")
        seqs = tuple(seqs)
        generators = [seq.generator for seq in seqs]
        for i, g in enumerate(generators):
            if type(g) is not torch.Generator or g.device.type != "cpu":
                raise ValueError(f"seqs[{i}] must hold a CPU torch.Generator to draw its noise ahead, got {g!r}")
            if seqs[i].noise is not None:
                raise ValueError(f"seqs[{i}] already holds noise for its next draw")
        fill = _scripted_fill()
        if fill is None:
            raise RuntimeError("this torch cannot compile the noise task (TorchScript); check available() first")
        buffer = torch.empty(len(seqs), width, dtype=torch.float64)
        job = cls(seqs, buffer, _Task(fill, buffer, generators))
        _worker().put(job._future)
        return job

    def wait(self) -> None:
        """Block until the task is done (an event, not a timeout; the GIL is released meanwhile) and give each
        sequence its row; re-raise what the task raised."""
        seqs, self._seqs = self._seqs, ()             # a second wait hands out nothing
        self._future.wait()     # re-raises the task's error
        for seq, row in zip(seqs, self._buffer.unbind(0)):
            seq.noise = row
