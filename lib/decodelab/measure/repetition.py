"""Repetition and diversity of generated text: loops, distinct-n and self-BLEU over lists of strings.

Pure Python over characters (one character = one token, as the tiny-zh tokenizer has it), so the same code scores a
decoding strategy's samples and text drawn from the true language (the "human" row of chapter 03's table).

- `repetition_rate`: share of texts caught in a loop (a phrase repeated back to back), Holtzman et al. 2020's
  "repetition".
- `ending_loop` / `loop_rate`: whether a text *ends* in a repeating loop, exactly as Holtzman et al. 2020 count their
  "Repetition %" (their metrics/repetition.py, on characters here instead of GPT-2 tokens).
- `zipf_coefficient`: the slope of log frequency against log rank of the characters (Holtzman et al.'s Figure 5).
- `distinct_n`: unique n-grams / all n-grams over a set of texts (Li et al. 2016).
- `self_bleu`: mean BLEU of each text against all the others (Zhu et al. 2018); high = the texts look alike.

Taught in: chapters/03-strategies.ipynb
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from decodelab.validation import check_int


def _check_texts(texts: Sequence[str], name: str = "texts", min_count: int = 1) -> list[str]:
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise TypeError(f"{name} must be a list of str, got {type(texts).__name__}")
    if len(texts) < min_count:
        raise ValueError(f"{name} must hold at least {min_count} text(s), got {len(texts)}")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(text).__name__}")
    return list(texts)


def _ngrams(text: str, n: int) -> list[str]:
    return [text[i:i + n] for i in range(len(text) - n + 1)]


def longest_loop(text: str, min_repeats: int = 3) -> str:
    """The longest phrase that `text` repeats at least `min_repeats` times back to back ("" if none).

    >>> longest_loop("小明在公园在公园在公园")
    '在公园'
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    check_int(min_repeats, "min_repeats", low=2)
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


def ending_loop(text: str, max_phrase: int = 90) -> tuple[str, int] | None:
    """(phrase, times) when `text` ends in a phrase repeated back to back, else None.

    Holtzman et al.'s rule: for every phrase length n up to `max_phrase`, count how often the last n characters
    repeat back to back at the end; take the n with the most repeats (the shortest on a tie). It is a loop when that
    phrase occurs at least twice and is at least 3 characters long (or occurs more than 50 times).

    >>> ending_loop("这是小明。小明在公园。小明在公园。")
    ('小明在公园。', 2)
    >>> ending_loop("小明在公园。") is None
    True
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    check_int(max_phrase, "max_phrase")
    best_n, best_times = 0, 0
    for n in range(1, min(max_phrase, len(text)) + 1):
        tail, times = text[len(text) - n:], 1
        while text[len(text) - n * (times + 1):len(text) - n * times] == tail and n * (times + 1) <= len(text):
            times += 1
        if times > best_times:
            best_n, best_times = n, times
    if best_times > 1 and (best_n >= 3 or best_times > 50):
        return text[len(text) - best_n:], best_times
    return None


def loop_rate(texts: Sequence[str]) -> float:
    """Share of `texts` that end in a repeating loop (`ending_loop`), Holtzman et al.'s "Repetition %" / 100.

    >>> loop_rate(["小明在公园。小明在公园。", "小明在公园。"])
    0.5
    """
    texts = _check_texts(texts)
    return sum(ending_loop(t) is not None for t in texts) / len(texts)


def zipf_coefficient(texts: Sequence[str]) -> float:
    """Least-squares slope s of log(count) = c - s * log(rank) over the characters of `texts` (all ranks).

    Natural language sits near 1; a larger s means fewer distinct characters carry the text.

    >>> round(zipf_coefficient(["aaaaaa", "bbbcc"]), 6)  # counts 6, 3, 2: exactly 1 / rank
    1.0
    """
    texts = _check_texts(texts)
    counts = sorted(Counter("".join(texts)).values(), reverse=True)
    if len(counts) < 2:
        raise ValueError(f"texts must hold at least 2 distinct characters, got {len(counts)}")
    xs = [math.log(r + 1) for r in range(len(counts))]
    ys = [math.log(c) for c in counts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return -slope


def distinct_n(texts: Sequence[str], n: int = 2) -> float:
    """Unique n-grams over all n-grams of `texts` (characters); 0.0 when no text is n characters long.

    >>> distinct_n(["ab", "ab", "ac"], n=2)
    0.6666666666666666
    """
    texts = _check_texts(texts)
    check_int(n, "n")
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
    check_int(max_n, "max_n")
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
