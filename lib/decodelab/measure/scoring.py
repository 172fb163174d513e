"""Scoring generated text: likelihood under the model, truth under the toy language, and chapter 03's table at once.

Plain functions over lists of strings (one character = one token, as the tiny-zh tokenizer has it), so the same code
scores a decoding strategy's samples and text drawn from the true language (the "human" row of chapter 03's table).

- `continuation_log_probs` / `perplexity`: how likely the model finds a continuation of a prompt.
- `true_log_prob`, `is_valid_continuation`: the exact answer of `ToyLanguage` or `DocumentLanguage`.
- `text_stats`: every statistic of chapter 03's table for one set of continuations.

The text statistics it builds on (`loop_rate`, `ending_loop`, `zipf_coefficient`, `repetition_rate`, `distinct_n`,
`self_bleu`, `longest_loop`) live in
`decodelab.measure.repetition`, and `support_errors` / `truncation_errors` (what a truncation keeps against the truth) in
`decodelab.measure.support_errors`; both are importable from here too.

Taught in: chapters/03-strategies.ipynb, chapters/04-autoregressive.ipynb
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from decodelab.measure.support_errors import SupportErrors, support_errors, truncation_errors
from decodelab.measure.repetition import (_check_texts, distinct_n, ending_loop, longest_loop, loop_rate, repetition_rate,
                                   self_bleu, zipf_coefficient)
from decodelab.toy.sentences import ToyLanguage
from decodelab.toy.documents import DocumentLanguage
from decodelab.validation import check_int

__all__ = [
    "ContinuationScore", "SupportErrors", "TextStats", "continuation_log_probs", "distinct_n", "ending_loop",
    "is_valid_continuation", "longest_loop", "loop_rate", "perplexity", "repetition_rate", "self_bleu",
    "support_errors", "text_stats", "true_log_prob", "truncation_errors", "zipf_coefficient",
]


# ---- likelihood under the model ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ContinuationScore:
    """Log-probability (nats) the model gives one continuation of its prompt, and how many tokens it scored."""

    log_prob: float
    num_tokens: int


@torch.no_grad()
def continuation_log_probs(model, tokenizer, prompts: Sequence[str], continuations: Sequence[str],
                           ended: Sequence[bool] | None = None, batch_size: int = 64) -> list[ContinuationScore]:
    """log P_model(continuation [+ </s>] | <s> prompt) for each pair, teacher-forced in batches of `batch_size`.

    `ended[i]` says whether continuation i stopped on the end token, which is then scored too (default: all True).

    Taught in: chapters/03-strategies.ipynb
    """
    prompts = _check_texts(prompts, "prompts")
    continuations = _check_texts(continuations, "continuations")
    if len(prompts) != len(continuations):
        raise ValueError(f"prompts and continuations must pair up, got {len(prompts)} and {len(continuations)}")
    ended = [True] * len(prompts) if ended is None else list(ended)
    if len(ended) != len(prompts) or not all(isinstance(e, bool) for e in ended):
        raise ValueError(f"ended must hold one bool per prompt ({len(prompts)}), got {ended!r}")
    check_int(batch_size, "batch_size")
    device = next(model.parameters()).device
    rows = []
    for prompt, cont, end in zip(prompts, continuations, ended):
        prompt_ids = tokenizer(prompt)["input_ids"]
        cont_ids = tokenizer(cont, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if end else [])
        rows.append((prompt_ids + cont_ids, len(prompt_ids)))
    scores = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        width = max(len(ids) for ids, _ in chunk)
        input_ids = torch.full((len(chunk), width), tokenizer.pad_token_id, dtype=torch.long)  # [B, L] right-padded
        mask = torch.zeros(len(chunk), width, dtype=torch.long)  # [B, L]
        for i, (ids, _) in enumerate(chunk):
            input_ids[i, :len(ids)] = torch.tensor(ids)
            mask[i, :len(ids)] = 1
        logits = model(input_ids=input_ids.to(device), attention_mask=mask.to(device)).logits.float()  # [B, L, V]
        log_probs = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:].to(device).unsqueeze(-1))
        log_probs = log_probs.squeeze(-1).cpu()  # [B, L - 1]: log p(token t + 1 | tokens <= t)
        for i, (ids, prompt_len) in enumerate(chunk):
            scored = log_probs[i, prompt_len - 1:len(ids) - 1]
            scores.append(ContinuationScore(float(scored.double().sum()), int(scored.numel())))
    return scores


def perplexity(scores: Sequence[ContinuationScore]) -> float:
    """exp(- total log-prob / total tokens) over all scored continuations (token-weighted, as in Holtzman et al.).

    >>> perplexity([ContinuationScore(-2.0, 2), ContinuationScore(0.0, 0)])
    2.718281828459045
    """
    if isinstance(scores, ContinuationScore) or not isinstance(scores, Sequence) or not scores:
        raise ValueError(f"scores must be a non-empty list of ContinuationScore, got {scores!r}")
    for i, s in enumerate(scores):
        if not isinstance(s, ContinuationScore):
            raise TypeError(f"scores[{i}] must be a ContinuationScore, got {type(s).__name__}")
    tokens = sum(s.num_tokens for s in scores)
    if tokens == 0:
        raise ValueError("scores must cover at least one token, got only empty continuations")
    return math.exp(-sum(s.log_prob for s in scores) / tokens)


# ---- truth under the toy language -------------------------------------------------------------------------------

def true_log_prob(lang: ToyLanguage | DocumentLanguage, prompt: str, continuation: str, ended: bool = True) -> float:
    """Exact log P(continuation [+ end] | prompt) under the toy language; -inf once it leaves the grammar.

    >>> lang = ToyLanguage()
    >>> true_log_prob(lang, "床前明月光，疑是地上", "霜。")
    0.0
    """
    if not isinstance(lang, (ToyLanguage, DocumentLanguage)):
        raise TypeError(f"lang must be a ToyLanguage or a DocumentLanguage, got {type(lang).__name__}")
    for name, text in (("prompt", prompt), ("continuation", continuation)):
        if not isinstance(text, str):
            raise TypeError(f"{name} must be a str, got {type(text).__name__}")
    if not isinstance(ended, bool):
        raise TypeError(f"ended must be a bool, got {type(ended).__name__}")
    alphabet = set(lang.alphabet)
    if any(ch not in alphabet for ch in prompt + continuation) or not lang.prefix_is_viable(prompt):
        return -math.inf
    total, prefix = 0.0, prompt
    for key in list(continuation) + ([lang.EOS] if ended else []):
        p = lang.next_token_probs(prefix).get(key, 0.0)
        if p == 0.0:
            return -math.inf
        total += math.log(p)
        prefix += key if key != lang.EOS else ""
    return total


def is_valid_continuation(lang: ToyLanguage | DocumentLanguage, prompt: str, continuation: str, ended: bool = True) -> bool:
    """True when prompt + continuation is a whole sentence of the language (`ended`) or a viable prefix of one."""
    return true_log_prob(lang, prompt, continuation, ended) > -math.inf


# ---- everything at once -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TextStats:
    """The statistics of chapter 03's table for one set of continuations."""

    num_texts: int
    repetition_rate: float           # share of texts with a loop
    distinct_2: float                # unique character bigrams / all bigrams
    self_bleu: float | None          # None for a single text
    model_perplexity: float          # under the model, continuation (and its end) given the prompt
    true_log_prob_per_token: float | None  # under the language, over the valid texts only (None: none valid)
    validity: float                  # share of prompt + continuation that are sentences of the language
    mean_length: float               # characters per continuation


def text_stats(model, tokenizer, lang: ToyLanguage, prompts: Sequence[str], continuations: Sequence[str],
               ended: Sequence[bool] | None = None) -> TextStats:
    """All of chapter 03's statistics for continuations of `prompts`; `ended[i]`: continuation i stopped on `</s>`.

    A continuation that did not end is scored without its end and counts as invalid (it is no whole sentence).

    Taught in: chapters/03-strategies.ipynb
    """
    prompts = _check_texts(prompts, "prompts")
    continuations = _check_texts(continuations, "continuations")
    ended = [True] * len(prompts) if ended is None else list(ended)
    scores = continuation_log_probs(model, tokenizer, prompts, continuations, ended)
    true = [true_log_prob(lang, p, c, e) if e else -math.inf for p, c, e in zip(prompts, continuations, ended)]
    valid = [t > -math.inf for t in true]
    valid_tokens = sum(len(c) + 1 for c, v in zip(continuations, valid) if v)
    return TextStats(
        num_texts=len(continuations),
        repetition_rate=repetition_rate(continuations),
        distinct_2=distinct_n(continuations, 2),
        self_bleu=self_bleu(continuations) if len(continuations) > 1 else None,
        model_perplexity=perplexity(scores),
        true_log_prob_per_token=sum(t for t in true if t > -math.inf) / valid_tokens if valid_tokens else None,
        validity=sum(valid) / len(valid),
        mean_length=sum(len(c) for c in continuations) / len(continuations),
    )
