"""A question with a right answer in the toy world: who is this document about?

Every document of `decodelab.toy.documents.DocumentLanguage` opens with "这是{P}在{CITY}的一天。", and afterwards each
{PERSON} slot names the protagonist P with probability 0.6 (else any person by the usual Zipf weights, P included). So
the prompt "这是{P}在{CITY}的一天。" poses a question whose answer it fixes: the continuation should be about P. A
sample answers with the first person it names (`answer_of`); it is right when that person is P (`is_correct`).

Why this question and not another: it is the one thing a document carries across sentence boundaries, so getting it
right needs the prompt, not just the grammar; one sample of the shipped tiny-zh-doc gets it right 62.5% of the time
at temperature 1, 83.0% at 0.7 and 36.0% at 1.5 (benchmarks/best_of_n.py, 200 questions): neither never nor
always, which is what best-of-n needs. Even the true language answers one sample right only about 62% of the time
(the first person may be someone else), but P is always its most likely answer, so a majority vote over many samples
converges on P: the question has a right answer, one sample is a noisy witness to it.

Extraction: the leftmost person name in the text, the longest one at that place (小李 and 李老师 are both people); a
name right after 祝 is the WHOM slot of "祝{WHOM}{WISH}！" (妈妈 is in both classes), not a person, and is skipped. A
text that names nobody has no answer (None), which is never correct.

    >>> q = question("老王", "成都")
    >>> q.prompt
    '这是老王在成都的一天。'
    >>> answer_of("祝妈妈生日快乐！老王喜欢吃饺子。"), is_correct("小红在公园跑步。", q.answer)
    ('老王', False)

Taught in: chapters/07e-best-of-n.ipynb
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from decodelab.toy.documents import DocumentLanguage
from decodelab.toy.templates import _CLASSES
from decodelab.validation import ParamError, check_int

PERSONS: tuple[str, ...] = tuple(_CLASSES["PERSON"][0].split())
CITIES: tuple[str, ...] = tuple(_CLASSES["CITY"][0].split())
_INTRO = re.compile(r"^这是(.+?)在(.+?)的一天。")
_NOT_A_PERSON_AFTER = "祝"  # 祝{WHOM}{WISH}！: WHOM words (妈妈, 老师) are addressees, not people of the story


@dataclass(frozen=True)
class Question:
    """A prompt and its right answer (the protagonist it names)."""
    prompt: str
    answer: str


def question(person: str, city: str) -> Question:
    """The question "这是{person}在{city}的一天。", answered by `person`."""
    if person not in PERSONS:
        raise ParamError("person", f"person must be one of the toy language's people {PERSONS}, got {person!r}")
    if city not in CITIES:
        raise ParamError("city", f"city must be one of the toy language's cities {CITIES}, got {city!r}")
    return Question(f"这是{person}在{city}的一天。", person)


def questions(num_cities: int) -> list[Question]:
    """Every person of the language with each of the first `num_cities` cities: 20 x num_cities questions, the
    rare people as often as the common ones."""
    num_cities = check_int(num_cities, "num_cities")
    if num_cities > len(CITIES):
        raise ParamError("num_cities", f"num_cities must be at most {len(CITIES)}, got {num_cities}")
    return [question(p, c) for c in CITIES[:num_cities] for p in PERSONS]


def answer_of(text: str) -> str | None:
    """The first person `text` names (leftmost, then longest), skipping names right after 祝; None if nobody."""
    if not isinstance(text, str):
        raise ParamError("text", f"text must be a str, got {type(text).__name__} {text!r}")
    best: tuple[int, int, str] | None = None  # (position, -length, name)
    for name in PERSONS:
        start = text.find(name)
        while start > 0 and text[start - 1] == _NOT_A_PERSON_AFTER:
            start = text.find(name, start + 1)
        if start >= 0 and (best is None or (start, -len(name)) < best[:2]):
            best = (start, -len(name), name)
    return None if best is None else best[2]


def is_correct(text: str, answer: str) -> bool:
    """Whether `text` answers with `answer`, the protagonist."""
    if answer not in PERSONS:
        raise ParamError("answer", f"answer must be one of the toy language's people {PERSONS}, got {answer!r}")
    return answer_of(text) == answer


def truth_accuracy(count: int, max_chars: int, seed: int = 0) -> tuple[int, int]:
    """(right, total): how often the true language itself answers right, on `count` documents it draws, reading the
    first `max_chars` characters after the opening sentence, the way the model's samples are read."""
    count, max_chars = check_int(count, "count"), check_int(max_chars, "max_chars")
    docs = DocumentLanguage().sample(count, seed=check_int(seed, "seed", low=0))
    right = 0
    for doc in docs:
        intro = _INTRO.match(doc)
        right += is_correct(doc[intro.end():intro.end() + max_chars], intro.group(1))
    return right, count

