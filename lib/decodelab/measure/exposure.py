"""Exposure bias measured: the model's error hazard at each position, by where its prefix came from.

A prefix of a document can come from the data (teacher forcing), from the model's own samples while they are still
error-free, or from its own samples after they made an error. Once a text holds an impossible character the truth
gives every later character probability 0, so the truth after an error needs a rule. The rule here drops broken
sentences, the way an editor would strike them out:

- the text is cut into sentences at each run of sentence-final punctuation (。！？”);
- a sentence that holds an error is *broken*; the *repaired prefix* is the text with its broken sentences left out;
- inside a broken sentence (after its error, before its end) there is no truth; the expert says "end it now" (。);
- elsewhere the truth is `DocumentLanguage.next_token_probs(repaired prefix)`, with the end of the document allowed
  (probability `STOP_PROB`) at a sentence boundary once the text *as written* holds `MIN_CHARS` characters.

The error hazard at a position is the model's probability (temperature 1) of a next token the truth forbids there:
the chance that sampling makes an error at that step.

>>> lang = DocumentLanguage()
>>> [s.status for s in judge(lang, "这是小明在北京的一天。小明喜欢吃书。小明")][10:19:4]
['clean', 'clean', 'after_error']
>>> judge(lang, "这是小明在北京的一天。小明喜欢吃书。小明")[16].error  # 书 cannot follow 喜欢吃
True

Taught in: chapters/05-exposure-bias.ipynb
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from decodelab.decoding.generate import generate
from decodelab.sampling.sampler import SamplingParams
from decodelab.toy.documents import DocumentLanguage

SENTENCE_ENDS = frozenset("。！？”")
RESTART = "。"  # what the expert says inside a broken sentence: close it, start afresh


@dataclass(frozen=True)
class Step:
    """The verdict before predicting `text[t]` (or the end, at t = len(text)).

    status: "clean" (no error so far), "after_error" (an earlier sentence broke, this one is fine so far) or
    "broken" (inside the sentence that holds an error: no truth). repaired: the prefix the truth is asked about.
    at_boundary: between two sentences. error: `text[t]` is impossible here (False at the end and when broken).
    """

    status: str
    repaired: str
    at_boundary: bool
    error: bool


def _closes(text: str, t: int) -> bool:
    """`text[t]` ends a run of sentence-final punctuation (so a sentence)."""
    return text[t] in SENTENCE_ENDS and (t + 1 == len(text) or text[t + 1] not in SENTENCE_ENDS)


def judge(lang: DocumentLanguage, text: str) -> list[Step]:
    """One `Step` per position 0..len(text) of `text`, a document or the start of one (characters outside the
    alphabet are errors)."""
    if not isinstance(lang, DocumentLanguage):
        raise TypeError(f"lang must be a DocumentLanguage, got {type(lang).__name__}")
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    kept, partial, broken, errored, steps = "", "", False, False, []
    for t in range(len(text) + 1):
        status = "broken" if broken else ("after_error" if errored else "clean")
        if t == len(text):
            steps.append(Step(status, kept + partial, not broken and partial == "", False))
            break
        ch = text[t]
        # the forward pass itself (prefix_is_viable re-checks the whole prefix's characters, quadratic in length)
        error = not broken and (not lang.in_alphabet(ch) or not lang.prefix_is_viable(kept + partial + ch))
        steps.append(Step(status, kept + partial, not broken and partial == "", error))
        if error:
            broken = errored = True
        elif not broken:
            partial += ch
        if _closes(text, t):
            kept, partial, broken = (kept if broken else kept + partial), "", False
    return steps


def expert_probs(lang: DocumentLanguage, step: Step, length: int) -> dict[str, float]:
    """The expert's next-token distribution at a judged position `length` characters into the text (the DAgger
    label): the truth after the repaired prefix, or {RESTART: 1} inside a broken sentence."""
    if step.status == "broken":
        return {RESTART: 1.0}
    truth = lang.next_token_probs(step.repaired)
    chars = {c: p for c, p in truth.items() if c != lang.EOS}
    stop = lang.STOP_PROB if step.at_boundary and length >= lang.MIN_CHARS else 0.0
    total = sum(chars.values())
    probs = {c: (1.0 - stop) * p / total for c, p in chars.items()}
    return {**probs, lang.EOS: stop} if stop > 0 else probs


def token_ids(tokenizer, lang: DocumentLanguage, tokens: Sequence[str]) -> list[int]:
    """Vocabulary ids of characters and of `lang.EOS` (the tokenizer's eos token)."""
    return [tokenizer.eos_token_id if c == lang.EOS else tokenizer.convert_tokens_to_ids(c) for c in tokens]


UNKNOWN = "\ufffd"  # stands for a special token (<pad>, <s>, <unk>) written by the model: never a character


@torch.inference_mode()
def continue_texts(model, tokenizer, prompts: Sequence[str], seed: int, max_tokens: int,
                   temperature: float = 1.0, top_p: float = 1.0) -> list[tuple[str, bool]]:
    """(prompt + continuation, ended) per prompt, sampled at `temperature` (and nucleus `top_p`) with seeds seed,
    seed + 1, ...; a special token other than the end is written as `UNKNOWN`, so the text keeps one character per
    generated token."""
    params = [SamplingParams(temperature=temperature, top_p=top_p, seed=seed + i, max_tokens=max_tokens)
              for i in range(len(prompts))]
    out = []
    for prompt, completion in zip(prompts, generate(model, tokenizer, list(prompts), params)):
        ended = completion.token_ids[-1:] == [tokenizer.eos_token_id]
        body = completion.token_ids[:-1] if ended else completion.token_ids
        pieces = tokenizer.convert_ids_to_tokens(body)
        out.append((prompt + "".join(p if i not in tokenizer.all_special_ids else UNKNOWN
                                     for i, p in zip(body, pieces)), ended))
    return out


@torch.inference_mode()
def hazards(model, tokenizer, lang: DocumentLanguage, text: str, start: int = 0,
            temperature: float = 1.0) -> list[tuple[int, str, float]]:
    """(position, status, hazard) for positions start..len(text) of `text` that have a truth (not "broken"): the
    model's probability at `temperature` (what sampling draws from) of a next token the truth forbids there.
    One forward pass per text."""
    if not isinstance(start, int) or isinstance(start, bool) or not 0 <= start <= len(text):
        raise ValueError(f"start must be an int in [0, len(text)] = [0, {len(text)}], got {start!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature must be a number > 0, got {temperature!r}")
    ids = torch.tensor([tokenizer(text)["input_ids"]], device=next(model.parameters()).device)  # [1, T + 1]
    logits = model(input_ids=ids).logits[0].float() / temperature  # [T + 1, V]
    probs = torch.softmax(logits, dim=-1).cpu().double()  # [T + 1, V]
    out = []
    for t, step in enumerate(judge(lang, text)):
        if t < start or step.status == "broken":
            continue
        allowed = token_ids(tokenizer, lang, list(expert_probs(lang, step, t)))
        out.append((t, step.status, float(1.0 - probs[t, allowed].sum())))
    return out


@dataclass(frozen=True)
class Binned:
    """Per-text sums and counts of a quantity in position bins: `sums[i, b]`, `counts[i, b]` for text i, bin b."""

    edges: list[int]
    sums: np.ndarray    # [texts, bins]
    counts: np.ndarray  # [texts, bins]


def bin_by_position(records: Sequence[Sequence[tuple[int, float]]], edges: Sequence[int]) -> Binned:
    """Group each text's (position, value) records into the bins [edges[b], edges[b + 1])."""
    if len(edges) < 2 or any(a >= b for a, b in zip(edges, edges[1:])):
        raise ValueError(f"edges must be at least two increasing positions, got {list(edges)}")
    sums = np.zeros((len(records), len(edges) - 1))
    counts = np.zeros((len(records), len(edges) - 1))
    for i, text in enumerate(records):
        for position, value in text:
            b = int(np.searchsorted(edges, position, side="right")) - 1
            if 0 <= b < len(edges) - 1:
                sums[i, b] += value
                counts[i, b] += 1
    return Binned(list(edges), sums, counts)


def bootstrap_means(binned: Binned, draws: int = 1000, seed: int = 0) -> np.ndarray:
    """Mean per bin (pooled over positions) in `draws` resamples of the texts: `[draws, bins]`, NaN where empty.
    The texts are the unit resampled, since positions of one text are not independent."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(binned.sums), size=(draws, len(binned.sums)))  # [draws, texts]
    with np.errstate(invalid="ignore", divide="ignore"):
        return binned.sums[picks].sum(1) / binned.counts[picks].sum(1)


def mean_and_interval(binned: Binned, draws: int = 1000, seed: int = 0) -> list[tuple[float, float, float]]:
    """(mean, 2.5%, 97.5%) per bin; NaN where no text reached the bin."""
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = binned.sums.sum(0) / binned.counts.sum(0)
    boot = bootstrap_means(binned, draws, seed)
    low, high = np.nanpercentile(boot, [2.5, 97.5], axis=0) if len(boot) else (mean, mean)
    return [(float(m), float(lo), float(hi)) for m, lo, hi in zip(mean, low, high)]


def gap_and_interval(a: Binned, b: Binned, draws: int = 1000, seed: int = 0) -> list[tuple[float, float, float]]:
    """Mean of `a` minus mean of `b` per bin, with a 95% bootstrap interval (the two sets resampled independently)."""
    if a.edges != b.edges:
        raise ValueError(f"both sets must use the same bins, got {a.edges} and {b.edges}")
    with np.errstate(invalid="ignore", divide="ignore"):
        gap = a.sums.sum(0) / a.counts.sum(0) - b.sums.sum(0) / b.counts.sum(0)
    boot = bootstrap_means(a, draws, seed) - bootstrap_means(b, draws, seed + 1)
    out = []
    for g, column in zip(gap, boot.T):
        column = column[np.isfinite(column)]
        low, high = np.percentile(column, [2.5, 97.5]) if len(column) else (np.nan, np.nan)
        out.append((float(g), float(low), float(high)))
    return out


def recovered(lang: DocumentLanguage, text: str, forced_at: int, ended: bool, sentences: int = 2) -> bool:
    """After a token forced at `forced_at`: does the sentence holding it end, and do the next `sentences` sentences
    hold no error (a document that ends where it may also counts)? Errors inside the forced token's own sentence are
    not looked at, so a wrong token and a valid substitute are judged the same way."""
    if not 0 <= forced_at < len(text):
        raise ValueError(f"forced_at must index a token of text (0..{len(text) - 1}), got {forced_at!r}")
    if isinstance(sentences, bool) or not isinstance(sentences, int) or sentences < 1:
        raise ValueError(f"sentences must be an int >= 1, got {sentences!r}")
    closing = next((t for t in range(forced_at, len(text)) if _closes(text, t)), None)
    if closing is None:
        return False
    steps, done = judge(lang, text), 0
    for t in range(closing + 1, len(text)):
        if steps[t].error:
            return False
        if _closes(text, t):
            done += 1
            if done == sentences:
                return True
    end = steps[-1]
    return ended and lang.EOS in expert_probs(lang, end, len(text)) and end.status != "broken"


def count_errors(lang: DocumentLanguage, text: str, ended: bool) -> int:
    """Errors in a generated document: impossible characters (at most one per sentence, since a broken sentence
    has no truth), plus an end where the document may not end."""
    steps = judge(lang, text)
    bad_end = ended and (steps[-1].status == "broken" or lang.EOS not in expert_probs(lang, steps[-1], len(text)))
    return sum(s.error for s in steps) + int(bad_end)


def at_positions(records: Sequence[tuple[int, float]], positions: Sequence[tuple[int, float]]
                 ) -> list[tuple[int, float]]:
    """The records of `records` at the positions `positions` holds: a document's data hazards at exactly the
    positions where its own continuation was still clean (matched positions, same document).

    >>> at_positions([(3, 0.1), (4, 0.2), (5, 0.3)], [(4, 0.9), (5, 0.8), (6, 0.7)])
    [(4, 0.2), (5, 0.3)]
    """
    keep = {t for t, _ in positions}
    return [(t, h) for t, h in records if t in keep]


def survival_weighted(records: Sequence[tuple[int, float]]) -> list[tuple[int, float, float]]:
    """(position, hazard, weight) with weight = the product of (1 - hazard) over the earlier records: the chance that
    a model sampling along this very prefix would still be error-free there (the data prefixes conditioned the way
    the own-clean prefixes are, to first order).

    >>> [(t, h, round(w, 3)) for t, h, w in survival_weighted([(0, 0.5), (1, 0.5), (2, 0.1)])]
    [(0, 0.5, 1.0), (1, 0.5, 0.5), (2, 0.1, 0.25)]
    """
    out, alive = [], 1.0
    for t, h in sorted(records):
        if not 0.0 <= h <= 1.0 + 1e-9:
            raise ValueError(f"hazards must be probabilities in [0, 1], got {h!r} at position {t}")
        out.append((t, h, alive))
        alive *= max(0.0, 1.0 - h)
    return out


def paired_ratio_difference(sums_a: np.ndarray, counts_a: np.ndarray, sums_b: np.ndarray, counts_b: np.ndarray,
                            draws: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """sum(a) / count(a) - sum(b) / count(b) over documents, with a 95% bootstrap interval that resamples the
    documents once for both (paired: a document's own text and its data stay together). One entry per document.

    >>> paired_ratio_difference(np.array([1.0, 3.0]), np.array([2.0, 2.0]), np.array([1.0, 3.0]), np.array([2.0, 2.0]))
    (0.0, 0.0, 0.0)
    """
    arrays = [np.asarray(x, dtype=float) for x in (sums_a, counts_a, sums_b, counts_b)]
    if any(x.ndim != 1 or len(x) != len(arrays[0]) for x in arrays) or len(arrays[0]) == 0:
        raise ValueError(f"sums and counts must be non-empty 1-D arrays of one length, got shapes "
                         f"{[x.shape for x in arrays]}")
    if not isinstance(draws, int) or isinstance(draws, bool) or draws < 1:
        raise ValueError(f"draws must be a positive int, got {draws!r}")
    sa, ca, sb, cb = arrays
    picks = np.random.default_rng(seed).integers(0, len(sa), size=(draws, len(sa)))  # [draws, documents]
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = sa[picks].sum(1) / ca[picks].sum(1) - sb[picks].sum(1) / cb[picks].sum(1)
        value = float(sa.sum() / ca.sum() - sb.sum() / cb.sum())
    boot = boot[np.isfinite(boot)]
    low, high = np.percentile(boot, [2.5, 97.5]) if len(boot) else (np.nan, np.nan)
    return value, float(low), float(high)
