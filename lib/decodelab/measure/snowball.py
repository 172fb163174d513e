"""Where the document world can carry a snowball: the protagonist, the forced sentence, and the next true characters.

In `DocumentLanguage` the sentences of a document share only their protagonist P, named by the first sentence; every
later {PERSON} slot names P with probability `PROTAGONIST_WEIGHT` and otherwise any person by the Zipf prior. So the
truth's later sentences do not depend on who an earlier body sentence named: a body sentence that names another
person Q is legal, and after it a later slot names Q with the same probability as before. A model that takes the
latest name as the protagonist follows Q instead; that is a snowball this world can show.

- `person_names` / `injection_cases`: find the names in a text; build, per held-out document, the prefix up to the
  end of its first body sentence that starts with P, once as written (clean) and once with Q in P's place (injected);
- `slot_share`: the truth's exact probability that a later {PERSON} slot names a given person;
- `paired_mean_difference`, `wilson`: the intervals the chapter reports;
- `sentence_end_distance`, `true_char_logprobs`: inside the forced sentence, and the model's log p of the document's
  own next characters at distance 1..k after a forced one (teacher forcing).

>>> person_names("小明喜欢吃米饭。他的妹妹在公园跑步。", ["小明", "他的妹妹", "妹妹"])
['小明', '他的妹妹']
>>> round(slot_share(DocumentLanguage(), "小明", "小明"), 4) > DocumentLanguage.PROTAGONIST_WEIGHT
True
>>> low, high = wilson(30, 100)
>>> round(low, 3), round(high, 3)
(0.219, 0.396)

Taught in: chapters/04-autoregressive.ipynb
"""
from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from decodelab.toy.documents import DocumentLanguage
from decodelab.validation import check_int


def person_names(text: str, names: Sequence[str]) -> list[str]:
    """The names of `names` in `text`, left to right, longest match first, not overlapping."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not names or any(not isinstance(n, str) or not n for n in names):
        raise ValueError(f"names must be a non-empty sequence of non-empty strings, got {names!r}")
    ordered = sorted(set(names), key=len, reverse=True)
    found, i = [], 0
    while i < len(text):
        match = next((n for n in ordered if text.startswith(n, i)), None)
        if match is None:
            i += 1
        else:
            found.append(match)
            i += len(match)
    return found


def slot_share(docs: DocumentLanguage, protagonist: str, name: str) -> float:
    """The truth's probability that a body {PERSON} slot of a document about `protagonist` names `name`."""
    if not isinstance(docs, DocumentLanguage):
        raise TypeError(f"docs must be a DocumentLanguage, got {type(docs).__name__}")
    for value, label in ((protagonist, "protagonist"), (name, "name")):
        if value not in docs.protagonists:
            raise ValueError(f"{label} must be one of {docs.protagonists}, got {value!r}")
    w = docs.PROTAGONIST_WEIGHT
    prior = docs._person_prior[docs.protagonists.index(name)]  # the Zipf prior the grammar draws persons by
    return (1.0 - w) * prior + (w if name == protagonist else 0.0)


@dataclass(frozen=True)
class Injection:
    """One held-out document cut after its first body sentence that starts with its protagonist: `clean` is that
    prefix as written, `injected` the same with `injected_name` in the protagonist's place (both legal)."""

    document: str
    protagonist: str
    injected_name: str
    clean: str
    injected: str


def injection_cases(docs: DocumentLanguage, documents: Sequence[str], seed: int) -> list[Injection]:
    """An `Injection` per document that has a body sentence starting with its protagonist (others are skipped);
    the injected person is drawn uniformly from the other names with `seed`."""
    if not isinstance(docs, DocumentLanguage):
        raise TypeError(f"docs must be a DocumentLanguage, got {type(docs).__name__}")
    seed = check_int(seed, "seed", low=0)
    rng, cases = random.Random(seed), []
    for document in documents:
        who = docs.protagonist(document)
        sentences = docs.split_sentences(document)
        for i, sentence in enumerate(sentences[1:], start=1):
            if sentence.startswith(who) and not any(sentence.startswith(n) and len(n) > len(who)
                                                    for n in docs.protagonists):
                other = rng.choice([n for n in docs.protagonists if n != who])
                before = "".join(sentences[:i])
                injected = before + other + sentence[len(who):]
                if not docs.prefix_is_viable(injected):  # cannot happen: a {PERSON} slot takes any person
                    raise AssertionError(f"injected prefix {injected!r} is not viable")
                cases.append(Injection(document, who, other, before + sentence, injected))
                break
    return cases


def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval (95% by default) for `successes` out of `n`."""
    n = check_int(n, "n", low=1)
    successes = check_int(successes, "successes", low=0)
    if successes > n:
        raise ValueError(f"successes must be at most n = {n}, got {successes}")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low, high = max(0.0, centre - half), min(1.0, centre + half)
    return (0.0 if successes == 0 else low), (1.0 if successes == n else high)  # exact at the ends, not 1 - 1e-16


def paired_mean_difference(a: Sequence[float], b: Sequence[float], draws: int = 2000, seed: int = 0,
                           weights: Sequence[float] | None = None) -> dict:
    """Mean of `a` minus mean of `b` over the same units (the i-th of each belong together), with a 95% bootstrap
    interval that resamples the units, so both means move together; `weights` (one per unit, e.g. how many
    positions a unit holds) make both weighted means. Returns {"value", "low", "high", "n"}.

    >>> paired_mean_difference([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])["high"]
    0.0
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.ndim != 1 or a.shape != b.shape or len(a) == 0:
        raise ValueError(f"a and b must be non-empty 1-D sequences of equal length, got shapes {a.shape}, {b.shape}")
    w = np.ones_like(a) if weights is None else np.asarray(weights, dtype=float)
    if w.shape != a.shape or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"weights must be one non-negative number per unit with a positive sum, got {weights!r}")
    draws = check_int(draws, "draws", low=1)
    picks = np.random.default_rng(seed).integers(0, len(a), size=(draws, len(a)))  # [draws, units]
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = (w[picks] * (a[picks] - b[picks])).sum(1) / w[picks].sum(1)
    boot = boot[np.isfinite(boot)]
    low, high = np.percentile(boot, [2.5, 97.5])
    value = float((w * (a - b)).sum() / w.sum())
    return {"value": value, "low": float(low), "high": float(high), "n": int(len(a))}


def sentence_end_distance(document: str, position: int, ends: str = "。！？”") -> int:
    """How many characters after `document[position]` its sentence ends (0: that character ends it)."""
    position = check_int(position, "position", low=0)
    if position >= len(document):
        raise ValueError(f"position must index a character of document (0..{len(document) - 1}), got {position}")
    for d, ch in enumerate(document[position:]):
        if ch in ends and (position + d + 1 == len(document) or document[position + d + 1] not in ends):
            return d
    return len(document) - position - 1


@torch.no_grad()
def true_char_logprobs(model, tokenizer, documents: Sequence[str], positions: Sequence[int],
                       forced: Sequence[str] | None, k: int) -> np.ndarray:
    """Teacher forcing on each document with `forced[i]` in place of `documents[i][positions[i]]` (None: as
    written): the model's log p (temperature 1) of the document's own characters at distances 1..k after that
    position, `[N, k]`."""
    k = check_int(k, "k", low=1)
    if len(positions) != len(documents) or (forced is not None and len(forced) != len(documents)):
        raise ValueError(f"positions (and forced, unless None) must hold one entry per document ({len(documents)}), "
                         f"got {len(positions)} and {None if forced is None else len(forced)}")
    out = np.zeros((len(documents), k))
    for i, (document, p) in enumerate(zip(documents, positions)):
        if p + k >= len(document):
            raise ValueError(f"document {i} has {len(document)} characters: position {p} + k = {k} runs past it")
        text = document[:p + k + 1]
        if forced is not None:
            text = text[:p] + forced[i] + text[p + 1:]
        ids = tokenizer(text)["input_ids"]  # <s> first: the logits at index t predict character t
        if len(ids) != len(text) + 1:
            raise ValueError(f"document {i}: the tokenizer must give one token per character (and <s>)")
        logp = model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)  # [L, V]
        for d in range(1, k + 1):
            out[i, d - 1] = float(logp[p + d, ids[p + d + 1]])
    return out
