"""Checks for the exercises of chapter 01 (从 logits 到概率): a stable softmax and a stable log-softmax.

Taught in: chapters/01-logits-to-probs.ipynb, exercises/01-logits-to-probs.ipynb
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

from decodelab.book.checks import (LOG_SOFTMAX_SPELLINGS, SOFTMAX_SPELLINGS, call_student, close, expect_tensor, fail,
                                   passed)


def _softmax_call(fn, x, what):
    return call_student(fn, x, what=what, forbidden=SOFTMAX_SPELLINGS)


def _log_softmax_call(fn, x, what):
    return call_student(fn, x, what=what, forbidden=LOG_SOFTMAX_SPELLINGS)

# Probing inputs, float32 as the model's logits are.
_SMALL = torch.tensor([[1.0, 2.0, 0.5, -1.0, 3.0, 0.0, 2.5],
                       [0.3, -0.2, 4.0, 1.0, 1.5, -3.0, 0.7],
                       [2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0],
                       [-1.0, 0.0, 1.0, 0.5, -0.5, 2.0, -2.0]])  # [4, 7]
_LARGE = torch.tensor([[1000.0, 999.0, 998.0, 990.0]])  # [1, 4]: exp overflows float32
_FAR_APART_ROWS = torch.tensor([[1000.0, 999.0, 997.0], [-1000.0, -1001.0, -1003.0]])  # [2, 3]
_TINY_PROB = torch.tensor([[0.0, -200.0, -1.0]])  # [1, 3]: exp(-200) underflows to 0 in float32


def check_stable_softmax(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Check `fn(logits [..., V]) -> probs [..., V]`, a softmax over the last dim that never overflows, written
    without torch's or the library's softmax (every spelling of them raises while `fn` runs)."""
    out = expect_tensor(_softmax_call(fn, _SMALL, what="形状 [4, 7] 的 logits"), (4, 7), "形状 [4, 7] 的 logits")
    if close(out, torch.log_softmax(_SMALL, dim=-1)):
        fail("你返回的是 log 概率（log-softmax）。softmax 要返回概率本身：exp(x - max) / sum(exp(x - max))。")
    if close(out, torch.softmax(_SMALL, dim=0)) or close(out.sum(dim=0), torch.ones(7)):
        fail("每一列加起来是 1，每一行却不是：你在 dim=0（batch 维）上归一化了。"
             "logits 的形状是 [B, V]，应该沿最后一维 dim=-1 求 max 和 sum。")
    if not close(out.sum(dim=-1), torch.ones(4)):
        fail(f"每一行的概率之和应为 1，你的结果是 {out.sum(dim=-1).tolist()}。检查分母：sum(exp(...), dim=-1, keepdim=True)。")
    if not close(out, torch.softmax(_SMALL, dim=-1)):
        fail("每一行加起来是 1，但数值不对。softmax 的分子是 exp(x_i - max)，分母是同一行所有 exp(x_j - max) 的和。")
    out = expect_tensor(_softmax_call(fn, _LARGE, what="logits [1000, 999, 998, 990]"), (1, 4),
                        "logits [1000, 999, 998, 990]")
    if not bool(torch.isfinite(out).all()):
        fail("输入 logits [1000, 999, 998, 990] 时得到了 nan/inf：exp(1000) 在 float32 里溢出成 inf，inf / inf = nan。"
             "提示：先减去每一行的最大值 x - x.max(dim=-1, keepdim=True).values，结果不变，exp 的参数却都 ≤ 0。")
    if not close(out, torch.softmax(_LARGE, dim=-1)):
        fail(f"输入 logits [1000, 999, 998, 990] 时结果不对：{out.tolist()}。减去最大值后别忘了对同一行做归一化。")
    out = expect_tensor(_softmax_call(fn, _FAR_APART_ROWS, what="两行相差 2000 的 logits"), (2, 3), "两行相差 2000 的 logits")
    if not bool(torch.isfinite(out).all()) or not close(out, torch.softmax(_FAR_APART_ROWS, dim=-1)):
        fail("第一行 logits 约 1000、第二行约 -1000 时，第二行变成了 nan 或 0：你减去的是整个张量的最大值，"
             "第二行的 exp 全部下溢成 0，0 / 0 = nan。每一行要减去它自己的最大值：x.max(dim=-1, keepdim=True)。")
    vector = torch.tensor([2.0, 1.0, 0.1])
    out = expect_tensor(_softmax_call(fn, vector, what="一维 logits [2.0, 1.0, 0.1]"), (3,), "一维 logits [2.0, 1.0, 0.1]")
    if not close(out, torch.softmax(vector, dim=-1)):
        fail("一维输入 [V] 时结果不对：沿 dim=-1 计算，就同时适用于 [V] 和 [B, V]。")
    passed("softmax 在 [V] 和 [B, V] 上都正确，logits 到 1000 也不会溢出，每一行各自减去了自己的最大值。")


def check_log_softmax(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Check `fn(logits [..., V]) -> log_probs [..., V]`, finite even where a probability underflows, written
    without torch's or the library's log_softmax."""
    out = expect_tensor(_log_softmax_call(fn, _SMALL, what="形状 [4, 7] 的 logits"), (4, 7), "形状 [4, 7] 的 logits")
    reference = torch.log_softmax(_SMALL, dim=-1)
    if close(out, torch.softmax(_SMALL, dim=-1)):
        fail("你返回的是概率（softmax），题目要的是 log 概率：log_softmax(x) = x - logsumexp(x)。")
    if close(out, torch.log_softmax(_SMALL, dim=0)):
        fail("你在 dim=0（batch 维）上做了 logsumexp：应该沿最后一维 dim=-1，每一行各自归一化。")
    row_offset = out - reference  # [4, 7]; a constant per row when only the normaliser is wrong
    if bool(torch.isfinite(row_offset).all()) and close(row_offset, row_offset[:, :1].expand_as(row_offset)):
        if close(row_offset[:, 0], _SMALL.amax(dim=-1)):
            fail("每一行都差了一个常数，正好是这一行的最大值：log-sum-exp 减去最大值 m 之后要把它加回来，"
                 "logsumexp(x) = m + log(sum(exp(x - m)))。")
        if not close(row_offset, torch.zeros_like(row_offset)):
            fail("每一行都差了一个常数：exp(结果) 加起来不是 1。检查 logsumexp 那一项：log(sum(exp(x - m))) + m，sum 沿 dim=-1。")
    if not close(out, reference):
        fail("数值不对。log_softmax(x)_i = x_i - m - log(sum_j exp(x_j - m))，其中 m 是这一行的最大值。")
    out = expect_tensor(_log_softmax_call(fn, _TINY_PROB, what="logits [0, -200, -1]"), (1, 3), "logits [0, -200, -1]")
    if bool(torch.isinf(out).any()):
        fail("输入 logits [0, -200, -1] 时出现了 -inf：exp(-200) 在 float32 里下溢成 0，log(0) = -inf。"
             "先算 softmax 再取 log 会丢掉小概率；直接用 x - m - log(sum(exp(x - m)))，结果是有限值。")
    if not close(out, torch.log_softmax(_TINY_PROB, dim=-1)):
        fail(f"输入 logits [0, -200, -1] 时结果不对：{out.tolist()}。")
    out = expect_tensor(_log_softmax_call(fn, _LARGE, what="logits [1000, 999, 998, 990]"), (1, 4), "logits [1000, 999, 998, 990]")
    if not bool(torch.isfinite(out).all()):
        fail("输入 logits [1000, 999, 998, 990] 时得到了 nan/inf：exp(1000) 溢出。先减去每一行的最大值再取 exp。")
    if not close(out, torch.log_softmax(_LARGE, dim=-1)):
        fail(f"输入 logits [1000, 999, 998, 990] 时结果不对：{out.tolist()}。")
    passed("log-softmax 正确：概率小到 exp(-200) 也保持有限，大 logits 不溢出，每一行各自归一化。")


# ---- exercise 1.3 (predict, then measure): where float32's exp overflows ------------------------------------------

def check_overflow_point(prediction, logits, values) -> None:
    """Check the student's measurement of where `exp` overflows in float32: `logits` are the integers they tried and
    `values` what `torch.exp` gave for each (float32 tensors or numbers). The check recomputes exp(z) in float32 for
    every z, finds the first one that is inf, and sets it beside the student's `prediction` (written before
    measuring). Raw material, not a bare number: the answer is recomputed from the student's own list.

    Taught in: exercises/01-logits-to-probs.ipynb
    """
    from decodelab.book.checks import as_prediction, compare_prediction

    guess = as_prediction(prediction, "PREDICTION", 0, 10_000)
    if logits is None or values is None:
        fail("还没有量：logits 和 values 还是 None。对一串整数 z 逐个算 torch.exp(torch.tensor(z, dtype=torch.float32))，"
             "把 z 的列表和结果的列表交给检查。")
    if isinstance(logits, torch.Tensor):
        logits = logits.tolist()
    if isinstance(values, torch.Tensor):
        values = values.tolist()
    try:
        logits = [int(z) for z in logits]
        values = [float(v) for v in values]
    except (TypeError, ValueError):
        fail("logits 应是一串整数，values 是每个整数的 exp 结果（数或只有一个元素的 tensor）。")
    if len(logits) != len(values) or len(logits) < 2:
        fail(f"logits 和 values 要一一对应（至少两个），你给了 {len(logits)} 个 z 和 {len(values)} 个结果。")
    recomputed = [float(torch.exp(torch.tensor(float(z), dtype=torch.float32))) for z in logits]
    for z, mine, right in zip(logits, values, recomputed):
        same = (math.isinf(mine) and math.isinf(right)) or math.isclose(mine, right, rel_tol=1e-6)
        if not same:
            if math.isfinite(mine) and math.isinf(right):
                fail(f"z = {z} 时你记下的结果是有限的 {mine:.4g}，float32 里它是 inf：你是不是用了 float64"
                     "（Python 的 math.exp 和 float64 张量能算到 709）？用 dtype=torch.float32。")
            fail(f"z = {z} 时你记下的结果 {mine:.6g} 不是 float32 的 exp(z)。values 要是 torch.exp 在 float32 下真的算出的值。")
    overflowed = [z for z, v in zip(logits, recomputed) if math.isinf(v)]
    finite = [z for z, v in zip(logits, recomputed) if math.isfinite(v)]
    if not overflowed:
        fail("你试的 z 里没有一个让 exp 溢出：再往大试一些。")
    if not finite or max(finite) + 1 != min(overflowed):
        fail("你的 z 里还找不到“最后一个有限、下一个就是 inf”的那一对：把范围缩小，逐个整数地试。")
    first = min(overflowed)
    passed(f"{compare_prediction(guess, first, '{:g}')}：float32 里 exp(z) 在 z = {first} 第一次变成 inf。"
           f"float32 最大约 3.4 × 10^38，ln(3.4 × 10^38) ≈ 88.7，所以 logits 只要超过 88 左右就会溢出；"
           "减去每一行的最大值之后 exp 的参数都 ≤ 0，结果才永远有限。"
           "如果你的预测差得远，想一想：你是按“很大的数”猜的，还是按 float32 能表示的最大值推的？")
