"""KV memory saved by sharing the prompt among n parallel samples, on workloads with long outputs, next to the
PagedAttention paper's 6.1-9.8% for parallel sampling and 37.6-55.2% for beam search.

Each step of the paged engine records the blocks in use and the blocks the same sequences would hold without sharing
(each sequence's own block table length, summed); the saving is 1 - used / unshared over all steps of the run.
Workloads on tiny-zh-doc (context 512), 16 requests each, temperature 1, seeded:
  - "document starts": prompts of 4-40 characters of a toy-language document, outputs until EOS (about 140 tokens);
  - "long prompts": 256-token prompts (three documents in a row, cut), 192 output tokens each (`ignore_eos`).

    .venv/bin/python scripts/ch07_sharing.py             # writes chapters/data/07-sharing.json

Beam search (widths 2, 4, 6) runs on the same prompts with `decodelab.decoding.beam` (a contiguous cache, as transformers),
and its family tree is replayed through a real block pool (`decodelab.measure.beam_sharing`): blocks held with sharing
against the same beams each on its own, summed over every forward.

    .venv/bin/python scripts/ch07_sharing.py --only beam    # recompute the beam rows, keep the sampling rows
Taught in: chapters/07-paged-attention.ipynb
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import torch

from decodelab.decoding import beam_search
from decodelab.measure.beam_sharing import beam_blocks
from decodelab.engine import Engine
from decodelab.models import load_model
from decodelab.sampling import SamplingParams
from decodelab.toy import DocumentLanguage
from provenance import stamp  # scripts/provenance.py: the command and library commit

OUT = Path(__file__).resolve().parent.parent / "chapters" / "data" / "07-sharing.json"


def workloads(tokenizer, num_requests: int, seed: int) -> dict[str, list[tuple[list[int], int, bool]]]:
    """name -> (prompt ids, max_tokens, ignore_eos) per request."""
    rng = np.random.default_rng(seed)
    documents = DocumentLanguage().sample(4 * num_requests, seed=seed)
    starts = [(tokenizer(doc[:int(k)]).input_ids, 320, False)
              for doc, k in zip(documents, rng.integers(4, 41, num_requests))]
    # three documents in a row, cut at 256 tokens (one document is about 150-200)
    long_docs = [tokenizer("".join(documents[3 * i:3 * i + 3])).input_ids[:256] for i in range(num_requests)]
    return {"document starts": starts, "long prompts": [(ids, 192, True) for ids in long_docs]}


def saving(model, requests, n: int, seed: int) -> dict:
    engine = Engine(model, block_size=16, num_blocks=4096, max_num_seqs=256, enable_prefix_caching=False)
    for i, (prompt, max_tokens, ignore_eos) in enumerate(requests):
        engine.add_request(prompt, SamplingParams(temperature=1.0, seed=seed + 100 * i, n=n, max_tokens=max_tokens,
                                                  ignore_eos=ignore_eos))
    used = unshared = 0
    done = {}
    while engine.has_unfinished():
        done |= {c.request_id: c for c in engine.step().finished}
        used += engine.pool.num_used_blocks
        unshared += sum(len(v.block_ids) for v in engine.sequences() if v.status == "running")
    completions = [done[r] for r in sorted(done)]
    outputs = [len(s.token_ids) for c in completions for s in (c.samples or (c,))]
    return {"n": n, "saving": 1 - used / unshared, "mean_output_tokens": float(np.mean(outputs))}


def beam_saving(model, requests, num_beams: int, eos_token_id: int) -> dict:
    shared = alone = 0
    outputs = []
    for prompt, max_tokens, ignore_eos in requests:
        result = beam_search(model, prompt, num_beams=num_beams, max_tokens=max_tokens,
                             eos_token_id=None if ignore_eos else eos_token_id)
        held = beam_blocks(len(prompt), result.steps, num_beams, block_size=16)
        shared += sum(s for s, _ in held)
        alone += sum(a for _, a in held)
        outputs.append(len(result.token_ids))
    return {"num_beams": num_beams, "saving": 1 - shared / alone, "mean_output_tokens": float(np.mean(outputs))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--only", choices=["sampling", "beam"], help="recompute one part, keep the other's rows")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tokenizer = load_model("tiny-zh-doc", device="cpu")
    result = {"command": "python scripts/ch07_sharing.py", "model": "tiny-zh-doc", "requests": args.requests,
              "seed": args.seed, "block_size": 16, "paper_parallel_sampling": [0.061, 0.098],
              "paper_beam_search": [0.376, 0.552],
              "load_average_before": [round(x, 2) for x in os.getloadavg()], "workloads": {}, "beam_search": {}}
    if args.only and args.out.exists():
        kept = json.loads(args.out.read_text(encoding="utf-8"))
        result["workloads"], result["beam_search"] = kept.get("workloads", {}), kept.get("beam_search", {})
    for name, requests in workloads(tokenizer, args.requests, args.seed).items():
        mean_prompt = float(np.mean([len(p) for p, _, _ in requests]))
        if args.only != "beam":
            rows = [saving(model, requests, n, args.seed) for n in (2, 4, 6)]
            result["workloads"][name] = {"mean_prompt_tokens": mean_prompt, "rows": rows}
            for row in rows:
                print(f"{name:16s} n={row['n']}  saving {row['saving']:.1%}  "
                      f"mean output {row['mean_output_tokens']:.1f}", flush=True)
        if args.only != "sampling":
            rows = [beam_saving(model, requests, b, tokenizer.eos_token_id) for b in (2, 4, 6)]
            result["beam_search"][name] = {"mean_prompt_tokens": mean_prompt, "rows": rows}
            for row in rows:
                print(f"{name:16s} beams={row['num_beams']}  saving {row['saving']:.1%}  "
                      f"mean output {row['mean_output_tokens']:.1f}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = stamp(result, result["command"])
    args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
