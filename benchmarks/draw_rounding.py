"""How often a CPU's float rounding changes the token a seeded draw picks: the inverse CDF of one uniform
(`rng="counter"`, and unseeded rows on the CPU) against the exponential race (`rng="torch"`), on the same logits.

The model's logits are not the same bits on every CPU: torch picks vectorised kernels by the CPU's capability (AVX2,
AVX-512, or the portable ones that `ATEN_CPU_CAPABILITY=default` forces), and they round differently. A seeded draw is a
function of the logits and of its random numbers, so a stored sampled text holds on a reader's CPU only if that
function does not move with the last bits. This measures how often it moves:

1. child processes compute tiny-zh-doc's logits at every position of the same `--docs` documents of the toy language
   (one forward per document, one thread), one per kernel set: the portable kernels, AVX2's (when the CPU has AVX2 and
   its own kernels are not already AVX2's: torch does not check the hardware when told `avx2`), and the CPU's own;
2. at each temperature, every row is drawn `--draws` times from each set's logits, with the same random numbers for
   every set. The inverse CDF as the library draws it (`counter_rng.inverse_cdf` on the float32 softmax, summed in
   float64) takes the first token whose running sum reaches 1 - u, u from the row's `CounterRNG`; the same from a
   float64 softmax, to see what that would buy; the race takes `argmax(p / E)` on the float32 softmax, with
   `E ~ Exponential(1)` over the vocabulary from one seeded `torch.Generator`. The two methods use different random
   numbers, so their flips are counted apart, not paired;
3. for each pair of kernel sets, a draw "flips" when the two sets' tokens differ: flips per million draws with
   Wilson's 95% interval (over the draws, for these documents), and the (row, draw) of each flip of the library's
   inverse CDF.

    python benchmarks/draw_rounding.py [--docs 40] [--draws 512] [--temperatures 1.0 2.0] [--quick] [--out PATH]

`--quick` (a smoke run): 2 documents, 4 draws per row. The defaults draw 3.4 million times per method, temperature and
kernel set (a few minutes; the JSON records the seconds). Writes benchmarks/results/draw-rounding.json
(draw-rounding-quick.json with `--quick`). Quoted in the README's "Why the default streams stay" section.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results" / "draw-rounding.json"
MODEL = "tiny-zh-doc"
INVERSE = "inverse CDF, as the library draws"          # float32 softmax, float64 running sum
INVERSE_64 = "inverse CDF from a float64 softmax"
RACE = "exponential race"


def wants_avx2() -> bool:
    """Whether to run an AVX2 child: the CPU has AVX2 (torch would not check, and AVX2 code on a CPU without it dies of
    an illegal instruction) and its own kernels are not AVX2's already."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx2" in flags and torch.backends.cpu.get_cpu_capability() != "AVX2"


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
    its `uniforms` `[n, K]` (float64 in [0, 1)): `[n, K]`. The sampler hands it the float32 softmax
    (`float64_softmax=False`)."""
    from decodelab.sampling.counter_rng import inverse_cdf

    probs = torch.softmax(z, dim=-1, dtype=torch.float64) if float64_softmax else torch.softmax(z, dim=-1)
    return torch.stack([inverse_cdf(probs, column) for column in uniforms.unbind(1)], dim=1)


def race_tokens(logits: dict[str, torch.Tensor], draws: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """`argmax(p / E)` of each row of every set's `[n, V]` logits for each of `draws` noise tensors
    `E ~ Exponential(1)` `[n, V]` (one seeded generator, made one at a time, the same for every set): `[n, draws]`
    each."""
    generator = torch.Generator().manual_seed(seed)
    probs = {name: torch.softmax(z, dim=-1) for name, z in logits.items()}
    noise = torch.empty_like(next(iter(probs.values())))
    tokens = {name: [] for name in logits}
    for _ in range(draws):
        noise.exponential_(generator=generator)
        for name, p in probs.items():
            tokens[name].append((p / noise).argmax(dim=-1))
    return {name: torch.stack(t, dim=1) for name, t in tokens.items()}


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
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        runs = [logits_on(c, args.docs, Path(folder)) for c in ("default", "avx2", None)
                if c != "avx2" or wants_avx2()]
    logits = {}
    for run in runs:
        logits.setdefault(run["capability"], run["logits"])   # the CPU's own kernels may be AVX2's: one set
    names = list(logits)
    pairs = [(x, y) for i, x in enumerate(names) for y in names[i + 1:]]
    rows, vocab = logits[names[0]].shape
    for x, y in pairs:
        differ = logits[x] != logits[y]
        print(f"{rows} positions x {vocab} logits: {differ.float().mean():.1%} differ between the {x} and {y} "
              f"kernels, by at most {(logits[x] - logits[y]).abs().max():.2e}")
    streams = [CounterRNG(row) for row in range(rows)]
    # each row's next `--draws` uniforms, float64 [rows, K]
    uniforms = torch.stack([torch.from_numpy(batch_uniforms(streams)) for _ in range(args.draws)], dim=1)
    results = []
    for temperature in args.temperatures:
        z = {name: x / temperature for name, x in logits.items()}   # the sampler's temperature: one float32 division
        tokens = {INVERSE: {name: inverse_cdf_tokens(x, uniforms, False) for name, x in z.items()},
                  INVERSE_64: {name: inverse_cdf_tokens(x, uniforms, True) for name, x in z.items()},
                  RACE: race_tokens(z, args.draws)}
        for x, y in pairs:
            flips = {method: by_set[x] != by_set[y] for method, by_set in tokens.items()}
            row = {"temperature": temperature, "kernels": [x, y],
                   **{method: share(int(f.sum()), rows * args.draws) for method, f in flips.items()},
                   "inverse_cdf_flips_at": flips[INVERSE].nonzero().tolist()}
            results.append(row)
            print(f"T = {temperature}, {x} vs {y}: {rows * args.draws:,} draws per method; flips, per million [95%]: "
                  + "; ".join(f"{method} {row[method]['flips']}: {row[method]['per_million']:.1f} "
                              f"[{row[method]['low_per_million']:.1f}, {row[method]['high_per_million']:.1f}]"
                              for method in flips))
    out = args.out or (RESULTS.with_name("draw-rounding-quick.json") if args.quick else RESULTS)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"started": started, "seconds": round(time.perf_counter() - began), "quick": args.quick, "model": MODEL,
            "docs": args.docs, "draws_per_row": args.draws, "positions": rows, "vocab": vocab, "kernels": names,
            "torch": torch.__version__,
            "logits_differing": {f"{x} vs {y}": float((logits[x] != logits[y]).float().mean()) for x, y in pairs},
            "max_abs_difference": {f"{x} vs {y}": float((logits[x] - logits[y]).abs().max()) for x, y in pairs}}
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
