"""The engine under asyncio: requests arrive while steps run, and each request reads its tokens as they come.

One background task owns the `Engine`. It alternates two phases and never overlaps them:
  1. between steps, on the event loop: queue the requests that arrived, abort the ones whose client left;
  2. one `Engine.step()` on a worker thread (the loop keeps accepting connections meanwhile), then hand each new
     token to its request's queue.
So continuous batching spans HTTP requests: a request that arrives during step t joins the batch at step t + 1.
`batching="static"` is the contrast, request-level batching: arrivals wait until the running batch has finished
completely, then up to `max_num_seqs` sequences start together.

    engine = AsyncEngine(Engine(model, tokenizer), max_queue_len=256)
    await engine.start()
    [stream] = engine.submit([engine.engine.check_request(prompt_ids, SamplingParams(max_tokens=20))])
    async for item in stream:            # TokenEvent per token, then the Completion
        ...

Used by: decodelab.serve.app. Taught in: chapters/07c-serving.ipynb
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from decodelab.engine.engine import CheckedRequest, Engine, StepOutput, TokenEvent
from decodelab.decoding.request import Completion
from decodelab.sampling.sampler import SamplingParams
from decodelab.validation import check_int

BATCHING = ("continuous", "static")


class QueueFull(Exception):
    """The server has `max_queue_len` requests waiting already; the caller should answer 503 and retry later."""


class EngineFailed(Exception):
    """A step raised; every request in flight at that moment ends with this error (the message says why)."""


@dataclass
class RequestStream:
    """One request in flight: its events arrive on `queue` (TokenEvent..., then a Completion or an exception)."""
    request: CheckedRequest
    arrival: float = field(default_factory=time.perf_counter)
    request_id: int | None = None              # the engine's id, once queued there
    first_token: float | None = None           # perf_counter time of the first token of any sample
    last_token: dict[int, float] = field(default_factory=dict)   # sample index -> time of its last token
    done: bool = False
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)

    @property
    def prompt_ids(self) -> tuple[int, ...]:
        return self.request.prompt_ids

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    def __aiter__(self) -> AsyncIterator[TokenEvent | Completion]:
        return self._events()

    async def _events(self) -> AsyncIterator[TokenEvent | Completion]:
        while True:
            item = await self.queue.get()
            if isinstance(item, Exception):
                raise item
            yield item
            if isinstance(item, Completion):
                return


class AsyncEngine:
    """Run `engine` in the background of an asyncio loop; `submit` requests, `abort` them, observe `stats()`.

    max_queue_len: requests that may wait (not yet running) before `submit` raises QueueFull.
    metrics: a `decodelab.serve.prometheus.ServerMetrics` told about every step, token, finish, refusal and abort.
    Taught in: chapters/07c-serving.ipynb
    """

    def __init__(self, engine: Engine, max_queue_len: int = 256, batching: str = "continuous",
                 metrics=None) -> None:
        if not isinstance(engine, Engine):
            raise TypeError(f"engine must be a decodelab Engine, got {type(engine).__name__}")
        if batching not in BATCHING:
            raise ValueError(f"batching must be one of {BATCHING}, got {batching!r}")
        self.engine = engine
        self.max_queue_len = check_int(max_queue_len, "max_queue_len")
        self.batching = batching
        self.metrics = metrics
        self._pending: deque[RequestStream] = deque()     # arrived, not yet handed to the engine
        self._aborts: list[RequestStream] = []
        self._streams: dict[int, RequestStream] = {}       # engine request id -> stream
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._threads = torch.get_num_threads()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decodelab-engine",
                                            initializer=torch.set_num_threads, initargs=(self._threads,))
        self.num_waiting = 0                                # engine's waiting queue after the last step
        self.num_running = 0

    # -- lifecycle -----------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="decodelab-engine-loop")

    async def stop(self) -> None:
        """Abort everything in flight and stop the loop."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for stream in list(self._pending) + list(self._streams.values()):
            self._fail(stream, EngineFailed("the server is shutting down"))
        for request_id in list(self._streams):
            self.engine.abort(request_id)
        self._pending.clear()
        self._streams.clear()
        self._executor.shutdown(wait=True)

    # -- requests ------------------------------------------------------------------------------------------
    @property
    def queue_length(self) -> int:
        """Requests waiting to run: arrived but not handed to the engine, plus the engine's own waiting queue."""
        return len(self._pending) + self.num_waiting

    def submit(self, requests: list[CheckedRequest]) -> list[RequestStream]:
        """Queue requests that the engine's `check_request` accepted (they are not checked again), all or none:
        raises QueueFull if they would take the queue past `max_queue_len`."""
        if self._task is None:
            raise RuntimeError("the engine loop is not running: await start() first")
        if self.queue_length + len(requests) > self.max_queue_len:
            if self.metrics is not None:
                self.metrics.refused.inc()
            raise QueueFull(f"{self.queue_length} requests are waiting, the limit is {self.max_queue_len}")
        if not all(isinstance(r, CheckedRequest) for r in requests):
            raise TypeError(f"requests must be CheckedRequests from engine.check_request, got "
                            f"{[type(r).__name__ for r in requests]}")
        streams = [RequestStream(request) for request in requests]
        self._pending.extend(streams)
        self._wake.set()
        return streams

    def abort(self, stream: RequestStream) -> None:
        """Stop a request whose client left; its blocks are freed before the next step."""
        if not stream.done:
            stream.done = True
            self._aborts.append(stream)
            self._wake.set()

    # -- the loop ------------------------------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self._aborts or self._pending:
                self._apply_aborts()
                self._admit()
                self._observe_state()
            if not self.engine.has_unfinished():
                self._wake.clear()
                if self._pending or self._aborts:
                    await asyncio.sleep(0)
                else:
                    await self._wake.wait()
                continue
            started = time.perf_counter()
            try:
                output = await loop.run_in_executor(self._executor, self.engine.step)
            except Exception as error:  # noqa: BLE001 - a failed step fails its requests, not the server
                self._fail_all(EngineFailed(f"engine step failed: {type(error).__name__}: {error}"))
                continue
            self._dispatch(output, time.perf_counter() - started)

    def _apply_aborts(self) -> None:
        for stream in self._aborts:
            if stream.request_id is None:
                if stream in self._pending:
                    self._pending.remove(stream)
            elif stream.request_id in self._streams:
                del self._streams[stream.request_id]
                self.engine.abort(stream.request_id)
            if self.metrics is not None:
                self.metrics.aborted.inc()
        self._aborts.clear()

    def _admit(self) -> None:
        if self.batching == "continuous":
            batch = len(self._pending)
        elif self.engine.has_unfinished():
            batch = 0                                        # static: wait for the whole batch to finish
        else:
            width, batch = 0, 0
            for stream in self._pending:
                width += stream.params.n
                if width > self.engine.max_num_seqs:
                    break
                batch += 1
        for _ in range(batch):
            stream = self._pending.popleft()
            stream.request_id = self.engine.add_request(stream.request)
            self._streams[stream.request_id] = stream
        self.num_waiting = self.engine.num_waiting
        self.num_running = self.engine.num_running

    def _observe_state(self) -> None:
        if self.metrics is not None:
            self.metrics.observe_state(self.engine.stats, self.queue_length, self.num_running)

    def _dispatch(self, output: StepOutput, seconds: float) -> None:
        now = time.perf_counter()
        self.num_waiting, self.num_running = output.num_waiting, self.engine.num_running
        if self.metrics is not None:
            self.metrics.observe_step(output, seconds)
        for event in output.events:
            stream = self._streams.get(event.request_id)
            if stream is None:
                continue
            if self.metrics is not None:
                self.metrics.observe_token(stream, event, now)
            if stream.first_token is None:
                stream.first_token = now
            stream.last_token[event.sample_index] = now
            stream.queue.put_nowait(event)
        for completion in output.finished:
            stream = self._streams.pop(completion.request_id, None)
            if stream is None:
                continue
            stream.done = True
            if self.metrics is not None:
                self.metrics.observe_finish(stream, completion, now)
            stream.queue.put_nowait(completion)
        self._observe_state()

    def _fail(self, stream: RequestStream, error: Exception) -> None:
        stream.done = True
        stream.queue.put_nowait(error)

    def _fail_all(self, error: Exception) -> None:
        for request_id, stream in list(self._streams.items()):
            self.engine.abort(request_id)
            self._fail(stream, error)
        self._streams.clear()
