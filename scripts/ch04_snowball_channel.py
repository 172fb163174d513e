"""Chapter 04: the snowball where this world can carry one, on tiny-zh-doc at temperature 1.

1. The protagonist (`decodelab.measure.snowball.injection_cases`): 800 held-out documents are cut after their first
   body sentence that starts with the protagonist P; in the injected prefix that sentence names another person Q
   instead (legal: a {PERSON} slot takes anyone). The model writes 80 more tokens from the clean and the injected
   prefix with the same seed per document. Measured: the share of documents whose first later name is Q, and the
   share of all later names that are Q (or P), against the truth's exact rate (`slot_share`: the truth does not
   care who an earlier body sentence named) and against sentences sampled from the truth, judged by the same rule.
2. Inside the forced sentence (the 2,000 documents and forced characters of `ch04_snowball.py`, the same seeds):
   tokens until the forced token's sentence ends (from there the text is back inside the grammar), after a wrong
   character and after a legal substitute, paired per prompt; the original document's own distance to its sentence
   end as the truth's reference; and the share of substitute sentences the model finishes as a valid sentence.
3. Teacher forcing on the original documents: the model's mean log p of the document's next true character at
   distance 1..K after the forced position, as written, with the wrong character and with the substitute, with
   paired bootstrap bands.

Margins fixed before the run (for any "no difference" reading): a share of names within +-0.02 of the clean
condition's; a mean log p within +-0.05 nats of the unforced text's at the same distance.

    .venv/bin/python scripts/ch04_snowball_channel.py   # writes chapters/data/04-snowball-channel.json (579 s measured on 1 thread, sharing 2 cores)

Taught in: chapters/04-autoregressive.ipynb
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from decodelab.decoding.generate import generate
from decodelab.measure.forced_token import DOCUMENT_SEED, continue_and_judge, forced_inputs
from decodelab.measure.snowball import (injection_cases, paired_mean_difference, person_names, sentence_end_distance,
                                        slot_share, true_char_logprobs, wilson)
from decodelab.models import load_model
from decodelab.sampling.sampler import SamplingParams
from decodelab.toy import DocumentLanguage, ToyLanguage
from provenance import write  # scripts/provenance.py: the command and library commit

OUT = Path(__file__).resolve().parent.parent / "chapters" / "data" / "04-snowball-channel.json"
INJECTION_SEED = 404_000_044   # held-out documents for the protagonist experiment
NAME_MARGIN = 0.02             # equivalence margin for shares of names, fixed before the run
LOGP_MARGIN = 0.05             # equivalence margin for mean log p (nats), fixed before the run
HORIZON = 50                   # as in ch04_snowball.py
START = 40                     # as in ch04_snowball.py
CONTINUE = 80                  # tokens written after an injection prefix
K = 20                         # distances for the next-true-character log p
DRAWS = 2000


def r(x: float, digits: int = 5) -> float:
    return round(float(x), digits)


def rounded(d: dict) -> dict:
    return {k: (r(v) if isinstance(v, float) else v) for k, v in d.items()}


def continuations(model, tokenizer, prompts: list[str], seed: int) -> list[str]:
    params = [SamplingParams(temperature=1.0, seed=seed + i, max_tokens=CONTINUE) for i in range(len(prompts))]
    texts = []
    for completion in generate(model, tokenizer, prompts, params):
        ids = [t for t in completion.token_ids if t != tokenizer.eos_token_id]
        texts.append("".join(t for t, i in zip(tokenizer.convert_ids_to_tokens(ids), ids)
                             if i not in tokenizer.all_special_ids))
    return texts


def protagonist_experiment(model, tokenizer, docs: DocumentLanguage, n: int) -> dict:
    cases = injection_cases(docs, docs.sample(n, seed=INJECTION_SEED), seed=1)
    names = docs.protagonists
    written = {"clean": continuations(model, tokenizer, [c.clean for c in cases], seed=44_000),
               "injected": continuations(model, tokenizer, [c.injected for c in cases], seed=44_000)}
    # the truth: its later sentences about P, drawn independently, as many characters as the model wrote at most
    truth_text = []
    for i, c in enumerate(cases):
        text = ""
        for s in docs.sample_sentences(c.protagonist, 12, seed=i):
            text += s
            if len(text) >= CONTINUE:
                break
        truth_text.append(text[:CONTINUE])
    written["truth_sampled"] = truth_text
    exact_q = np.array([slot_share(docs, c.protagonist, c.injected_name) for c in cases])
    exact_p = np.array([slot_share(docs, c.protagonist, c.protagonist) for c in cases])
    out = {"documents": len(cases), "tried": n, "continue_tokens": CONTINUE,
           "exact_share_injected_name": r(exact_q.mean()), "exact_share_protagonist": r(exact_p.mean()),
           "conditions": {}, "examples": []}
    per = {}
    for name, texts in written.items():
        found = [person_names(t, names) for t in texts]
        has = np.array([bool(f) for f in found])
        first_q = np.array([bool(f) and f[0] == c.injected_name for f, c in zip(found, cases)], dtype=float)
        count = np.array([len(f) for f in found], dtype=float)
        q = np.array([sum(x == c.injected_name for x in f) for f, c in zip(found, cases)], dtype=float)
        p = np.array([sum(x == c.protagonist for x in f) for f, c in zip(found, cases)], dtype=float)
        per[name] = {"has": has, "first_q": first_q, "count": count, "q": q, "p": p}
        k, m = int(first_q[has].sum()), int(has.sum())
        low, high = wilson(k, m)
        share_q = paired_mean_difference(q / np.maximum(count, 1), np.zeros_like(q), DRAWS, 3, weights=count)
        share_p = paired_mean_difference(p / np.maximum(count, 1), np.zeros_like(p), DRAWS, 3, weights=count)
        out["conditions"][name] = {
            "with_a_name": m, "first_name_injected": k, "first_name_injected_share": r(k / m),
            "first_name_injected_wilson": [r(low), r(high)],
            "names": int(count.sum()), "share_injected": rounded({kk: share_q[kk] for kk in ("value", "low", "high")}),
            "share_protagonist": rounded({kk: share_p[kk] for kk in ("value", "low", "high")})}
    both = per["clean"]["has"] & per["injected"]["has"]
    out["paired_first_name"] = {
        "documents": int(both.sum()),
        "injected - clean": rounded(paired_mean_difference(per["injected"]["first_q"][both],
                                                           per["clean"]["first_q"][both], DRAWS, 5)),
        "clean - exact": rounded(paired_mean_difference(per["clean"]["first_q"][both], exact_q[both], DRAWS, 6)),
        "injected - exact": rounded(paired_mean_difference(per["injected"]["first_q"][both], exact_q[both], DRAWS, 7))}
    # shares of all later names: ratio of sums, paired over documents (weights = names in the injected run)
    inj, cln = per["injected"], per["clean"]
    picks = np.random.default_rng(8).integers(0, len(cases), size=(DRAWS, len(cases)))
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = inj["q"][picks].sum(1) / inj["count"][picks].sum(1) - cln["q"][picks].sum(1) / cln["count"][picks].sum(1)
        boot_p = inj["p"][picks].sum(1) / inj["count"][picks].sum(1) - cln["p"][picks].sum(1) / cln["count"][picks].sum(1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    lo_p, hi_p = np.percentile(boot_p, [2.5, 97.5])
    diff_q = inj["q"].sum() / inj["count"].sum() - cln["q"].sum() / cln["count"].sum()
    diff_p = inj["p"].sum() / inj["count"].sum() - cln["p"].sum() / cln["count"].sum()
    out["paired_share"] = {"injected - clean (injected name)": {"value": r(diff_q), "low": r(lo), "high": r(hi)},
                           "injected - clean (protagonist)": {"value": r(diff_p), "low": r(lo_p), "high": r(hi_p)},
                           "margin": NAME_MARGIN,
                           "within_margin": bool(-NAME_MARGIN < lo and hi < NAME_MARGIN)}
    for i in range(6):
        c = cases[i]
        out["examples"].append({"protagonist": c.protagonist, "injected_name": c.injected_name,
                                "injected_prefix": c.injected, "clean": written["clean"][i][:40],
                                "injected": written["injected"][i][:40]})
    return out


def forced_sentence(model, tokenizer, docs: DocumentLanguage, inputs, n: int) -> dict:
    sentences = ToyLanguage()
    judged = {name: continue_and_judge(model, tokenizer, sentences, inputs.prefixes, chars, 1.0, HORIZON, seed=0)
              for name, chars in (("wrong", inputs.wrong), ("substitute", inputs.substitutes))}
    censored = HORIZON + 1  # never closed within the horizon: counted as HORIZON + 1 (a lower bound)
    dist = {name: np.array([j.closed_at if j.closed_at is not None else censored for j in items], dtype=float)
            for name, items in judged.items()}
    original = np.array([sentence_end_distance(d, len(p)) for d, p in zip(inputs.documents, inputs.prefixes)],
                        dtype=float)
    # does the model finish the substitute's sentence as a valid sentence of the grammar?
    valid_sub = []
    for prefix, char, j in zip(inputs.prefixes, inputs.substitutes, judged["substitute"]):
        start = docs.split_sentences(prefix)[-1]
        if j.closed_at is None:
            valid_sub.append(False)
            continue
        sentence = start + char + "".join(j.tail[1:j.closed_at + 1])
        try:
            valid_sub.append(bool(sentences.is_valid(sentence)))
        except ValueError:  # a character outside the language (or the end) inside the sentence
            valid_sub.append(False)
    k = int(sum(valid_sub))
    out = {"documents": n, "horizon": HORIZON, "censored_as": censored, "conditions": {}}
    for name, values in (*dist.items(), ("original_document", original)):
        boot = values[np.random.default_rng(9).integers(0, n, size=(DRAWS, n))].mean(1)
        lo, hi = np.percentile(boot, [2.5, 97.5])
        out["conditions"][name] = {"mean": r(values.mean(), 3), "low": r(lo, 3), "high": r(hi, 3),
                                   "median": r(np.median(values), 1),
                                   "closed_share": r((values < censored).mean())}
    out["paired"] = {"wrong - substitute": rounded(paired_mean_difference(dist["wrong"], dist["substitute"], DRAWS, 10)),
                     "wrong - original_document": rounded(paired_mean_difference(dist["wrong"], original, DRAWS, 11)),
                     "substitute - original_document": rounded(paired_mean_difference(dist["substitute"], original,
                                                                                      DRAWS, 12))}
    low, high = wilson(k, n)
    out["substitute_sentence_valid"] = {"valid": k, "n": n, "share": r(k / n), "wilson": [r(low), r(high)]}
    return out


def next_true_characters(model, tokenizer, inputs) -> dict:
    positions = [len(p) for p in inputs.prefixes]
    logp = {name: true_char_logprobs(model, tokenizer, inputs.documents, positions, chars, K)
            for name, chars in (("original", None), ("wrong", list(inputs.wrong)),
                                ("substitute", list(inputs.substitutes)))}
    in_sentence = np.array([[d <= sentence_end_distance(doc, p) for d in range(1, K + 1)]
                            for doc, p in zip(inputs.documents, positions)], dtype=float)  # [N, K]
    out = {"k": K, "margin": LOGP_MARGIN, "share_in_forced_sentence": [r(x, 4) for x in in_sentence.mean(0)],
           "mean": {}, "differences": {}}
    for name, values in logp.items():
        rows = []
        for d in range(K):
            m = paired_mean_difference(values[:, d], np.zeros(len(values)), DRAWS, 20 + d)
            rows.append([r(m["value"], 4), r(m["low"], 4), r(m["high"], 4)])
        out["mean"][name] = rows
    for a, b in (("wrong", "original"), ("substitute", "original"), ("wrong", "substitute")):
        rows = []
        for d in range(K):
            m = paired_mean_difference(logp[a][:, d], logp[b][:, d], DRAWS, 40 + d)
            rows.append([r(m["value"], 4), r(m["low"], 4), r(m["high"], 4)])
        out["differences"][f"{a} - {b}"] = rows
    # the first distance from which every later paired interval lies inside the margin
    out["within_margin_from_d"] = {}
    for key, rows in out["differences"].items():
        inside = [-LOGP_MARGIN < lo and hi < LOGP_MARGIN for _, lo, hi in rows]
        first = next((d + 1 for d in range(K) if all(inside[d:])), None)
        out["within_margin_from_d"][key] = first
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=2000)
    parser.add_argument("--injections", type=int, default=800)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    began = time.time()
    model, tokenizer = load_model("tiny-zh-doc", device="cpu")
    docs = DocumentLanguage()
    protagonist = protagonist_experiment(model, tokenizer, docs, args.injections)
    c = protagonist["conditions"]
    print("first later name is the injected one: " + ", ".join(
        f"{k} {v['first_name_injected_share']:.3f} {v['first_name_injected_wilson']}" for k, v in c.items())
        + f"; exact {protagonist['exact_share_injected_name']:.3f}; paired {protagonist['paired_first_name']}")
    print(f"share of names: {protagonist['paired_share']} ({time.time() - began:.0f} s)")
    inputs = forced_inputs(model, tokenizer, docs, args.documents, DOCUMENT_SEED, start=START)
    inside = forced_sentence(model, tokenizer, docs, inputs, args.documents)
    print(f"tokens to the sentence end: {inside['conditions']}; paired {inside['paired']}; "
          f"substitute valid {inside['substitute_sentence_valid']} ({time.time() - began:.0f} s)")
    nextchar = next_true_characters(model, tokenizer, inputs)
    print("log p at d=1,2,5,10,20: " + "; ".join(
        f"{k} " + " ".join(str(nextchar['differences'][k][d - 1][0]) for d in (1, 2, 5, 10, 20))
        for k in ("wrong - original", "substitute - original", "wrong - substitute")) + f" ({time.time() - began:.0f} s)")
    result = {"command": "python scripts/ch04_snowball_channel.py", "model": "tiny-zh-doc", "temperature": 1.0,
              "document_seed": DOCUMENT_SEED, "injection_seed": INJECTION_SEED, "bootstrap": DRAWS,
              "name_margin": NAME_MARGIN, "logp_margin": LOGP_MARGIN,
              "protagonist": protagonist, "forced_sentence": inside, "next_true_character": nextchar,
              "seconds": round(time.time() - began)}
    write(args.out, result, result["command"])


if __name__ == "__main__":
    main()
