"""Checks for the exercise of chapter 07d (constrained decoding): one masked step, renormalised over the allowed tokens,
checked on its own and then run over a two-step tree, where the sequence distribution q it produces is set beside the
model's distribution conditioned on validity, p(x | valid).

Taught in: chapters/07d-constrained-decoding.ipynb, exercises/07d-constrained-decoding.ipynb
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from decodelab.book.checks import NO_PREDICTION, call_student, fail, passed

# Each first step of the tree: (token, p(token)); the rest of the mass goes to tokens the grammar forbids at once.
# After 喜 only 北 keeps the text valid, and the model gives it little; after 坐 the model gives its valid next token a lot.
_FIRST = torch.tensor([0.60, 0.10, 0.30], dtype=torch.float64)  # 喜, 坐, a token no valid text starts with
_FIRST_ALLOWED = torch.tensor([True, True, False])
_SECOND = {0: torch.tensor([0.001, 0.999], dtype=torch.float64),  # after 喜: 北 (valid), 米 (what the model wants)
           1: torch.tensor([0.90, 0.10], dtype=torch.float64)}  # after 坐: 飞 (valid), something invalid
_SECOND_ALLOWED = torch.tensor([True, False])
_NAMES = {0: "喜欢吃北京烤鸭", 1: "坐飞机去北京"}


def _fmt(t: torch.Tensor) -> str:
    return "[" + ", ".join(f"{float(v):.3f}" for v in t) + "]"


def _probes() -> list[tuple[torch.Tensor, torch.Tensor]]:
    probs = [[0.5, 0.2, 0.2, 0.1], [0.05, 0.05, 0.1, 0.2, 0.6], [0.25, 0.25, 0.25, 0.25]]
    allowed = [[True, False, True, False], [False, True, True, False, True], [False, False, False, True]]
    return [(torch.tensor(p, dtype=torch.float64), torch.tensor(a)) for p, a in zip(probs, allowed)]


def _check_one(step: Callable, probs: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    what = f"probs={_fmt(probs)}, allowed={allowed.tolist()}"
    result = call_student(step, probs, allowed, what=what)
    if not isinstance(result, torch.Tensor):
        fail(f"mask_and_renormalize({what}) 应返回 torch.Tensor，实际返回了 {type(result).__name__}。")
    if tuple(result.shape) != tuple(probs.shape):
        fail(f"mask_and_renormalize({what}) 应返回长度为 {len(probs)} 的向量，你返回的形状是 {tuple(result.shape)}。")
    result = result.to(torch.float64)
    if torch.isnan(result).any():
        fail(f"mask_and_renormalize({what}) 的结果里有 nan：{_fmt(result)}。")
    if bool((result[~allowed].abs() > 1e-9).any()):
        fail(f"mask_and_renormalize({what}) = {_fmt(result)}：不允许的 token（allowed 为 False）还有概率。"
             "掩码的意思是这些 token 的 logit 变成 −∞，概率必须是 0；检查是不是把 allowed 用反了。")
    kept = probs * allowed
    expected = kept / kept.sum()
    if torch.allclose(result, expected, atol=1e-9):
        return result
    if torch.allclose(result, kept, atol=1e-9):
        fail(f"mask_and_renormalize({what}) = {_fmt(result)}，加起来是 {float(result.sum()):.3f}，不是 1："
             "去掉不允许的 token 之后，还要除以剩下的概率之和（重新归一化）。")
    if abs(float(result.sum()) - 1.0) > 1e-6:
        fail(f"mask_and_renormalize({what}) = {_fmt(result)}，加起来是 {float(result.sum()):.3f}，不是 1。")
    fail(f"mask_and_renormalize({what}) 不对，你的结果是 {_fmt(result)}：允许的 token 之间的比例要和 probs "
         "里一样（例如 0.5 与 0.2 仍是 5:2）。如果你用了 softmax：probs 已经是概率，不是 logits。")


def check_mask_step(mask_and_renormalize: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                    prediction=NO_PREDICTION) -> None:
    """Check `mask_and_renormalize(probs [V], allowed [V] bool) -> [V]`: zero outside `allowed`, proportional to
    `probs` inside, summing to 1; a mask that allows nothing raises ValueError. Then run it over the two-step tree and
    print q beside p(. | valid), and beside the student's `prediction` of q("喜欢吃北京烤鸭") when one is given."""
    from decodelab.book.checks import as_prediction, compare_prediction

    guess = None if prediction is NO_PREDICTION else as_prediction(prediction, "PREDICTION", 0, 1)
    for probs, allowed in _probes():
        _check_one(mask_and_renormalize, probs, allowed)
    nothing = torch.zeros(4, dtype=torch.bool)
    try:
        result = mask_and_renormalize(torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64), nothing)
    except ValueError:
        pass
    except Exception as error:  # noqa: BLE001 - any other failure is the student's to see, in Chinese
        fail(f"allowed 全为 False 时应抛出 ValueError，你的函数抛出了 {type(error).__name__}: {error}。")
    else:
        fail(f"allowed 全为 False 时你的函数返回了 {result!r}。一个 token 也不允许时没有分布可言："
             "应抛出 ValueError（raise ValueError(...)），而不是返回 nan，更不能悄悄选一个 EOS。")
    q, p = {}, {}
    first = _check_one(mask_and_renormalize, _FIRST, _FIRST_ALLOWED)
    for branch, probs in _SECOND.items():
        second = _check_one(mask_and_renormalize, probs, _SECOND_ALLOWED)
        q[branch] = float(first[branch] * second[0])
        p[branch] = float(_FIRST[branch] * probs[0])
    z = sum(p.values())
    lines = "；".join(f"“{_NAMES[b]}”：q = {q[b]:.3f}，p(x | valid) = {p[b] / z:.3f}" for b in q)
    passed(f"掩码后重新归一化正确，一个 token 也不允许时会报错。两步的小树上：{lines}。每一步都合法，"
           "整句的分布却不是条件分布：第一步按模型的偏好选了“喜”，第二步只能硬选模型几乎不给概率的“北”。"
           + (f"\n“{_NAMES[0]}”的 q：{compare_prediction(guess, q[0])}；条件分布给它 {p[0] / z:.3f}。"
              "如果你按 p(x | valid) 去猜，就是默认了“每一步都合法，整句也就按条件分布”：掩码只看眼前一步，"
              "看不见第一步选“喜”之后几乎无路可走。" if guess is not None else ""))
