"""A/B of one benchmark between two commits: each side runs from its own copy of the repository, in alternation
(before, after, before, after, ...), and the JSON keeps every run's figures and the median paired ratio.

    python benchmarks/ab.py --before REF [--after REF] [--repeats 5] --name NAME \
        --metric LABEL=PATH [--metric ...] -- benchmarks/serving.py --quick

Each side is `git archive REF` unpacked into a temporary folder (`--after` defaults to HEAD); the benchmark script
named after `--` runs there with that side's `lib/` on PYTHONPATH, one venv for both, and `--out FILE` appended. The
script is each side's own version of it, so a benchmark whose output changed between the commits still runs. Runs
alternate, so a change in the load of a shared machine falls on both sides of a pair; the 1-minute load average is
recorded before every run.

A metric PATH walks the benchmark's JSON: keys separated by "/", and a list picked by the element whose fields match,
`rows[scenario=top-p 0.9, sigma 3 (LM-shaped);B=64]/fast_vs_transformers`. Per metric the JSON holds each side's
values (in run order) and their medians, the paired ratios after/before of the same repeat, their median and a
percentile bootstrap 95% interval of that median over repeats (2,000 resamples, seed 0).

Writes benchmarks/results/NAME.json. Used for the README's "The decodelab III redesign, A/B" section.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def resolve(ref: str, repo: Path = ROOT) -> str:
    """The full commit id of `ref`; a ValueError naming it when git does not know it."""
    found = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd=repo,
                           capture_output=True, text=True)
    if found.returncode != 0:
        raise ValueError(f"not a commit of this repository: {ref!r}")
    return found.stdout.strip()


def unpack(commit: str, into: Path, repo: Path = ROOT) -> Path:
    """`git archive commit` unpacked into a new folder under `into` (no .git: nothing of it can move HEAD)."""
    folder = into / commit[:12]
    folder.mkdir()
    archive = subprocess.run(["git", "archive", commit], cwd=repo, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def pick(data, path: str):
    """The value at `path` in `data` ("a/b[k=v;k2=v2]/c"); a KeyError naming the step that matched nothing."""
    for step in path.split("/"):
        key, _, where = step.partition("[")
        if key not in data:
            raise KeyError(f"{path!r}: no key {key!r} (have {sorted(data)})")
        data = data[key]
        if where:
            wanted = dict(condition.split("=", 1) for condition in where.rstrip("]").split(";"))
            matches = [item for item in data if all(str(item.get(k)) == v for k, v in wanted.items())]
            if len(matches) != 1:
                raise KeyError(f"{path!r}: {len(matches)} elements of {key!r} match {wanted}, expected exactly 1")
            data = matches[0]
    if not isinstance(data, (int, float)) or isinstance(data, bool):
        raise KeyError(f"{path!r} is not a number: {data!r}")
    return float(data)


def median_interval(values: list[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(median, low, high): the median of `values` and a percentile bootstrap 95% interval of it over the values."""
    if len(values) < 2:
        raise ValueError(f"values must hold at least 2 repeats, got {len(values)}")
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return statistics.median(values), medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def parse_metric(text: str) -> tuple[str, str]:
    label, sep, path = text.partition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"--metric must be LABEL=PATH, got {text!r}")
    return label, path


def summarize(before: list[dict], after: list[dict], metrics: list[tuple[str, str]]) -> dict:
    """Per metric: each side's values, the paired ratios after/before, their median and its interval."""
    summary = {}
    for label, path in metrics:
        old = [pick(run, path) for run in before]
        new = [pick(run, path) for run in after]
        ratios = [n / o for o, n in zip(old, new)]
        median, low, high = median_interval(ratios)
        summary[label] = {"path": path, "before": old, "after": new, "median_before": statistics.median(old),
                          "median_after": statistics.median(new), "ratio_after_over_before": ratios,
                          "median_ratio": median, "interval_95": [low, high]}
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the commit the A side runs")
    parser.add_argument("--after", default="HEAD", help="the commit the B side runs (default HEAD)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per side, alternating (at least 2)")
    parser.add_argument("--name", required=True, help="the result is benchmarks/results/NAME.json")
    parser.add_argument("--repo", type=Path, default=ROOT, help="the repository (default: this one)")
    parser.add_argument("--metric", type=parse_metric, action="append", required=True, help="LABEL=PATH, repeatable")
    parser.add_argument("benchmark", nargs=argparse.REMAINDER, help="-- script.py [its arguments]")
    args = parser.parse_args()
    benchmark = args.benchmark[1:] if args.benchmark[:1] == ["--"] else args.benchmark
    if not benchmark or not benchmark[0].endswith(".py"):
        parser.error(f"give the benchmark after --, e.g. -- benchmarks/serving.py --quick; got {benchmark!r}")
    if args.repeats < 2:
        parser.error(f"--repeats must be at least 2 (a paired interval needs them), got {args.repeats}")
    try:
        sides = {"before": resolve(args.before, args.repo), "after": resolve(args.after, args.repo)}
    except ValueError as error:
        parser.error(str(error))
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    loads: dict[str, list[float]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="ab-") as tmp:
        if sides["before"] == sides["after"]:
            parser.error(f"--before and --after name the same commit {sides['before'][:12]}")
        folders = {side: unpack(commit, Path(tmp), args.repo) for side, commit in sides.items()}
        for repeat in range(args.repeats):
            for side in ("before", "after"):
                out = Path(tmp) / f"{side}-{repeat}.json"
                env = {**os.environ, "PYTHONPATH": str(folders[side] / "lib"), "HF_HUB_OFFLINE": "1"}
                loads[side].append(round(os.getloadavg()[0], 2))
                print(f"[{repeat + 1}/{args.repeats}] {side} {sides[side][:12]}: {shlex.join(benchmark)}", flush=True)
                subprocess.run([sys.executable, *benchmark, "--out", str(out)], cwd=folders[side], env=env,
                               check=True, stdout=subprocess.DEVNULL)
                runs[side].append(json.loads(out.read_text(encoding="utf-8")))
    summary = summarize(runs["before"], runs["after"], args.metric)
    command = "python benchmarks/ab.py " + shlex.join(
        ["--before", args.before, "--after", args.after, "--repeats", str(args.repeats), "--name", args.name,
         *[part for label, path in args.metric for part in ("--metric", f"{label}={path}")], "--", *benchmark])
    result = {"command": command, "before": sides["before"], "after": sides["after"],
              "date": datetime.date.today().isoformat(),
              "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                          "load_average_1min_before_each_run": loads},
              "metrics": summary}
    path = args.repo / "benchmarks" / "results" / f"{args.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    width = max(len(label) for label in summary)
    for label, m in summary.items():
        print(f"{label:<{width}}  before {m['median_before']:.3f}  after {m['median_after']:.3f}"
              f"  after/before {m['median_ratio']:.3f} [{m['interval_95'][0]:.3f}, {m['interval_95'][1]:.3f}]")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
