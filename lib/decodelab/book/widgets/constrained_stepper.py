"""The constrained-decoding stepper: one step of one masked generation per frame, what the mask removed and where
the removed probability went.

`constrained_frames` runs `decodelab.decoding.constrained.constrained_generate` once (n = 1) and turns each of its steps into
a frame: the model's next-token distribution p_t (after the request's own logits processing, without the mask), the
grammar's mask A_t, the masked and renormalised distribution q_t = p_t 1[A_t] / m_t the token was drawn from, the
kept mass m_t, the token drawn and the running log q and log p of the text so far. The tokens are the run's own;
p_t, q_t and the masks are recomputed for display with one teacher-forced forward and a replay of the grammar state.

`ConstrainedStepper` shows the frames of a few such runs (the cases) with Prev/Next, a slider and a choice of case.
Its ESM (`constrained_stepper.js` after the shared prelude) only draws stored frames, so it works in the static HTML
book with no kernel.

Taught in: chapters/07d-constrained-decoding.ipynb
"""
from __future__ import annotations

import math
import pathlib
from collections.abc import Mapping, Sequence

import anywidget
import torch
import traitlets

from decodelab.decoding.constrained import constrained_generate
from decodelab.decoding.generate import model_step
from decodelab.sampling.sampler import SamplingParams, process_logits
from decodelab.models.tokenizer import encode_prompt
from decodelab.validation import check_index, check_int, check_records
from decodelab.book.widgets.esm import ESM_PRELUDE

_HERE = pathlib.Path(__file__).parent
# Allowed tokens outside the model's top `top` that a frame shows as well: where the mask keeps only tokens the model
# barely wants (after 小明喜欢吃 only 北), the top of p is all forbidden and q's mass sits below it.
_EXTRA_ALLOWED = 3


def _rounded(value: float) -> float:
    """A probability to 3 significant digits: enough to read, small in the notebook, stable across CPUs."""
    return float(f"{value:.3g}")


def _log_rounded(value: float) -> float | None:
    """A log-probability to 3 decimals; None for -inf (JSON has no infinity)."""
    return None if value == -math.inf else round(value, 3)


def _params_text(params: SamplingParams) -> str:
    """The sampling parameters a case used, as the stepper prints them."""
    parts = ["greedy" if params.greedy else f"T = {params.temperature:g}"]
    if params.top_k:
        parts.append(f"top-k = {params.top_k}")
    if params.top_p < 1:
        parts.append(f"top-p = {params.top_p:g}")
    if params.min_p:
        parts.append(f"min-p = {params.min_p:g}")
    parts.append(f"seed = {params.seed}")
    return " · ".join(parts)


@torch.no_grad()
def _step_log_probs(model, ids: list[int], generated: list[int], params: SamplingParams,
                    masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log p_t and log q_t, `[T, V]` float64, at every step t of a generation: one teacher-forced forward over the
    prompt `ids` and the `generated` tokens, then the sampler's logits processing without and with `masks` `[T, V]`."""
    device = next(model.parameters()).device
    tokens = torch.tensor([ids + generated[:-1]], device=device)  # [1, L + T - 1]
    logits, _ = model_step(model, tokens)  # [1, L + T - 1, V]
    steps = logits[0, len(ids) - 1:].double()  # [T, V]: row t predicts generated[t]
    log_p, log_q = [], []
    for t in range(len(generated)):
        seen = ({"output_tokens": [generated[:t]], "prompt_tokens": [ids]} if params.has_penalties else {})
        row = steps[t:t + 1]  # [1, V]
        log_p.append(torch.log_softmax(process_logits(row, params, **seen), dim=-1)[0])
        masked = row.masked_fill(~masks[t:t + 1].to(device), float("-inf"))
        log_q.append(torch.log_softmax(process_logits(masked, params, **seen), dim=-1)[0])
    return torch.stack(log_p).cpu(), torch.stack(log_q).cpu()  # [T, V] each


def constrained_frames(model, tokenizer, prompt: str | list[int], params: SamplingParams, grammar, name: str, *,
                       description: str = "", log_z: float | None = None, log_z_source: str = "",
                       top: int = 10) -> dict:
    """Run `constrained_generate(model, tokenizer, prompt, params, grammar)` (params.n must be 1) and return it as
    plain data: `{"case", "description", "params", "prompt", "text", "finish_reason", "vocab_size", "eos_id", "log_q",
    "log_p", "log_z", "log_z_source", "steps": [frame, ...]}`, one frame per generated token:

    - `rows`: the `top` most probable tokens under p_t, the `_EXTRA_ALLOWED` most probable allowed tokens and the
      drawn token, by p_t descending, each `{"id", "token", "rank" (under p_t, from 1), "p", "allowed", "q" (q_t, 0
      when forbidden), "drawn"}`;
    - `allowed`: |A_t|; `eos_allowed`; `kept`: m_t = p_t(A_t); `removed`: 1 - m_t;
    - `rest_allowed`, `rest_allowed_p`, `rest_allowed_q`, `rest_forbidden`, `rest_forbidden_p`: the tokens not
      shown, how many and their total probability;
    - `token`, `id`, `eos`, `p`, `q`: the token drawn and its p_t and q_t; `text`: the text after this step;
    - `log_q`, `log_p`: running sums up to this step (None for -inf); `summary`: the step in one Chinese sentence.

    `log_z` (log P(valid) of the grammar under p, with `log_z_source` saying where it comes from) lets the stepper
    compare the finished text's q(x) with p(x | valid) = p(x) / Z. Probabilities keep 3 significant digits.

    Example:
        run = constrained_frames(model, tokenizer, "", SamplingParams(seed=5, max_tokens=40), form, "正则：6 句",
                                 log_z=-8.555, log_z_source="6 句全部列出，精确值")   # 小明喜欢吃北京烤鸭。
    Taught in: chapters/07d-constrained-decoding.ipynb
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str, got {name!r}")
    if not isinstance(params, SamplingParams) or params.n != 1:
        raise ValueError(f"params must be a SamplingParams with n = 1 (the stepper follows one generation), got "
                         f"{params!r}")
    check_int(top, "top")
    if log_z is not None and (isinstance(log_z, bool) or not isinstance(log_z, (int, float))
                              or not -math.inf < log_z <= 0):
        raise ValueError(f"log_z must be None or a finite log-probability <= 0, got {log_z!r}")
    completion = constrained_generate(model, tokenizer, prompt, params, grammar)[0]
    ids = encode_prompt(tokenizer, prompt) if isinstance(prompt, str) else list(prompt)
    generated = completion.token_ids
    state = grammar.start()
    masks = []
    for token in generated:
        masks.append(state.mask())
        state.advance(token)
    masks = torch.stack(masks)  # [T, V]
    log_p, log_q = _step_log_probs(model, ids, generated, params, masks)  # [T, V] each

    def piece(token: int) -> str:
        return tokenizer.decode([token], skip_special_tokens=False)

    truncated = bool(params.top_k or params.top_p < 1 or params.min_p)
    frames, running_q, running_p = [], 0.0, 0.0
    for t, token in enumerate(generated):
        p, q, mask = log_p[t].exp(), log_q[t].exp(), masks[t]  # [V] each
        kept = float(p[mask].sum())
        order = torch.argsort(p, descending=True, stable=True)  # [V]
        ranks = {int(v): r + 1 for r, v in enumerate(order.tolist())}
        allowed_by_p = [int(v) for v in order.tolist() if bool(mask[v])]
        shown = set(order[:top].tolist()) | set(allowed_by_p[:_EXTRA_ALLOWED]) | {token}
        rows = [{"id": v, "token": piece(v), "rank": ranks[v], "p": _rounded(float(p[v])), "allowed": bool(mask[v]),
                 "q": _rounded(float(q[v])) if bool(mask[v]) else 0.0, "drawn": v == token}
                for v in sorted(shown, key=ranks.get)]
        hidden = torch.ones_like(mask)
        hidden[sorted(shown)] = False
        running_q += float(log_q[t, token])
        running_p += float(log_p[t, token])
        text = tokenizer.decode(generated[:t + 1], skip_special_tokens=True)
        frame = {
            "step": t + 1,
            "rows": rows,
            "allowed": int(mask.sum()),
            "eos_allowed": bool(mask[grammar.eos_token_id]),
            "kept": _rounded(kept),
            "removed": _rounded(max(0.0, 1.0 - kept)),
            "rest_allowed": int((hidden & mask).sum()),
            "rest_allowed_p": _rounded(float(p[hidden & mask].sum())),
            "rest_allowed_q": _rounded(float(q[hidden & mask].sum())),
            "rest_forbidden": int((hidden & ~mask).sum()),
            "rest_forbidden_p": _rounded(float(p[hidden & ~mask].sum())),
            "token": piece(token),
            "id": token,
            "eos": token == grammar.eos_token_id,
            "p": _rounded(float(p[token])),
            "q": _rounded(float(q[token])),
            "text": text,
            "log_q": _log_rounded(running_q),
            "log_p": _log_rounded(running_p),
        }
        frame["summary"] = _summary(frame, truncated)
        frames.append(frame)
    return {"case": name, "description": description, "params": _params_text(params),
            "prompt": tokenizer.decode(ids, skip_special_tokens=True), "text": completion.text,
            "finish_reason": completion.finish_reason, "vocab_size": int(masks.shape[1]),
            "eos_id": grammar.eos_token_id,
            "log_q": _log_rounded(completion.log_q), "log_p": _log_rounded(completion.log_p),
            "log_z": None if log_z is None else round(float(log_z), 3), "log_z_source": log_z_source,
            "steps": frames}


def _summary(frame: dict, truncated: bool) -> str:
    """One step in words (Chinese), as the stepper shows it under the tokens. With top-k, top-p or min-p
    (`truncated`) the sampler truncates after the mask, so q is not p / m and the sentence does not say it is."""
    # Chinese quotes need no space around them; a Latin word does.
    drawn = " EOS，生成结束" if frame["eos"] else f"“{frame['token']}”"
    kept, removed = frame["kept"], frame["removed"]
    if kept == 0:
        return (f"模型（经过这组采样参数之后）给语法允许的 {frame['allowed']} 个 token 的概率全是 0，"
                f"掩码之后只能在它们之间选。抽到{drawn}。")
    if frame["allowed"] == 1:
        only = " EOS " if frame["eos"] else f"“{frame['token']}”"
        if removed < 0.01:
            return (f"语法只允许{only}一个 token，模型本来也几乎只想要它（p = {frame['p']:.3g}）：q = 1，"
                    f"这一步几乎没有改变分布。抽到{drawn}。")
        forced = "：模型想往别处走，被硬拉了回来" if kept < 0.5 else ""
        return (f"语法只允许{only}一个 token，模型给它 p = {frame['p']:.3g}；掩码把它放大成 q = 1，"
                f"是 p 的 {1 / kept:.3g} 倍{forced}。抽到{drawn}。")
    if removed < 0.01:
        return f"掩码几乎什么也没砍掉（1 − m = {removed:.2g}）：这一步 q 与 p 几乎一样。抽到{drawn}。"
    cut = f"几乎全部（只剩 m = {kept:.3g}）" if kept < 0.001 else f" {100 * removed:.1f}%"
    share = "" if truncated else (f"剩下的 {frame['allowed']} 个允许的 token 按 p 的比例分掉全部概率："
                                  f"每个都乘以 1 / m = {1 / kept:.3g}。")
    return f"掩码砍掉了 p 的{cut}。{share}抽到{drawn}，p = {frame['p']:.3g}，q = {frame['q']:.3g}。"


# A blank line between the shared prelude and this widget's own view (constrained_stepper.js).
_ESM = ESM_PRELUDE + "\n" + (_HERE / "constrained_stepper.js").read_text(encoding="utf-8")


class ConstrainedStepper(anywidget.AnyWidget):
    """Prev/Next through the steps of runs recorded by `constrained_frames`, with a choice of case: each step's
    top tokens under the model, which the grammar allows, the renormalised q, the mass the mask removed, the token
    drawn and the running log q and log p.

    >>> from decodelab.book.widgets.constrained_stepper import ConstrainedStepper, constrained_frames
    >>> from decodelab.grammar import LLGuidanceGrammar
    >>> from decodelab.sampling import SamplingParams
    >>> form = LLGuidanceGrammar.regex("(小明|小红)(喜欢吃北京烤鸭|坐(飞机|火车)去北京)。", tokenizer)
    >>> city = LLGuidanceGrammar.regex("[^。！？]{0,15}北京[^。！？]{0,15}[。！？]", tokenizer)
    >>> runs = [constrained_frames(model, tokenizer, "", SamplingParams(seed=5, max_tokens=40), form, "正则：6 句"),
    ...         constrained_frames(model, tokenizer, "", SamplingParams(seed=0, max_tokens=40), city, "正则：提到北京")]
    >>> stepper = ConstrainedStepper(runs, case="正则：提到北京", index=11)
    >>> stepper
    ConstrainedStepper(cases=['正则：6 句', '正则：提到北京'], case='正则：提到北京', index=11, lecture=False)
    >>> stepper.frame()["text"], stepper.frame()["allowed"]   # the text after this step, |A_t|
    ('小红正在火车站等王奶奶的', 466)

    Taught in: chapters/07d-constrained-decoding.ipynb
    """

    _esm = _ESM

    runs = traitlets.List(traitlets.Dict()).tag(sync=True)
    case = traitlets.Unicode("").tag(sync=True)
    index = traitlets.Int(0).tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)
    lecture = traitlets.Bool(False).tag(sync=True)

    def __init__(self, runs: Sequence[Mapping], *, case: str | None = None, index: int = 0, title: str = "",
                 lecture: bool = False) -> None:
        runs = check_records(runs, "runs", "constrained_frames")
        if not runs:
            raise ValueError("runs must hold at least one run (see constrained_frames), got none")
        for position, run in enumerate(runs):
            missing = {"case", "params", "prompt", "steps"} - set(run)
            if missing or not run["steps"]:
                raise ValueError(f"runs must come from constrained_frames; runs[{position}] lacks "
                                 f"{sorted(missing) or ['steps']}")
        cases = [run["case"] for run in runs]
        if len(set(cases)) != len(cases):
            raise ValueError(f"runs must have distinct case names, got {cases}")
        case = cases[0] if case is None else case
        if case not in cases:
            raise ValueError(f"case must be one of {cases}, got {case!r}")
        steps = runs[cases.index(case)]["steps"]
        index = check_index(index, "index", len(steps), f" (the steps of case {case!r})")
        super().__init__(runs=[dict(run) for run in runs], case=case, index=index, title=title,
                         lecture=bool(lecture))

    @property
    def cases(self) -> list[str]:
        """The case names offered, in the order of the runs."""
        return [run["case"] for run in self.runs]

    def run(self) -> dict:
        """The run of the chosen case."""
        return self.runs[self.cases.index(self.case)]

    def frame(self) -> dict:
        """The step shown now."""
        return self.run()["steps"][self.index]

    def __repr__(self) -> str:
        return (f"ConstrainedStepper(cases={self.cases}, case={self.case!r}, index={self.index}, "
                f"lecture={self.lecture})")
