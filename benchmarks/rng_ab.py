"""A/B of the engine's random streams: `Engine(rng="torch")` (a torch.Generator per seeded request, Exponential(1)
noise over the vocabulary for every random row) against `Engine(rng="counter")` (one hashed uniform per row, inverse
CDF; `decodelab.sampling.counter_rng`), on the same code and the same requests, alternating within each pair.

The measure is `benchmarks/serving.py`'s engine overhead (`run_overhead`: wall time against the time inside the
model's forward, and the engine's microseconds per step beside it) on its 64-request short workload, tiny-zh, at
most 32 running sequences (`--batch`: 1 measures a step's fixed cost), temperature 1: seeded (each request its own
stream), unseeded, and seeded on the wider random Llama (512 wide, 8 layers, 25M parameters; `--no-wide` skips it).
Pair i runs torch then counter when i is even, counter then torch when odd, so a drift in the machine's load falls on
both. Per measure the JSON holds every run,
the medians, the paired ratios counter / torch, their median and a percentile bootstrap 95% interval
(`benchmarks/ab.py`'s `median_interval`); every pair keeps the 1-minute load before it, and the meta the run's start
(UTC) and library commit: on a shared VM the same code's medians drift between runs minutes apart (the README's
"The draw after the forward" section), so a run is read with its time and load.

    python benchmarks/rng_ab.py [--pairs 7] [--no-wide] [--batch 32] [--out PATH]

It ends by printing issue 31's three targets for the engine's own cost (`TARGETS`: tiny-zh seeded at most 1.10x its
forward, unseeded at most 300 us per step, the 25M model at most 1.02x) with each stream's median and whether it
meets them; the JSON keeps them under "targets".

Writes benchmarks/results/rng-ab.json (rng-ab-batch-N.json for another `--batch`, so that the quoted 32-sequence run is
kept). Quoted in the README's "Counter-based streams" section.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import serving  # noqa: E402
from ab import median_interval  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "rng-ab.json"
MEASURES = ("wall_over_forward", "overhead_us_per_step", "forward_us_per_step")


def summarize(runs: list[dict]) -> dict:
    """Medians per side and the paired ratio counter / torch with its interval, for every measure."""
    out = {}
    for measure in MEASURES:
        torch_side = [r["torch"][measure] for r in runs]
        counter_side = [r["counter"][measure] for r in runs]
        median, low, high = median_interval([c / t for c, t in zip(counter_side, torch_side)])
        out[measure] = {"torch_median": statistics.median(torch_side),
                        "counter_median": statistics.median(counter_side),
                        "counter_over_torch": median, "interval_95": [low, high]}
    out["sample_share"] = {side: statistics.median(r[side]["shares"]["sample"] for r in runs)
                           for side in ("torch", "counter")}
    out["noise_share"] = {side: statistics.median(r[side]["shares"]["sample: noise"] for r in runs)
                          for side in ("torch", "counter")}
    return out


# issue 31's targets for the engine's own cost, on this workload: (setting, measure, bound, what it says)
TARGETS = (("seeded", "wall_over_forward", 1.10, "tiny-zh, seeded T=1: wall / forward <= 1.10x"),
           ("unseeded", "overhead_us_per_step", 300.0, "tiny-zh, unseeded: engine overhead <= 300 us per step"),
           ("seeded, random Llama 512 x 8 (25M)", "wall_over_forward", 1.02,
            "25M-parameter random Llama, seeded: wall / forward <= 1.02x"))


def targets(results: dict) -> list[dict]:
    """Each target with both streams' medians and whether each meets it (a setting that did not run is left out)."""
    out = []
    for setting, measure, bound, label in TARGETS:
        if setting not in results:
            continue
        summary = results[setting]["summary"][measure]
        out.append({"target": label, "setting": setting, "measure": measure, "bound": bound,
                    **{rng: {"median": summary[f"{rng}_median"], "met": summary[f"{rng}_median"] <= bound}
                       for rng in ("torch", "counter")}})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=7, help="alternating torch/counter pairs per setting")
    parser.add_argument("--no-wide", action="store_true", help="skip the 25M-parameter random Llama")
    parser.add_argument("--batch", type=int, default=32,
                        help="running sequences at most (the targets are for 32; 1 measures the fixed cost of a step)")
    parser.add_argument("--out", type=Path, help="where the JSON goes (default results/rng-ab.json; "
                                                  "rng-ab-batch-N.json for another --batch)")
    args = parser.parse_args()
    if args.batch < 1:
        raise SystemExit(f"--batch must be at least 1, got {args.batch}")
    if args.pairs < 2:
        raise SystemExit(f"--pairs must be at least 2, got {args.pairs}")
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, model_name = serving.load("cpu")
    requests = serving.workload(64, model.config.vocab_size, model.config.max_position_embeddings, 0)
    settings = {"seeded": (model, True), "unseeded": (model, False)}
    if not args.no_wide:
        settings["seeded, random Llama 512 x 8 (25M)"] = (serving.wider(model, 512, 8), True)
    serving.run_overhead(model, requests[:8], args.batch, rng="counter")     # warm-up
    results = {}
    for name, (m, seeded) in settings.items():
        runs = []
        for i in range(args.pairs):
            order = ("torch", "counter") if i % 2 == 0 else ("counter", "torch")
            run = {"load_1min": os.getloadavg()[0]}
            for rng in order:
                run[rng] = serving.run_overhead(m, requests, args.batch, seeded=seeded, rng=rng)
            runs.append(run)
            print(f"{name} pair {i}: torch {run['torch']['wall_over_forward']:.3f}x "
                  f"({run['torch']['overhead_us_per_step']:.0f} us/step), counter "
                  f"{run['counter']['wall_over_forward']:.3f}x ({run['counter']['overhead_us_per_step']:.0f} us/step)",
                  flush=True)
        results[name] = {"summary": summarize(runs), "runs": runs}
    for name, result in results.items():
        s = result["summary"]
        w, o = s["wall_over_forward"], s["overhead_us_per_step"]
        print(f"{name}: wall/forward torch {w['torch_median']:.3f}x, counter {w['counter_median']:.3f}x, counter/torch "
              f"{w['counter_over_torch']:.3f} [{w['interval_95'][0]:.3f}, {w['interval_95'][1]:.3f}]; "
              f"overhead per step {o['torch_median']:.0f} -> {o['counter_median']:.0f} us, counter/torch "
              f"{o['counter_over_torch']:.2f} [{o['interval_95'][0]:.2f}, {o['interval_95'][1]:.2f}]")
    checked = targets(results) if args.batch == 32 else []     # the targets are for 32 running sequences
    for t in checked:
        unit = " us" if t["measure"] == "overhead_us_per_step" else "x"
        print(f"target: {t['target']}: " + ", ".join(
            f"{rng} {t[rng]['median']:.3f}{unit} ({'met' if t[rng]['met'] else 'not met'})" for rng in ("torch", "counter")))
    meta = {"model": model_name, "date": datetime.date.today().isoformat(), "started": started,
            "library_commit": serving.library_commit(), "pairs": args.pairs,
            "torch": torch.__version__, "machine": platform.machine(), "cpus": os.cpu_count(), "threads": 1,
            "batch": args.batch,
            "workload": f"benchmarks/serving.py's 64 short requests, at most {args.batch} running, temperature 1"}
    out = args.out or (RESULTS if args.batch == 32 else RESULTS.with_name(f"rng-ab-batch-{args.batch}.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "settings": results, "targets": checked}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
