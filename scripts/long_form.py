"""Chapter 03 measured on long continuations, the way Holtzman et al. (2020) measured GPT-2, with a known truth.

Prompts are the first two sentences of documents drawn from `DocumentLanguage` (the intro that names the protagonist
and one more sentence); the rest of each document is the "human" continuation. tiny-zh-doc continues every prompt
once per strategy, up to `MAX_TOKENS` tokens. Writes chapters/data/03-long-form.json with:

- `table`: loop rate, distinct-3, self-BLEU, Zipf coefficient, perplexity under the model, true log-probability per
  token, grammaticality and validity for each strategy and for the true language, with 95% intervals (bootstrap
  over texts; jackknife for the statistics of a whole set);
- `sweeps`: perplexity, grammaticality and loop rate against T, k and p (the idea of the paper's Figures 6-7);
- `tail`: for p up to 0.999 at T = 1 and 1.3, the impossible mass the truncation admits at teacher-forced positions;
- `spread`: distinct next sentences among 20 samples of one prompt at T = 0, 0.3, 0.7, 1, 1.3 against the truth's
  own, and a graded measure that does not saturate: the share of the 190 pairs of samples whose first sentences agree;
- `reinforcement`: the model's probability of a sentence after it has been repeated k times (the paper's Figure 4),
  and the paired difference k = 8 minus k = 0 on the same prompts against a margin fixed in advance (REINFORCEMENT_MARGIN);
- `penalties`: repetition, frequency, presence penalties and no-repeat-n-gram on greedy decoding;
- `examples`: a greedy and a beam continuation of one prompt.

Takes about 15 minutes on one CPU thread, so chapter 03 reads the committed JSON:

    python scripts/long_form.py                    # writes chapters/data/03-long-form.json
    python scripts/long_form.py --prompts 40 --out /tmp/lf.json   # a quick look
    python scripts/long_form.py --only penalties   # recompute one section, keep the rest of the committed JSON

Taught in: chapters/03-strategies.ipynb
"""
from __future__ import annotations

import argparse
from collections import Counter
import json
import math
import re
import time
from pathlib import Path

import numpy as np
import torch

from decodelab.decoding import beam_search
from decodelab.decoding import generate
from decodelab.measure.scoring import continuation_log_probs, true_log_prob
from decodelab.models import load_model
from decodelab.sampling import SamplingParams, process_logits
from decodelab.measure.repetition import distinct_n, ending_loop, self_bleu, zipf_coefficient
from decodelab.toy import DocumentLanguage
from provenance import stamp  # scripts/provenance.py: the command and library commit

OUT = Path(__file__).resolve().parents[1] / "chapters" / "data" / "03-long-form.json"
MODEL = "tiny-zh-doc"
MAX_TOKENS = 256
PROMPT_SENTENCES = 2
NUM_BEAMS = 4
HUMAN_SEED = 2026
DRAWS = 200  # bootstrap resamples
STRATEGIES: list[tuple[str, dict | None]] = [  # (row, SamplingParams fields); None marks beam search
    ("greedy", {"temperature": 0.0}),
    (f"beam (b={NUM_BEAMS})", None),
    ("pure sampling", {}),
    ("temperature 0.7", {"temperature": 0.7}),
    ("top-k (k=40)", {"top_k": 40}),
    ("top-k (k=5)", {"top_k": 5}),
    ("top-p (p=0.95)", {"top_p": 0.95}),
    ("min-p (0.1)", {"min_p": 0.1}),
    ("typical (0.95)", {"typical_p": 0.95}),
]
SWEEPS = {"temperature": [0.3, 0.5, 0.7, 0.9, 1.0, 1.2, 1.5, 2.0],
          "top_k": [1, 2, 3, 5, 10, 20, 50],
          "top_p": [0.1, 0.3, 0.5, 0.7, 0.9, 0.95, 0.99, 0.999]}
TAIL_P = [0.9, 0.95, 0.99, 0.995, 0.999, 1.0]
TAIL_T = [1.0, 1.3]
SPREAD_T = [0.0, 0.3, 0.7, 1.0, 1.3]
SPREAD_T_TABLE = [0.7, 1.0, 1.3]   # the temperatures of `spread["model"]`; `distinct` holds all of SPREAD_T
# Self-reinforcement "of the size the paper reports" means the per-token probability of the repeated sentence rises by
# tens of points (Xu et al. 2022, Figure 4, climbs towards 1 within a few repeats); a paired rise whose whole 95%
# interval stays under 0.01 (one point of per-token probability) is read as no reinforcement of that kind. Fixed
# before the paired run.
REINFORCEMENT_MARGIN = 0.01
PENALTIES: list[tuple[str, dict]] = [
    ("greedy", {}),
    ("repetition 1.2", {"repetition_penalty": 1.2}),
    ("repetition 1.5", {"repetition_penalty": 1.5}),
    ("frequency 0.5", {"frequency_penalty": 0.5}),
    ("presence 0.5", {"presence_penalty": 0.5}),
    ("no-repeat-4-gram", {"no_repeat_ngram_size": 4}),
    ("no-repeat-8-gram", {"no_repeat_ngram_size": 8}),
]


FIRST_SENTENCE = re.compile(r".*?(?:[。！”]|？(?!”))")  # up to the first sentence end (？” closes a quote)


def first_sentence(text: str) -> str:
    """The first sentence of `text` by its punctuation (all of it when nothing closes a sentence)."""
    match = FIRST_SENTENCE.match(text)
    return match.group(0) if match else text


# ---- decoding ---------------------------------------------------------------------------------------------------

def sampled(model, tokenizer, prompts: list[str], fields: dict) -> tuple[list[str], list[bool]]:
    """One continuation per prompt; prompt i always has seed i, so a text does not depend on the batch."""
    params = [SamplingParams(max_tokens=MAX_TOKENS, seed=i, **fields) for i in range(len(prompts))]
    out = []
    for start in range(0, len(prompts), 100):
        out += generate(model, tokenizer, prompts[start:start + 100], params[start:start + 100])
    return [c.text for c in out], [c.finish_reason == "stop" for c in out]


def beamed(model, tokenizer, prompts: list[str]) -> tuple[list[str], list[bool]]:
    texts, ended = [], []
    for prompt in prompts:
        result = beam_search(model, tokenizer(prompt)["input_ids"], num_beams=NUM_BEAMS, max_tokens=MAX_TOKENS,
                             eos_token_id=tokenizer.eos_token_id)
        ended.append(bool(result.token_ids) and result.token_ids[-1] == tokenizer.eos_token_id)
        texts.append(tokenizer.decode(result.token_ids, skip_special_tokens=True))
    return texts, ended


# ---- statistics with intervals ----------------------------------------------------------------------------------

def interval(values: np.ndarray, weights: np.ndarray | None = None) -> list[float]:
    """Bootstrap 95% interval of a mean (or of a ratio of sums when `weights` are given), resampling texts."""
    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(values), size=(DRAWS, len(values)))
    if weights is None:
        stats = values[picks].mean(axis=1)
    else:
        stats = values[picks].sum(axis=1) / np.maximum(weights[picks].sum(axis=1), 1)
    return [round(float(v), 4) for v in np.percentile(stats, [2.5, 97.5])]


def text_interval(texts: list[str], stat, groups: int = 20, bounds: tuple[float, float] = (-math.inf, math.inf)
                  ) -> list[float]:
    """Grouped-jackknife 95% interval of a statistic of the whole set (distinct-n, self-BLEU, Zipf).

    A bootstrap would draw some texts twice, and a duplicated text lowers distinct-n and raises self-BLEU, so its
    interval would not even contain the estimate; leaving one group of texts out at a time has no such bias."""
    point = stat(texts)
    leave_out = np.array([stat([t for i, t in enumerate(texts) if i % groups != g]) for g in range(groups)])
    se = math.sqrt((groups - 1) / groups * float(((leave_out - leave_out.mean()) ** 2).sum()))
    return [round(max(point - 1.96 * se, bounds[0]), 4), round(min(point + 1.96 * se, bounds[1]), 4)]


def row_stats(model, tokenizer, lang, prompts, texts, ended, full: bool = True) -> dict:
    """Every column of the table for one set of continuations."""
    loops = np.array([ending_loop(t) is not None for t in texts], dtype=float)
    scores = continuation_log_probs(model, tokenizer, prompts, texts, ended)
    model_lp = np.array([s.log_prob for s in scores])
    model_n = np.array([s.num_tokens for s in scores], dtype=float)
    true_lp = np.array([true_log_prob(lang, p, t, e) for p, t, e in zip(prompts, texts, ended)])
    grammatical = np.isfinite(true_lp)
    valid = grammatical & np.array(ended)
    tokens = np.array([len(t) + e for t, e in zip(texts, ended)], dtype=float)
    ppl_draws = interval(model_lp, model_n)
    row = {
        "loop_rate": float(loops.mean()), "loop_rate_ci": interval(loops),
        "perplexity": math.exp(-model_lp.sum() / model_n.sum()),
        "perplexity_ci": sorted(math.exp(-v) for v in ppl_draws),
        "grammatical": float(grammatical.mean()), "grammatical_ci": interval(grammatical.astype(float)),
        "valid": float(valid.mean()), "valid_ci": interval(valid.astype(float)),
        "mean_length": float(np.mean([len(t) for t in texts])),
    }
    if grammatical.any():
        g_lp, g_n = np.where(grammatical, true_lp, 0.0), np.where(grammatical, tokens, 0.0)
        row["true_log_prob_per_token"] = float(g_lp.sum() / g_n.sum())
        row["true_log_prob_per_token_ci"] = interval(g_lp, g_n)
    if full:
        row["distinct_3"] = distinct_n(texts, 3)
        row["distinct_3_ci"] = text_interval(texts, lambda ts: distinct_n(ts, 3), bounds=(0.0, 1.0))
        row["self_bleu"] = self_bleu(texts)
        row["self_bleu_ci"] = text_interval(texts, self_bleu, bounds=(0.0, 1.0))
        row["zipf"] = zipf_coefficient(texts)
        row["zipf_ci"] = text_interval(texts, zipf_coefficient)
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}


# ---- the experiments --------------------------------------------------------------------------------------------

def table(model, tokenizer, lang, prompts, humans) -> tuple[dict, dict]:
    rows = {"true language": row_stats(model, tokenizer, lang, prompts, humans, [True] * len(prompts))}
    outputs = {}
    for name, fields in STRATEGIES:
        texts, ended = beamed(model, tokenizer, prompts) if fields is None else sampled(model, tokenizer, prompts, fields)
        rows[name] = row_stats(model, tokenizer, lang, prompts, texts, ended)
        outputs[name] = texts
        print(f"  {name:18s} loop {rows[name]['loop_rate']:.3f}  ppl {rows[name]['perplexity']:.3f}  "
              f"valid {rows[name]['valid']:.3f}", flush=True)
    return rows, outputs


def sweeps(model, tokenizer, lang, prompts) -> dict:
    out = {}
    for knob, values in SWEEPS.items():
        out[knob] = []
        for value in values:
            texts, ended = sampled(model, tokenizer, prompts, {knob: value})
            stats = row_stats(model, tokenizer, lang, prompts, texts, ended, full=False)
            out[knob].append({"value": value, **stats})
    return out


@torch.no_grad()
def tail(model, tokenizer, lang, docs: list[str]) -> list[dict]:
    """Mean impossible mass a top-p truncation keeps, per position of held-out documents (teacher forcing)."""
    vocab = tokenizer.get_vocab()
    logits_rows, impossible_rows = [], []
    for doc in docs:
        ids = torch.tensor([tokenizer(doc)["input_ids"]])
        logits = model(input_ids=ids).logits[0].float()  # [T, V]
        for pos in range(len(doc) + 1):
            possible = torch.zeros(logits.shape[-1], dtype=torch.bool)
            for ch in lang.next_token_probs(doc[:pos]):
                possible[vocab[ch] if ch != lang.EOS else tokenizer.eos_token_id] = True
            logits_rows.append(logits[pos])
            impossible_rows.append(~possible)
    logits, impossible = torch.stack(logits_rows), torch.stack(impossible_rows)  # [N, V]
    out = []
    for temperature in TAIL_T:
        for p in TAIL_P:
            params = SamplingParams(temperature=temperature, top_p=p)
            probs = torch.softmax(process_logits(logits, params), dim=-1)
            mass = (probs * impossible).sum(dim=-1).double()  # [N]
            out.append({"temperature": temperature, "top_p": p, "impossible_mass": float(mass.mean()),
                        "per_100_tokens": round(100 * float(mass.mean()), 4)})
    return out


def agreement(sentences: list[str]) -> float:
    """The share of pairs of `sentences` that are equal: an estimate of the chance two samples agree."""
    pairs = len(sentences) * (len(sentences) - 1) // 2
    return sum(n * (n - 1) // 2 for n in Counter(sentences).values()) / pairs


def spread(model, tokenizer, lang, prompts: list[str], samples: int = 20) -> dict:
    """Distinct first sentences among `samples` continuations of each prompt, and the share of pairs that agree,
    model vs truth (means over prompts, bootstrap intervals over prompts)."""
    out = {"samples": samples, "prompts": len(prompts), "model": {}, "truth": None, "distinct": {}, "agreement": {}}
    for temperature in SPREAD_T:
        counts, agree = [], []
        for i, prompt in enumerate(prompts):
            params = [SamplingParams(temperature=temperature, max_tokens=40, seed=1000 * i + j) for j in range(samples)]
            firsts = [first_sentence(c.text) for c in generate(model, tokenizer, [prompt] * samples, params)]
            counts.append(len(set(firsts)))
            agree.append(agreement(firsts))
        distinct = {"mean": float(np.mean(counts)), "ci": interval(np.array(counts, float))}
        out["distinct"][str(temperature)] = distinct
        if temperature in SPREAD_T_TABLE:                   # the chapter's first table (kept as it was)
            out["model"][str(temperature)] = distinct
        out["agreement"][str(temperature)] = {"mean": float(np.mean(agree)), "ci": interval(np.array(agree))}
    truth_sentences = [lang.sample_sentences(lang.protagonist(p), samples, seed=i) for i, p in enumerate(prompts)]
    truth = [len(set(s)) for s in truth_sentences]
    out["truth"] = {"mean": float(np.mean(truth)), "ci": interval(np.array(truth, float))}
    truth_agree = np.array([agreement(list(s)) for s in truth_sentences])
    out["agreement"]["truth"] = {"mean": float(truth_agree.mean()), "ci": interval(truth_agree)}
    out["example_prompt"] = prompts[0]
    out["example"] = {str(t): sorted({first_sentence(c.text) for c in generate(
        model, tokenizer, [prompts[0]] * 8,
        [SamplingParams(temperature=t, max_tokens=40, seed=j) for j in range(8)])}) for t in SPREAD_T_TABLE}
    return out


@torch.no_grad()
def reinforcement(model, tokenizer, lang, prompts: list[str], repeats: int = 8) -> dict:
    """Mean model probability per token of a sentence S after the context already holds S k times, k = 0..repeats.

    S is the sentence greedy decoding writes first after each prompt; the truth's probability of S does not change
    with k (sentences are independent given the protagonist), and is reported beside it."""
    model_curve, true_curve, first, last = [], [], None, None
    sentences = [first_sentence(c.text) for c in generate(
        model, tokenizer, prompts, SamplingParams(temperature=0.0, max_tokens=40))]
    for k in range(repeats + 1):
        contexts = [p + s * k for p, s in zip(prompts, sentences)]
        scores = continuation_log_probs(model, tokenizer, contexts, sentences, [False] * len(prompts))
        per_token = np.array([math.exp(sc.log_prob / sc.num_tokens) for sc in scores])
        model_curve.append({"k": k, "mean": float(per_token.mean()), "ci": interval(per_token)})
        first = per_token if k == 0 else first
        last = per_token
        truth = [true_log_prob(lang, c, s, ended=False) for c, s in zip(contexts, sentences)]
        true_curve.append(float(np.mean([math.exp(t / len(s)) for t, s in zip(truth, sentences)])))
    diff = last - first                                    # per prompt: k = repeats minus k = 0, paired
    low, high = interval(diff)
    verdict = ("no reinforcement of the paper's size (inside the margin)" if -REINFORCEMENT_MARGIN < low
               and high < REINFORCEMENT_MARGIN else "a rise beyond the margin" if low >= REINFORCEMENT_MARGIN
               else "inconclusive against the margin")
    return {"model": model_curve, "truth": true_curve, "example_sentence": sentences[0],
            "paired_last_minus_first": {"k": repeats, "mean": float(diff.mean()), "ci": [low, high],
                                        "rises": int((diff > 0).sum()), "prompts": len(diff),
                                        "margin": REINFORCEMENT_MARGIN, "verdict": verdict}}


def penalties(model, tokenizer, lang, prompts) -> dict:
    out = {}
    for name, fields in PENALTIES:
        texts, ended = sampled(model, tokenizer, prompts, {"temperature": 0.0, **fields})
        out[name] = row_stats(model, tokenizer, lang, prompts, texts, ended, full=False)
    return out


SECTIONS = ("sweeps", "tail", "spread", "reinforcement", "penalties")  # independent of the table and of each other,
                                                                      # computed in this order


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--only", choices=SECTIONS, help="recompute this section alone and keep the others from the "
                                                         "JSON already at --out (same --prompts)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.time()
    model, tokenizer = load_model(MODEL, device="cpu")
    lang = DocumentLanguage()
    docs = lang.sample(args.prompts, seed=HUMAN_SEED)
    split = [lang.split_sentences(d) for d in docs]
    prompts = ["".join(s[:PROMPT_SENTENCES]) for s in split]
    humans = ["".join(s[PROMPT_SENTENCES:]) for s in split]
    print(f"{len(set(prompts))} distinct prompts of {len(prompts)}", flush=True)
    sections = {"sweeps": lambda: sweeps(model, tokenizer, lang, prompts),
                "tail": lambda: tail(model, tokenizer, lang, lang.sample(60, seed=HUMAN_SEED + 1)),
                "spread": lambda: spread(model, tokenizer, lang, prompts[:40]),
                "reinforcement": lambda: reinforcement(model, tokenizer, lang, prompts[:100]),
                "penalties": lambda: penalties(model, tokenizer, lang, prompts)}
    if args.only:
        result = json.loads(args.out.read_text(encoding="utf-8"))
        if result["num_prompts"] != len(prompts):
            raise SystemExit(f"{args.out} was made with {result['num_prompts']} prompts, not --prompts {len(prompts)}")
        result[args.only] = sections[args.only]()
        result = stamp(result, f"python scripts/long_form.py --only {args.only}")
        args.out.write_text(json.dumps(result, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.only} into {args.out} in {round(time.time() - start)} s")
        return
    result = {"model": MODEL, "max_tokens": MAX_TOKENS, "num_prompts": len(prompts),
              "distinct_prompts": len(set(prompts)), "num_beams": NUM_BEAMS, "entropy_rate": lang.entropy_rate()}
    result["table"], outputs = table(model, tokenizer, lang, prompts, humans)
    result["examples"] = {"prompt": prompts[0], "true": humans[0],
                          **{name: outputs[name][0] for name in ("greedy", f"beam (b={NUM_BEAMS})", "pure sampling")}}
    for name, compute in sections.items():
        print(name, flush=True)
        result[name] = compute()
    result["seconds"] = round(time.time() - start)
    result = stamp(result, "python scripts/long_form.py")
    args.out.write_text(json.dumps(result, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out} in {result['seconds']} s")


if __name__ == "__main__":
    main()
