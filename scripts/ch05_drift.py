"""Exposure bias on the shipped tiny-zh, measured against the toy language's truth:

1. teacher forcing against free running at several temperatures (per-position error mass and survival), with a
   95% bootstrap band (over the sampled sentences) for the product of per-step validity and for measured survival
   minus that product;
2. a forbidden character forced into true sentences: how often the model's continuation still fits the sentence
   as it was meant (recovered) rather than building on the error (drifted), against the same judgement after a
   different *valid* character (the baseline: how often a continuation fits the meant sentence after any change);
3. filtering: sampling in short chunks checked by a verifier, resampling chunks that fail, against plain sampling:
   validity, model calls, true −log P per character. The oracle verifier is the grammar itself (so validity near
   100% is true by construction); the other is the model's own likelihood (`min_prob`).

    .venv/bin/python scripts/ch05_drift.py        # writes chapters/data/05-drift.json (about 2 minutes on 1 core)

Taught in: chapters/05-exposure-bias.ipynb
"""
from __future__ import annotations

import argparse
import json
import math
import warnings
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from decodelab.decoding import generate
from decodelab.models import load_model
from decodelab.sampling import SamplingParams
from decodelab.toy import ToyLanguage
from decodelab.book.widgets.drift import inject_and_continue, position_errors, sample_with_verifier
from provenance import stamp  # scripts/provenance.py: the command and library commit

OUT = Path(__file__).resolve().parent.parent / "chapters" / "data" / "05-drift.json"
TEMPERATURES = (0.7, 1.0, 1.5, 2.0)
POSITIONS = (1, 3, 6, 10)
HORIZONS = (None, 1, 4, 8)
LIKELIHOOD_VERIFIERS = ((4, 0.01), (4, 0.001), (1, 0.01))  # (horizon, min_prob): the model checks itself


def nll_per_char(lang: ToyLanguage, texts: list[str]) -> float:
    """Mean true −log P per character (end included) over the texts that are sentences."""
    valid = [t for t in texts if all(ch in lang._alphabet_set for ch in t) and lang.is_valid(t)]
    return sum(-lang.log_prob(t) for t in valid) / max(1, sum(len(t) + 1 for t in valid))


def finite(value):
    """JSON has no NaN: positions no text reached become null."""
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 6)
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def product_band(model, tokenizer, lang: ToyLanguage, texts: list[str], max_position: int, temperature: float,
                 draws: int = 1000, seed: int = 0) -> dict:
    """The product of per-step validity, prod_{s<t} (1 - mean invalid mass at s), and measured survival minus it,
    per position t, each with a 95% bootstrap band: the sentences are resampled, both curves recomputed from the same
    resample (paired)."""
    per_text = [position_errors(model, tokenizer, lang, [text], max_position, temperature) for text in texts]
    mass = np.array([p.invalid_mass for p in per_text])  # [texts, positions], NaN where not viable or not reached
    viable = np.array([p.viable for p in per_text])      # [texts, positions], NaN where not reached

    def curves(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(product, survival) over the sentences `rows` [..., n]: [..., positions] each."""
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_mass = np.nansum(mass[rows], -2) / np.isfinite(mass[rows]).sum(-2)
            survival = np.nansum(viable[rows], -2) / np.isfinite(viable[rows]).sum(-2)
        step = np.nan_to_num(1.0 - mean_mass, nan=1.0)  # no sentence scored at t: nothing multiplied in
        product = np.concatenate([np.ones(step.shape[:-1] + (1,)), np.cumprod(step, -1)[..., :-1]], -1)
        return product, survival

    product, survival = curves(np.arange(len(texts)))
    picks = np.random.default_rng(seed).integers(0, len(texts), size=(draws, len(texts)))  # [draws, texts]
    boot_product, boot_survival = curves(picks)
    with warnings.catch_warnings():  # positions no resampled sentence reaches have no band (NaN, then null)
        warnings.simplefilter("ignore", RuntimeWarning)
        band = lambda values, boot: {"value": values.tolist(), "low": np.nanpercentile(boot, 2.5, 0).tolist(),
                                     "high": np.nanpercentile(boot, 97.5, 0).tolist()}
        return {"product": band(product, boot_product),
                "survival_minus_product": band(survival - product, boot_survival - boot_product)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--verifier-samples", type=int, default=200)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tokenizer = load_model("tiny-zh", device="cpu")
    lang = ToyLanguage()
    true_texts = lang.sample(args.samples, seed=5)

    runs = []
    for temperature in TEMPERATURES:
        params = [SamplingParams(temperature=temperature, seed=1000 + i, max_tokens=60) for i in range(args.samples)]
        own = [c.text for c in generate(model, tokenizer, [""] * args.samples, params)]
        own = [t if all(ch in lang._alphabet_set for ch in t) else "" for t in own]
        scored = [t for t in own if t] or ["小"]
        runs.append({"temperature": temperature,
                     "teacher_forcing": asdict(position_errors(model, tokenizer, lang, true_texts, 30, temperature)),
                     "free_running": asdict(position_errors(model, tokenizer, lang, scored, 30, temperature)),
                     **product_band(model, tokenizer, lang, scored, 30, temperature),
                     "valid": sum(lang.is_valid(t) for t in own) / len(own), "nll": nll_per_char(lang, own),
                     "examples": own[:5]})
        print(f"T={temperature}: {runs[-1]['valid']:.1%} valid, nll {runs[-1]['nll']:.3f}")

    injections = {}
    for name, params in (("greedy", SamplingParams(temperature=0.0, max_tokens=40)),
                         ("T=1", SamplingParams(temperature=1.0, seed=7, max_tokens=40))):
        def continue_fn(prefixes: list[str]) -> list[str]:
            per_row = [SamplingParams(temperature=params.temperature, seed=None if params.seed is None else params.seed + i,
                                      max_tokens=40) for i in range(len(prefixes))]
            return [c.text for c in generate(model, tokenizer, prefixes, per_row)]
        results = inject_and_continue(lang, true_texts, POSITIONS, continue_fn, seed=3)
        substituted = inject_and_continue(lang, true_texts, POSITIONS, continue_fn, seed=3, substitute="valid")
        clean = continue_fn([t[:k + 1] for t in true_texts for k in POSITIONS if k < len(t) - 1])
        clean_prefixes = [t[:k + 1] for t in true_texts for k in POSITIONS if k < len(t) - 1]
        injections[name] = {
            "by_position": {str(k): {"n": sum(r.position == k for r in results),
                                     "recovered": sum(r.recovered for r in results if r.position == k)
                                     / max(1, sum(r.position == k for r in results))} for k in POSITIONS},
            "recovered": sum(r.recovered for r in results) / len(results),
            "valid_substitute": {"n": len(substituted),
                                 "recovered": sum(r.recovered for r in substituted) / len(substituted)},
            "clean_valid": sum(lang.is_valid(p + c) for p, c in zip(clean_prefixes, clean)) / len(clean),
            "examples": [asdict(r) for r in results[:12]],
        }
        print(f"injection, {name}: recovered {injections[name]['recovered']:.1%}, after a valid substitute "
              f"{injections[name]['valid_substitute']['recovered']:.1%} "
              f"(no injection: {injections[name]['clean_valid']:.1%} valid)")

    verifier = []
    for horizon, min_prob in [(h, None) for h in HORIZONS] + list(LIKELIHOOD_VERIFIERS):
        samples = [sample_with_verifier(model, tokenizer, lang, horizon, 1.5, seed=i, min_prob=min_prob)
                   for i in range(args.verifier_samples)]
        texts = [s.text for s in samples]
        verifier.append({"horizon": horizon, "temperature": 1.5,
                         "verifier": "none" if horizon is None else ("oracle" if min_prob is None else "likelihood"),
                         "min_prob": min_prob,
                         "valid": sum(s.valid for s in samples) / len(samples),
                         "model_calls": sum(s.model_calls for s in samples) / len(samples),
                         "resamples": sum(s.resamples for s in samples) / len(samples),
                         "nll": nll_per_char(lang, texts),
                         "distinct": len(set(texts)) / len(texts)})
        print(f"horizon {horizon}, {verifier[-1]['verifier']} {min_prob}: {verifier[-1]['valid']:.1%} valid, {verifier[-1]['model_calls']:.1f} calls/sample")

    result = {"command": "python scripts/ch05_drift.py", "samples": args.samples, "entropy_rate": lang.entropy_rate(),
              "runs": runs, "injections": injections, "verifier": verifier}
    result = stamp(result, result["command"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(finite(result), indent=1, ensure_ascii=False, allow_nan=False) + "\n",
                        encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
