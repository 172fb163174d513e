"""Load benchmark of the OpenAI-compatible server: latency and throughput against request rate, continuous
batching against static batching, over loopback only.

For each batching mode the script starts `python -m decodelab.serve` on 127.0.0.1 (tiny-zh, `--max-num-seqs`
sequences, one engine thread) and sends it `--requests` streaming completions from an asyncio driver (httpx,
one connection per client), arriving as a Poisson process at each rate of `--rates` (requests/s; `burst` sends
them all at once: that many concurrent streaming clients). Prompts are 2-8 characters of toy-language sentences;
output lengths are heavy-tailed (Pareto, shape 1.5, from 8 tokens, at most 200; `ignore_eos` makes each request
generate exactly its length), sampled at temperature 0.8 with a seed per request. A workload seed (`--seeds`, default
0) fixes the prompts, the lengths and the arrival times; every mode and rate gets the same workload of a seed. With
several seeds the runs go seed by seed (all rates of seed 0, then of seed 1, ...), so a change in the machine's load
from other jobs spreads over the rates, and the JSON's "summary" gives, per mode and rate, the median and the
interquartile range over seeds of each latency percentile and of the throughput.

Per run: the machine's 1-minute load average just before it; requests completed, refused (503, queue full) and lost
(anything else: must be 0); p50 and p99 of TTFT (send to first streamed token) and of TPOT (time per output token
after the first, per request); normalized latency (end-to-end time / output tokens, the vLLM paper's Figure 12
measure); output tokens/s over the run. CPU figures: the server and the clients share this machine's cores.

    python benchmarks/load.py [--quick] [--rates 2,4,8,burst] [--requests N] [--seeds 0,1,2] [--out PATH]
    python benchmarks/load.py --base-url http://127.0.0.1:8000/v1 --model NAME   # a server already running

Prints a table and writes benchmarks/results/load.json. Taught in: chapters/07c-serving.ipynb
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import httpx
import numpy as np

from decodelab.serve import LocalServer
from decodelab.book.tables import Table
from decodelab.toy import ToyLanguage

RESULTS = Path(__file__).parent / "results" / "load.json"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
MIN_TOKENS, MAX_TOKENS, PARETO_SHAPE = 8, 200, 1.5
# the per-run figures the summary over seeds gives a median and interquartile range of
SUMMARIZED = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "normalized_latency_mean_s", "throughput_tok_s")


@dataclass(frozen=True)
class Request:
    index: int
    prompt: str
    max_tokens: int
    delay: float                 # seconds after the run starts


@dataclass
class Result:
    status: int | str            # HTTP status, or the exception's name
    sent: float
    first: float | None = None
    end: float | None = None
    tokens: int = 0


def workload(count: int, rate: float | None, seed: int = 0) -> list[Request]:
    """`count` requests, arriving as a Poisson process at `rate` per second (None: all at once)."""
    rng = np.random.default_rng(seed)
    sentences = ToyLanguage().sample(count, seed=seed)
    lengths = np.minimum(MAX_TOKENS, np.floor(MIN_TOKENS * (1 + rng.pareto(PARETO_SHAPE, count)))).astype(int)
    cuts = rng.integers(2, 9, count)
    gaps = rng.exponential(1 / rate, count) if rate else np.zeros(count)
    delays = np.cumsum(gaps) - (gaps[0] if rate else 0)
    return [Request(i, s[:min(int(c), len(s) - 1)], int(n), float(d))
            for i, (s, c, n, d) in enumerate(zip(sentences, cuts, lengths, delays))]


async def one(client: httpx.AsyncClient, url: str, model: str, request: Request, start: float) -> Result:
    await asyncio.sleep(max(0.0, start + request.delay - time.perf_counter()))
    body = {"model": model, "prompt": request.prompt, "max_tokens": request.max_tokens, "temperature": 0.8,
            "seed": request.index, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    result = Result("sent", time.perf_counter())
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                await response.aread()
                result.status = response.status_code
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and result.first is None:
                    result.first = time.perf_counter()
                if chunk.get("usage"):
                    result.tokens = chunk["usage"]["completion_tokens"]
            result.end = time.perf_counter()
            result.status = 200
    except (httpx.HTTPError, json.JSONDecodeError) as error:
        result.status = type(error).__name__
    return result


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


async def run(url: str, model: str, requests: list[Request], timeout: float) -> tuple[list[Result], float]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout)) as client:
        start = time.perf_counter()
        results = await asyncio.gather(*(one(client, url, model, r, start) for r in requests))
    return list(results), start


def summarize(requests: list[Request], results: list[Result], start: float) -> dict:
    done = [(q, r) for q, r in zip(requests, results) if r.status == 200 and r.tokens == q.max_tokens]
    refused = sum(r.status == 503 for r in results)
    ttft = [r.first - r.sent for _, r in done]
    tpot = [(r.end - r.first) / (r.tokens - 1) for _, r in done if r.tokens > 1]
    normalized = [(r.end - r.sent) / r.tokens for _, r in done]
    ends = [r.end for _, r in done]
    duration = max(ends) - start if ends else 0.0
    events = sorted([(r.sent, 1) for r in results] + [(r.end or r.sent, -1) for r in results])
    in_flight, peak = 0, 0
    for _, change in events:
        in_flight += change
        peak = max(peak, in_flight)
    tokens = sum(r.tokens for _, r in done)
    return {"requests": len(requests), "completed": len(done), "refused": refused,
            "lost": len(requests) - len(done) - refused, "peak_in_flight": peak,
            "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
            "tpot_p50_s": percentile(tpot, 50), "tpot_p99_s": percentile(tpot, 99),
            "normalized_latency_mean_s": statistics.fmean(normalized) if normalized else None,
            "output_tokens": tokens, "duration_s": duration,
            "throughput_tok_s": tokens / duration if duration else None,
            "statuses": sorted({str(r.status) for r in results})}


def ms(value: float | None) -> str:
    return "-" if value is None else f"{1000 * value:.0f}" if value >= 0.1 else f"{1000 * value:.1f}"


def table(runs: list[dict]) -> Table:
    rows = [[r["batching"], r["rate"], f"{r['completed']}/{r['requests']}", r["refused"], r["lost"],
             r["peak_in_flight"], ms(r["ttft_p50_s"]), ms(r["ttft_p99_s"]), ms(r["tpot_p50_s"]), ms(r["tpot_p99_s"]),
             ms(r["normalized_latency_mean_s"]), "-" if r["throughput_tok_s"] is None else f"{r['throughput_tok_s']:.0f}"]
            for r in runs]
    return Table(["batching", "rate req/s", "done", "503", "lost", "peak clients", "TTFT p50 ms", "TTFT p99 ms",
                  "TPOT p50 ms", "TPOT p99 ms", "norm. latency ms/tok", "tok/s"], rows)


def over_seeds(runs: list[dict]) -> list[dict]:
    """Per (batching, rate), in the order first run: the median, first and third quartile over seeds of each figure
    in SUMMARIZED (numpy's linear percentiles), and the requests completed, refused and lost over all seeds.

    >>> rows = over_seeds([{"batching": "continuous", "rate": 8.0, "seed": s, "requests": 2, "completed": 2,
    ...                     "refused": 0, "lost": 0, **dict.fromkeys(SUMMARIZED, float(s))} for s in range(5)])
    >>> rows[0]["seeds"], rows[0]["ttft_p99_s"]
    ([0, 1, 2, 3, 4], {'median': 2.0, 'q1': 1.0, 'q3': 3.0})
    """
    if not isinstance(runs, list) or not runs:
        raise ValueError(f"runs must be a non-empty list of run dicts, got {runs!r}")
    groups: dict[tuple, list[dict]] = {}
    for i, run in enumerate(runs):
        missing = {"batching", "rate", "seed", "requests", "completed", "refused", "lost", *SUMMARIZED} - set(run)
        if missing:
            raise ValueError(f"runs[{i}] lacks {sorted(missing)}")
        groups.setdefault((run["batching"], run["rate"]), []).append(run)
    rows = []
    for (mode, rate), group in groups.items():
        row = {"batching": mode, "rate": rate, "seeds": [r["seed"] for r in group]}
        for key in ("requests", "completed", "refused", "lost"):
            row[key] = sum(r[key] for r in group)
        for key in SUMMARIZED:
            values = [r[key] for r in group if r[key] is not None]
            q1, median, q3 = np.percentile(values, [25, 50, 75]) if values else (None, None, None)
            row[key] = None if not values else {"median": float(median), "q1": float(q1), "q3": float(q3)}
        rows.append(row)
    return rows


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise SystemExit(f"--seeds takes non-negative integers, comma-separated, got {text!r}") from None
    if any(seed < 0 for seed in seeds) or len(set(seeds)) != len(seeds):
        raise SystemExit(f"--seeds must be distinct non-negative integers, got {text!r}")
    return seeds


def parse_rates(text: str) -> list[float | None]:
    rates = []
    for part in text.split(","):
        if part.strip() == "burst":
            rates.append(None)
            continue
        try:
            value = float(part)
        except ValueError:
            raise SystemExit(f"--rates takes numbers (requests/s) or 'burst', got {part!r}") from None
        if not (value > 0 and math.isfinite(value)):
            raise SystemExit(f"--rates must be positive, got {part!r}")
        rates.append(value)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="continuous only, 200 burst clients and one rate")
    parser.add_argument("--rates", default="4,8,16,32,64,burst", help="requests/s, comma-separated; burst = at once")
    parser.add_argument("--requests", type=int, default=200, help="requests per run (default 200)")
    parser.add_argument("--seeds", default="0", help="workload seeds, comma-separated (default 0)")
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--batching", default="continuous,static", help="modes to run, comma-separated")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a client waits (default 300)")
    parser.add_argument("--base-url", help="a server already running on loopback (then --model names its model)")
    parser.add_argument("--model", default="tiny-zh")
    parser.add_argument("--out", type=Path, help="where the JSON goes (default results/load.json)")
    args = parser.parse_args()
    if args.requests < 1:
        raise SystemExit(f"--requests must be >= 1, got {args.requests}")
    if args.quick:
        args.rates, args.batching = "16,burst", "continuous"
    rates = parse_rates(args.rates)
    args.seed_list = parse_seeds(args.seeds)
    modes = [m.strip() for m in args.batching.split(",")]
    if not set(modes) <= {"continuous", "static"}:
        raise SystemExit(f"--batching takes continuous and/or static, got {args.batching!r}")
    if args.base_url and urlparse(args.base_url).hostname not in LOOPBACK:
        raise SystemExit(f"--base-url must be on loopback ({', '.join(sorted(LOOPBACK))}), got {args.base_url}")
    if args.base_url and len(modes) > 1:
        raise SystemExit("with --base-url there is one server: pass one --batching, the mode it runs")

    runs = []
    for mode in modes:
        if args.base_url:
            runs += measure(args.base_url, args.model, mode, rates, args)
            continue
        options = ["--model", args.model, "--max-num-seqs", str(args.max_num_seqs), "--batching", mode,
                   "--max-queue-len", str(max(256, 2 * args.requests)), "--threads", "1"]
        with LocalServer(*options) as server:
            runs += measure(server.base_url, args.model, mode, rates, args)
    print(table(runs))
    result = {"model": args.model, "quick": args.quick, "max_num_seqs": args.max_num_seqs,
              "requests_per_run": args.requests, "engine_threads": 1, "machine": platform.machine(),
              "processor": platform.processor() or platform.machine(), "python": sys.version.split()[0],
              "workload": {"prompt_chars": "2-8", "output_tokens": f"{MIN_TOKENS}*(1+Pareto({PARETO_SHAPE})), "
                                                                   f"at most {MAX_TOKENS}",
                           "temperature": 0.8, "seeds": args.seed_list},
              "summary": over_seeds(runs), "runs": runs}
    out = args.out or RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    lost = sum(r["lost"] for r in runs)
    if lost:
        raise SystemExit(f"{lost} requests were lost (neither completed nor refused with 503)")


def measure(base_url: str, model: str, mode: str, rates: list[float | None], args) -> list[dict]:
    runs = []
    requests_count = 200 if args.quick else args.requests
    for seed in args.seed_list:
        for rate in rates:
            count = requests_count if rate is None or not args.quick else 40
            requests = workload(count, rate, seed)
            load_before = os.getloadavg()[0]  # other jobs on the machine: what the run's figures shared it with
            results, start = asyncio.run(run(base_url + "/completions", model, requests, args.timeout))
            summary = summarize(requests, results, start)
            runs.append({"batching": mode, "rate": "burst" if rate is None else rate, "seed": seed,
                         "load_average_1min_before": load_before, **summary})
            print(f"{mode:10s} seed {seed} rate {runs[-1]['rate']}: {summary['completed']}/{count} done, "
                  f"{summary['refused']} refused, {summary['lost']} lost, {summary['duration_s']:.1f} s", flush=True)
    return runs


if __name__ == "__main__":
    main()
