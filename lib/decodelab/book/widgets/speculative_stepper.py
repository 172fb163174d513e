"""The speculative-decoding stepper: one round of speculative sampling per frame, which drafts were kept and why.

`speculative_frames` runs `decodelab.decoding.speculative.speculative_generate` once and turns each of its `Round` records
into a frame: the draft's proposals with q(x), the target's p(x) and the acceptance probability min(1, p / q) of each,
which were accepted, which one was rejected (and the token the target drew from the residual instead), or the bonus
token after a fully accepted round, with running counts. The accept/reject decisions and tokens are the run's own;
p and q are recomputed for display with one plain forward of each model over the round's context and drafts.

`speculative_runs` records one run per draft and gamma; `SpeculativeStepper` shows them with Prev/Next buttons and a
choice of draft and gamma. Its ESM (`speculative_stepper.js` after the shared prelude) only draws stored frames, so
it works in the static HTML book with no kernel.

Taught in: chapters/07b-speculative-decoding.ipynb
"""
from __future__ import annotations

import pathlib
from collections.abc import Callable, Mapping, Sequence

import anywidget
import torch
import traitlets

from decodelab.decoding.generate import model_step
from decodelab.decoding.request import prompt_token_ids
from decodelab.sampling.sampler import SamplingParams
from decodelab.decoding.speculative import ModelDraft, NgramDraft, distributions, speculative_generate
from decodelab.validation import as_scalar, check_index, check_int, check_records
from decodelab.book.widgets.esm import ESM_PRELUDE

_HERE = pathlib.Path(__file__).parent


def _rounded(probability: float) -> float:
    """A probability to 3 significant digits: enough to read, small in the notebook, stable across CPUs."""
    return float(f"{probability:.3g}")


@torch.no_grad()
def _round_probs(target, draft, ids: list[int], num_drafted: int,
                 params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor | None]:
    """p `[k + 1, V]` of the target and q `[k, V]` of a model draft (None for a point-mass draft) at the positions a
    round judged: `ids` is the context followed by the k = `num_drafted` drafts."""
    device = next(target.parameters()).device
    tokens = torch.tensor([ids], device=device)  # [1, n + k]
    start = len(ids) - num_drafted - 1  # the position that predicts the first draft
    logits, _ = model_step(target, tokens)  # [1, n + k, V]
    p = distributions(logits[0, start:], params)  # [k + 1, V]
    if not isinstance(draft, ModelDraft) or num_drafted == 0:
        return p, None
    draft_logits, _ = model_step(draft.model, tokens[:, :-1].to(next(draft.model.parameters()).device))
    return p, distributions(draft_logits[0, start:].to(p.device), params)  # [k, V]


def speculative_frames(target, tokenizer, prompt: str, params: SamplingParams, draft, gamma: int,
                       draft_name: str) -> dict:
    """Run `speculative_generate(target, tokenizer, prompt, params, draft, gamma)` and return the run as plain data:
    `{"draft", "gamma", "point_mass", "prompt", "text", "rounds": [frame, ...]}`, one frame per round (target forward):

    - `drafts`: per proposal `{"token", "q", "p", "accept_prob", "status"}`, status "accepted", "rejected" (the first
      rejected one) or "unjudged" (after a rejection: thrown away without a test); q is 1 for a point-mass draft;
    - `target`: the target's own token `{"token", "kind", "prob"}`, kind "residual" (drawn from
      r = normalize(max(0, p - q)) after a rejection, prob = r(x)), "bonus" (all proposals kept, drawn from the next
      p, prob = p(x)) or "plain" (no proposal: an ordinary step, prob = p(x));
    - `new_text`: what the round added to the output (shorter than accepted + 1 tokens when max_tokens or a stop token
      ended the run inside it), `emitted` its number of tokens;
    - running counts after the round: `tokens`, `forwards`, `accepted_total`, `judged_total`; and `summary`, the
      round in one Chinese sentence.

    `draft` must be a `ModelDraft` or an `NgramDraft` (the frames need its q); use a fresh one per run.

    Example:
        run = speculative_frames(target, tokenizer, "这是小明在北京的一天。", SamplingParams(seed=0, max_tokens=48),
                                 ModelDraft(small), 4, "tiny-zh-doc-small")
    Taught in: chapters/07b-speculative-decoding.ipynb
    """
    if not isinstance(draft, (ModelDraft, NgramDraft)):
        raise TypeError(f"draft must be a ModelDraft or an NgramDraft, got {type(draft).__name__}")
    if not isinstance(draft_name, str) or not draft_name:
        raise ValueError(f"draft_name must be a non-empty str, got {draft_name!r}")
    result = speculative_generate(target, tokenizer, prompt, params, draft, gamma)
    context = prompt_token_ids(prompt, tokenizer, "prompt", target.config.vocab_size)

    def text(ids: Sequence[int]) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=True)

    def piece(token: int) -> str:
        return tokenizer.decode([token], skip_special_tokens=False)

    prompt_text = text(context)
    why_cut = f"到了 max_tokens = {params.max_tokens}" if result.finish_reason == "length" else "其中最后一个是停止 token"
    frames, tokens, accepted_total, judged_total = [], 0, 0, 0
    for number, record in enumerate(result.rounds, 1):
        drafted, kept = list(record.drafted), record.accepted
        p, q = _round_probs(target, draft, context + drafted, len(drafted), params)
        drafts = []
        for i, token in enumerate(drafted):
            p_x, q_x = float(p[i, token]), 1.0 if q is None else float(q[i, token])
            status = "accepted" if i < kept else "rejected" if i == kept else "unjudged"
            drafts.append({"token": piece(token), "q": _rounded(q_x), "p": _rounded(p_x),
                           "accept_prob": _rounded(min(1.0, p_x / q_x)), "status": status})
        if kept < len(drafted):
            residual = p[kept].clone()  # [V]
            if q is None:
                residual[drafted[kept]] = 0.0  # max(0, p - a point mass on the draft)
            else:
                residual = (residual - q[kept]).clamp_min(0.0)
            if float(residual.sum()) <= 0.0:  # p == q up to rounding; verify() draws from p then
                residual = p[kept]
            kind, prob = "residual", float(residual[record.token] / residual.sum())
        else:
            kind, prob = ("bonus" if drafted else "plain"), float(p[len(drafted), record.token])
        emitted = min(kept + 1, len(result.token_ids) - tokens)
        new_ids = result.token_ids[tokens:tokens + emitted]
        tokens += emitted
        accepted_total += kept
        judged_total += len(record.acceptance_probs)
        frames.append({
            "round": number,
            "drafts": drafts,
            "target": {"token": piece(record.token), "kind": kind, "prob": _rounded(prob)},
            "accepted": kept,
            "new_text": text(new_ids),
            "emitted": emitted,
            "tokens": tokens,
            "forwards": number,
            "accepted_total": accepted_total,
            "judged_total": judged_total,
            "summary": _summary(drafts, kept, piece(record.token), kind, emitted, draft_name, why_cut),
        })
        context += new_ids
    return {"draft": draft_name, "gamma": gamma, "point_mass": isinstance(draft, NgramDraft),
            "prompt": prompt_text, "text": result.text, "rounds": frames}


def _summary(drafts: list[dict], kept: int, token: str, kind: str, emitted: int, draft_name: str,
             why_cut: str) -> str:
    """One round in words (Chinese), as the stepper shows it under the tokens; `why_cut` says why the run ended,
    for a round it cut short."""
    if not drafts:
        said = f"{draft_name} 在上下文里找不到匹配，这一轮什么也不提议；目标模型的一次前向只从 p 抽出“{token}”"
    elif kind == "residual":
        rejected = drafts[kept]
        said = (f"draft 提议 {len(drafts)} 个，目标模型一次前向检验：" + (f"接受前 {kept} 个，" if kept else "")
                + f"第 {kept + 1} 个“{rejected['token']}”被拒绝（接受概率 {rejected['accept_prob']:.2f}），"
                f"改从残差分布 r 抽出“{token}”" + ("，后面的提议作废" if kept + 1 < len(drafts) else ""))
    else:
        said = f"draft 提议的 {len(drafts)} 个全部被接受，目标模型再从下一个位置的 p 多抽一个 bonus token“{token}”"
    produced = kept + 1
    if emitted < produced:
        return said + f"；这一轮只留下前 {emitted} 个 token，{why_cut}，生成结束。"
    return said + f"；这一轮产出 {produced} 个 token。"


def speculative_runs(target, tokenizer, prompt: str, params: SamplingParams,
                     drafts: Mapping[str, Callable[[], ModelDraft | NgramDraft]], gammas: Sequence[int]) -> list[dict]:
    """`speculative_frames` for every draft in `drafts` (name -> a function that makes a fresh draft) and every gamma
    in `gammas`, in that order: the runs a `SpeculativeStepper` offers.

    >>> from decodelab.book.widgets.speculative_stepper import speculative_runs
    >>> from decodelab.decoding.speculative import ModelDraft, NgramDraft
    >>> from decodelab.models import load_model
    >>> from decodelab.sampling import SamplingParams
    >>> target, tokenizer = load_model("tiny-zh-doc", device="cpu")
    >>> small = load_model("tiny-zh-doc-small", device="cpu")[0]
    >>> runs = speculative_runs(target, tokenizer, "这是小明在北京的一天。", SamplingParams(seed=0, max_tokens=16),
    ...                         {"tiny-zh-doc-small": lambda: ModelDraft(small), "n-gram": NgramDraft}, (2, 4, 6))
    >>> [(run["draft"], run["gamma"]) for run in runs]   # doctest: +NORMALIZE_WHITESPACE
    [('tiny-zh-doc-small', 2), ('tiny-zh-doc-small', 4), ('tiny-zh-doc-small', 6),
     ('n-gram', 2), ('n-gram', 4), ('n-gram', 6)]

    Taught in: chapters/07b-speculative-decoding.ipynb
    """
    if not drafts:
        raise ValueError("drafts must name at least one draft, got none")
    if not gammas:
        raise ValueError("gammas must hold at least one gamma, got none")
    for gamma in gammas:
        check_int(gamma, "gamma", 1)
    return [speculative_frames(target, tokenizer, prompt, params, make_draft(), gamma, name)
            for name, make_draft in drafts.items() for gamma in gammas]


# A blank line between the shared prelude and this widget's own view (speculative_stepper.js).
_ESM = ESM_PRELUDE + "\n" + (_HERE / "speculative_stepper.js").read_text(encoding="utf-8")


class SpeculativeStepper(anywidget.AnyWidget):
    """Prev/Next through the rounds of runs recorded by `speculative_runs`, with a choice of draft and gamma among
    the recorded ones: each round's proposals (accepted, rejected, thrown away), the target's own token, the counts.

    >>> from decodelab.book.widgets.speculative_stepper import SpeculativeStepper, speculative_runs
    >>> from decodelab.decoding.speculative import ModelDraft, NgramDraft
    >>> from decodelab.models import load_model
    >>> from decodelab.sampling import SamplingParams
    >>> target, tokenizer = load_model("tiny-zh-doc", device="cpu")
    >>> small = load_model("tiny-zh-doc-small", device="cpu")[0]
    >>> runs = speculative_runs(target, tokenizer, "这是小明在北京的一天。", SamplingParams(seed=0, max_tokens=16),
    ...                         {"tiny-zh-doc-small": lambda: ModelDraft(small), "n-gram": NgramDraft}, (2, 4, 6))
    >>> SpeculativeStepper(runs, draft="n-gram", gamma=4)
    SpeculativeStepper(drafts=['tiny-zh-doc-small', 'n-gram'], gammas=[2, 4, 6], draft='n-gram', gamma=4, index=0)

    Taught in: chapters/07b-speculative-decoding.ipynb
    """

    _esm = _ESM

    runs = traitlets.List(traitlets.Dict()).tag(sync=True)
    draft = traitlets.Unicode("").tag(sync=True)
    gamma = traitlets.Int(1).tag(sync=True)
    index = traitlets.Int(0).tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)
    lecture = traitlets.Bool(False).tag(sync=True)

    def __init__(self, runs: Sequence[Mapping], *, draft: str | None = None, gamma: int | None = None,
                 index: int = 0, title: str = "", lecture: bool = False) -> None:
        runs = check_records(runs, "runs", "speculative_runs")
        if not runs:
            raise ValueError("runs must hold at least one run (see speculative_runs), got none")
        missing = {"draft", "gamma", "prompt", "rounds"} - set(runs[0])
        if missing:
            raise ValueError(f"runs must come from speculative_runs; the first run lacks {sorted(missing)}")
        drafts = list(dict.fromkeys(run["draft"] for run in runs))
        gammas = sorted({run["gamma"] for run in runs})
        recorded = [(run["draft"], run["gamma"]) for run in runs]
        wanted = [(name, g) for name in drafts for g in gammas]
        if sorted(recorded, key=wanted.index) != wanted:
            raise ValueError(f"runs must hold each (draft, gamma) of {wanted} once, got {recorded}")
        draft = runs[0]["draft"] if draft is None else draft
        gamma = runs[0]["gamma"] if gamma is None else as_scalar(gamma)
        if draft not in drafts:
            raise ValueError(f"draft must be one of {drafts}, got {draft!r}")
        if gamma not in gammas or isinstance(gamma, bool):
            raise ValueError(f"gamma must be one of {gammas}, got {gamma!r}")
        rounds = next(run["rounds"] for run in runs if (run["draft"], run["gamma"]) == (draft, gamma))
        index = check_index(index, "index", len(rounds), f" (the rounds of draft {draft!r}, gamma {gamma})")
        super().__init__(runs=[dict(run) for run in runs], draft=draft, gamma=gamma, index=index, title=title,
                         lecture=bool(lecture))

    @property
    def drafts(self) -> list[str]:
        """The draft names offered, in the order of the runs."""
        return list(dict.fromkeys(run["draft"] for run in self.runs))

    @property
    def gammas(self) -> list[int]:
        """The gammas offered, ascending."""
        return sorted({run["gamma"] for run in self.runs})

    def run(self) -> dict:
        """The run of the chosen draft and gamma."""
        return next(run for run in self.runs if (run["draft"], run["gamma"]) == (self.draft, self.gamma))

    def frame(self) -> dict:
        """The round shown now."""
        return self.run()["rounds"][self.index]

    def __repr__(self) -> str:
        return (f"SpeculativeStepper(drafts={self.drafts}, gammas={self.gammas}, draft={self.draft!r}, "
                f"gamma={self.gamma}, index={self.index})")
