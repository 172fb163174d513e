"""Are sampling parameters a capability switch? The weak model against the strong one, under every setting.

Chapter 08 says temperature and top-p choose how to sample from what a model knows, and cannot give it knowledge it
lacks. Measured here on the toy language, where validity is exact: `tiny-zh-doc-small` (2 layers, hidden 64, made weak
on purpose) continues the first sentence of 200 documents of `DocumentLanguage` under temperature in {0 (greedy),
0.5, 0.7, 1} x top-p in {0.8, 0.9, 0.95, 1}, and `tiny-zh-doc` (the strong model) under temperature 1, top-p 1. A
continuation is "完整合法" (a complete valid document) when it has no error and ends where a document may end
(`decodelab.measure.exposure.count_errors`); each share has Wilson's 95% interval. Validity alone can be bought by
cooling (greedy never leaves the likeliest path), so each setting also records its diversity, distinct-3 over the 200
continuations (`decodelab.measure.repetition.distinct_n`), beside the truth's own continuations of the same prompts.
The comparison that asks about capability: among the small model's settings at least as diverse as the strong model
at T = 1, the most valid one against the strong model, paired over the same 200 prompts and seeds (bootstrap of the
per-document difference); "not a capability switch" holds when that difference's whole interval lies below 0.

    .venv/bin/python scripts/ch05_capability.py       # writes chapters/data/05-capability.json (a few minutes)

Taught in: chapters/05-exposure-bias.ipynb
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from decodelab.measure.best_of_n import bootstrap_mean
from decodelab.measure.constrained import wilson_interval
from decodelab.measure.dagger import first_sentence
from decodelab.measure.exposure import continue_texts, count_errors
from decodelab.measure.repetition import distinct_n
from decodelab.models import load_model
from decodelab.models.train import ASSETS
from decodelab.toy import DocumentLanguage
from provenance import stamp

OUT = Path(__file__).resolve().parent.parent / "chapters" / "data" / "05-capability.json"
DOCUMENTS, SEED, MAX_TOKENS = 200, 606_000_006, 400
TEMPERATURES = (0.0, 0.5, 0.7, 1.0)
TOP_PS = (0.8, 0.9, 0.95, 1.0)


def validity(model, tokenizer, lang, prompts, temperature: float, top_p: float) -> tuple[list[bool], float]:
    """Per prompt, whether the continuation is a complete valid document; and distinct-3 of the continuations."""
    texts = continue_texts(model, tokenizer, prompts, seed=SEED, max_tokens=MAX_TOKENS, temperature=temperature,
                           top_p=top_p)
    valid = [count_errors(lang, text, ended) == 0 and ended for text, ended in texts]
    return valid, distinct_n([text[len(p):] for (text, _), p in zip(texts, prompts)], 3)


def main() -> None:
    torch.set_num_threads(1)
    begin = time.time()
    lang = DocumentLanguage()
    docs = lang.sample(DOCUMENTS, seed=SEED)
    prompts = [first_sentence(d) for d in docs]
    truth_distinct = distinct_n([d[len(p):] for d, p in zip(docs, prompts)], 3)
    small, tokenizer = load_model(str(ASSETS / "tiny-zh-doc-small"), device="cpu")
    strong, _ = load_model("tiny-zh-doc", device="cpu")
    rows, valid = [], {}
    for temperature in TEMPERATURES:
        for top_p in (TOP_PS if temperature > 0 else (1.0,)):           # greedy ignores top-p
            v, diversity = validity(small, tokenizer, lang, prompts, temperature, top_p)
            valid[(temperature, top_p)] = (v, diversity)
            rows.append({"model": "tiny-zh-doc-small", "temperature": temperature, "top_p": top_p,
                         "distinct_3": diversity, **asdict(wilson_interval(sum(v), len(v)))})
            print(f"small T={temperature} p={top_p}: {sum(v)}/{len(v)}", flush=True)
    reference, strong_diversity = validity(strong, tokenizer, lang, prompts, 1.0, 1.0)
    strong_row = {"model": "tiny-zh-doc", "temperature": 1.0, "top_p": 1.0, "distinct_3": strong_diversity,
                  **asdict(wilson_interval(sum(reference), len(reference)))}
    as_diverse = [k for k, (_, d) in valid.items() if d >= strong_diversity]
    most_valid = max(valid, key=lambda k: sum(valid[k][0]))
    best = max(as_diverse, key=lambda k: sum(valid[k][0])) if as_diverse else None
    if best is None:
        raise SystemExit("no setting of the small model is as diverse as the strong model: nothing to compare")
    diff = np.array(valid[best][0], float) - np.array(reference, float)       # per document, same prompt and seed
    value, low, high = bootstrap_mean(diff)
    most = np.array(valid[most_valid][0], float) - np.array(reference, float)
    m_value, m_low, m_high = bootstrap_mean(most)
    result = stamp({"documents": DOCUMENTS, "seed": SEED, "max_tokens": MAX_TOKENS, "small": rows, "strong": strong_row,
                    "truth_distinct_3": truth_distinct,
                    "most_valid_small": {"temperature": most_valid[0], "top_p": most_valid[1],
                                         "distinct_3": valid[most_valid][1],
                                         "minus_strong": {"value": m_value, "low": m_low, "high": m_high}},
                    "best_small_as_diverse": {"temperature": best[0], "top_p": best[1], "distinct_3": valid[best][1]},
                    "best_small_minus_strong": {"value": value, "low": low, "high": high,
                                                "verdict": "below the strong model" if high < 0 else "cannot tell"},
                    "seconds": round(time.time() - begin)}, "python scripts/ch05_capability.py")
    OUT.write_text(json.dumps(result, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"strong: {sum(reference)}/{len(reference)}; best small {best}: {value:+.3f} [{low:+.3f}, {high:+.3f}]")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
