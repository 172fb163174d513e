"""What a seeded batch's Exponential(1) noise costs on the CPU, two ways, with one torch.Generator per row:
  exponential  `exponential_(generator=g)` row by row (what every seeded row drew before
               `decodelab.sampling.ops.exponential`, and what a group drawing fewer than `MIN_ENTRIES` entries still
               does);
  batched      `exponential_noise`: each row's uniforms by `uniform_(generator=g)` in float64, one logarithm for the
               batch, rounded to float32 exactly as `exponential_` rounds.
Both give the same numbers and leave each generator in the same state: every pass compares them and the JSON counts
the entries that differ (0 is the only right answer).

For each vocabulary size (tiny-zh's 473, 32,000 and Qwen's 151,936) and number of seeded rows (1 to 32; tiny-zh's
serving workload draws 13.7 rows per step on average), the median over `--repeats` passes of the mean over `--calls`
draws (`calls_per_pass`: fewer for large batches, so a pass stays short), the two ways alternating pass by pass, one
torch thread. The sampler takes the batched way from `MIN_ENTRIES` entries (rows x vocabulary); the JSON lists the
settings where that choice took the slower way. It also counts, on a million entries, how often torch's vectorised
log1p differs in the double from the C library's, and by how many ulps at most (`log1p_last_bit`).

    python benchmarks/seeded_noise.py [--vocab 473 32000 151936] [--rows 1 2 3 4 8 14 32] [--repeats 7]
                                      [--calls 200] [--quick] [--out PATH]

`--quick` (a smoke run): vocabularies of 473 and 2,000, one pass of 5 draws.

Writes benchmarks/results/seeded-noise.json. Quoted in the README's "Seeded noise by uniforms" section.
"""
from __future__ import annotations

import datetime
import json
import platform
import statistics
from pathlib import Path

import torch

from decodelab.sampling.ops.exponential import MIN_ENTRIES, exponential_noise
from noise import parse_sweep, per_call_us, sweep_parser  # benchmarks/noise.py: the same sweep, timed the same way

RESULTS = Path(__file__).parent / "results" / "seeded-noise.json"


def row_by_row(generators: list[torch.Generator], vocab: int) -> torch.Tensor:
    """The former way: `exponential_` on each row with its own generator."""
    noise = torch.empty(len(generators), vocab)
    for row, g in zip(noise.unbind(0), generators):
        row.exponential_(generator=g)
    return noise


def measure(vocab: int, rows: int, repeats: int, calls: int) -> dict:
    """Both ways on `rows` generators (seeds 0..rows-1, one set per way, so each way's streams advance alike),
    alternating pass by pass; each pass first checks that the two give the same numbers."""
    streams = {way: [torch.Generator().manual_seed(j) for j in range(rows)] for way in ("exponential", "batched")}
    ways = {"exponential": lambda: row_by_row(streams["exponential"], vocab),
            "batched": lambda: exponential_noise(streams["batched"], [vocab] * rows, (rows, vocab))}
    times = {way: [] for way in ways}
    differing = 0
    for _ in range(repeats + 1):                        # the first pass warms up and is not kept
        differing += int((ways["exponential"]() != ways["batched"]()).sum())
        for way, call in ways.items():
            times[way].append(per_call_us(call, calls, torch.device("cpu")))
    row = {"vocab": vocab, "rows": rows, "calls_per_pass": calls,
           **{f"{way}_us": statistics.median(t[1:]) for way, t in times.items()},
           "entries_compared": (repeats + 1) * rows * vocab, "entries_differing": differing}
    row["batched_over_exponential"] = row["batched_us"] / row["exponential_us"]
    return row


def last_bit_differences(entries: int = 1_000_000) -> dict:
    """How often torch's vectorised -log1p(-u) (what the batched way computes) differs in the double from the C
    library's (float64 `exponential_`, the serial kernel), and by how many ulps at most: the differences the
    batched way's recomputation next to float32 midpoints exists for."""
    g, h = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    reference = torch.empty(entries, dtype=torch.float64).exponential_(generator=g)
    vectorised = torch.empty(entries, dtype=torch.float64).uniform_(generator=h).neg_().log1p_().neg_()
    ulps = (vectorised.view(torch.int64) - reference.view(torch.int64)).abs()
    return {"entries": entries, "share_differing": float((ulps != 0).double().mean()), "max_ulps": int(ulps.max())}


def main() -> None:
    args = parse_sweep(sweep_parser(__doc__.split("\n")[0], rows=[1, 2, 3, 4, 8, 14, 32], out=RESULTS))
    torch.set_num_threads(1)
    results = []
    print(f"{'V':>7} {'rows':>4} {'exponential_':>13} {'batched':>10} {'ratio':>6} {'differing':>9}")
    for vocab in args.vocab:
        for rows in args.rows:
            calls = max(1, min(args.calls, args.calls * 32 * 473 // (rows * vocab)))   # passes stay short
            row = measure(vocab, rows, args.repeats, calls)
            results.append(row)
            print(f"{vocab:>7} {rows:>4} {row['exponential_us']:>11.1f}us {row['batched_us']:>8.1f}us "
                  f"{row['batched_over_exponential']:>6.3f} {row['entries_differing']:>9}")
    bits = last_bit_differences(100_000 if args.quick else 1_000_000)
    print(f"vectorised log1p against the C library's: {bits['share_differing']:.1%} of {bits['entries']:,} doubles "
          f"differ, by at most {bits['max_ulps']} ulp(s)")
    # where the sampler's rule (batched from MIN_ENTRIES entries) took the slower of the two ways
    slower = [[r["vocab"], r["rows"]] for r in results
              if (r["rows"] * r["vocab"] >= MIN_ENTRIES) != (r["batched_over_exponential"] < 1)]
    meta = {"date": datetime.date.today().isoformat(), "torch": torch.__version__, "machine": platform.machine(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": 1, "repeats": args.repeats,
            "calls": args.calls, "quick": args.quick, "min_entries": MIN_ENTRIES, "rule_took_the_slower_way": slower,
            "log1p_last_bit": bits}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": results}, indent=1) + "\n")
    print(f"MIN_ENTRIES = {MIN_ENTRIES}; the rule took the slower way at (vocab, rows): {slower or 'none'}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
