"""Constrained decoding benchmark: validity, the distortion against the model's conditional and the truth, and the
cost of a mask per step.

Model: the shipped tiny-zh (single sentences), prompt "" (the whole sentence is generated), fixed seeds. Grammars:

  - toy: the toy language's own automaton (`ToyLanguageGrammar`), at T = 1 and at T = 2 (a deliberately weak sampler:
    chapter 05 measured 8% valid sentences at T = 2);
  - city: the regex `[^。！？]{0,15}北京[^。！？]{0,15}[。！？]` (a sentence that names 北京) compiled by llguidance;
  - form: the regex `(小明|小红)(喜欢吃北京烤鸭|坐(飞机|火车)去北京)。`, six strings, enumerated exactly.

It reports:

  - validity: the share of constrained samples that are whole strings of the grammar (100% by construction, when they
    end before max_tokens) against unconstrained samples of the same sampler, with Wilson 95% intervals; for the regexes
    also the share that the toy language calls a sentence at all (the truth, outside the regex); the mean length in
    characters of the constrained samples, of the valid unconstrained ones (samples of p(. | valid)) and of the truth;
  - KL(q || p(. | valid)) in nats: q is the masked sampler, p the unmasked one, Z = P(valid) both by importance
    sampling from q's own samples and from the share of valid unconstrained samples; the headline uses the first
    when its effective sample size is at least 10% of the samples, else the second; bootstrap 95% intervals. For
    `form`, exactly, by enumeration;
  - against the truth (toy grammar): KL(truth || r) for r = the model p, the masked q and the conditional p(. | valid),
    scored on sentences drawn from the toy language;
  - overhead: per decode step at batch 1, the ms of one mask (and advancing the grammar) against one model forward,
    replayed over sentences of the language. A CPU figure at `--threads` threads.

The validity and KL figures depend only on the seeds (up to float rounding), not on the machine; the times do.

    python benchmarks/constrained.py [--quick] [--threads N] [--out PATH]

Prints markdown tables and writes benchmarks/results/constrained.json. Taught in: chapters/07d-constrained-decoding.ipynb
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import time
from dataclasses import asdict
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch

from decodelab.decoding.constrained import constrained_generate, score_sequences
from decodelab.grammar import LLGuidanceGrammar, ToyLanguageGrammar
from decodelab.measure.constrained import (enumerate_grammar, kl_exact, kl_to_conditional, mean_log_ratio,
                                           wilson_interval)
from decodelab.decoding.generate import generate, model_step
from decodelab.models import load_model
from decodelab.sampling import SamplingParams
from decodelab.toy import ToyLanguage

RESULTS = Path(__file__).parent / "results" / "constrained.json"
CITY = "[^。！？]{0,15}北京[^。！？]{0,15}[。！？]"
FORM = "(小明|小红)(喜欢吃北京烤鸭|坐(飞机|火车)去北京)。"
MAX_TOKENS = 60  # the longest toy sentence has 31 characters; CITY allows at most 33
SEED_UNCONSTRAINED = 1_000_000  # unconstrained request i has seed SEED_UNCONSTRAINED + i
ESS_SHARE = 0.1  # importance weights are trusted for Z when their effective sample size is at least this share of n


def unconstrained(model, tokenizer, count: int, temperature: float, batch: int = 500) -> list[list[int]]:
    """Token ids of `count` plain samples (seeded one by one), in batches of `batch` prompts."""
    out = []
    for start in range(0, count, batch):
        params = [SamplingParams(temperature=temperature, seed=SEED_UNCONSTRAINED + i, max_tokens=MAX_TOKENS)
                  for i in range(start, min(count, start + batch))]
        out += [c.token_ids for c in generate(model, tokenizer, [""] * len(params), params)]
    return out


def interval(value) -> dict:
    return asdict(value)


def mean_interval(values: list[float]) -> dict:
    """The mean of `values` with a normal 95% interval (None when there are fewer than two)."""
    if len(values) < 2:
        return {"value": float(np.mean(values)) if values else None, "low": None, "high": None}
    half = 1.959964 * float(np.std(values, ddof=1)) / math.sqrt(len(values))
    return {"value": float(np.mean(values)), "low": float(np.mean(values)) - half, "high": float(np.mean(values)) + half}


def measure_grammar(name: str, grammar, model, tokenizer, lang: ToyLanguage, temperature: float, n_q: int,
                    n_p: int) -> tuple[dict, dict]:
    """One validity row and one KL row for `grammar` at `temperature`."""
    samples = constrained_generate(model, tokenizer, "", SamplingParams(temperature=temperature, seed=0, n=n_q,
                                                                        max_tokens=MAX_TOKENS), grammar)
    finished = [s for s in samples if s.finish_reason == "stop"]
    plain = unconstrained(model, tokenizer, n_p, temperature)
    valid = [grammar.accepts(ids) for ids in plain]
    texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in plain]
    validity = {
        "grammar": name, "temperature": temperature, "n_constrained": n_q, "n_unconstrained": n_p,
        "constrained": interval(wilson_interval(sum(grammar.accepts(s.token_ids) for s in samples), n_q)),
        "constrained_finished": len(finished) / n_q,
        "unconstrained": interval(wilson_interval(sum(valid), n_p)),
        "constrained_sentences": interval(wilson_interval(sum(lang.is_valid(s.text) for s in samples), n_q)),
        "unconstrained_valid_sentences": interval(wilson_interval(
            sum(ok and lang.is_valid(t) for ok, t in zip(valid, texts)), max(1, sum(valid)))),
        "length_constrained": mean_interval([len(s.text) for s in finished]),
        "length_unconstrained_valid": mean_interval([len(t) for ok, t in zip(valid, texts) if ok]),
        "length_truth": lang.expected_length(),
        "examples_constrained": [s.text for s in samples[:6]],
        "examples_unconstrained_valid": sorted({t for ok, t in zip(valid, texts) if ok})[:6],
    }
    log_q, log_p = [s.log_q for s in finished], [s.log_p for s in finished]
    by_share = kl_to_conditional(log_q, log_p, valid=valid)
    by_weights = kl_to_conditional(log_q, log_p)
    trusted = by_weights.ess >= ESS_SHARE * len(finished)
    best = by_weights if trusted else by_share
    kl = {
        "grammar": name, "temperature": temperature, "n": len(finished), "kl": interval(best.kl),
        "log_z": interval(best.log_z), "method": "importance" if trusted else "valid share",
        "kl_share": interval(by_share.kl), "log_z_share": interval(by_share.log_z),
        "kl_importance": interval(by_weights.kl), "log_z_importance": interval(by_weights.log_z), "ess": by_weights.ess,
        "mean_log_q_minus_log_p": float(np.mean(np.subtract(log_q, log_p))),
        "mean_steps_below_half": float(np.mean([sum(m < 0.5 for m in s.kept_mass) for s in finished])),
    }
    return validity, kl


def against_truth(model, tokenizer, lang: ToyLanguage, temperature: float, count: int, log_z: dict,
                  draws: int = 1000) -> dict:
    """KL(truth || r) for r = p, q, p(. | valid), on `count` sentences drawn from the toy language. The conditional's
    interval adds log Z's interval (`log_z`: value, low, high) to the sample mean's, end to end (conservative)."""
    sentences = lang.sample(count, seed=2)
    rows = [tokenizer(s, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for s in sentences]
    scores = score_sequences(model, tokenizer, "", rows, SamplingParams(temperature=temperature),
                             ToyLanguageGrammar(tokenizer, lang))
    truth = [lang.log_prob(s) for s in sentences]
    log_q, log_p = [s[0] for s in scores], [s[1] for s in scores]
    model_gap = mean_log_ratio(truth, log_p, draws)
    conditional = {key: getattr(model_gap, key) + log_z[key] for key in ("value", "low", "high")}
    return {"temperature": temperature, "n": count, "kl_model": interval(model_gap),
            "kl_masked": interval(mean_log_ratio(truth, log_q, draws)), "kl_conditional": conditional}


def corner(model, tokenizer, lang: ToyLanguage) -> dict:
    """Every string of FORM, with p, p(. | valid), q and the truth's conditional, exactly."""
    grammar = LLGuidanceGrammar.regex(FORM, tokenizer)
    strings = enumerate_grammar(grammar)
    scores = score_sequences(model, tokenizer, "", strings, SamplingParams(), grammar)
    log_q, log_p = [s[0] for s in scores], [s[1] for s in scores]
    kl, log_z = kl_exact(log_q, log_p)
    texts = [tokenizer.decode(s, skip_special_tokens=True) for s in strings]
    truth = np.array([math.exp(lang.log_prob(t)) for t in texts])
    rows = [{"text": t, "p": math.exp(p), "conditional": math.exp(p - log_z), "q": math.exp(q),
             "truth_conditional": float(truth[i] / truth.sum()), "is_sentence": bool(truth[i] > 0)}
            for i, (t, q, p) in enumerate(zip(texts, log_q, log_p))]
    return {"pattern": FORM, "rows": rows, "kl": kl, "log_z": log_z}


@torch.no_grad()
def overhead(model, tokenizer, grammars: dict, sentences: list[str]) -> list[dict]:
    """Per decode step at batch 1: ms of mask + advance for each grammar, and of one model forward, replayed over
    `sentences` (each grammar follows the tokens it allows; the regexes see the same sentences and stop where they
    leave them)."""
    rows = []
    forward = []
    for sentence in sentences:
        ids = tokenizer(sentence)["input_ids"]
        logits, cache = model_step(model, torch.tensor([ids[:1]]))
        for token in ids[1:]:
            start = time.perf_counter()
            logits, cache = model_step(model, torch.tensor([[token]]), cache)
            forward.append(time.perf_counter() - start)
    forward_ms = np.array(forward) * 1e3
    for name, make in grammars.items():
        grammar, times = make(), []
        for sentence in sentences:
            state = grammar.start()
            for token in tokenizer(sentence, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]:
                start = time.perf_counter()
                allowed = state.mask()
                if bool(allowed[token]):
                    state.advance(token)
                times.append(time.perf_counter() - start)
                if not bool(allowed[token]):
                    break
        mask_ms = np.array(times) * 1e3
        rows.append({"grammar": name, "steps": len(times), "mask_ms": float(np.median(mask_ms)),
                     "mask_ms_p10": float(np.percentile(mask_ms, 10)), "mask_ms_p90": float(np.percentile(mask_ms, 90)),
                     "forward_ms": float(np.median(forward_ms)),
                     "forward_ms_p10": float(np.percentile(forward_ms, 10)),
                     "forward_ms_p90": float(np.percentile(forward_ms, 90)),
                     "ratio": float(np.median(mask_ms) / np.median(forward_ms))})
    return rows


def fmt(row: dict, scale: float = 1.0, digits: int = 3) -> str:
    return f"{row['value'] * scale:.{digits}f} [{row['low'] * scale:.{digits}f}, {row['high'] * scale:.{digits}f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="about a tenth of the samples")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--out", type=Path, help="where the JSON goes (default results/constrained.json)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model("tiny-zh", device="cpu")
    lang = ToyLanguage()
    scale = 10 if args.quick else 1
    toy = ToyLanguageGrammar(tokenizer, lang)
    city = LLGuidanceGrammar.regex(CITY, tokenizer)
    plan = [("toy", toy, 1.0, 2000, 2000), ("toy", toy, 2.0, 2000, 2000), ("city", city, 1.0, 1000, 20000)]
    validity, kls = [], []
    for name, grammar, temperature, n_q, n_p in plan:
        row, kl = measure_grammar(name, grammar, model, tokenizer, lang, temperature, n_q // scale, n_p // scale)
        validity.append(row)
        kls.append(kl)
    truth = [against_truth(model, tokenizer, lang, kl["temperature"], 1000 // scale, kl["log_z"])
             for kl in kls if kl["grammar"] == "toy"]
    form = corner(model, tokenizer, lang)
    grammars = {"toy": lambda: ToyLanguageGrammar(tokenizer, ToyLanguage()),  # a fresh language: no warm caches
                "city": lambda: LLGuidanceGrammar.regex(CITY, tokenizer),
                "form": lambda: LLGuidanceGrammar.regex(FORM, tokenizer)}
    costs = overhead(model, tokenizer, grammars, ToyLanguage().sample(200 // scale, seed=3))

    print(f"tiny-zh, CPU, {args.threads} thread(s); 95% intervals in brackets")
    print("| grammar | T | valid, constrained | valid, unconstrained | toy-language sentences, constrained |")
    print("|---|---:|---|---|---|")
    for row in validity:
        print(f"| {row['grammar']} | {row['temperature']:g} | {fmt(row['constrained'])} | {fmt(row['unconstrained'])} | "
              f"{fmt(row['constrained_sentences'])} |")
    print("\n| grammar | T | KL(q ‖ p(·|valid)) nats | Z from | log Z (valid share) | log Z (importance) | ESS |")
    print("|---|---:|---|---|---|---|---:|")
    for row in kls:
        print(f"| {row['grammar']} | {row['temperature']:g} | {fmt(row['kl'])} | {row['method']} | "
              f"{fmt(row['log_z_share'])} | {fmt(row['log_z_importance'])} | {row['ess']:.0f} of {row['n']} |")
    print(f"| form | 1 | {form['kl']:.3f} | exact | {form['log_z']:.3f} | | |")
    print("\n| T | KL(truth ‖ p) | KL(truth ‖ q) | KL(truth ‖ p(·|valid)) |")
    print("|---:|---|---|---|")
    for row in truth:
        print(f"| {row['temperature']:g} | {fmt(row['kl_model'])} | {fmt(row['kl_masked'])} | "
              f"{fmt(row['kl_conditional'])} |")
    print("\n| grammar | mask ms/step (p10-p90) | forward ms/step (p10-p90) | mask / forward |")
    print("|---|---|---|---:|")
    for row in costs:
        print(f"| {row['grammar']} | {row['mask_ms']:.3f} ({row['mask_ms_p10']:.3f}-{row['mask_ms_p90']:.3f}) | "
              f"{row['forward_ms']:.3f} ({row['forward_ms_p10']:.3f}-{row['forward_ms_p90']:.3f}) | "
              f"{row['ratio']:.2f} |")
    out = args.out or RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "model": "tiny-zh (shipped)", "device": "cpu", "threads": args.threads, "quick": args.quick,
        "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
        "llguidance": version("llguidance"), "max_tokens": MAX_TOKENS, "city": CITY, "form": FORM,
        "validity": validity, "kl": kls, "truth": truth, "corner": form, "overhead": costs,
    }, ensure_ascii=False, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
