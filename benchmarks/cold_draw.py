"""What the engine's draw costs right after the forward, beside the same draw run again at once: how much more a
step's calls cost on a CPU after the forward than warm.

An `Engine` on tiny-zh runs its requests into decode (temperature 1, `--rows` sequences running, each to its own
`max_tokens`). Then, on the plan of the first decode step that runs every row, each trial times the engine's draw
(`TokenDrawer.draw`: the rows' batch, the sampler, the tokens) twice, cold then warm:
  cold  just after `PagedLlama.execute` of the plan (the batch and the forward, timed apart), as in every engine step;
  warm  at once after that draw, with nothing between (what a loop timing the draw alone measures).
Each trial's two timings are a pair, so a drift in the machine's load falls on both. The draw advances the streams as
a step does (the engine does not step between trials: same rows, same logits); every other trial makes one more
untimed draw first, so a counter stream's refill (its hashing ahead, once per 32 to 256 draws) falls on cold and warm
draws alike. Beside them, one small tensor call (`logits.sum()` on a new forward's logits), timed the same two ways: a
call's fixed cost, cold and warm. That the difference is the caches refilled after the forward is the likely reading,
not a measurement (no cache counters are read).

Per setting (streams: "torch" seeded, a torch.Generator per row; "counter" seeded; "unseeded") and row count: the
median of each, the median of the paired ratios cold / warm with a percentile bootstrap 95% interval
(`benchmarks/ab.py`'s `median_interval`), and the median of `execute` (batch and forward) for scale. One torch
thread, CPU.

    python benchmarks/cold_draw.py [--rows 1 14 32] [--trials 500] [--settings torch counter unseeded] [--quick]
                                   [--out PATH]

`--quick` (a smoke run): 1 and 4 rows, 5 trials, whatever `--rows` and `--trials` say. The JSON's meta records the
run's start (UTC), the 1-minute load before and after, torch and the CPU count. Writes
benchmarks/results/cold-draw.json. Quoted in the README's "The draw after the forward" section.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import serving  # noqa: E402
from ab import median_interval  # noqa: E402
from decodelab.engine import Engine  # noqa: E402
from decodelab.engine.scheduler import StepKind  # noqa: E402
from decodelab.sampling import SamplingParams  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "cold-draw.json"
SETTINGS = {"torch": ("torch", True), "counter": ("counter", True), "unseeded": ("torch", False)}


def decode_state(model, rows: int, rng: str, seeded: bool):
    """An engine with `rows` sequences running in decode, and the plan of its first decode step that runs them all."""
    engine = Engine(model, block_size=16, max_num_seqs=rows, rng=rng)
    vocab = model.config.vocab_size
    for i in range(rows):
        prompt = [3 + (7 * i + j) % (vocab - 3) for j in range(12 + i % 5)]
        engine.add_request(prompt, SamplingParams(temperature=1.0, seed=i if seeded else None, max_tokens=200,
                                                  ignore_eos=True))
    for _ in range(rows + 50):            # prefills admit at least one request a step; then the first decode step
        out = engine.step()
        if out.kind is StepKind.DECODE and len(out.plan.scheduled) == rows:
            return engine, out.plan
    raise RuntimeError(f"{rows} sequences did not all reach decode together (the KV cache may not hold them)")


def measure(model, rows: int, rng: str, seeded: bool, trials: int) -> dict:
    engine, plan = decode_state(model, rows, rng, seeded)
    clock = time.perf_counter
    cold, warm, cold_call, warm_call, executes = [], [], [], [], []
    with torch.inference_mode():
        logits = engine.runner.execute(plan, engine.kv_cache)
        engine.drawer.draw(plan, logits)
        for trial in range(trials):
            if trial % 2:
                engine.drawer.draw(plan, logits)                             # untimed: refills fall on both sides
            begin = clock()
            logits = engine.runner.execute(plan, engine.kv_cache)            # the step's batch and forward
            executes.append(clock() - begin)
            begin = clock()
            engine.drawer.draw(plan, logits)                                 # cold
            cold.append(clock() - begin)
            begin = clock()
            engine.drawer.draw(plan, logits)                                 # warm: the same draw again at once
            warm.append(clock() - begin)
            logits = engine.runner.execute(plan, engine.kv_cache)
            begin = clock()
            logits.sum()                                                     # one tensor call, cold
            cold_call.append(clock() - begin)
            begin = clock()
            logits.sum()                                                     # and warm
            warm_call.append(clock() - begin)
    out = {"rows": rows, "rng": rng, "seeded": seeded, "trials": trials,
           "execute_us": statistics.median(executes) * 1e6}
    for name, after, again in (("draw", cold, warm), ("one_call", cold_call, warm_call)):
        ratio, low, high = median_interval([c / w for c, w in zip(after, again)])
        out[name] = {"cold_us": statistics.median(after) * 1e6, "warm_us": statistics.median(again) * 1e6,
                     "cold_over_warm": ratio, "interval_95": [low, high]}
    return out


def table(results: list[dict]) -> str:
    lines = ["| streams | rows | draw cold µs | draw warm µs | cold / warm [95%] | one call cold µs | warm µs | "
             "cold / warm [95%] | batch + forward µs |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        d, c = r["draw"], r["one_call"]
        lines.append(f"| {r['setting']} | {r['rows']} | {d['cold_us']:.1f} | {d['warm_us']:.1f} | "
                     f"{d['cold_over_warm']:.2f} [{d['interval_95'][0]:.2f}, {d['interval_95'][1]:.2f}] | "
                     f"{c['cold_us']:.1f} | {c['warm_us']:.1f} | "
                     f"{c['cold_over_warm']:.2f} [{c['interval_95'][0]:.2f}, {c['interval_95'][1]:.2f}] | "
                     f"{r['execute_us']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 14, 32],
                        help="sequences running (14: the serving workload's mean rows per step)")
    parser.add_argument("--trials", type=int, default=500, help="pairs of timings per setting and row count")
    parser.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 and 4 rows, 5 trials")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.rows, args.trials = [1, 4], 5
    if args.trials < 2:
        parser.error(f"--trials must be at least 2 (the interval needs two pairs), got {args.trials}")
    if min(args.rows) < 1:
        parser.error(f"--rows must each be at least 1, got {args.rows}")
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    load_before = os.getloadavg()[0]
    torch.set_num_threads(1)
    model, name = serving.load("cpu")
    results = []
    for setting in args.settings:
        rng, seeded = SETTINGS[setting]
        for rows in args.rows:
            result = measure(model, rows, rng, seeded, args.trials)
            results.append({"setting": setting, **result})
            print(f"{setting}, {rows} rows: draw {result['draw']['cold_us']:.1f} us cold, "
                  f"{result['draw']['warm_us']:.1f} us warm", flush=True)
    print(table(results))
    meta = {"model": name, "threads": 1, "device": "cpu", "quick": args.quick, "trials": args.trials,
            "date": datetime.date.today().isoformat(), "started": started,
            "load_1min": {"before": load_before, "after": os.getloadavg()[0]},
            "library_commit": serving.library_commit(), "torch": torch.__version__, "machine": platform.machine(),
            "cpus": os.cpu_count(), "command": "python benchmarks/cold_draw.py " + " ".join(sys.argv[1:])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
