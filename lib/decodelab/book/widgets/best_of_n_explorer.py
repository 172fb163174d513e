"""The best-of-n explorer: one question's samples as cards, which one each verifier picks among the first n, pass@k.

`best_of_n_frames` draws n samples of each question at each temperature with `decodelab.measure.best_of_n.draw` (the engine
prefills a prompt once and its samples share its KV blocks; question i seeded `seed + i`) and returns plain data: per
(question, temperature) the samples (text, answer, right or wrong, mean log-probability per token, tokens) and, for
every m = 1..n, what the first m samples give: each verifier's pick (`best_of_n.pick`), the count c of right ones, the
unbiased pass@k for k = 1..m (`best_of_n.pass_at_k(m, c, k)`) and the tokens they cost.

`BestOfNExplorer` shows them with a choice of question and temperature and a slider for n. Its ESM
(`best_of_n_explorer.js` after the shared prelude) only draws stored data, so it works in the static HTML book with
no kernel.

Taught in: chapters/07e-best-of-n.ipynb
"""
from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence

import anywidget
import traitlets

from decodelab.measure.best_of_n import VERIFIERS, draw, pass_at_k, pick
from decodelab.toy.questions import Question
from decodelab.engine.engine import Engine
from decodelab.decoding.request import prompt_token_ids
from decodelab.validation import as_scalar, check_int, check_records
from decodelab.book.widgets.esm import ESM_PRELUDE

_HERE = pathlib.Path(__file__).parent
_NOT_A_PERSON_AFTER = "祝"  # as best_of_n_task.answer_of: a name right after 祝 is an addressee, not the answer


def _answer_at(text: str, answer: str | None) -> int:
    """Where `answer_of(text)` found `answer` in `text` (its first occurrence not right after 祝); -1 for None.
    answer_of takes the leftmost such occurrence over all names, so it is this name's own first one."""
    if answer is None:
        return -1
    start = text.find(answer)
    while start > 0 and text[start - 1] == _NOT_A_PERSON_AFTER:
        start = text.find(answer, start + 1)
    return start


def best_of_n_frames(engine: Engine, questions: Sequence[Question], temperatures: Sequence[float], n: int = 16,
                     seed: int = 0, max_tokens: int = 40) -> list[dict]:
    """`draw(engine, questions, n, temperature, seed, max_tokens)` at each temperature, as plain data: one run per
    (question, temperature), questions in order, temperatures in order within each, each run

    `{"question": prompt, "answer", "temperature", "seed", "prompt_tokens", "max_tokens", "samples", "frames"}`

    - `samples`: the n samples in draw order, `{"text", "answer" (None: names nobody), "answer_at" (where the answer
      starts in the text, -1 for None), "correct", "mean_logprob" (nats per token, 3 decimals), "num_tokens"}`;
    - `frames`: one per m = 1..n, what the first m samples give: `{"n": m, "picks": {verifier: index}}` from
      `best_of_n.pick`, `"num_right"` (c), `"pass_at_k"` (`pass_at_k(m, c, k)` for k = 1..m, 4 decimals) and
      `"tokens"` (tokens the m samples generated).

    Six questions x three temperatures x 16 samples of tiny-zh-doc take a few seconds on one CPU thread.

    Example:
        runs = best_of_n_frames(Engine(model, tokenizer, block_size=4),
                                [question("老王", "成都"), question("小明", "北京")], (0.7, 1.0, 1.5))
    Taught in: chapters/07e-best-of-n.ipynb
    """
    if isinstance(temperatures, (str, bytes)) or not isinstance(temperatures, Sequence) or not temperatures:
        raise ValueError(f"temperatures must be a non-empty list of temperatures, got {temperatures!r}")
    if len(set(temperatures)) != len(temperatures):
        raise ValueError(f"temperatures must be distinct, got {list(temperatures)}")
    n, seed = check_int(n, "n"), check_int(seed, "seed", low=0)
    draws = {float(t): draw(engine, questions, n, t, seed=seed, max_tokens=max_tokens) for t in temperatures}
    runs = []
    for i, asked in enumerate(questions):
        for temperature, drawn in draws.items():
            samples = drawn.samples[i]
            frames = []
            for m in range(1, n + 1):
                right = sum(samples.correct[:m])
                frames.append({"n": m, "picks": {v: pick(samples, m, v) for v in VERIFIERS}, "num_right": right,
                               "pass_at_k": [round(pass_at_k(m, right, k), 4) for k in range(1, m + 1)],
                               "tokens": sum(samples.num_tokens[:m])})
            runs.append({
                "question": asked.prompt, "answer": asked.answer, "temperature": temperature, "seed": seed + i,
                "prompt_tokens": len(prompt_token_ids(asked.prompt, engine.tokenizer, "question")),
                "max_tokens": max_tokens,
                "samples": [{"text": text, "answer": answer, "answer_at": _answer_at(text, answer), "correct": ok,
                             "mean_logprob": round(logprob, 3), "num_tokens": tokens}
                            for text, answer, ok, logprob, tokens in zip(samples.texts, samples.answers,
                                                                         samples.correct, samples.mean_logprobs,
                                                                         samples.num_tokens)],
                "frames": frames,
            })
    return runs


# A blank line between the shared prelude and this widget's own view (best_of_n_explorer.js).
_ESM = ESM_PRELUDE + "\n" + (_HERE / "best_of_n_explorer.js").read_text(encoding="utf-8")


class BestOfNExplorer(anywidget.AnyWidget):
    """Samples recorded by `best_of_n_frames` as cards, with a choice of question and temperature among the recorded
    ones and a slider for n: which card each verifier picks among the first n, pass@k for k <= n, the token cost.

    >>> from decodelab.book.widgets.best_of_n_explorer import BestOfNExplorer, best_of_n_frames
    >>> from decodelab.engine import Engine
    >>> from decodelab.models import load_model
    >>> from decodelab.toy.questions import question
    >>> model, tokenizer = load_model("tiny-zh-doc", device="cpu")
    >>> runs = best_of_n_frames(Engine(model, tokenizer, block_size=4),
    ...                         [question("老王", "成都"), question("小明", "北京")], (0.7, 1.0), n=4, max_tokens=24)
    >>> BestOfNExplorer(runs, question="这是老王在成都的一天。", temperature=1.0, n=4)
    BestOfNExplorer(questions=2, temperatures=[0.7, 1.0], question='这是老王在成都的一天。', temperature=1.0, n=4)

    Taught in: chapters/07e-best-of-n.ipynb
    """

    _esm = _ESM

    runs = traitlets.List(traitlets.Dict()).tag(sync=True)
    question = traitlets.Unicode("").tag(sync=True)
    temperature = traitlets.Float(1.0).tag(sync=True)
    n = traitlets.Int(1).tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)
    lecture = traitlets.Bool(False).tag(sync=True)

    def __init__(self, runs: Sequence[Mapping], *, question: str | None = None, temperature: float | None = None,
                 n: int = 4, title: str = "", lecture: bool = False) -> None:
        runs = check_records(runs, "runs", "best_of_n_frames")
        if not runs:
            raise ValueError("runs must hold at least one run (see best_of_n_frames), got none")
        missing = {"question", "answer", "temperature", "samples", "frames"} - set(runs[0])
        if missing:
            raise ValueError(f"runs must come from best_of_n_frames; the first run lacks {sorted(missing)}")
        questions = list(dict.fromkeys(run["question"] for run in runs))
        temperatures = list(dict.fromkeys(run["temperature"] for run in runs))
        recorded = [(run["question"], run["temperature"]) for run in runs]
        wanted = [(q, t) for q in questions for t in temperatures]
        if recorded != wanted:
            raise ValueError(f"runs must hold each (question, temperature) of {wanted} once, in that order, "
                             f"got {recorded}")
        sizes = sorted({len(run["samples"]) for run in runs})
        if len(sizes) != 1:
            raise ValueError(f"runs must all hold the same number of samples, got {sizes}")
        question = questions[0] if question is None else question
        temperature = temperatures[0] if temperature is None else temperature
        if question not in questions:
            raise ValueError(f"question must be one of {questions}, got {question!r}")
        temperature, n = as_scalar(temperature), as_scalar(n)
        if isinstance(temperature, bool) or temperature not in temperatures:
            raise ValueError(f"temperature must be one of {temperatures}, got {temperature!r}")
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= sizes[0]:
            raise ValueError(f"n must be an int in [1, {sizes[0]}] (the samples drawn per question), got {n!r}")
        super().__init__(runs=[dict(run) for run in runs], question=question, temperature=float(temperature), n=n,
                         title=title, lecture=bool(lecture))

    @property
    def questions(self) -> list[str]:
        """The question prompts offered, in the order of the runs."""
        return list(dict.fromkeys(run["question"] for run in self.runs))

    @property
    def temperatures(self) -> list[float]:
        """The temperatures offered, in the order of the runs."""
        return list(dict.fromkeys(run["temperature"] for run in self.runs))

    def run(self) -> dict:
        """The run of the chosen question and temperature."""
        return next(run for run in self.runs if (run["question"], run["temperature"]) == (self.question,
                                                                                           self.temperature))

    def frame(self) -> dict:
        """What the first n samples give: the verifiers' picks, the count right, pass@k, the tokens."""
        return self.run()["frames"][self.n - 1]

    def __repr__(self) -> str:
        return (f"BestOfNExplorer(questions={len(self.questions)}, temperatures={self.temperatures}, "
                f"question={self.question!r}, temperature={self.temperature}, n={self.n})")
