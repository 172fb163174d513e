"""Checks for the exercise of chapter 07b (speculative decoding): the acceptance test min(1, p/q) and the residual
normalize(max(0, p - q)), checked one by one and then together: the token one judged position puts out must follow
the target's p exactly.

Taught in: chapters/07b-speculative-decoding.ipynb, exercises/07b-speculative-decoding.ipynb
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from decodelab.book.checks import call_student, fail, passed

SPECULATIVE_FORBIDDEN = ("decodelab.decoding.speculative.verify",)  # the library's own accept/resample step
_GRID = [(j + 0.5) / 1000 for j in range(1000)]  # uniform draws u, evenly spread: the acceptance probability


def _cases() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(p, q) pairs over 5 tokens: overlapping, q with mass where p has none, q nearly a point mass."""
    p = [[0.4, 0.3, 0.2, 0.1, 0.0], [0.05, 0.05, 0.1, 0.2, 0.6], [0.25, 0.25, 0.25, 0.25, 0.0]]
    q = [[0.1, 0.2, 0.3, 0.2, 0.2], [0.3, 0.3, 0.2, 0.1, 0.1], [0.0, 0.0, 0.9, 0.05, 0.05]]
    return [(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)) for a, b in zip(p, q)]


def _fmt(t: torch.Tensor) -> str:
    return "[" + ", ".join(f"{float(v):.3f}" for v in t) + "]"


def _check_residual(residual: Callable, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    what = f"p={_fmt(p)}, q={_fmt(q)}"
    result = call_student(residual, p, q, what=what, forbidden=SPECULATIVE_FORBIDDEN)
    try:
        result = torch.as_tensor(result, dtype=torch.float64).flatten()
    except (TypeError, ValueError, RuntimeError):
        fail(f"residual({what}) 应返回长度为 {len(p)} 的概率向量（tensor），实际返回了 {result!r}。")
    if result.shape != p.shape:
        fail(f"residual({what}) 应返回长度为 {len(p)} 的向量，你返回的形状是 {tuple(result.shape)}。")
    expected = (p - q).clamp_min(0)
    expected = expected / expected.sum()
    if torch.allclose(result, expected, atol=1e-6):
        return result
    if torch.allclose(result, p - q, atol=1e-6):
        fail(f"residual({what}) 返回了 p − q = {_fmt(result)}，里面有负数，不是概率。先取 max(0, p − q)，再除以它的和。")
    if torch.allclose(result, (p - q).clamp_min(0), atol=1e-6):
        fail(f"residual({what}) 返回的 max(0, p − q) = {_fmt(result)} 加起来是 {float(result.sum()):.3f}，不是 1："
             "还要除以它的和（归一化）。")
    if torch.allclose(result, p, atol=1e-6):
        fail(f"residual({what}) 直接返回了 p。被拒绝时要从 p 里“扣掉” q 已经给过的那部分概率：max(0, p − q) 再归一化；"
             "直接从 p 抽，q 偏爱的 token 会被多抽。")
    flipped = (q - p).clamp_min(0)
    if torch.allclose(result, flipped / flipped.sum(), atol=1e-6):
        fail(f"residual({what}) 的方向反了：你算的是 max(0, q − p)。要补的是目标模型 p 比 draft 多出来的概率，即 max(0, p − q)。")
    fail(f"residual({what}) 不对，你的结果是 {_fmt(result)}。公式：max(0, p − q) / Σ max(0, p − q)。")


def _acceptance(accepts: Callable, p_x: float, q_x: float) -> float:
    what = f"p(x)={p_x:.3f}, q(x)={q_x:.3f}"
    hits = 0
    for u in _GRID:
        result = call_student(accepts, p_x, q_x, u, what=f"{what}, u={u:.4f}", forbidden=SPECULATIVE_FORBIDDEN)
        if not isinstance(result, (bool, int)) and not (isinstance(result, torch.Tensor) and result.numel() == 1):
            fail(f"accepts({what}, u) 应返回 True 或 False，实际返回了 {result!r}。")
        hits += bool(result)
    return hits / len(_GRID)


def check_speculative_step(accepts: Callable[[float, float, float], bool],
                           residual: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """Check `accepts(p_x, q_x, u) -> bool` (u uniform in [0, 1)) and `residual(p, q) -> [V]`, then that a judged
    position's output, q(x) a(x) + (1 - sum_y q(y) a(y)) r(x), equals p."""
    for p, q in _cases():
        r = _check_residual(residual, p, q)
        rates = torch.zeros_like(p)
        for x in range(len(p)):
            if q[x] == 0:
                continue  # the draft never proposes x
            rate = _acceptance(accepts, float(p[x]), float(q[x]))
            right = min(1.0, float(p[x] / q[x]))
            if abs(rate - right) > 2e-3:
                what = f"p(x)={float(p[x]):.3f}, q(x)={float(q[x]):.3f}"
                if rate == 1.0:
                    fail(f"accepts({what}) 总是接受，但 p(x) < q(x) 时只能以 p(x)/q(x) 的概率接受，"
                         "否则 draft 偏爱的 token 会出现得太多。")
                if p[x] > 0 and abs(rate - min(1.0, float(q[x] / p[x]))) <= 2e-3:
                    fail(f"accepts({what}) 的接受概率是 {rate:.3f}，正好是 q/p：比值写反了。接受概率是 min(1, p(x)/q(x))："
                         "目标模型比 draft 更看好的 token 一定接受。")
                fail(f"accepts({what}) 的接受概率是 {rate:.3f}（对 u 的 1000 个均匀取值），应为 min(1, p(x)/q(x))。"
                     "提示：u < p(x)/q(x) 时接受。")
            rates[x] = rate
        out = q * rates + (1 - float((q * rates).sum())) * r  # [V]: the token this position puts out
        if not torch.allclose(out, p, atol=3e-3):
            fail(f"合在一起，输出分布是 {_fmt(out)}，目标分布是 {_fmt(p)}。")
    passed("接受概率 min(1, p/q) 与残差分布 max(0, p − q) 归一化都对：一个被检验的位置输出的 token 恰好服从目标分布 p。")
