"""Chapter 05: exposure bias at T = 1, 1.3 and 1.5: the paired own − data hazard gap, and the survivors' selection.

For the baseline `tiny-zh-doc-small` and the first 500 held-out documents of `ch05_exposure.py` (the same seed), at
each temperature T the model continues each document's first sentence (up to 400 tokens, seed 8,000 + i), and the
error hazard at T (`decodelab.measure.exposure.hazards`: the probability at T of a token the truth forbids) is taken
at each position of the true document (data prefixes) and of the model's own text while it is still error-free
(own-clean prefixes). Own-clean prefixes are survivors: at position t only the texts that made no error before t
are still there, and what survives is what the model found easy. Reported, each paired over documents (a document's
own text and its data are resampled together, 95% bootstrap):

- pooled: own-clean mean hazard − data mean hazard, every position of each;
- matched: the data hazards only at the positions where the same document's own text was still clean (same
  documents, same positions, so the survivors' positions and documents are matched);
- survival-weighted: the data hazards weighted by the chance the model would still be error-free on that data
  prefix (`survival_weighted`), the data conditioned the way the survivors are, to first order;
- per position bin, matched; and how many own texts are still clean at each position (survival, Wilson 95%).

Equivalence margin, fixed before the run: a gap counts as "no exposure bias" only if its whole paired interval lies
within ±10% of the data prefixes' mean hazard at that temperature (matched positions).

    .venv/bin/python scripts/ch05_temperature.py   # writes chapters/data/05-temperature.json (328 s measured on 1 thread, sharing 2 cores)

Taught in: chapters/05-exposure-bias.ipynb
"""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import torch

from decodelab.measure.dagger import first_sentence
from decodelab.measure.exposure import (at_positions, bin_by_position, continue_texts, hazards,
                                        paired_ratio_difference, survival_weighted)
from decodelab.measure.snowball import wilson
from decodelab.models import load_model
from decodelab.models.train import ASSETS
from decodelab.toy import DocumentLanguage
from provenance import write  # scripts/provenance.py: the command and library commit

OUT = Path(__file__).resolve().parent.parent / "chapters" / "data" / "05-temperature.json"
MODEL = "tiny-zh-doc-small"
DOC_SEED = 505_000_005       # as in ch05_exposure.py
TEMPERATURES = (1.0, 1.3, 1.5)
MAX_TOKENS = 400
EDGES = (0, 25, 50, 75, 100, 150, 200, 300, 412)
SURVIVAL_AT = (25, 50, 75, 100, 150, 200, 300, 400)
MARGIN_RELATIVE = 0.10       # equivalence margin: 10% of the data's mean hazard at the matched positions
DRAWS = 1000


def r(x, digits: int = 6):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), digits)


def triple(values) -> dict:
    value, low, high = values
    return {"value": r(value), "low": r(low), "high": r(high)}


def sums(records: list[list[tuple]], weighted: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Per document: sum of hazards (times weights) and number of positions (or sum of weights)."""
    if weighted:
        return (np.array([sum(h * w for _, h, w in x) for x in records]),
                np.array([sum(w for _, _, w in x) for x in records]))
    return np.array([sum(h for _, h in x) for x in records]), np.array([float(len(x)) for x in records])


def at_temperature(model, tokenizer, lang, docs: list[str], temperature: float, seed: int) -> dict:
    prompts = [first_sentence(d) for d in docs]
    own = continue_texts(model, tokenizer, prompts, seed=8_000, max_tokens=MAX_TOKENS, temperature=temperature)
    data, clean, matched, weighted, clean_until = [], [], [], [], []
    for doc, (text, _), prompt in zip(docs, own, prompts):
        start = len(prompt)
        d = [(t, h) for t, _, h in hazards(model, tokenizer, lang, doc, start, temperature)]
        c = [(t, h) for t, s, h in hazards(model, tokenizer, lang, text, start, temperature) if s == "clean"]
        data.append(d)
        clean.append(c)
        matched.append(at_positions(d, c))
        weighted.append(survival_weighted(d))
        clean_until.append(max((t for t, _ in c), default=start) - start)  # characters written before the first error
    s_data, n_data = sums(data)
    s_clean, n_clean = sums(clean)
    s_matched, n_matched = sums(matched)
    s_clean_m, n_clean_m = sums([at_positions(c, m) for c, m in zip(clean, matched)])
    s_weighted, n_weighted = sums(weighted, weighted=True)
    data_matched_mean = s_matched.sum() / n_matched.sum()
    margin = MARGIN_RELATIVE * data_matched_mean
    gaps = {"pooled": paired_ratio_difference(s_clean, n_clean, s_data, n_data, DRAWS, seed),
            "matched": paired_ratio_difference(s_clean_m, n_clean_m, s_matched, n_matched, DRAWS, seed + 1),
            "survival_weighted": paired_ratio_difference(s_clean, n_clean, s_weighted, n_weighted, DRAWS, seed + 2)}
    bins_own = bin_by_position(clean, EDGES)
    bins_data = bin_by_position(matched, EDGES)
    per_bin = []
    for b in range(len(EDGES) - 1):
        keep = (bins_own.counts[:, b] > 0) & (bins_data.counts[:, b] > 0)
        if keep.sum() < 2:
            per_bin.append(None)
            continue
        per_bin.append({**triple(paired_ratio_difference(bins_own.sums[keep, b], bins_own.counts[keep, b],
                                                         bins_data.sums[keep, b], bins_data.counts[keep, b],
                                                         DRAWS, seed + 10 + b)),
                        "documents": int(keep.sum())})
    written = np.array(clean_until)
    survival = []
    for length in SURVIVAL_AT:
        k = int((written >= length).sum())
        low, high = wilson(k, len(docs))
        survival.append({"characters": length, "clean": k, "share": r(k / len(docs), 4), "wilson": [r(low, 4), r(high, 4)]})
    out = {"temperature": temperature, "documents": len(docs),
           "mean_hazard": {"data": r(s_data.sum() / n_data.sum()), "own_clean": r(s_clean.sum() / n_clean.sum()),
                           "data_matched": r(data_matched_mean),
                           "data_survival_weighted": r(s_weighted.sum() / n_weighted.sum())},
           "positions": {"data": int(n_data.sum()), "own_clean": int(n_clean.sum()), "matched": int(n_matched.sum())},
           "gap": {k: triple(v) for k, v in gaps.items()},
           "margin": r(margin),
           "within_margin": {k: bool(-margin < v[1] and v[2] < margin) for k, v in gaps.items()},
           "gap_by_position": {"edges": list(EDGES), "bins": per_bin},
           "survival": survival,
           "median_clean_characters": r(float(np.median(written)), 1)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=500)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    began = time.time()
    lang = DocumentLanguage()
    docs = lang.sample(args.documents, seed=DOC_SEED)
    model, tokenizer = load_model(str(ASSETS / MODEL), device="cpu")
    runs = []
    for i, temperature in enumerate(TEMPERATURES):
        run = at_temperature(model, tokenizer, lang, docs, temperature, seed=100 * (i + 1))
        runs.append(run)
        print(f"T={temperature}: hazard {run['mean_hazard']}; gaps " + ", ".join(
            f"{k} {v['value']:+.5f} [{v['low']:+.5f}, {v['high']:+.5f}]" for k, v in run["gap"].items())
            + f"; margin {run['margin']:.5f} {run['within_margin']}; median clean {run['median_clean_characters']}"
            + f" ({time.time() - began:.0f} s)")
    result = {"command": "python scripts/ch05_temperature.py", "model": MODEL, "document_seed": DOC_SEED,
              "max_tokens": MAX_TOKENS, "margin_relative": MARGIN_RELATIVE, "bootstrap": DRAWS, "runs": runs,
              "seconds": round(time.time() - began)}
    write(args.out, result, result["command"])


if __name__ == "__main__":
    main()
