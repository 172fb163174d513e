"""Chapter 03's table in the spirit of Holtzman et al. (2020), Table 1, measured on the toy language.

Draw `--n` sentences from the true language; each one's first two characters are a prompt and its rest is the
"human" continuation. Every decoding strategy continues every prompt once; each row reports repetition, distinct-2,
self-BLEU, perplexity under tiny-zh (with a bootstrap 95% interval), the true log-probability per token and the
validity under the grammar. Takes a few minutes on a CPU, so chapter 03 reads the committed JSON.

    python scripts/strategy_table.py                 # writes chapters/data/strategy_table.json
    python scripts/strategy_table.py --n 200 --out /tmp/table.json

Taught in: chapters/03-strategies.ipynb
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from decodelab import metrics
from decodelab.beam import beam_search
from decodelab.generate import generate
from decodelab.models import load_model
from decodelab.sampling import SamplingParams
from decodelab.toylang import ToyLanguage

OUT = Path(__file__).resolve().parents[1] / "chapters" / "data" / "strategy_table.json"
PROMPT_CHARS = 2
MAX_TOKENS = 40
NUM_BEAMS = 8
HUMAN_SEED = 2024
# (row name, SamplingParams fields); None marks beam search
STRATEGIES: list[tuple[str, dict | None]] = [
    ("greedy", {"temperature": 0.0}),
    (f"beam search (b={NUM_BEAMS})", None),
    ("pure sampling", {}),
    ("temperature 0.7", {"temperature": 0.7}),
    ("top-k (k=10)", {"top_k": 10}),
    ("top-k (k=40)", {"top_k": 40}),
    ("top-p (p=0.95)", {"top_p": 0.95}),
    ("min-p (0.1)", {"min_p": 0.1}),
    ("typical (0.95)", {"typical_p": 0.95}),
]


def beam_continuations(model, tokenizer, prompts: list[str]) -> tuple[list[str], list[bool]]:
    """Beam search once per distinct prompt (the result depends on the prompt only)."""
    done: dict[str, tuple[str, bool]] = {}
    for prompt in dict.fromkeys(prompts):
        result = beam_search(model, tokenizer(prompt)["input_ids"], num_beams=NUM_BEAMS, max_tokens=MAX_TOKENS,
                             eos_token_id=tokenizer.eos_token_id)
        ended = bool(result.token_ids) and result.token_ids[-1] == tokenizer.eos_token_id
        done[prompt] = (tokenizer.decode(result.token_ids, skip_special_tokens=True), ended)
    return [done[p][0] for p in prompts], [done[p][1] for p in prompts]


def sampled_continuations(model, tokenizer, prompts: list[str], fields: dict) -> tuple[list[str], list[bool]]:
    """One continuation per prompt; row i has seed i, so a row's text does not depend on the batch."""
    params = [SamplingParams(max_tokens=MAX_TOKENS, seed=i, **fields) for i in range(len(prompts))]
    out = []
    for start in range(0, len(prompts), 500):
        out += generate(model, tokenizer, prompts[start:start + 500], params[start:start + 500])
    return [c.text for c in out], [c.finish_reason == "stop" for c in out]


def perplexity_interval(model, tokenizer, prompts, continuations, ended, draws: int = 200) -> list[float]:
    """A bootstrap 95% interval of the model perplexity, resampling whole texts."""
    scores = metrics.continuation_log_probs(model, tokenizer, prompts, continuations, ended)
    log_probs = np.array([s.log_prob for s in scores])
    tokens = np.array([s.num_tokens for s in scores])
    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(scores), size=(draws, len(scores)))
    values = np.exp(-log_probs[picks].sum(axis=1) / tokens[picks].sum(axis=1))
    return [round(float(v), 4) for v in np.percentile(values, [2.5, 97.5])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="number of prompts (and human continuations)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--model", default="tiny-zh", help="tiny-zh (default) or a local model directory")
    args = parser.parse_args()
    if args.n < 2:
        raise SystemExit(f"--n must be >= 2, got {args.n}")
    torch.set_num_threads(1)  # small batches: a second thread only adds contention
    model, tokenizer = load_model(args.model, device="cpu")
    lang = ToyLanguage()
    human = lang.sample(args.n, seed=HUMAN_SEED)
    prompts = [h[:PROMPT_CHARS] for h in human]
    rows = [("human (true language)", None, [h[PROMPT_CHARS:] for h in human], [True] * args.n)]
    for name, fields in STRATEGIES:
        texts, ended = (beam_continuations(model, tokenizer, prompts) if fields is None
                        else sampled_continuations(model, tokenizer, prompts, fields))
        rows.append((name, fields, texts, ended))
        print(f"generated: {name}", flush=True)
    table = []
    for name, fields, texts, ended in rows:
        stats = metrics.text_stats(model, tokenizer, lang, prompts, texts, ended)
        row = {"name": name, "params": fields if fields is not None else (
            {"num_beams": NUM_BEAMS} if name.startswith("beam") else None)}
        row.update({k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(stats).items()})
        row["model_perplexity_95"] = perplexity_interval(model, tokenizer, prompts, texts, ended)
        row["examples"] = [p + t for p, t in zip(prompts[:4], texts[:4])]
        table.append(row)
        print(f"{name:24s} rep {stats.repetition_rate:6.2%}  distinct-2 {stats.distinct_2:.3f}  "
              f"self-BLEU {stats.self_bleu:.3f}  PPL {stats.model_perplexity:.3f} {row['model_perplexity_95']}  "
              f"true logP/token {stats.true_log_prob_per_token:.3f}  valid {stats.validity:6.2%}", flush=True)
    config = {"model": args.model, "n": args.n, "prompt_chars": PROMPT_CHARS, "max_tokens": MAX_TOKENS, "human_seed": HUMAN_SEED,
              "sampling_seeds": "row i uses seed i", "entropy_rate": round(lang.entropy_rate(), 4),
              "command": "python scripts/strategy_table.py"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": config, "rows": table}, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
