"""What the draw of rows without a generator costs on the CPU, two ways, from the rows' probabilities `[B, V]`:
  exponential  `argmax(p / E)` with `E ~ Exponential(1)` over the whole batch, one `exponential_` call (what such
               rows drew before; seeded rows with a torch.Generator still draw this way, one call per row);
  uniform      one float64 uniform per row from one `torch.rand` call and the inverse CDF (a float64 cumulative sum
               and a search; `decodelab.sampling.sampler._rests` and `_draw_columns`, what such rows draw now on
               the CPU).
Both pick token i with probability p_i (the chi-square tests in tests/sampling/test_sampler.py). Also `exponential_`
alone, in nanoseconds per entry, and the uniforms alone.

With `--device cuda` the probabilities live on the GPU, each pass ends with a synchronisation, and the uniform draw is
what a counter stream's row costs there (its uniforms made on the host, `_draw_columns` with the guard pass a GPU's
parallel scan needs): the measurement that would decide whether unseeded rows off the CPU should take it too
(`scripts/gpu_check.sh` runs it).

For each vocabulary size (tiny-zh's 473, 32,000 and Qwen's 151,936) and batch size, the median over `--repeats`
passes of the mean over `--calls` draws, the two ways alternating pass by pass. One torch thread.

    python benchmarks/noise.py [--device cpu|cuda] [--vocab 473 32000 151936] [--rows 1 32] [--repeats 7]
                               [--calls 200] [--quick] [--out PATH]

`--quick` (a smoke run): vocabularies of 473 and 2,000, one pass of 5 draws.

Writes benchmarks/results/noise.json. Quoted in the README's "Unseeded rows by one uniform" section.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from decodelab.sampling.sampler import _draw_columns, _rests

RESULTS = Path(__file__).parent / "results" / "noise.json"


def exponential_race(probs: torch.Tensor) -> torch.Tensor:
    """The former route: Exponential(1) noise for every entry, one call for the batch, `argmax(p / E)`."""
    noise = torch.empty_like(probs).exponential_().clamp_min_(torch.finfo(probs.dtype).tiny)
    return (probs / noise).argmax(dim=-1)


def uniform_draw(probs: torch.Tensor) -> torch.Tensor:
    """The route now: one uniform per row from the global CPU RNG (the sampler's own `_rests`), the inverse CDF."""
    return _draw_columns(probs, _rests([None] * probs.shape[0]), normalized=True)


def per_call_us(call, calls: int, device: torch.device) -> float:
    """Mean microseconds of `calls` calls of `call()` (on a GPU, until its work is done)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    begin = time.perf_counter()
    for _ in range(calls):
        call()
    sync()
    return (time.perf_counter() - begin) / calls * 1e6


def measure(vocab: int, rows: int, repeats: int, calls: int, device: torch.device = torch.device("cpu")) -> dict:
    """Both draws and their noise alone on one `[rows, vocab]` batch of probabilities, alternating pass by pass."""
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(vocab + rows)) * 2
    probs = torch.softmax(logits.to(device), dim=-1)
    noise = torch.empty_like(probs)
    ways = {"exponential": lambda: exponential_race(probs), "uniform": lambda: uniform_draw(probs),
            "exponential_only": lambda: noise.exponential_(),
            "rand_only": lambda: torch.rand(rows, dtype=torch.float64)}
    for call in ways.values():
        per_call_us(call, 5, device)                                          # warm-up
    times = {name: [] for name in ways}
    for _ in range(repeats):
        for name, call in ways.items():
            times[name].append(per_call_us(call, calls, device))
    row = {"vocab": vocab, "rows": rows, **{f"{name}_us": statistics.median(t) for name, t in times.items()}}
    row["uniform_over_exponential"] = row["uniform_us"] / row["exponential_us"]
    row["exponential_ns_per_entry"] = row["exponential_only_us"] * 1e3 / (rows * vocab)
    return row


def sweep_parser(description: str, rows: list[int], out: Path) -> argparse.ArgumentParser:
    """The arguments of a sweep over vocabulary sizes and rows per draw, timed in passes of calls (this benchmark's
    and benchmarks/seeded_noise.py's)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--vocab", type=int, nargs="+", default=[473, 32000, 151936], help="vocabulary sizes")
    parser.add_argument("--rows", type=int, nargs="+", default=rows, help="rows per draw")
    parser.add_argument("--repeats", type=int, default=7, help="timed passes per way (the median is kept)")
    parser.add_argument("--calls", type=int, default=200, help="draws per pass")
    parser.add_argument("--quick", action="store_true", help="a smoke run: small vocabularies, one short pass")
    parser.add_argument("--out", type=Path, default=out)
    return parser


def parse_sweep(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """`parser`'s arguments, `--quick` applied and the sizes checked (a bad one exits with a usage error)."""
    args = parser.parse_args()
    if args.quick:
        args.vocab, args.repeats, args.calls = [473, 2000], 1, 5
    if min(args.vocab) < 2 or min(args.rows) < 1 or args.repeats < 1 or args.calls < 1:
        parser.error(f"--vocab must be >= 2 and --rows, --repeats, --calls >= 1, got {args.vocab}, {args.rows}, "
                     f"{args.repeats} and {args.calls}")
    return args


def main() -> None:
    parser = sweep_parser(__doc__.split("\n")[0], rows=[1, 32], out=RESULTS)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parse_sweep(parser)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU: torch.cuda.is_available() is False")
    device = torch.device(args.device)
    torch.set_num_threads(1)
    results = []
    print(f"{'V':>7} {'B':>4} {'exponential':>12} {'uniform':>9} {'ratio':>6} {'exponential_ alone':>19} "
          f"{'ns/entry':>8} {'rand alone':>10}")
    for vocab in args.vocab:
        for rows in args.rows:
            # the calls per pass shrink with the batch's size, so a pass over a large vocabulary stays short
            calls = max(1, min(args.calls, args.calls * 32 * 473 // (rows * vocab)))
            row = measure(vocab, rows, args.repeats, calls, device)
            results.append(row)
            print(f"{vocab:>7} {rows:>4} {row['exponential_us']:>10.1f}us {row['uniform_us']:>7.1f}us "
                  f"{row['uniform_over_exponential']:>6.3f} {row['exponential_only_us']:>17.1f}us "
                  f"{row['exponential_ns_per_entry']:>8.1f} {row['rand_only_us']:>8.1f}us")
    meta = {"date": datetime.date.today().isoformat(), "torch": torch.__version__, "machine": platform.machine(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": 1, "repeats": args.repeats,
            "calls": args.calls, "quick": args.quick, "device": args.device}
    if device.type == "cuda":
        meta["gpu"] = torch.cuda.get_device_name()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": results}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
