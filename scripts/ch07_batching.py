"""Continuous against static batching on the shipped tiny-zh model: tokens/s, engine steps, latency in steps.

Static batching: requests are cut into batches of `batch_size`; a batch starts when the previous one has finished
(the slowest request holds the whole batch). Continuous batching: one Engine with `max_num_seqs = batch_size`,
a finished request's place is taken by the next waiting one at the next step. Same requests, same seeds, so both
generate exactly the same tokens; only the schedule differs.

    .venv/bin/python scripts/ch07_batching.py            # writes chapters/data/07-batching.json

Taught in: chapters/07-paged-attention.ipynb
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from decodelab.engine import Engine
from decodelab.models import load_model
from decodelab.sampling import SamplingParams
from decodelab.toy import ToyLanguage
from provenance import stamp  # scripts/provenance.py: the command and library commit

OUT = Path(__file__).resolve().parent.parent / "chapters" / "data" / "07-batching.json"


def workload(num_requests: int, seed: int) -> tuple[list[str], list[SamplingParams]]:
    """Prompts of 2 characters from the toy language; output lengths drawn from 8..128 (most short, a few long,
    as in chat traffic) and forced with `ignore_eos`, as load tests do; seeded sampling at T = 1."""
    texts = ToyLanguage().sample(num_requests, seed=seed)
    prompts = [t[:2] for t in texts]
    gen = torch.Generator().manual_seed(seed)
    lengths = (8 * torch.exp(torch.rand(num_requests, generator=gen) * torch.log(torch.tensor(16.0)))).long()
    params = [SamplingParams(temperature=1.0, seed=seed + i, max_tokens=int(n), ignore_eos=True)
              for i, n in enumerate(lengths)]
    return prompts, params


def run(model, tokenizer, prompts, params, batch_size: int, continuous: bool) -> dict:
    """One timed run; returns tokens, steps, wall time and each request's finish step."""
    finish_step: dict[int, int] = {}
    tokens: dict[int, list[int]] = {}
    steps = 0
    start = time.perf_counter()
    engine = Engine(model, tokenizer, block_size=16, max_num_seqs=batch_size)
    groups = [list(range(len(prompts)))] if continuous else \
        [list(range(i, min(i + batch_size, len(prompts)))) for i in range(0, len(prompts), batch_size)]
    for group in groups:
        ids = {engine.add_request(prompts[i], params[i]): i for i in group}
        while engine.has_unfinished():
            output = engine.step()
            steps += 1
            for done in output.finished:
                finish_step[ids[done.request_id]] = steps
                tokens[ids[done.request_id]] = done.token_ids
    seconds = time.perf_counter() - start
    generated = sum(len(t) for t in tokens.values())
    return {"steps": steps, "seconds": seconds, "generated_tokens": generated, "tokens_per_s": generated / seconds,
            "mean_finish_step": sum(finish_step.values()) / len(finish_step),
            "tokens": [tokens[i] for i in range(len(prompts))]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-zh")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steadier on a shared machine)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model, device=args.device)
    prompts, params = workload(args.requests, args.seed)
    rows = []
    for batch_size in args.batch_sizes:
        for continuous in (False, True):
            runs = [run(model, tokenizer, prompts, params, batch_size, continuous) for _ in range(args.repeats)]
            best = min(runs, key=lambda r: r["seconds"])
            assert all(r["tokens"] == best["tokens"] for r in runs), "seeded runs must repeat exactly"
            rows.append({"batch_size": batch_size, "schedule": "continuous" if continuous else "static",
                         **{k: v for k, v in best.items() if k != "tokens"}, "tokens": best["tokens"]})
            print(f"B={batch_size:3d} {rows[-1]['schedule']:10s} steps={best['steps']:4d} "
                  f"tokens={best['generated_tokens']:5d} {best['tokens_per_s']:8.1f} tok/s "
                  f"mean finish step {best['mean_finish_step']:.1f}")
    for batch_size in args.batch_sizes:
        static, continuous = [r for r in rows if r["batch_size"] == batch_size]
        assert static["tokens"] == continuous["tokens"], "both schedules must generate the same tokens"
    for row in rows:
        del row["tokens"]
    result = {"command": "python scripts/ch07_batching.py", "model": args.model, "device": args.device,
              "torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
              "requests": args.requests, "seed": args.seed, "max_tokens": [p.max_tokens for p in params], "repeats": args.repeats, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = stamp(result, result["command"])
    args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
