"""Chapter 03's beam baseline: beam search against greedy and sampling on 400 short prompts, scored by the true
language, written to chapters/data/03-beam-baseline.json (about 1 minute on the 2-core course machine).

    .venv/bin/python scripts/ch03_beam_baseline.py [--prompts 400]

Prompts: the first 1-6 characters of toy-language sentences (`ToyLanguage().sample(4000, seed=303)`, the cut drawn
with `random.Random(303)`, shorter than the sentence), distinct, in the order drawn. Each strategy finishes each
prompt once with tiny-zh, at most 40 tokens: greedy (temperature 0), beam search with b = 4 and b = 8 (length
penalty 1, as chapter 03's cells), and pure sampling at T = 1 (prompt i gets seed i). Scores, from `ToyLanguage`:

- valid: the output ends with the end token and prompt + output is a sentence of the language (Wilson 95% interval);
- true log P per token: log P(output + end | prompt) / (characters + 1), averaged over the prompts where every
  strategy's output is valid (percentile bootstrap over prompts, 2000 resamples, seed 0); and the same log P
  unnormalised (per output), the quantity the truth's most probable continuation maximises;
- mode: whether the output is the truth's most probable continuation (`ToyLanguage.most_probable_continuations`),
  over the prompts where that continuation is unique (its log P above the runner-up's by more than 1e-9);
  an invalid output counts as a miss (Wilson interval).

Differences between two strategies are paired: the same prompts, bootstrap over prompts
(`decodelab.measure.snowball.paired_mean_difference`, 2000 resamples, seed 0). The equivalence margins were fixed
before the run, in this docstring: 0.02 nats per token for true log P per token (a sentence of about 12 characters
and its end then moves by about 0.26 nats, a likelihood ratio of 1.3) and 5 percentage points for the mode rate.
A difference whose whole interval lies inside the margin is reported as no effect larger than the margin.

Taught in: chapters/03-strategies.ipynb
"""
from __future__ import annotations

import argparse
import math
import random
import time
from pathlib import Path

import torch

from provenance import write

from decodelab.decoding import beam_search, generate
from decodelab.measure.best_of_n import bootstrap_mean
from decodelab.measure.constrained import wilson_interval
from decodelab.measure.scoring import true_log_prob
from decodelab.measure.snowball import paired_mean_difference
from decodelab.models import load_model
from decodelab.sampling import SamplingParams
from decodelab.toy import ToyLanguage

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "chapters" / "data" / "03-beam-baseline.json"
SEED, MAX_TOKENS, TIE = 303, 40, 1e-9
MARGINS = {"log_prob_per_token": 0.02, "mode": 0.05}
PAIRS = [("beam (b=4)", "greedy"), ("beam (b=8)", "greedy"), ("beam (b=8)", "beam (b=4)"),
         ("greedy", "sampling (T=1)"), ("beam (b=4)", "sampling (T=1)")]


def short_prompts(language: ToyLanguage, count: int) -> list[str]:
    """`count` distinct prompts: the first 1-6 characters of sentences of the language, in the order drawn."""
    rng = random.Random(SEED)
    prompts: dict[str, None] = {}
    for sentence in language.sample(4000, seed=SEED):
        cut = rng.randint(1, 6)
        if cut < len(sentence):
            prompts.setdefault(sentence[:cut])
        if len(prompts) == count:
            return list(prompts)
    raise ValueError(f"only {len(prompts)} distinct prompts in 4000 sentences, asked for {count}")


def interval(value: float, low: float, high: float, **extra) -> dict:
    return {"value": value, "low": low, "high": high, **extra}


def share(successes: int, trials: int) -> dict:
    """successes / trials with Wilson's 95% interval, and both counts."""
    rate = wilson_interval(successes, trials)
    return interval(rate.value, rate.low, rate.high, count=successes, n=trials)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=400, help="distinct short prompts (default 400, at least 300)")
    args = parser.parse_args()
    if args.prompts < 300:
        parser.error(f"--prompts must be at least 300, got {args.prompts}")
    torch.set_num_threads(1)
    start = time.perf_counter()
    language = ToyLanguage()
    model, tokenizer = load_model("tiny-zh", device="cpu")
    prompts = short_prompts(language, args.prompts)
    eos = tokenizer.eos_token_id

    outputs: dict[str, list[tuple[str, bool]]] = {}  # strategy -> (text, ended on the end token) per prompt
    greedy = generate(model, tokenizer, prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    outputs["greedy"] = [(c.text, c.finish_reason == "stop") for c in greedy]
    for beams in (4, 8):
        rows = []
        for prompt in prompts:
            result = beam_search(model, tokenizer(prompt)["input_ids"], num_beams=beams, max_tokens=MAX_TOKENS,
                                 eos_token_id=eos)
            rows.append((tokenizer.decode(result.token_ids, skip_special_tokens=True),
                         bool(result.token_ids) and result.token_ids[-1] == eos))
        outputs[f"beam (b={beams})"] = rows
    sampled = generate(model, tokenizer, prompts,
                       [SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS, seed=i) for i in range(len(prompts))])
    outputs["sampling (T=1)"] = [(c.text, c.finish_reason == "stop") for c in sampled]

    modes = [language.most_probable_continuations(prompt, k=2) for prompt in prompts]
    unique = [len(m) == 1 or m[0][1] - m[1][1] > TIE for m in modes]
    log_probs = {name: [true_log_prob(language, prompt, text) if ended else -math.inf
                        for prompt, (text, ended) in zip(prompts, rows)] for name, rows in outputs.items()}
    per_token = {name: [lp / (len(text) + 1) for lp, (text, _) in zip(lps, outputs[name])]
                 for name, lps in log_probs.items()}
    per_token["truth's most probable"] = [m[0][1] / (len(m[0][0]) + 1) for m in modes]
    log_probs["truth's most probable"] = [m[0][1] for m in modes]
    all_valid = [i for i in range(len(prompts)) if all(math.isfinite(log_probs[name][i]) for name in outputs)]
    hits = {name: [float(text == modes[i][0][0] and ended) for i, (text, ended) in enumerate(rows) if unique[i]]
            for name, rows in outputs.items()}

    table = {}
    for name in [*outputs, "truth's most probable"]:
        values = [per_token[name][i] for i in all_valid]
        row = {"log_prob_per_token": interval(*bootstrap_mean(values), n=len(values)),
               "log_prob": interval(*bootstrap_mean([log_probs[name][i] for i in all_valid]), n=len(values))}
        if name in outputs:
            valid = sum(math.isfinite(lp) for lp in log_probs[name])
            row["valid"] = share(valid, len(prompts))
            hit = int(sum(hits[name]))
            row["mode"] = share(hit, len(hits[name]))
        table[name] = row
    paired = []
    for a, b in PAIRS:
        lp = paired_mean_difference([per_token[a][i] for i in all_valid], [per_token[b][i] for i in all_valid])
        total = paired_mean_difference([log_probs[a][i] for i in all_valid], [log_probs[b][i] for i in all_valid])
        mode = paired_mean_difference(hits[a], hits[b])
        paired.append({"a": a, "b": b, "log_prob_per_token": lp, "log_prob": total, "mode": mode,
                       "differ": sum(x != y for x, y in zip(outputs[a], outputs[b]))})
    examples = [{"prompt": prompts[i], "truth_mode": modes[i][0][0], "unique": unique[i],
                 **{name: outputs[name][i][0] for name in outputs}} for i in range(8)]
    seconds = time.perf_counter() - start
    write(OUT, {
        "model": "tiny-zh (shipped)", "device": "cpu", "threads": 1, "num_prompts": len(prompts),
        "prompt_chars": "1-6", "seed": SEED, "max_tokens": MAX_TOKENS, "tie_tolerance": TIE, "margins": MARGINS,
        "all_valid_prompts": len(all_valid), "unique_mode_prompts": sum(unique), "table": table, "paired": paired,
        "examples": examples, "seconds": seconds,
        "per_prompt": [{"prompt": p, "truth_mode": modes[i][0][0], "unique": unique[i],
                        **{name: outputs[name][i][0] for name in outputs}} for i, p in enumerate(prompts)],
    }, "python scripts/ch03_beam_baseline.py")
    for name, row in table.items():
        extra = "" if name not in outputs else (f"  valid {row['valid']['value']:.3f}  mode {row['mode']['count']}/"
                                                f"{row['mode']['n']}")
        lp = row["log_prob_per_token"]
        print(f"{name:<22} logP/tok {lp['value']:.4f} [{lp['low']:.4f}, {lp['high']:.4f}]  "
              f"logP {row['log_prob']['value']:.3f}{extra}")
    for pair in paired:
        lp, mode = pair["log_prob_per_token"], pair["mode"]
        total = pair["log_prob"]
        print(f"{pair['a']} - {pair['b']}: logP/tok {lp['value']:+.4f} [{lp['low']:+.4f}, {lp['high']:+.4f}], "
              f"logP {total['value']:+.3f} [{total['low']:+.3f}, {total['high']:+.3f}], "
              f"mode {mode['value']:+.3f} [{mode['low']:+.3f}, {mode['high']:+.3f}], {pair['differ']} outputs differ")
    print(f"{seconds:.0f} s")


if __name__ == "__main__":
    main()
