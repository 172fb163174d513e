"""Checks for the exercise of chapter 07b (speculative decoding): the acceptance test min(1, p/q) and the residual
normalize(max(0, p - q)), checked one by one and then together: the token one judged position puts out must follow
the target's p exactly.

Taught in: chapters/07b-speculative-decoding.ipynb, exercises/07b-speculative-decoding.ipynb
"""
from __future__ import annotations

import math
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


# ---- exercise 7b.2 (predict, then measure): the acceptance rate a draft gets ---------------------------------------

# One position's distributions over 6 tokens: the draft q overrates tokens 0 and 3, the target p likes 1 and 2.
ACCEPT_P = torch.tensor([0.10, 0.30, 0.25, 0.05, 0.20, 0.10], dtype=torch.float64)
ACCEPT_Q = torch.tensor([0.30, 0.15, 0.15, 0.25, 0.10, 0.05], dtype=torch.float64)
MIN_DRAWS = 2000


def check_acceptance_rate(prediction, records) -> None:
    """Check the student's simulation of one speculative position: `records` holds one (x, u, accepted) per draw,
    x drawn from ACCEPT_Q, u uniform in [0, 1), `accepted` what the student's acceptance test said. The check
    confirms the records (x follows q, u is uniform, each verdict is u < p(x)/q(x)), recomputes the acceptance rate
    from them and sets it beside the student's `prediction` and the exact 1 - TV(p, q) = sum_x min(p(x), q(x)).

    Taught in: exercises/07b-speculative-decoding.ipynb
    """
    from decodelab.book.checks import as_prediction, compare_prediction

    guess = as_prediction(prediction, "PREDICTION", 0, 1)
    if records is None:
        fail("还没有量：records 还是 None。按 q 抽 token x、抽一个均匀的 u，用你的 accepts 判断，每次记下 (x, u, accepted)。")
    try:
        rows = [(int(x), float(u), bool(a)) for x, u, a in records]
    except (TypeError, ValueError):
        fail("records 里每一项应是三元组 (x, u, accepted)：token 下标、均匀随机数、是否接受。")
    if len(rows) < MIN_DRAWS:
        fail(f"只有 {len(rows)} 次模拟：至少 {MIN_DRAWS} 次，接受率的抽样误差才够小（约 1 个百分点）。")
    n, vocab = len(rows), len(ACCEPT_Q)
    if any(not 0 <= x < vocab for x, _, _ in rows):
        fail(f"records 里有 token 下标不在 0 … {vocab - 1} 之间。")
    counts = torch.bincount(torch.tensor([x for x, _, _ in rows]), minlength=vocab).double()
    spread = (ACCEPT_Q * (1 - ACCEPT_Q) * n).sqrt()
    if bool(((counts - ACCEPT_Q * n).abs() > 5 * spread + 1).any()):
        if bool(((counts - ACCEPT_P * n).abs() <= 5 * (ACCEPT_P * (1 - ACCEPT_P) * n).sqrt() + 1).all()):
            fail("你的 x 是按目标分布 p 抽的：draft 提议的 token 来自 draft 的分布 q，x 要按 ACCEPT_Q 抽。")
        fail("你的 x 的频率和 q 对不上：x 要按 ACCEPT_Q 抽（torch.multinomial(ACCEPT_Q, ...)）。")
    us = torch.tensor([u for _, u, _ in rows], dtype=torch.float64)
    if bool(((us < 0) | (us >= 1)).any()) or abs(float(us.mean()) - 0.5) > 5 * math.sqrt(1 / 12 / n):
        fail("u 应是 [0, 1) 上的均匀随机数（torch.rand），你的 u 不像：有的超出范围，或者平均值离 0.5 太远。")
    for x, u, accepted in rows:
        if accepted != (u < float(ACCEPT_P[x] / ACCEPT_Q[x])):
            fail(f"有一次 x = {x}、u = {u:.4f} 的判断不对：接受当且仅当 u < p(x)/q(x)。先让练习 7b.1 的检查通过。")
    measured = sum(a for _, _, a in rows) / n
    exact = float(torch.minimum(ACCEPT_P, ACCEPT_Q).sum())
    tv = 1 - exact
    passed(f"{compare_prediction(guess, measured)}；精确值是 1 − TV(p, q) = Σ min(p, q) = {exact:.3f}"
           f"（TV = {tv:.3f}，{n} 次模拟的抽样误差约 ±{2 * math.sqrt(exact * (1 - exact) / n):.3f}）。"
           "每个 token 被接受的概率是 q(x)·min(1, p/q) = min(p, q)，加起来就是 1 − TV：draft 和目标越像，接受越多。"
           "如果你的预测偏高，多半是只看了 draft 最爱的那个 token；偏低，多半是忘了 p ≥ q 的 token 一定接受。")
