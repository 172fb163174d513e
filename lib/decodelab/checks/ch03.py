"""Checks for the exercises of chapter 03 (常见解码策略): a top-p filter and a batched top-k filter.

Both filters take logits `[B, V]` and return logits `[B, V]` in which removed tokens are -inf; the kept tokens keep
their logits (a constant shift per row is accepted too: softmax does not see it).

Taught in: chapters/03-strategies.ipynb, exercises/03-strategies.ipynb
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from decodelab.checks import call_student, expect_tensor, fail, passed
from decodelab.sampling import SamplingParams, process_logits


def _logits_of(probs: list[list[float]]) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64).log().float()  # [B, V]


# Probes: probabilities chosen so that no cumulative sum lands on p, and written in shuffled vocabulary order.
# p = 0.65: keep 0.4 and 0.3 (0.3 crosses 0.65); each plausible mistake keeps a different set here
_CROSSING = _logits_of([[0.05, 0.1, 0.15, 0.4, 0.3]])
_TWO_ROWS = _logits_of([[0.02, 0.6, 0.03, 0.25, 0.1],  # p = 0.9: keep 0.6, 0.25, 0.1
                        [0.22, 0.18, 0.2, 0.21, 0.19]])  # flat row: all five (0.18 crosses 0.9)
_PEAKED = _logits_of([[0.01, 0.97, 0.01, 0.01]])  # p = 0.5: only the top token


def _reference(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    return process_logits(logits, params, method="sort")


def _kept(x: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(x)


def _same_distribution(out: torch.Tensor, expected: torch.Tensor) -> bool:
    if not torch.equal(_kept(out), _kept(expected)):
        return False
    shift = torch.where(_kept(out), out - expected, 0.0)  # [B, V]
    row_shift = shift.amax(dim=-1, keepdim=True)  # the constant a row may be shifted by
    return bool(torch.allclose(torch.where(_kept(out), shift, row_shift), row_shift.expand_as(shift), atol=1e-4))


def _top_p_mistake(out: torch.Tensor, logits: torch.Tensor, p: float) -> str | None:
    """Name a plausible mistake whose output matches `out`, or None."""
    kept, probs = _kept(out), logits.softmax(dim=-1)
    if bool((out >= 0).all()) and bool((out <= 1).all()) and not bool(torch.isinf(out).any()):
        return ("你返回的像是概率（被删掉的位置是 0），题目要的是 logits：被删掉的 token 设为 -inf，留下的保持原来的 logits，"
                "这样后面还能接 softmax 和采样。")
    if not bool(kept.any(dim=-1).all()):
        return ("有一行所有 token 都被删掉了（全是 -inf，softmax 之后是 nan）。最可能的 token 无论如何都要保留："
                "p 很小时 nucleus 也至少有 1 个 token。")
    order = probs.argsort(dim=-1, descending=True)
    sorted_probs = probs.gather(-1, order)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs  # [B, V], mass of the strictly better tokens
    without_crossing = torch.zeros_like(kept).scatter(-1, order, sorted_probs.cumsum(-1) < p)
    if torch.equal(kept, without_crossing) and not torch.equal(kept, torch.zeros_like(kept).scatter(-1, order, mass_before < p)):
        return ("越过 p 的那个 token 被你删掉了：保留的累积概率还没有达到 p。"
                "规则是保留“前面的累积概率 < p”的所有 token，包括让累积概率第一次达到 p 的那一个。"
                "提示：先把 cumsum 右移一位（或用 cumsum - 自身概率）再和 p 比较。")
    ascending = probs.argsort(dim=-1)
    if torch.equal(kept, torch.zeros_like(kept).scatter(-1, ascending, probs.gather(-1, ascending).cumsum(-1) < p)) or \
            torch.equal(kept, torch.zeros_like(kept).scatter(-1, ascending, probs.gather(-1, ascending).cumsum(-1) - probs.gather(-1, ascending) < p)):
        return "你保留的是最不可能的那些 token：排序要从大到小（descending=True），从概率最大的 token 开始累加。"
    in_vocab_order = (probs.cumsum(-1) - probs) < p
    if torch.equal(kept, in_vocab_order) or torch.equal(kept, probs.cumsum(-1) < p):
        return "你在词表原来的顺序上做了 cumsum：要先按概率从大到小排序，累加完再把结果放回原来的位置（scatter）。"
    sorted_rule = (mass_before < p)  # right set, but laid out in sorted order instead of vocabulary order
    if torch.equal(kept, sorted_rule) or torch.equal(kept, sorted_probs.cumsum(-1) < p):
        return ("保留的个数对了，位置却不对：你把排好序的结果直接返回了。"
                "要用排序时得到的下标把掩码放回词表顺序，例如 mask.scatter(-1, sorted_idx, sorted_mask)。")
    return None


def check_top_p(fn: Callable[[torch.Tensor, float], torch.Tensor]) -> None:
    """Check `fn(logits [B, V], top_p) -> logits [B, V]`: the nucleus keeps the token that crosses p."""
    for logits, p, what in ((_CROSSING, 0.65, "概率 [0.05, 0.1, 0.15, 0.4, 0.3]，top_p=0.65"),
                            (_TWO_ROWS, 0.9, "两行概率（一行尖、一行平），top_p=0.9"),
                            (_PEAKED, 0.5, "概率 [0.01, 0.97, 0.01, 0.01]，top_p=0.5"),
                            (_CROSSING, 0.01, "概率 [0.05, 0.1, 0.15, 0.4, 0.3]，top_p=0.01")):
        out = expect_tensor(call_student(fn, logits, p, what=what), tuple(logits.shape), what)
        expected = _reference(logits, SamplingParams(top_p=p))
        if _same_distribution(out, expected):
            continue
        if bool(torch.isnan(out).any()):
            fail(f"输入 {what} 时结果里有 nan。被删掉的 token 用 -inf（float('-inf')），不要用 0 乘 -inf 之类的运算。")
        hint = _top_p_mistake(out, logits, p)
        if hint:
            fail(f"输入 {what} 时：{hint}")
        if torch.equal(_kept(out), _kept(expected)):
            fail(f"输入 {what} 时留下的 token 对了，但它们的 logits 被改了。只把被删掉的位置设为 -inf，其他位置保持原值。")
        fail(f"输入 {what} 时保留的 token 不对：应保留 {_kept(expected).int().tolist()}（1 = 保留），"
             f"你保留了 {_kept(out).int().tolist()}。")
    passed("top-p 正确：越过 p 的 token 被保留，最可能的 token 总在，每一行各自计算，结果放回了词表原来的位置。")


# Probes for top-k: no ties; a square batch [4, 4] makes a missing keepdim broadcast along the wrong axis silently.
_ROW = torch.tensor([[0.3, 2.0, -1.0, 1.5, 0.9, -0.4, 1.1]])  # [1, 7]
_BATCH = torch.tensor([[0.3, 2.0, -1.0, 1.5, 0.9, -0.4, 1.1],
                       [5.0, -2.0, 4.0, 3.5, 0.1, 2.2, -0.7],
                       [-3.0, -1.0, -2.5, -0.2, -4.0, -1.5, -0.6]])  # [3, 7]
_SQUARE = torch.tensor([[1.0, 4.0, 2.0, 3.0],
                        [40.0, 10.0, 30.0, 20.0],
                        [-0.1, -0.4, -0.3, -0.2],
                        [7.0, 8.0, 5.0, 6.0]])  # [4, 4]


def _top_k_mistake(out: torch.Tensor, logits: torch.Tensor, k: int) -> str | None:
    kept = _kept(out)
    counts = kept.sum(dim=-1)
    if bool((counts == k + 1).all()):
        return f"每一行保留了 k+1 = {k + 1} 个 token：第 k 大的值是 topk(...).values[..., -1]（或下标 k-1），不是下标 k。"
    if bool((counts == k - 1).all()):
        return f"每一行只保留了 k-1 = {k - 1} 个 token：第 k 大的那个 token 本身也要保留，比较用 >=（或删掉 < 第 k 大值的）。"
    smallest = logits <= logits.topk(k, dim=-1, largest=False).values[..., -1:]
    if torch.equal(kept, smallest):
        return "你保留的是 logits 最小的 k 个 token：topk 默认取最大的；若自己排序，要从大到小（descending=True）。"
    global_kth = logits >= logits.flatten().topk(k).values[-1]
    if torch.equal(kept, global_kth):
        return "你用了整个 batch 的第 k 大值：每一行要用它自己的第 k 大值，topk 要沿 dim=-1 计算。"
    if logits.shape[0] == logits.shape[1]:
        kth = logits.topk(k, dim=-1).values[:, -1]  # [B], without keepdim
        if torch.equal(kept, logits >= kth) or torch.equal(kept, ~(logits < kth)):
            return ("batch 里每一行的阈值被用到了别的行上：第 k 大值的形状是 [B]，和 [B, V] 比较时沿最后一维广播，"
                    "B == V 时不会报错却用错了行。写成 values[:, -1:] 或 values[:, [-1]]（形状 [B, 1]），"
                    "或 topk(...).values.min(dim=-1, keepdim=True)。")
    return None


def check_top_k(fn: Callable[[torch.Tensor, int], torch.Tensor]) -> None:
    """Check `fn(logits [B, V], k) -> logits [B, V]`: each row keeps its own k largest logits, for any batch size."""
    for logits, k, what in ((_ROW, 3, "一行 logits，k=3"), (_BATCH, 2, "三行 logits [3, 7]，k=2"),
                            (_SQUARE, 2, "四行四列的 logits [4, 4]，k=2"), (_BATCH, 7, "三行 logits [3, 7]，k=7（= V）"),
                            (_BATCH, 1, "三行 logits [3, 7]，k=1")):
        out = expect_tensor(call_student(fn, logits, k, what=what), tuple(logits.shape), what)
        expected = _reference(logits, SamplingParams(top_k=k))
        if _same_distribution(out, expected):
            continue
        if bool(torch.isnan(out).any()):
            fail(f"输入 {what} 时结果里有 nan。被删掉的 token 设为 float('-inf')。")
        if not bool(torch.isinf(out).any()) and k < logits.shape[1]:
            fail(f"输入 {what} 时没有任何 token 被删掉：被删掉的位置要设为 -inf（不是 0），例如 "
                 "logits.masked_fill(logits < kth, float('-inf'))。")
        hint = _top_k_mistake(out, logits, k)
        if hint:
            fail(f"输入 {what} 时：{hint}")
        if torch.equal(_kept(out), _kept(expected)):
            fail(f"输入 {what} 时留下的 token 对了，但它们的 logits 被改了：只把被删掉的位置设为 -inf。")
        fail(f"输入 {what} 时保留的 token 不对：应保留 {_kept(expected).int().tolist()}（1 = 保留），"
             f"你保留了 {_kept(out).int().tolist()}。")
    passed("top-k 正确：每一行用自己的第 k 大值（形状 [B, 1]），batch 为 1、3 还是 B == V 都对，k = V 时全部保留。")
