"""Paged against slab reservation (one extent of consecutive slots per request) under one KV memory cap: admitted concurrency, throughput, and where the
memory goes (the PagedAttention paper's Figure 2 split), measured on the same engine, scheduler and model.

Workload: 64 requests on the shipped tiny-zh-doc (context 512). Each prompt is the first k characters of a document
of the toy language (k log-normal, median 16); each request sets its own `max_tokens` (log-normal, median 256, as
clients pick limits), samples at temperature 1 with its own seed and stops at EOS, so most outputs end well before
their limit. Memory cap: 128 blocks x 16 slots = 2,048 token slots of K/V for every layout:

  - paged (block 16): blocks on demand, preemption by recompute when they run out (vLLM's policy);
  - slab, prompt + max_tokens: one extent reserved at admission, first fit in a slab of 2,048 slots;
  - slab, max_model_len: one extent of 512 slots per request.

Every step records, as shares of the 2,048 slots: slots holding a token's K/V; for slab extents, reserved slots
that the request will still write (reserved for later) and those it never writes (over-reserved, known once it
ends); for paged blocks, the unwritten tail of each sequence's last block (internal fragmentation); free slots in
gaps too short for the request waiting at the head of the queue (external fragmentation); other free slots.

Each layout runs `--repeats` times (the fastest run's time is kept; the tokens must be equal every time); the time
spent inside the model's forward is measured too, so the engine's own overhead (scheduler, sampler) shows.

    .venv/bin/python scripts/ch07_slab.py                # writes chapters/data/07-slab.json (about 1 min)

Taught in: chapters/07-paged-attention.ipynb
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from decodelab.engine import Engine
from decodelab.models import load_model
from decodelab.sampling import SamplingParams
from decodelab.toy import DocumentLanguage
from provenance import stamp  # scripts/provenance.py: the command and library commit

OUT = Path(__file__).resolve().parent.parent / "chapters" / "data" / "07-slab.json"
LAYOUTS = {"paged": ("paged", "max_tokens"), "slab, prompt + max_tokens": ("slab", "max_tokens"),
           "slab, max_model_len": ("slab", "max_model_len")}
PARTS = ("live", "reserved_later", "over_reserved", "internal", "external", "free")


def workload(tokenizer, num_requests: int, seed: int, max_len: int) -> tuple[list[list[int]], list[SamplingParams]]:
    rng = np.random.default_rng(seed)
    documents = DocumentLanguage().sample(num_requests, seed=seed)
    prompt_chars = np.clip(rng.lognormal(np.log(16), 0.8, num_requests), 2, 96).astype(int)
    limits = np.clip(rng.lognormal(np.log(256), 0.4, num_requests), 64, 448).astype(int)
    prompts = [tokenizer(doc[:k]).input_ids for doc, k in zip(documents, prompt_chars)]
    params = [SamplingParams(temperature=1.0, seed=seed + i, max_tokens=int(min(m, max_len - len(p))))
              for i, (p, m) in enumerate(zip(prompts, limits))]
    return prompts, params


def measure(model, prompts, params, kv_layout: str, reserve: str, num_blocks: int, block_size: int) -> dict:
    engine = Engine(model, block_size=block_size, num_blocks=num_blocks, max_num_seqs=64,
                    enable_prefix_caching=False, kv_layout=kv_layout, reserve=reserve)
    cap = num_blocks * block_size
    for prompt, p in zip(prompts, params):
        engine.add_request(prompt, p)
    forward, forward_seconds = engine.runner.forward, [0.0]

    def timed_forward(*args, **kwargs):
        begin = time.perf_counter()
        logits = forward(*args, **kwargs)
        forward_seconds[0] += time.perf_counter() - begin
        return logits

    engine.runner.forward = timed_forward
    steps, holdings = [], []          # per step: counters; (seq_id, reserved, written) of every holder
    done = {}
    start = time.perf_counter()
    while engine.has_unfinished():
        out = engine.step()
        done |= {c.request_id: c for c in out.finished}
        running = engine.scheduler.running
        waiting = engine.scheduler.waiting
        if kv_layout == "slab":
            head = waiting[0].table.size if waiting else None
            external = engine.pool.external_fragmentation(head) if head else 0
            holdings.append([(s.seq_id, s.table.size, s.table.num_tokens) for s in running])
        else:
            # any free block serves any request: free paged memory is never externally fragmented
            external = 0
            holdings.append([])
        steps.append({"seconds": time.perf_counter() - start, "kind": out.kind, "running": len(running),
                      "waiting": len(waiting), "live": engine.pool.filled_slots(),
                      "held": engine.pool.num_used_blocks * engine.block_size, "external": external})
    seconds = time.perf_counter() - start
    final = {}                        # seq_id -> slots it had written when it finished
    for step in holdings:
        for seq_id, _, written in step:
            final[seq_id] = max(final.get(seq_id, 0), written)
    for step, held in zip(steps, holdings):
        later = sum(final[s] - written for s, _, written in held)
        if kv_layout == "slab":
            step["reserved_later"], step["internal"] = later, 0
            step["over_reserved"] = step["held"] - step["live"] - later
        else:
            step["reserved_later"], step["over_reserved"] = 0, 0
            step["internal"] = step["held"] - step["live"]
        step["free"] = cap - step["held"] - step["external"]
    completions = [done[r] for r in sorted(done)]
    generated = sum(len(c.token_ids) for c in completions)
    share = {part: float(np.mean([s[part] for s in steps])) / cap for part in PARTS}
    every = -(-len(steps) // 400)                 # the stored trace: at most 400 steps, as columns
    trace = {key: [s[key] for s in steps[::every]] for key in ("running", "waiting", *PARTS)}
    trace["seconds"] = [round(s["seconds"], 3) for s in steps[::every]]
    trace["step"] = list(range(1, len(steps) + 1))[::every]
    return {"steps": len(steps), "seconds": seconds, "forward_seconds": forward_seconds[0],
            "generated_tokens": generated, "tokens_per_s": generated / seconds,
            "preemptions": engine.stats.preemptions, "prefill_tokens": engine.stats.prefill_tokens,
            "mean_running": float(np.mean([s["running"] for s in steps])),
            "max_running": max(s["running"] for s in steps), "share_of_cap": share,
            "trace": trace, "tokens": [c.token_ids for c in completions]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-zh-doc")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--num-blocks", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    model, tokenizer = load_model(args.model, device="cpu")
    prompts, params = workload(tokenizer, args.requests, args.seed, model.config.max_position_embeddings)
    Engine(model, max_num_seqs=4).generate(prompts[:4], [SamplingParams(max_tokens=4)] * 4)   # warm-up
    results = {}
    for name, (layout, reserve) in LAYOUTS.items():
        runs = [measure(model, prompts, params, layout, reserve, args.num_blocks, args.block_size)
                for _ in range(args.repeats)]
        assert all(r["tokens"] == runs[0]["tokens"] for r in runs), "seeded runs must repeat exactly"
        results[name] = r = min(runs, key=lambda r: r["seconds"])
        print(f"{name:32s} steps {r['steps']:5d}  {r['tokens_per_s']:7.1f} tok/s  running mean {r['mean_running']:5.2f} "
              f"max {r['max_running']:3d}  forward {r['forward_seconds'] / r['seconds']:.0%}  preemptions {r['preemptions']:3d}  " +
              "  ".join(f"{p} {v:.1%}" for p, v in r["share_of_cap"].items()), flush=True)
    tokens = [r.pop("tokens") for r in results.values()]
    result = {"command": "python scripts/ch07_slab.py", "model": args.model, "device": "cpu", "threads": 1,
              "torch": torch.__version__, "machine": platform.machine(), "requests": args.requests,
              "seed": args.seed, "repeats": args.repeats, "num_blocks": args.num_blocks, "block_size": args.block_size,
              "cap_slots": args.num_blocks * args.block_size, "max_model_len": model.config.max_position_embeddings,
              "prompt_tokens": [len(p) for p in prompts], "max_tokens": [p.max_tokens for p in params],
              "output_tokens": [len(t) for t in tokens[0]], "same_tokens": all(t == tokens[0] for t in tokens),
              "load_average_before": [round(x, 2) for x in load_before],
              "load_average_after": [round(x, 2) for x in os.getloadavg()], "layouts": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = stamp(result, result["command"])
    args.out.write_text(json.dumps(result, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"same tokens in every layout: {result['same_tokens']}; wrote {args.out}")


if __name__ == "__main__":
    main()
