"""Statistics of generated text: repetition, diversity, likelihood under the model and truth under the toy language.

Plain functions over lists of strings (one character = one token, as the tiny-zh tokenizer has it), so the same code
scores a decoding strategy's samples and text drawn from the true language (the "human" row of chapter 03's table).

- `repetition_rate`: share of texts caught in a loop (a phrase repeated back to back), Holtzman et al. 2020's
  "repetition".
- `distinct_n`: unique n-grams / all n-grams over a set of texts (Li et al. 2016).
- `self_bleu`: mean BLEU of each text against all the others (Zhu et al. 2018); high = the texts look alike.
- `continuation_log_probs` / `perplexity`: how likely the model finds a continuation of a prompt.
- `true_log_prob`, `is_valid_continuation`: the exact answer of `ToyLanguage`.
- `support_errors`: what a truncation keeps against the truth (the flat-versus-peaked comparison).

Taught in: chapters/03-strategies.ipynb, chapters/04-autoregressive.ipynb
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from decodelab.toylang import ToyLanguage


def _check_texts(texts: Sequence[str], name: str = "texts", min_count: int = 1) -> list[str]:
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise TypeError(f"{name} must be a list of str, got {type(texts).__name__}")
    if len(texts) < min_count:
        raise ValueError(f"{name} must hold at least {min_count} text(s), got {len(texts)}")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(text).__name__}")
    return list(texts)


def _check_positive_int(value, name: str, low: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def _ngrams(text: str, n: int) -> list[str]:
    return [text[i:i + n] for i in range(len(text) - n + 1)]


# ---- repetition and diversity ----------------------------------------------------------------------------------

def longest_loop(text: str, min_repeats: int = 3) -> str:
    """The longest phrase that `text` repeats at least `min_repeats` times back to back ("" if none).

    >>> longest_loop("小明在公园在公园在公园")
    '在公园'
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    _check_positive_int(min_repeats, "min_repeats", low=2)
    for length in range(len(text) // min_repeats, 0, -1):
        for start in range(len(text) - length * min_repeats + 1):
            phrase = text[start:start + length]
            if text[start:start + length * min_repeats] == phrase * min_repeats:
                return phrase
    return ""


def repetition_rate(texts: Sequence[str], min_repeats: int = 3) -> float:
    """Share of `texts` that contain a loop: some phrase repeated `min_repeats` times back to back.

    Holtzman et al. (2020) report "% of generations that end in a repetition loop"; the toy language never repeats a
    phrase three times in a row, so any loop is the decoder's.

    >>> repetition_rate(["小明在公园跑步。", "好好好好"])
    0.5
    """
    texts = _check_texts(texts)
    return sum(bool(longest_loop(t, min_repeats)) for t in texts) / len(texts)


def distinct_n(texts: Sequence[str], n: int = 2) -> float:
    """Unique n-grams over all n-grams of `texts` (characters); 0.0 when no text is n characters long.

    >>> distinct_n(["ab", "ab", "ac"], n=2)
    0.6666666666666666
    """
    texts = _check_texts(texts)
    _check_positive_int(n, "n")
    grams = [g for t in texts for g in _ngrams(t, n)]
    return len(set(grams)) / len(grams) if grams else 0.0


def _bleu(hypothesis: str, clip: list[dict[str, int]], ref_lengths: list[int], max_n: int) -> float:
    """Sentence BLEU with precomputed clipping counts; zero matches are smoothed to 0.1 (Chen & Cherry method 1)."""
    log_precision = 0.0
    for n in range(1, max_n + 1):
        counts = Counter(_ngrams(hypothesis, n))
        total = sum(counts.values())
        if total == 0:
            return 0.0
        matched = sum(min(c, clip[n - 1].get(g, 0)) for g, c in counts.items())
        log_precision += math.log((matched if matched > 0 else 0.1) / total) / max_n
    closest = min(ref_lengths, key=lambda r: (abs(r - len(hypothesis)), r))
    brevity = 1.0 if len(hypothesis) > closest else math.exp(1.0 - closest / len(hypothesis))
    return brevity * math.exp(log_precision)


def self_bleu(texts: Sequence[str], max_n: int = 4) -> float:
    """Mean BLEU-`max_n` of each text against all the other texts as references (character n-grams).

    1.0 when every text is the same; lower when the texts differ. Each n-gram's clipping count is the most any
    other text holds, found from the two largest counts per n-gram, so the cost is linear in the number of texts.

    >>> self_bleu(["今天天气很好。"] * 3)
    1.0
    """
    texts = _check_texts(texts, min_count=2)
    _check_positive_int(max_n, "max_n")
    counts = [[Counter(_ngrams(t, n)) for n in range(1, max_n + 1)] for t in texts]
    top_two: list[dict[str, tuple[int, int]]] = [{} for _ in range(max_n)]  # n-gram -> (largest, second) count
    for per_text in counts:
        for n, counter in enumerate(per_text):
            for gram, c in counter.items():
                first, second = top_two[n].get(gram, (0, 0))
                top_two[n][gram] = (c, first) if c >= first else (first, max(second, c))
    lengths = [len(t) for t in texts]
    scores = []
    for i, text in enumerate(texts):
        clip = []
        for n in range(max_n):
            own = counts[i][n]
            # the most any *other* text holds: the largest count, or the second when this text holds the largest
            clip.append({g: (top_two[n][g][1] if top_two[n][g][0] == c else top_two[n][g][0]) for g, c in own.items()})
        scores.append(_bleu(text, clip, lengths[:i] + lengths[i + 1:], max_n))
    return sum(scores) / len(scores)


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
    _check_positive_int(batch_size, "batch_size")
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

def true_log_prob(lang: ToyLanguage, prompt: str, continuation: str, ended: bool = True) -> float:
    """Exact log P(continuation [+ end] | prompt) under the toy language; -inf once it leaves the grammar.

    >>> lang = ToyLanguage()
    >>> true_log_prob(lang, "床前明月光，疑是地上", "霜。")
    0.0
    """
    if not isinstance(lang, ToyLanguage):
        raise TypeError(f"lang must be a ToyLanguage, got {type(lang).__name__}")
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


def is_valid_continuation(lang: ToyLanguage, prompt: str, continuation: str, ended: bool = True) -> bool:
    """True when prompt + continuation is a whole sentence of the language (`ended`) or a viable prefix of one."""
    return true_log_prob(lang, prompt, continuation, ended) > -math.inf


@dataclass(frozen=True)
class SupportErrors:
    """A truncated distribution against the truth: what it wrongly drops and what it wrongly admits."""

    kept: int                # tokens the truncation keeps
    possible: int            # tokens the truth allows (true probability > 0)
    dropped_possible: int    # truly possible tokens the truncation removes
    dropped_true_mass: float  # their total true probability
    admitted_impossible: int  # truly impossible tokens the truncation keeps
    admitted_mass: float     # the probability sampling gives them (renormalised over the kept tokens)


def truncation_errors(kept: torch.Tensor, model_probs: torch.Tensor, true_probs: torch.Tensor) -> dict[str, torch.Tensor]:
    """Row by row, what truncations `kept` (bool `[N, V]`) of `model_probs` `[N, V]` get wrong against `true_probs`
    `[N, V]`: a dict of `[N]` tensors named as the fields of `SupportErrors`.

    Taught in: chapters/03-strategies.ipynb
    """
    for name, t in (("kept", kept), ("model_probs", model_probs), ("true_probs", true_probs)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"{name} must be a 2-D tensor [N, V], got {t!r:.60}")
    if kept.dtype != torch.bool:
        raise TypeError(f"kept must be a bool tensor, got {kept.dtype}")
    if not (kept.shape == model_probs.shape == true_probs.shape):
        raise ValueError(f"kept, model_probs and true_probs must have one shape [N, V], got {tuple(kept.shape)}, "
                         f"{tuple(model_probs.shape)} and {tuple(true_probs.shape)}")
    if not bool(kept.any(dim=-1).all()):
        raise ValueError("kept must keep at least one token in every row, got a row with none")
    possible = true_probs > 0  # [N, V]
    renormalised = torch.where(kept, model_probs.double(), 0.0)
    renormalised = renormalised / renormalised.sum(dim=-1, keepdim=True)
    dropped, admitted = possible & ~kept, ~possible & kept
    return {
        "kept": kept.sum(dim=-1),
        "possible": possible.sum(dim=-1),
        "dropped_possible": dropped.sum(dim=-1),
        "dropped_true_mass": torch.where(dropped, true_probs.double(), 0.0).sum(dim=-1),
        "admitted_impossible": admitted.sum(dim=-1),
        "admitted_mass": torch.where(admitted, renormalised, 0.0).sum(dim=-1),
    }


def support_errors(kept: torch.Tensor, model_probs: torch.Tensor, true_probs: torch.Tensor) -> SupportErrors:
    """Compare one truncation (`kept` bool `[V]`) of `model_probs` `[V]` with the true next-token `true_probs` `[V]`.

    >>> support_errors(torch.tensor([True, True, False]), torch.tensor([.5, .3, .2]), torch.tensor([.6, 0., .4]))
    SupportErrors(kept=2, possible=2, dropped_possible=1, dropped_true_mass=0.4, admitted_impossible=1, admitted_mass=0.375)

    Taught in: chapters/03-strategies.ipynb
    """
    for name, t in (("kept", kept), ("model_probs", model_probs), ("true_probs", true_probs)):
        if not isinstance(t, torch.Tensor) or t.dim() != 1:
            raise ValueError(f"{name} must be a 1-D tensor [V], got {t!r:.60}")
    if not (kept.shape == model_probs.shape == true_probs.shape):
        raise ValueError(f"kept, model_probs and true_probs must have one shape [V], got {tuple(kept.shape)}, "
                         f"{tuple(model_probs.shape)} and {tuple(true_probs.shape)}")
    rows = truncation_errors(kept.unsqueeze(0), model_probs.unsqueeze(0), true_probs.unsqueeze(0))
    return SupportErrors(**{name: (round(float(v[0]), 6) if v.is_floating_point() else int(v[0]))
                            for name, v in rows.items()})


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
