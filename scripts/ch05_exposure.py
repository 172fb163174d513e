"""Exposure bias measured on long generation: error hazard by prefix provenance, and DAgger against its twins.

For each document model (the small baseline `tiny-zh-doc-small`, its twins trained by `decodelab.measure.dagger`, and
the large `tiny-zh-doc` for reference), on the same held-out documents:

1. held-out cross-entropy (clean data, nats per character);
2. the model's own continuations (temperature 1, up to 400 characters) of each document's first sentence;
3. the error hazard (`decodelab.measure.exposure.hazards`) at each position of the true documents (teacher forcing), of
   the own continuations while error-free, and of the own continuations after their first error, binned by position,
   with 95% bootstrap intervals over documents, and the gaps between them;
4. validity and errors per 100 characters of the own continuations;
5. recovery: a forbidden character, a different valid character, or the original one forced into a true document,
   then the model continues; recovered = the next two sentences after the forced one hold no error;
6. for the exercise: the baseline's hazard on data and on its own error-free prefixes at several temperatures.

    .venv/bin/python scripts/ch05_exposure.py     # writes chapters/data/05-exposure.json (about 6 minutes on 1 core)

Taught in: chapters/05-exposure-bias.ipynb
"""
from __future__ import annotations

import argparse
import json
import math
import random
import re
import time
from pathlib import Path

import numpy as np
import torch

from decodelab.measure.exposure import (Binned, bin_by_position, bootstrap_means, continue_texts, count_errors,
                                gap_and_interval, hazards, mean_and_interval, recovered)
from decodelab.models import load_model
from decodelab.toy import DocumentLanguage
from decodelab.models.train import ASSETS, cross_entropy_per_char
from decodelab.measure.dagger import first_sentence
from provenance import stamp  # scripts/provenance.py: the command and library commit

OUT = Path(__file__).resolve().parent.parent / "chapters" / "data" / "05-exposure.json"
MODELS = ("tiny-zh-doc-small", "tiny-zh-doc-small-soft", "tiny-zh-doc-small-dagger", "tiny-zh-doc")
DOC_SEED = 505_000_005  # held-out documents: training draws seeds seed * 1_000_000 + step
EDGES = (0, 25, 50, 75, 100, 125, 150, 175, 200, 250, 300, 412)
MATCHED_BELOW = 200     # the overall gap pools bins up to here, weighted as the data's positions are
MAX_TOKENS = 400
EXERCISE_TEMPERATURES = (0.7, 1.0, 1.3)
DRAWS = 1000


def rounded(value, digits: int = 6):
    """JSON has no NaN: empty bins become null; floats are rounded."""
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, digits)
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v, digits) for v in value]
    return value


def interval(draws: np.ndarray) -> list[float]:
    low, high = np.percentile(draws[np.isfinite(draws)], [2.5, 97.5])
    return [float(low), float(high)]


def matched(binned: Binned, weights: np.ndarray, seed: int) -> tuple[float, np.ndarray]:
    """Mean over bins below MATCHED_BELOW weighted by `weights` (the data's positions), and its bootstrap draws."""
    keep = np.array(binned.edges[1:]) <= MATCHED_BELOW
    w = weights * keep
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = binned.sums.sum(0) / binned.counts.sum(0)
    boot = bootstrap_means(binned, DRAWS, seed)  # [draws, bins]
    return float(np.nansum(mean * w) / w[np.isfinite(mean)].sum()), \
        np.nansum(boot * w, axis=1) / (np.isfinite(boot) * w).sum(1)


def proportion(flags: list[bool], seed: int) -> dict:
    rng = np.random.default_rng(seed)
    values = np.array(flags, dtype=float)
    boot = values[rng.integers(0, len(values), size=(DRAWS, len(values)))].mean(1)
    return {"rate": float(values.mean()), "interval": interval(boot), "n": len(flags)}


def hazard_sets(model, tokenizer, lang, docs, own, temperature=1.0) -> dict[str, Binned]:
    """Binned hazards of the true documents and of the own texts, split into error-free and after-error."""
    data, clean, after = [], [], []
    for doc, (text, _) in zip(docs, own):
        start = len(first_sentence(doc))
        data.append([(t, h) for t, _, h in hazards(model, tokenizer, lang, doc, start, temperature)])
        records = hazards(model, tokenizer, lang, text, start, temperature)
        clean.append([(t, h) for t, s, h in records if s == "clean"])
        after.append([(t, h) for t, s, h in records if s == "after_error"])
    return {"data": bin_by_position(data, EDGES), "own_clean": bin_by_position(clean, EDGES),
            "own_after_error": bin_by_position(after, EDGES)}


def forced_cases(lang: DocumentLanguage, docs: list[str], seed: int) -> list[tuple[str, int, dict[str, str]]]:
    """(document, position, {variant: forced character}) with a forbidden, a valid different and the original
    character at a random body position that is not punctuation and has a valid alternative."""
    rng, cases, punctuation = random.Random(seed), [], set("，。！？“”：；、")
    for doc in docs:
        start = len(first_sentence(doc))
        options = [k for k in range(start, len(doc) - 1) if doc[k] not in punctuation]
        rng.shuffle(options)
        for k in options:
            allowed = set(lang.next_token_probs(doc[:k]))
            valid = sorted(c for c in allowed - {doc[k], lang.EOS} if c not in punctuation)
            forbidden = sorted(c for c in set(lang.alphabet) - allowed if c not in punctuation)
            if valid and forbidden:
                cases.append((doc, k, {"forbidden": rng.choice(forbidden), "valid_substitute": rng.choice(valid),
                                       "original": doc[k]}))
                break
    return cases


def measure(name: str, lang: DocumentLanguage, docs: list[str], heldout: list[str], args) -> dict:
    began = time.time()
    model, tokenizer = load_model(str(ASSETS / name), device="cpu")
    prompts = [first_sentence(d) for d in docs]
    own = continue_texts(model, tokenizer, prompts, seed=7_000, max_tokens=MAX_TOKENS)
    sets = hazard_sets(model, tokenizer, lang, docs, own)
    weights = sets["data"].counts.sum(0)
    result = {"name": name, "heldout_ce": cross_entropy_per_char(model, tokenizer, heldout, batch_size=32),
              "hazard": {k: [list(x) for x in mean_and_interval(b, DRAWS, 1)] for k, b in sets.items()},
              "counts": {k: b.counts.sum(0).astype(int).tolist() for k, b in sets.items()},
              "documents_with_positions": {k: int((b.counts.sum(1) > 0).sum()) for k, b in sets.items()},
              "gap": {"own_clean - data": gap_and_interval(sets["own_clean"], sets["data"], DRAWS, 2),
                      "own_after_error - data": gap_and_interval(sets["own_after_error"], sets["data"], DRAWS, 4),
                      "own_after_error - own_clean": gap_and_interval(sets["own_after_error"], sets["own_clean"],
                                                                      DRAWS, 6)}}
    pooled = {k: matched(b, weights, seed) for (k, b), seed in zip(sets.items(), (11, 13, 17))}
    result["matched"] = {k: {"mean": m, "interval": interval(d)} for k, (m, d) in pooled.items()}
    for a, b in (("own_clean", "data"), ("own_after_error", "data"), ("own_after_error", "own_clean")):
        result["matched"][f"{a} - {b}"] = {"mean": pooled[a][0] - pooled[b][0],
                                           "interval": interval(pooled[a][1] - pooled[b][1])}
    errors = [count_errors(lang, text, ended) for text, ended in own]
    characters = sum(len(text) - len(p) for (text, _), p in zip(own, prompts))
    result["own"] = {"valid": proportion([e == 0 and ended for e, (_, ended) in zip(errors, own)], 21),
                     "error_free": proportion([e == 0 for e in errors], 23),
                     "errors_per_100_chars": 100 * sum(errors) / characters,
                     "ended": sum(ended for _, ended in own) / len(own),
                     "mean_length": float(np.mean([len(t) for t, _ in own])),
                     "examples": [t for t, _ in own[:3]]}
    cases = forced_cases(lang, docs[:args.forced], seed=31)
    result["recovery"] = {}
    for variant in ("forbidden", "valid_substitute", "original"):
        prefixes = [doc[:k] + chars[variant] for doc, k, chars in cases]
        texts = continue_texts(model, tokenizer, prefixes, seed=9_000, max_tokens=80)
        result["recovery"][variant] = proportion(
            [recovered(lang, text, k, ended) for (text, ended), (_, k, _) in zip(texts, cases)], 41)
    if name == "tiny-zh-doc-small":
        result["exercise"] = {}
        for temperature in EXERCISE_TEMPERATURES:
            few = docs[:args.exercise]
            sample = continue_texts(model, tokenizer, prompts[:args.exercise], seed=8_000, max_tokens=MAX_TOKENS,
                                    temperature=temperature)
            t_sets = hazard_sets(model, tokenizer, lang, few, sample, temperature)
            means = {k: float(b.sums.sum() / b.counts.sum()) for k, b in t_sets.items() if k != "own_after_error"}
            boot = {k: bootstrap_means(Binned([0, 10_000], b.sums.sum(1, keepdims=True), b.counts.sum(1, keepdims=True)),
                                       DRAWS, 51)[:, 0] for k, b in t_sets.items() if k != "own_after_error"}
            result["exercise"][str(temperature)] = {**means, "gap": means["own_clean"] - means["data"],
                                                    "gap_interval": interval(boot["own_clean"] - boot["data"]),
                                                    "documents": len(few)}
    result["seconds"] = time.time() - began
    card = (ASSETS / name / "README.md").read_text(encoding="utf-8")
    minutes = re.search(r"Training time: ([\d.]+) min", card)
    rollout = re.search(r"of which ([\d.]+)\s+min drawing rollouts", card)
    result["training_minutes"] = float(minutes.group(1)) if minutes else None
    result["rollout_minutes"] = float(rollout.group(1)) if rollout else 0.0
    print(f"{name}: CE {result['heldout_ce']:.4f}; matched hazard data {pooled['data'][0]:.4f}, own clean "
          f"{pooled['own_clean'][0]:.4f}, after error {pooled['own_after_error'][0]:.4f}; valid "
          f"{result['own']['valid']['rate']:.1%}; recovered " + ", ".join(
              f"{k} {v['rate']:.1%}" for k, v in result["recovery"].items()) + f" ({result['seconds']:.0f} s)")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=300)
    parser.add_argument("--forced", type=int, default=300)
    parser.add_argument("--exercise", type=int, default=40)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    lang = DocumentLanguage()
    docs = lang.sample(args.documents, seed=DOC_SEED)
    heldout = lang.sample(400, seed=DOC_SEED + 1)
    result = {"command": "python scripts/ch05_exposure.py", "documents": args.documents, "edges": list(EDGES),
              "matched_below": MATCHED_BELOW, "max_tokens": MAX_TOKENS, "entropy_rate": lang.entropy_rate(),
              "models": [measure(name, lang, docs, heldout, args) for name in args.models]}
    result = stamp(result, result["command"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rounded(result), indent=1, ensure_ascii=False, allow_nan=False) + "\n",
                        encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
