"""Best-of-n with a verifier, and pass@k: n samples per prompt, a verifier picks one, count how often it is right.

`draw` sends each question of `decodelab.toy.questions` to `decodelab.engine.engine.Engine` as one request with
`SamplingParams(n=n, seed=...)`: the engine prefills the prompt once and forks its KV blocks to the n samples
(copy-on-write), and `draw` counts from each `StepOutput`'s block tables how many blocks that sharing saved. Every
token comes back with its log-probability under the model (`logprobs=0`). Three verifiers then choose, among the first
m samples of a prompt:

  - "exact": the truth (`is_correct`): right when any of the m is right; an oracle no real system has;
  - "likelihood": the sample with the highest mean log-probability per token, the model's own opinion of its text;
  - "majority": the answer most samples give (self-consistency, Wang et al. 2023), ties to the one named first.

pass@k is the chance that at least one of k samples is right; from n >= k samples of which c are right, Chen et al.
(2021) estimate it without bias by 1 - C(n-c, k) / C(n, k), computed as a product so no factorial overflows.

    >>> round(pass_at_k(16, 4, 4), 4)              # 1 - C(12,4)/C(16,4) = 1 - 495/1820
    0.728
    >>> majority_answer(["小明", None, "小红", "小明"])
    '小明'

Taught in: chapters/07e-best-of-n.ipynb
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from decodelab.toy.questions import Question, answer_of, is_correct
from decodelab.engine.engine import Engine
from decodelab.sampling.sampler import SamplingParams
from decodelab.validation import ParamError, check_int

VERIFIERS = ("exact", "likelihood", "majority")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from `n` samples with `c` right (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), as
    1 - prod_{i=n-c+1}^{n} (1 - k / i), which never forms a factorial. Needs 1 <= k <= n and 0 <= c <= n."""
    n, c, k = check_int(n, "n"), check_int(c, "c", low=0), check_int(k, "k")
    if c > n:
        raise ParamError("c", f"c (right samples) must be at most n ({n}), got {c}")
    if k > n:
        raise ParamError("k", f"k must be at most n ({n}): pass@k needs at least k samples, got k={k}")
    if n - c < k:  # every k-subset holds a right sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@dataclass(frozen=True)
class Samples:
    """The n samples of one question, in sample order: text, mean log-probability per token (nats, under the model
    before temperature) and generated tokens."""
    question: Question
    texts: tuple[str, ...]
    mean_logprobs: tuple[float, ...]
    num_tokens: tuple[int, ...]

    @property
    def answers(self) -> tuple[str | None, ...]:
        return tuple(answer_of(t) for t in self.texts)

    @property
    def correct(self) -> tuple[bool, ...]:
        return tuple(is_correct(t, self.question.answer) for t in self.texts)


@dataclass(frozen=True)
class Sharing:
    """KV blocks over a run, summed over its steps: what the sequences' block tables list (`listed`, a block shared by
    s samples counted s times, as separate copies would need) and what the pool holds (`distinct`). The peak is the
    step listing the most."""
    listed: int
    distinct: int
    peak_listed: int
    peak_distinct: int

    @property
    def saved_share(self) -> float:
        """The share of block-steps that sharing saved: 1 - distinct / listed."""
        return 1.0 - self.distinct / self.listed if self.listed else 0.0


@dataclass(frozen=True)
class Draw:
    """What `draw` returns: the samples of each question, the block sharing, and the engine's token counts for the
    run (prompt tokens computed by prefill or found in the prefix cache, tokens computed by decode steps)."""
    samples: list[Samples]
    sharing: Sharing
    prefill_tokens: int
    cached_prompt_tokens: int
    decode_tokens: int


def draw(engine: Engine, questions: Sequence[Question], n: int, temperature: float, seed: int = 0,
         max_tokens: int = 40) -> Draw:
    """`n` samples of each question through `engine` (question i seeded `seed + i`, so its samples do not depend on
    the batch), every token's log-probability, and the block sharing seen step by step."""
    if isinstance(questions, (str, bytes)) or not isinstance(questions, Sequence) or not questions or not all(
            isinstance(q, Question) for q in questions):
        raise ParamError("questions", f"questions must be a non-empty list of Question, got {questions!r}")
    if not isinstance(engine, Engine):
        raise ParamError("engine", f"engine must be a decodelab Engine, got {type(engine).__name__}")
    seed = check_int(seed, "seed", low=0)
    params = [SamplingParams(n=n, temperature=temperature, seed=seed + i, max_tokens=max_tokens, logprobs=0)
              for i in range(len(questions))]
    checked = [engine.check_request(q.prompt, p, f"questions[{i}]") for i, (q, p) in enumerate(zip(questions, params))]
    before = engine.stats
    request_ids = [engine.add_request(request) for request in checked]
    done, listed, distinct, peak = {}, 0, 0, (0, 0)
    while engine.has_unfinished():
        out = engine.step()
        tables = list(out.block_tables.values())
        step_listed, step_distinct = sum(map(len, tables)), len({b for t in tables for b in t})
        listed, distinct, peak = listed + step_listed, distinct + step_distinct, max(peak, (step_listed, step_distinct))
        done.update((c.request_id, c) for c in out.finished)
    after = engine.stats
    samples = []
    for q, rid in zip(questions, request_ids):
        completion = done[rid]
        each = completion.samples or (completion,)
        samples.append(Samples(q, tuple(s.text for s in each),
                               tuple(float(np.mean([t.logprob for t in s.logprobs])) for s in each),
                               tuple(len(s.token_ids) for s in each)))
    return Draw(samples, Sharing(listed, distinct, *peak), after.prefill_tokens - before.prefill_tokens,
                after.prefix_cache_hit_tokens - before.prefix_cache_hit_tokens,
                after.decode_tokens - before.decode_tokens)


def _check_m(samples: Samples, m: int) -> int:
    if not isinstance(samples, Samples):
        raise ParamError("samples", f"samples must be a Samples, got {type(samples).__name__}")
    m = check_int(m, "m")
    if m > len(samples.texts):
        raise ParamError("m", f"m must be at most the {len(samples.texts)} samples drawn, got {m}")
    return m


def majority_answer(answers: Sequence[str | None]) -> str | None:
    """The answer given most often (None, no answer, never wins), ties to the one given first; None if no answers."""
    if isinstance(answers, (str, bytes)) or not isinstance(answers, Sequence):
        raise ParamError("answers", f"answers must be a list of answers (str or None), got {answers!r}")
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    top = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == top)


def pick(samples: Samples, m: int, verifier: str) -> int:
    """The index (among the first `m` samples) that `verifier` chooses: "exact" the first right one (else 0),
    "likelihood" the highest mean log-probability, "majority" the first sample giving the majority answer (else 0)."""
    m = _check_m(samples, m)
    if verifier == "exact":
        return next((i for i, ok in enumerate(samples.correct[:m]) if ok), 0)
    if verifier == "likelihood":
        return int(np.argmax(samples.mean_logprobs[:m]))
    if verifier == "majority":
        answers = samples.answers[:m]
        winner = majority_answer(answers)
        return answers.index(winner) if winner is not None else 0
    raise ParamError("verifier", f"verifier must be one of {VERIFIERS}, got {verifier!r}")


def is_right(samples: Samples, m: int, verifier: str) -> bool:
    """Whether best-of-`m` under `verifier` answers the question right."""
    return samples.correct[pick(samples, m, verifier)]


def mean_pass_at_k(all_samples: Sequence[Samples], k: int) -> list[float]:
    """pass@k of each question, estimated from all its samples."""
    if isinstance(all_samples, (str, bytes)) or not isinstance(all_samples, Sequence) or not all_samples:
        raise ParamError("all_samples", f"all_samples must be a non-empty list of Samples, got {all_samples!r}")
    return [pass_at_k(len(s.texts), sum(s.correct), k) for s in all_samples]


def bootstrap_mean(values: Sequence[float], draws: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): the mean of `values` with a percentile bootstrap 95% interval, resampling the values."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0 or not np.isfinite(array).all():
        raise ParamError("values", f"values must be a non-empty list of finite numbers, got {values!r}")
    rng = np.random.default_rng(check_int(seed, "seed", low=0))
    means = array[rng.integers(0, array.size, size=(check_int(draws, "draws"), array.size))].mean(axis=1)
    return float(array.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))
