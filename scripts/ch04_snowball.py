"""Chapter 04: does one wrong token snowball? The model's own later errors after a forced token, on tiny-zh-doc.

For 2,000 held-out documents of `DocumentLanguage`, cut at the first position after character 40 where the truth
allows at least two characters, three conditions share the prefix and the sampling seed of each document:

- clean: nothing is forced, the model writes that position itself;
- wrong: a character the truth forbids there is forced (drawn from the model's own distribution restricted to them);
- substitute: another character the truth allows there (not the document's) is forced, the same way.

The model then writes 50 more tokens at temperature T. An error after an impossible character is judged as in
`decodelab.measure.forced_token`: the rest of the forced token's sentence is skipped; from the first run of sentence-final
punctuation on, every character is judged by the sentence grammar, which restarts at each sentence end (and after an
error, at the next one). Reported per bin of distances after the forced token: errors per judged character, with
bootstrap 95% intervals over documents (paired, so the differences between conditions get intervals too); the share
that is back on track (the first sentence after the forced one is whole and valid); and, with teacher forcing on the
original documents, how far the forced character moves the model's next-token distribution (total variation)
inside its own sentence and in the sentences after it.

    .venv/bin/python scripts/ch04_snowball.py        # writes chapters/data/04-snowball.json (about 5 minutes on 1 core)

Taught in: chapters/04-autoregressive.ipynb
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from decodelab.measure.forced_token import DOCUMENT_SEED, continue_and_judge, forced_inputs
from decodelab.models import load_model
from decodelab.toy import ToyLanguage
from decodelab.toy import DocumentLanguage
from provenance import write  # scripts/provenance.py: the command and library commit

OUT = Path(__file__).resolve().parent.parent / "chapters" / "data" / "04-snowball.json"
TEMPERATURES = (1.0, 1.5)
HORIZON = 50
BINS = ((1, 10), (11, 20), (21, 30), (31, 40), (41, 50))
START = 40
BOOTSTRAP = 2000


def interval(samples: np.ndarray, estimate: float) -> dict:
    low, high = np.quantile(samples, [0.025, 0.975])
    return {"value": round(float(estimate), 5), "low": round(float(low), 5), "high": round(float(high), 5)}


def counts(judged, first: int, last: int) -> tuple[np.ndarray, np.ndarray]:
    """Per document: errors and judged characters at distances first..last."""
    window = [j.statuses[first - 1:last] for j in judged]
    errors = np.array([w.count("error") for w in window], dtype=float)
    return errors, errors + np.array([w.count("ok") for w in window], dtype=float)


def same_later_text(clean, wrong) -> dict:
    """Documents where both forced sentences ended after equally many sampled tokens (clean samples the forced
    position itself, so one more), so the same seed's later random draws line up: how many of them go on with the
    same text after that sentence, character for character (over the shorter of the two)?"""
    aligned = [(c, w) for c, w in zip(clean, wrong) if c.closed_at is not None and w.closed_at == c.closed_at + 1]
    same = [c.tail[c.closed_at + 1:][:len(w.tail) - w.closed_at - 1] == w.tail[w.closed_at + 1:] for c, w in aligned]
    return {"aligned": len(aligned), "same": sum(same), "share": round(sum(same) / len(aligned), 5)}


@torch.no_grad()
def prediction_shift(model, tokenizer, docs: DocumentLanguage, inputs, forced: list[str], horizon: int) -> dict:
    """Teacher forcing on each original document: mean total variation between the model's next-token distributions
    with and without the forced character, at each distance d, split by whether the predicted character is still in
    the forced character's sentence or in a later one."""
    same, later = [[] for _ in range(horizon)], [[] for _ in range(horizon)]
    for document, prefix, char in zip(inputs.documents, inputs.prefixes, forced):
        k = len(prefix)
        text = document[:k + 1 + horizon]
        altered = text[:k] + char + text[k + 1:]
        ids = torch.tensor([tokenizer(text)["input_ids"], tokenizer(altered)["input_ids"]])  # [2, L], same length
        probs = model(input_ids=ids).logits.float().softmax(-1)  # [2, L, V]; position t predicts token t + 1
        sentence_end, total = None, 0
        for sentence in docs.split_sentences(text):
            total += len(sentence)
            if total > k:
                sentence_end = total
                break
        for d in range(1, min(horizon, len(text) - k - 1) + 1):
            t = k + d  # the character predicted; with <s> first, the logits at index t predict it
            shift = 0.5 * float((probs[0, t] - probs[1, t]).abs().sum())
            (same if t < sentence_end else later)[d - 1].append(shift)
    mean = lambda values: round(sum(values) / len(values), 5) if values else None  # noqa: E731
    everything = lambda groups: [v for g in groups for v in g]  # noqa: E731
    return {"same_sentence": [mean(v) for v in same], "later_sentences": [mean(v) for v in later],
            "same_sentence_count": [len(v) for v in same], "later_sentences_count": [len(v) for v in later],
            "same_sentence_mean": mean(everything(same)), "later_sentences_mean": mean(everything(later))}


def error_rates(judged, resample: np.ndarray) -> tuple[list[float], list[np.ndarray]]:
    """Errors per judged character in each bin and over the whole horizon (last): estimates, bootstrap samples."""
    pooled = [counts(judged, first, last) for first, last in (*BINS, (1, HORIZON))]
    return [e.sum() / j.sum() for e, j in pooled], [e[resample].sum(1) / j[resample].sum(1) for e, j in pooled]


def summarise(judged: dict, resample: np.ndarray) -> tuple[dict, dict]:
    """Per condition: binned error rates, back on track, how long the forced sentence went on; and the paired
    differences of each forced condition from the clean one."""
    rates = {name: error_rates(items, resample) for name, items in judged.items()}
    back = {name: np.array([bool(j.sentences) and j.sentences[0] for j in items], dtype=float)
            for name, items in judged.items()}
    conditions = {}
    for name, items in judged.items():
        estimates, samples = rates[name]
        closed = [j.closed_at for j in items if j.closed_at is not None]
        tallies = [counts(items, first, last) for first, last in (*BINS, (1, HORIZON))]
        stats = [{**interval(s, e), "errors": int(errors.sum()), "judged": int(judged_chars.sum())}
                 for e, s, (errors, judged_chars) in zip(estimates, samples, tallies)]
        conditions[name] = {"bins": stats[:-1], "overall": stats[-1],
                            "back_on_track": interval(back[name][resample].mean(1), back[name].mean()),
                            "closed": round(len(closed) / len(items), 5),
                            "mean_closed_at": round(sum(closed) / len(closed), 3)}
    differences = {}
    for name in ("wrong", "substitute"):
        (estimates, samples), (clean_estimates, clean_samples) = rates[name], rates["clean"]
        differences[f"{name}-clean"] = {
            "bins": [interval(s - c, e - ce)
                     for e, s, ce, c in zip(estimates, samples, clean_estimates, clean_samples)],
            "back_on_track": interval(back[name][resample].mean(1) - back["clean"][resample].mean(1),
                                      back[name].mean() - back["clean"].mean())}
    return conditions, differences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tokenizer = load_model("tiny-zh-doc", device="cpu")
    docs, sentences = DocumentLanguage(), ToyLanguage()
    inputs = forced_inputs(model, tokenizer, docs, args.documents, DOCUMENT_SEED, start=START)
    longest = max(len(p) for p in inputs.prefixes) + 1 + HORIZON
    if longest >= docs.MIN_CHARS:  # so that an end of text inside the horizon is always an error
        raise SystemExit(f"prefix + forced + {HORIZON} tokens reaches {longest} >= {docs.MIN_CHARS} characters")
    forced = {"clean": None, "wrong": list(inputs.wrong), "substitute": list(inputs.substitutes)}
    resample = np.random.default_rng(0).integers(0, args.documents, size=(BOOTSTRAP, args.documents))  # [B, N]

    runs = []
    for temperature in TEMPERATURES:
        judged = {name: continue_and_judge(model, tokenizer, sentences, inputs.prefixes, chars, temperature,
                                           HORIZON, seed=0) for name, chars in forced.items()}
        conditions, differences = summarise(judged, resample)
        same_text = same_later_text(judged["clean"], judged["wrong"])
        examples = [{"prefix": inputs.prefixes[i], "original": inputs.originals[i],
                     **{name: {"forced": items[i].tail[0], "continuation": "".join(items[i].tail[1:]),
                               "statuses": "".join(s[0] for s in items[i].statuses)} for name, items in judged.items()}}
                    for i in range(8)]
        runs.append({"temperature": temperature, "conditions": conditions, "differences": differences,
                     "same_later_text": same_text, "examples": examples})
        print(f"T={temperature}: " + ", ".join(
            f"{name} {c['overall']['value']:.4f} [{c['overall']['low']:.4f}, {c['overall']['high']:.4f}]"
            f" back {c['back_on_track']['value']:.3f}" for name, c in conditions.items()))
        print(f"  same text after the forced sentence: {same_text}")

    shift = {name: prediction_shift(model, tokenizer, docs, inputs, list(chars), HORIZON)
             for name, chars in forced.items() if chars is not None}
    print("prediction shift (TV): " + ", ".join(
        f"{name} same {s['same_sentence_mean']} later {s['later_sentences_mean']}" for name, s in shift.items()))
    result = {"command": "python scripts/ch04_snowball.py", "model": "tiny-zh-doc", "documents": args.documents,
              "document_seed": DOCUMENT_SEED, "start": START, "horizon": HORIZON, "bins": BINS,
              "bootstrap": BOOTSTRAP, "runs": runs, "prediction_shift": shift}
    write(args.out, result, result["command"])


if __name__ == "__main__":
    main()
