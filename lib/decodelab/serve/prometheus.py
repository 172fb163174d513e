"""The server's `/metrics`, in Prometheus text format, with vLLM's metric names under the `decodelab:` prefix.

So the dashboard query that reads `vllm:time_to_first_token_seconds` from a vLLM server reads
`decodelab:time_to_first_token_seconds` here. Each server has its own registry (two servers in one process, as in
the tests, do not mix their counts).

    metrics = ServerMetrics()
    AsyncEngine(engine, metrics=metrics)     # the engine loop reports every step, token and finished request
    metrics.render()                         # bytes for GET /metrics

Used by: decodelab.serve.app. Taught in: chapters/07c-serving.ipynb
"""
from __future__ import annotations

import prometheus_client
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from decodelab.engine.engine import EngineStats, StepOutput, TokenEvent
from decodelab.decoding.request import Completion

prometheus_client.disable_created_metrics()  # no `*_created` series (as vLLM): counters and histograms only
PREFIX = "decodelab:"
# vLLM's buckets (seconds), so the two servers' histograms compare bucket by bucket
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0)
STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


class ServerMetrics:
    """Gauges, counters and histograms of one server. Taught in: chapters/07c-serving.ipynb"""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.waiting = Gauge(PREFIX + "num_requests_waiting", "Requests queued, not yet running.", registry=r)
        self.running = Gauge(PREFIX + "num_requests_running", "Sequences holding KV blocks.", registry=r)
        self.kv_usage = Gauge(PREFIX + "kv_cache_usage_perc", "Fraction of KV blocks in use (1 = full).", registry=r)
        self.preemptions = Counter(PREFIX + "num_preemptions", "Sequences preempted (recomputed later).", registry=r)
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens of finished requests.", registry=r)
        self.generation_tokens = Counter(PREFIX + "generation_tokens", "Tokens generated.", registry=r)
        self.success = Counter(PREFIX + "request_success", "Finished requests by finish reason.",
                               ["finished_reason"], registry=r)
        self.refused = Counter(PREFIX + "request_refused", "Requests refused because the queue was full.",
                               registry=r)
        self.aborted = Counter(PREFIX + "request_aborted", "Requests aborted because their client left.",
                               registry=r)
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds", "Arrival to first token.",
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram(PREFIX + "inter_token_latency_seconds", "Time between two tokens of one sample.",
                             buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram(PREFIX + "e2e_request_latency_seconds", "Arrival to last token.",
                             buckets=E2E_BUCKETS, registry=r)
        self.step = Histogram(PREFIX + "step_duration_seconds", "One engine step (schedule, forward, sample).",
                              buckets=STEP_BUCKETS, registry=r)
        self._preemptions_seen = 0

    def observe_state(self, stats: EngineStats, queue_length: int, num_running: int) -> None:
        """The gauges, after each step and whenever requests were admitted or aborted between steps."""
        self.waiting.set(queue_length)
        self.running.set(num_running)
        self.kv_usage.set(1 - stats.free_blocks / stats.num_blocks)
        self.preemptions.inc(stats.preemptions - self._preemptions_seen)
        self._preemptions_seen = stats.preemptions

    def observe_step(self, output: StepOutput, seconds: float) -> None:
        self.step.observe(seconds)
        self.generation_tokens.inc(len(output.events))

    def observe_token(self, stream, event: TokenEvent, now: float) -> None:
        """Before the stream records the token: the first token of the request gives TTFT, a later token of the
        same sample gives one inter-token latency."""
        if stream.first_token is None:
            self.ttft.observe(now - stream.arrival)
        elif event.sample_index in stream.last_token:
            self.itl.observe(now - stream.last_token[event.sample_index])

    def observe_finish(self, stream, completion: Completion, now: float) -> None:
        self.e2e.observe(now - stream.arrival)
        self.prompt_tokens.inc(len(completion.prompt_token_ids))
        self.success.labels(finished_reason=completion.finish_reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
