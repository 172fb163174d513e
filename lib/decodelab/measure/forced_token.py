"""One token forced into a document, and the model's own errors after it, judged sentence by sentence.

Once a text holds one impossible character, the truth gives every later character probability 0, so "the errors
after it" needs a definition that starts again. Here the truth restarts at sentence boundaries. The rest of the
forced token's own sentence is skipped, up to its first run of sentence-final punctuation (。！？”). From there each
character is judged by the sentence grammar (`ToyLanguage`, whose sentences are exactly the body sentences of
`DocumentLanguage`):

- "ok": the sentence so far is still the start of some sentence of the language;
- "error": the first character that makes it impossible (so is an end of text: documents are longer than the
  continuations measured here);
- "skip": the characters after an error, up to the next run of sentence-final punctuation, where judging restarts.

The error rate at distance d after the forced token is errors / (ok + errors) at d, pooled over documents.

>>> judged = judge_after_forced(ToyLanguage(), list("和小猫。小明在河边跳舞。小明在在"))
>>> judged.statuses[:6], judged.closed_at, judged.sentences  # the first three finish the forced sentence
(('skip', 'skip', 'skip', 'ok', 'ok', 'ok'), 3, (True, False))
>>> judged.statuses[-2:]
('ok', 'error')

Taught in: chapters/04-autoregressive.ipynb
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from decodelab.decoding.generate import generate
from decodelab.sampling.sampler import SamplingParams
from decodelab.toy.sentences import ToyLanguage
from decodelab.toy.documents import DocumentLanguage
from decodelab.validation import as_scalar, check_int

SENTENCE_ENDS = frozenset("。！？”")  # every sentence of the grammar ends with one; "？”" is the only run of two
DOCUMENT_SEED = 404_000_004  # held-out documents: training draws seeds seed * 1_000_000 + step (decodelab.models.train)


@dataclass(frozen=True)
class Judged:
    """The verdicts on the tokens after a forced one. `tail` is the forced token and the tokens after it;
    `statuses[d - 1]` is "ok", "error" or "skip" for `tail[d]`, the d-th token after it; `closed_at` is the d at
    which the forced token's sentence ended (0: the forced token ended it; None: it never did); `sentences` says, for
    each later sentence that ended or broke, whether it was valid."""

    tail: tuple[str, ...]
    statuses: tuple[str, ...]
    closed_at: int | None
    sentences: tuple[bool, ...]


def judge_after_forced(lang: ToyLanguage, tail: Sequence[str]) -> Judged:
    """Judge `tail[1:]`, the tokens a model wrote after the forced token `tail[0]`, sentence by sentence.

    Tokens are single characters of the language, `ToyLanguage.EOS` for the end, or anything else (an error).
    """
    if not isinstance(lang, ToyLanguage):
        raise TypeError(f"lang must be a ToyLanguage (the sentence grammar), got {type(lang).__name__}")
    if len(tail) == 0:
        raise ValueError("tail must hold at least the forced token, got an empty sequence")
    statuses: list[str] = []
    sentences: list[bool] = []
    closed_at = 0 if _ends_run(tail, 0) else None
    judging, sentence = closed_at is not None, ""
    for d, token in enumerate(tail[1:], start=1):
        if not judging:
            statuses.append("skip")
            if _ends_run(tail, d):
                judging, sentence = True, ""
                closed_at = d if closed_at is None else closed_at
            continue
        sentence += token
        if token == lang.EOS or not _viable(lang, sentence):
            statuses.append("error")
            sentences.append(False)
            judging = False
            if _ends_run(tail, d):
                judging, sentence = True, ""  # an impossible sentence end still ends the sentence
            continue
        statuses.append("ok")
        if lang.is_valid(sentence):  # the grammar is prefix-free: a whole sentence cannot go on
            sentences.append(True)
            sentence = ""
    return Judged(tuple(tail), tuple(statuses), closed_at, tuple(sentences))


def _ends_run(tail: Sequence[str], i: int) -> bool:
    """`tail[i]` is the last of a run of sentence-final punctuation: judging can restart after it."""
    return tail[i] in SENTENCE_ENDS and (i + 1 == len(tail) or tail[i + 1] not in SENTENCE_ENDS)


def _viable(lang: ToyLanguage, sentence: str) -> bool:
    try:
        return lang.prefix_is_viable(sentence)
    except ValueError:  # a character outside the language
        return False


@dataclass(frozen=True)
class ForcedInputs:
    """Where to force and what: `prefixes[i]` is the start of the held-out `documents[i]`, `originals[i]` its next
    character, `wrong[i]` a character the truth forbids there and `substitutes[i]` another one it allows, both
    drawn from the model's own distribution restricted to those sets."""

    documents: tuple[str, ...]
    prefixes: tuple[str, ...]
    originals: tuple[str, ...]
    wrong: tuple[str, ...]
    substitutes: tuple[str, ...]


def forced_position(docs: DocumentLanguage, document: str, start: int) -> int | None:
    """The first position >= `start` inside a sentence (not its first character) where the truth allows at
    least two characters, so a forbidden one and another allowed one both exist; None if there is none."""
    boundaries, total = set(), 0
    for sentence in docs.split_sentences(document):
        total += len(sentence)
        boundaries.add(total)
    for k in range(start, len(document)):
        if k in boundaries or document[k - 1] in SENTENCE_ENDS:
            continue
        if sum(ch != docs.EOS for ch in docs.next_token_probs(document[:k])) >= 2:
            return k
    return None


@torch.no_grad()
def _last_logits(model, tokenizer, prefixes: Sequence[str]) -> torch.Tensor:
    """Logits for the next token after each prefix, `[N, V]`; right padding leaves a causal model's real
    positions untouched."""
    rows = [tokenizer(p)["input_ids"] for p in prefixes]
    width = max(len(r) for r in rows)
    batch = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])  # [N, W]
    logits = model(input_ids=batch).logits  # [N, W, V]
    return logits[torch.arange(len(rows)), torch.tensor([len(r) - 1 for r in rows])].float()  # [N, V]


def forced_inputs(model, tokenizer, docs: DocumentLanguage, n: int, seed: int, start: int = 40) -> ForcedInputs:
    """`n` held-out documents (drawn with `seed`), each cut at `forced_position(..., start)`, with the characters
    to force there. The model picks the wrong and the substitute character by its own probabilities (at T = 1),
    so the wrong one is a mistake this model could make."""
    n = as_scalar(n)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    start = check_int(start, "start", low=1)
    documents, prefixes, originals = [], [], []
    for document in docs.sample(2 * n + 20, seed=seed):
        k = forced_position(docs, document, start)
        if k is not None:
            documents.append(document)
            prefixes.append(document[:k])
            originals.append(document[k])
        if len(prefixes) == n:
            break
    if len(prefixes) < n:
        raise ValueError(f"only {len(prefixes)} of {2 * n + 20} documents have a forcing position at or after "
                         f"start={start}; use a smaller start")
    vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    alphabet = set(docs.alphabet)
    known = [token in alphabet for token in vocab]
    generator = torch.Generator().manual_seed(seed)
    wrong, substitutes = [], []
    for prefix, original, logits in zip(prefixes, originals, _last_logits(model, tokenizer, prefixes)):
        allowed = docs.next_token_probs(prefix)
        forbidden = torch.tensor([ok and token not in allowed for ok, token in zip(known, vocab)])  # [V]
        other = torch.tensor([ok and token in allowed and token != original for ok, token in zip(known, vocab)])
        for mask, out in ((forbidden, wrong), (other, substitutes)):
            probs = logits.masked_fill(~mask, float("-inf")).softmax(-1)  # [V], the model restricted to `mask`
            out.append(vocab[int(torch.multinomial(probs, 1, generator=generator))])
    return ForcedInputs(tuple(documents), tuple(prefixes), tuple(originals), tuple(wrong), tuple(substitutes))


def continue_and_judge(model, tokenizer, lang: ToyLanguage, prefixes: Sequence[str], forced: Sequence[str] | None,
                       temperature: float = 1.0, max_tokens: int = 60, seed: int = 0) -> list[Judged]:
    """Force `forced[i]` after `prefixes[i]` (None: force nothing, the model writes that token itself), let the
    model go on for `max_tokens` tokens (row i samples with seed `seed + i`), and judge what it wrote after."""
    if forced is not None and len(forced) != len(prefixes):
        raise ValueError(f"forced must be None or hold one token per prefix: {len(prefixes)} expected, got "
                         f"{len(forced)}")
    starts = list(prefixes) if forced is None else [p + f for p, f in zip(prefixes, forced)]
    params = [SamplingParams(temperature=temperature, seed=seed + i, max_tokens=max_tokens + (forced is None))
              for i in range(len(starts))]
    judged = []
    for i, completion in enumerate(generate(model, tokenizer, starts, params)):
        tokens = [lang.EOS if t == tokenizer.eos_token_id else tokenizer.convert_ids_to_tokens(t)
                  for t in completion.token_ids]
        judged.append(judge_after_forced(lang, tokens if forced is None else [forced[i]] + tokens))
    return judged


def error_rate(judged: Sequence[Judged], first: int = 1, last: int | None = None) -> float:
    """Errors per judged token ("ok" or "error") at distances `first`..`last` after the forced token, pooled."""
    first = check_int(first, "first")
    if last is not None and check_int(last, "last") < first:
        raise ValueError(f"last must be None or an int >= first ({first}), got {last!r}")
    errors = judged_tokens = 0
    for j in judged:
        window = j.statuses[first - 1:last]
        errors += window.count("error")
        judged_tokens += window.count("error") + window.count("ok")
    return errors / judged_tokens if judged_tokens else float("nan")
