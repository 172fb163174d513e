"""Chapter 05's training-time mitigations as controlled runs: each model differs from its reference in one thing.

`COMPARISONS` pairs every model with the model it changes one thing of (the trainings are named in each model card):

- coverage alone: `tiny-zh-doc-small-4xdata` (the small network on 4x the documents) against `tiny-zh-doc-small`;
- parameters alone: `tiny-zh-doc` against `tiny-zh-doc-small-4xdata` (the same 38,400 training documents, 7x the
  parameters);
- scheduled sampling: `tiny-zh-doc-small-scheduled` against `tiny-zh-doc-small` (same data, steps and targets);
- soft labels: `tiny-zh-doc-small-soft` against `tiny-zh-doc-small`;
- DAgger's rollouts: `tiny-zh-doc-small-dagger-fulldata` (the full batch of data documents plus 8 rollout rows)
  against `tiny-zh-doc-small-soft`;
- the data budget: `-dagger` (rollouts take half of the batch) against `-dagger-fulldata`;
- the "end the sentence now" (。) labels: `-dagger-fulldata-noend` against `-dagger-fulldata`;
- DAgger's rollouts without those labels: `-dagger-fulldata-noend` against `-soft` (added after the first run, see
  `POST_HOC`).

Every model is measured as scripts/ch05_exposure.py measures it, on the same 300 held-out documents with the same
seeds (so the models both scripts measure get the same figures): its own continuations (T = 1, up to 400 characters) of
each document's first sentence, the error hazard on the data and on its own prefixes (pooled below position 200,
weighted as the data's positions), validity of the continuations. Each comparison is paired: the documents are
resampled once for both models (the same bootstrap draws), 95% intervals. The margins below were written here before
the runs: a difference whose whole interval lies inside the margin counts as no effect.

    .venv/bin/python scripts/ch05_mitigations.py   # writes chapters/data/05-mitigations.json (about 8 minutes on 1 core)

Taught in: chapters/05-exposure-bias.ipynb
"""
from __future__ import annotations

import argparse
import math
import re
import time
from pathlib import Path

import numpy as np
import torch

from ch05_exposure import (DOC_SEED, DRAWS, EDGES, MATCHED_BELOW, MAX_TOKENS, hazard_sets, matched,
                           rounded)  # scripts/ch05_exposure.py: the chapter's measurement, reused as it is
from decodelab.measure.dagger import first_sentence
from decodelab.measure.exposure import continue_texts, count_errors
from decodelab.models import load_model
from decodelab.models.train import ASSETS, cross_entropy_per_char
from decodelab.toy import DocumentLanguage
from provenance import write  # scripts/provenance.py: the command and library commit

OUT = Path(__file__).resolve().parent.parent / "chapters" / "data" / "05-mitigations.json"
COMMAND = "python scripts/ch05_mitigations.py"
COMPARISONS = (  # (model, reference, what changed)
    ("tiny-zh-doc-small-4xdata", "tiny-zh-doc-small", "4x the training documents (coverage alone)"),
    ("tiny-zh-doc", "tiny-zh-doc-small-4xdata", "7x the parameters (same training documents)"),
    ("tiny-zh-doc-small-scheduled", "tiny-zh-doc-small", "scheduled sampling"),
    ("tiny-zh-doc-small-soft", "tiny-zh-doc-small", "soft labels (the truth's distribution)"),
    ("tiny-zh-doc-small-dagger-fulldata", "tiny-zh-doc-small-soft", "DAgger rollouts added, data kept"),
    ("tiny-zh-doc-small-dagger", "tiny-zh-doc-small-dagger-fulldata", "rollouts replace half the data"),
    ("tiny-zh-doc-small-dagger-fulldata-noend", "tiny-zh-doc-small-dagger-fulldata", "no 'end the sentence' labels"),
    ("tiny-zh-doc-small-dagger-fulldata-noend", "tiny-zh-doc-small-soft", "DAgger rollouts without the 。 labels"),
)
# Comparisons added after the first run had shown the others (flagged "post_hoc" in the data): -noend against -soft
# asks whether DAgger without its 。 labels beats soft labels alone, a question the first run's results raised.
POST_HOC = {("tiny-zh-doc-small-dagger-fulldata-noend", "tiny-zh-doc-small-soft")}
# No-effect margins, fixed before the runs: a hazard (or hazard gap) difference within 10% of the reference's data
# hazard (the chapter's equivalence margin for the exposure-bias gap), a validity difference within 5 points.
HAZARD_MARGIN = 0.10
VALID_MARGIN = 0.05
SEEDS = {"data": 11, "own_clean": 13, "own_after_error": 17, "valid": 21, "error_free": 23}  # as ch05_exposure.py


def interval(draws: np.ndarray) -> list[float]:
    """The 95% percentile interval of the finite draws; NaN (null in the JSON) when there are none (a model whose
    continuations never err has no after-error hazard)."""
    finite = draws[np.isfinite(draws)]
    return [float(x) for x in np.percentile(finite, [2.5, 97.5])] if len(finite) else [math.nan, math.nan]


def share(flags: list[bool], seed: int) -> tuple[float, np.ndarray]:
    """The share of True and its bootstrap draws (documents resampled with `seed`: the same draws for every model)."""
    values = np.array(flags, dtype=float)
    picks = np.random.default_rng(seed).integers(0, len(values), size=(DRAWS, len(values)))  # [draws, documents]
    return float(values.mean()), values[picks].mean(1)


def measure(name: str, lang: DocumentLanguage, docs: list[str], heldout: list[str]) -> tuple[dict, dict]:
    """The model's figures (for the JSON) and its bootstrap draws (for the paired comparisons)."""
    began = time.time()
    model, tokenizer = load_model(str(ASSETS / name), device="cpu")
    prompts = [first_sentence(d) for d in docs]
    own = continue_texts(model, tokenizer, prompts, seed=7_000, max_tokens=MAX_TOKENS)
    sets = hazard_sets(model, tokenizer, lang, docs, own)
    weights = sets["data"].counts.sum(0)  # the same for every model: the data's positions
    pooled = {k: matched(b, weights, SEEDS[k]) for k, b in sets.items()}
    draws = {k: d for k, (_, d) in pooled.items()}
    values = {k: m for k, (m, _) in pooled.items()}
    for kind in ("own_clean", "own_after_error"):
        values[f"{kind} - data"] = values[kind] - values["data"]
        draws[f"{kind} - data"] = draws[kind] - draws["data"]
    errors = [count_errors(lang, text, ended) for text, ended in own]
    for key, flags in (("valid", [e == 0 and ended for e, (_, ended) in zip(errors, own)]),
                       ("error_free", [e == 0 for e in errors])):
        values[key], draws[key] = share(flags, SEEDS[key])
    characters = sum(len(text) - len(p) for (text, _), p in zip(own, prompts))
    card = (ASSETS / name / "README.md").read_text(encoding="utf-8")
    minutes = re.search(r"Training time: ([\d.]+) min", card)
    rollout = re.search(r"of which ([\d.]+)\s+min drawing rollouts", card)
    result = {"name": name, "heldout_ce": cross_entropy_per_char(model, tokenizer, heldout, batch_size=32),
              "hazard": {k: {"mean": values[k], "interval": interval(draws[k])}
                         for k in ("data", "own_clean", "own_after_error", "own_clean - data",
                                   "own_after_error - data")},
              "own": {k: {"rate": values[k], "interval": interval(draws[k]), "n": len(own)}
                      for k in ("valid", "error_free")},
              "errors_per_100_chars": 100 * sum(errors) / characters,
              "mean_length": float(np.mean([len(t) for t, _ in own])),
              "training_minutes": float(minutes.group(1)) if minutes else None,
              "rollout_minutes": float(rollout.group(1)) if rollout else 0.0,
              "seconds": time.time() - began}
    print(f"{name}: CE {result['heldout_ce']:.4f}; hazard data {values['data']:.4f}, own clean - data "
          f"{values['own_clean - data']:+.4f}; valid {values['valid']:.1%} ({result['seconds']:.0f} s)", flush=True)
    return result, {"values": values, "draws": draws}


def difference(a: dict, b: dict, key: str, margin: float) -> dict:
    """a − b for `key`, with the paired 95% interval and where it lies against 0 and the no-effect margin."""
    low, high = interval(a["draws"][key] - b["draws"][key])
    return {"value": a["values"][key] - b["values"][key], "low": low, "high": high, "margin": margin,
            "excludes_zero": bool(low > 0 or high < 0), "within_margin": bool(-margin < low and high < margin)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=300)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.documents < 10:
        parser.error(f"--documents must be at least 10, got {args.documents}")
    torch.set_num_threads(1)
    lang = DocumentLanguage()
    docs = lang.sample(args.documents, seed=DOC_SEED)
    heldout = lang.sample(400, seed=DOC_SEED + 1)
    names = list(dict.fromkeys(n for model, reference, _ in COMPARISONS for n in (reference, model)))
    measured = {name: measure(name, lang, docs, heldout) for name in names}
    comparisons = []
    for model, reference, change in COMPARISONS:
        a, b = measured[model][1], measured[reference][1]
        hazard_margin = HAZARD_MARGIN * b["values"]["data"]
        comparisons.append({"model": model, "reference": reference, "change": change,
                            "post_hoc": (model, reference) in POST_HOC,
                            **{key: difference(a, b, key, hazard_margin)
                               for key in ("data", "own_clean - data", "own_after_error - data")},
                            "valid": difference(a, b, "valid", VALID_MARGIN)})
    result = {"documents": args.documents, "edges": list(EDGES), "matched_below": MATCHED_BELOW,
              "max_tokens": MAX_TOKENS, "entropy_rate": lang.entropy_rate(),
              "margins": {"hazard_relative": HAZARD_MARGIN, "valid": VALID_MARGIN},
              "models": [measured[name][0] for name in names], "comparisons": comparisons}
    write(args.out, rounded(result), COMMAND if args.documents == 300 else f"{COMMAND} --documents {args.documents}")


if __name__ == "__main__":
    main()
