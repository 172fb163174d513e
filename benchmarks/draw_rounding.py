"""How often a CPU's float rounding changes the token a seeded draw picks: the exponential race (`rng="torch"`) against
the inverse CDF of one uniform (`rng="counter"`, and unseeded rows on the CPU), on the same logits and the same random
numbers.

The model's logits are not the same bits on every CPU: torch picks vectorised kernels by the CPU's capability (AVX2,
AVX-512, or the portable ones that `ATEN_CPU_CAPABILITY=default` forces), and they round differently. A seeded draw is a
function of the logits and of its random numbers, so a stored sampled text holds on a reader's CPU only if that
function does not move with the last bits. This measures how often it moves:

1. two child processes, one with `ATEN_CPU_CAPABILITY=default` and one on the CPU's own kernels, compute tiny-zh-doc's
   logits at every position of the same `--docs` documents of the toy language (one forward per document, one thread);
2. at each temperature, every row is drawn `--draws` times from each process's logits, with the same random numbers
   for both: the inverse CDF takes the first token whose cumulative probability (softmax in float64, then a float64
   running sum) reaches 1 - u, u from the row's `CounterRNG`; the race takes `argmax(p / E)` with the float32 softmax
   and `E ~ Exponential(1)` over the vocabulary from one seeded `torch.Generator` (as the sampler draws them). The
   inverse CDF is also drawn from the float32 softmax (summed in float64), to see what computing it in float64 buys;
3. a draw "flips" when the two processes' tokens differ. The report gives flips per million draws with Wilson's 95%
   interval, and the paired count of draws where one method flips and the other does not.

    python benchmarks/draw_rounding.py [--docs 40] [--draws 512] [--temperatures 1.0 2.0] [--quick] [--out PATH]

`--quick` (a smoke run): 2 documents, 4 draws per row. About 1.5 minutes at the defaults (3.4 million draws per
method and temperature). Writes benchmarks/results/draw-rounding.json (draw-rounding-quick.json with `--quick`).
Quoted in the README's "Why the default streams stay" section.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

RESULTS = Path(__file__).parent / "results" / "draw-rounding.json"
MODEL = "tiny-zh-doc"


def child_logits(docs: int, out: Path) -> None:
    """In this process's kernels: the model's logits at every position of `docs` documents, `[rows, V]` float32."""
    from decodelab.models import load_model
    from decodelab.toy import DocumentLanguage

    torch.set_num_threads(1)
    model, tokenizer = load_model(MODEL, device="cpu")
    context = model.config.max_position_embeddings
    rows = []
    with torch.no_grad():
        for text in DocumentLanguage().sample(docs, seed=0):
            ids = tokenizer(text)["input_ids"][:context]
            rows.append(model(torch.tensor([ids])).logits[0].float())
    torch.save({"logits": torch.cat(rows), "capability": torch.backends.cpu.get_cpu_capability()}, out)


def logits_on(capability: str | None, docs: int, folder: Path) -> dict:
    """Run `child_logits` in a child process with ATEN_CPU_CAPABILITY=`capability` (None: the CPU's own kernels)."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    if capability is not None:
        env["ATEN_CPU_CAPABILITY"] = capability
    out = folder / f"logits-{capability or 'native'}.pt"
    subprocess.run([sys.executable, __file__, "--child", str(out), "--docs", str(docs)], env=env, check=True)
    return torch.load(out)


def inverse_cdf_tokens(z: torch.Tensor, uniforms: torch.Tensor, float64_softmax: bool) -> torch.Tensor:
    """The token the library's inverse CDF (`counter_rng.inverse_cdf`) picks in each row of `z` `[n, V]` for each of
    its `uniforms` `[n, K]` (float64 in [0, 1)): `[n, K]`."""
    from decodelab.sampling.counter_rng import inverse_cdf

    probs = torch.softmax(z, dim=-1, dtype=torch.float64) if float64_softmax else torch.softmax(z, dim=-1)
    return torch.stack([inverse_cdf(probs, column) for column in uniforms.unbind(1)], dim=1)


def race_flips(za: torch.Tensor, zb: torch.Tensor, draws: int, seed: int = 0) -> torch.Tensor:
    """Whether `argmax(p / E)` differs between the rows of `za` and `zb` `[n, V]` for each of `draws` noise tensors
    `E ~ Exponential(1)` `[n, V]` (one seeded generator; made one at a time, the same for both): bool `[n, draws]`."""
    generator = torch.Generator().manual_seed(seed)
    pa, pb = torch.softmax(za, dim=-1), torch.softmax(zb, dim=-1)
    noise = torch.empty_like(pa)
    flips = []
    for _ in range(draws):
        noise.exponential_(generator=generator)
        flips.append((pa / noise).argmax(dim=-1) != (pb / noise).argmax(dim=-1))
    return torch.stack(flips, dim=1)


def share(flips: int, draws: int) -> dict:
    from decodelab.measure.constrained import wilson_interval

    rate = wilson_interval(flips, draws)
    return {"flips": flips, "draws": draws, "per_million": rate.value * 1e6, "low_per_million": rate.low * 1e6,
            "high_per_million": rate.high * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=40, help="documents of the toy language (default 40)")
    parser.add_argument("--draws", type=int, default=512, help="draws per row and method (default 512)")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 2.0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 documents, 4 draws per row")
    parser.add_argument("--out", type=Path, help="where the JSON goes (default results/draw-rounding.json)")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.docs < 1 or args.draws < 1:
        parser.error(f"--docs and --draws must be at least 1, got {args.docs} and {args.draws}")
    if any(not t > 0 for t in args.temperatures):
        parser.error(f"--temperatures must be positive, got {args.temperatures}")
    if args.quick:
        args.docs, args.draws = 2, 4
    if args.child:
        child_logits(args.docs, args.child)
        return
    from decodelab.sampling.counter_rng import CounterRNG, batch_uniforms

    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory() as folder:
        portable, native = (logits_on(c, args.docs, Path(folder)) for c in ("default", None))
    a, b = portable["logits"], native["logits"]
    rows, vocab = a.shape
    differ = (a != b)
    print(f"{rows} positions x {vocab} logits: {differ.float().mean():.1%} differ between the {portable['capability']}"
          f" and {native['capability']} kernels, by at most {(a - b).abs().max():.2e}")
    streams = [CounterRNG(row) for row in range(rows)]
    # each row's next `--draws` uniforms, float64 [rows, K]
    uniforms = torch.stack([torch.from_numpy(batch_uniforms(streams)) for _ in range(args.draws)], dim=1)
    results = []
    for temperature in args.temperatures:
        za, zb = a / temperature, b / temperature       # the sampler's temperature: one float32 division
        flips = {name: inverse_cdf_tokens(za, uniforms, wide) != inverse_cdf_tokens(zb, uniforms, wide)
                 for name, wide in (("inverse CDF, float64 softmax", True), ("inverse CDF, float32 softmax", False))}
        flips["exponential race"] = race_flips(za, zb, args.draws)
        one, race = flips["inverse CDF, float64 softmax"], flips["exponential race"]
        row = {"temperature": temperature,
               **{name: share(int(f.sum()), rows * args.draws) for name, f in flips.items()},
               "inverse_only": int((one & ~race).sum()), "race_only": int((race & ~one).sum())}
        results.append(row)
        print(f"T = {temperature}: {rows * args.draws:,} draws per method; flips, per million [95%]: " + "; ".join(
            f"{name} {row[name]['flips']}: {row[name]['per_million']:.1f} [{row[name]['low_per_million']:.1f}, "
            f"{row[name]['high_per_million']:.1f}]" for name in flips)
              + f"; only the inverse CDF {row['inverse_only']}, only the race {row['race_only']}")
    out = args.out or (RESULTS.with_name("draw-rounding-quick.json") if args.quick else RESULTS)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"started": started, "quick": args.quick, "model": MODEL, "docs": args.docs, "draws_per_row": args.draws,
            "positions": rows, "vocab": vocab, "kernels": [portable["capability"], native["capability"]],
            "torch": torch.__version__,
            "logits_differing": float(differ.float().mean()), "max_abs_difference": float((a - b).abs().max())}
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
