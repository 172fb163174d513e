"""Checks for the exercise of chapter 07e (best-of-n): the unbiased pass@k estimator of Chen et al. (2021), checked
against brute force on small cases, on sizes whose factorials overflow a float, at the edges (c = 0, n - c < k) and on
k > n, which must be refused; a passing estimator is then set beside the plug-in 1 - (1 - c/n)^k in expectation.

Taught in: chapters/07e-best-of-n.ipynb, exercises/07e-best-of-n.ipynb
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch

from decodelab.book.checks import CheckFailed, call_student, fail, passed

_SMALL = [(5, 2, 1), (5, 2, 2), (10, 3, 4), (16, 4, 4), (8, 1, 3), (3, 0, 2), (6, 6, 6), (4, 3, 2), (7, 2, 7)]
PASS_AT_K_FORBIDDEN = ("decodelab.measure.best_of_n.pass_at_k",)  # the library's own estimator
_LARGE = [(2000, 30, 100), (10000, 5, 1000)]  # C(2000, 100) ~ 1e185: its factorials, as floats, overflow


def _brute_force(n: int, c: int, k: int) -> float:
    subsets = list(itertools.combinations([True] * c + [False] * (n - c), k))
    return sum(any(s) for s in subsets) / len(subsets)


def _exact(n: int, c: int, k: int) -> float:
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)  # Python ints: exact, no overflow


def _plug_in(n: int, c: int, k: int) -> float:
    return 1.0 - (1.0 - c / n) ** k


def _as_float(result, what: str) -> float:
    if isinstance(result, bool) or not (isinstance(result, (int, float)) or hasattr(result, "__float__")):
        fail(f"pass_at_k({what}) 应返回一个数（float），实际返回了 {type(result).__name__} {result!r}。")
    return float(result)


def _call(pass_at_k: Callable, n: int, c: int, k: int, what: str):
    """(result, None) or (None, the OverflowError / ValueError it raised); other failures are call_student's."""
    def guarded(*args):
        try:
            return pass_at_k(*args), None
        except (OverflowError, ValueError) as error:
            return None, error
    return call_student(guarded, n, c, k, what=what, forbidden=PASS_AT_K_FORBIDDEN)


def _check_value(pass_at_k: Callable, n: int, c: int, k: int, expected: float) -> None:
    what = f"n={n}, c={c}, k={k}"
    result, error = _call(pass_at_k, n, c, k, what)
    if isinstance(error, OverflowError):
        fail(f"pass_at_k({what}) 抛出了 OverflowError（{error}）：阶乘或组合数转成 float 时溢出了。"
             "C(n−c, k)/C(n, k) 可以写成连乘 ∏_{i=n−c+1}^{n} (1 − k/i)，每一项都在 0 和 1 之间，不会溢出。")
    if isinstance(error, ValueError):
        if n - c < k:
            fail(f"pass_at_k({what}) 抛出了 ValueError（{error}）。这里 n − c = {n - c} < k = {k}：错的样本凑不满 k 个，"
                 "任何 k 个里都有对的，pass@k = 1。先处理这种情况，再算组合数（负数没有阶乘）。")
        fail(f"pass_at_k({what}) 抛出了 ValueError（{error}），但这是合法的输入（1 ≤ k ≤ n，0 ≤ c ≤ n）。")
    value = _as_float(result, what)
    if math.isnan(value) or math.isinf(value):
        fail(f"pass_at_k({what}) = {value}：多半是阶乘或组合数溢出成 inf，inf / inf 得 nan。"
             "把 C(n−c, k)/C(n, k) 写成连乘 ∏_{i=n−c+1}^{n} (1 − k/i)，每一项都在 0 和 1 之间。")
    if abs(value - expected) <= 1e-9 * max(1.0, abs(expected)):
        return
    if abs(value - _plug_in(n, c, k)) <= 1e-9:
        fail(f"pass_at_k({what}) = {value:.6f}，这是 plug-in 估计 1 − (1 − c/n)^k。"
             "它把 n 个样本当成可以放回地抽 k 次；而 pass@k 问的是不放回地取 k 个，至少一个对的概率："
             "1 − C(n−c, k)/C(n, k)。plug-in 的期望比真值低（有偏）。")
    if abs(value - (1.0 - expected)) <= 1e-9:
        fail(f"pass_at_k({what}) = {value:.6f}，正好是 1 − 正确答案：C(n−c, k)/C(n, k) 是 k 个全错的概率，"
             "pass@k 是 1 减去它。")
    fail(f"pass_at_k({what}) 不对，你的结果是 {value:.6f}。pass@k = 1 − C(n−c, k)/C(n, k)："
         "从 n 个样本里不放回地取 k 个，至少一个是对的概率。")


def check_pass_at_k(pass_at_k: Callable[[int, int, int], float]) -> None:
    """Check `pass_at_k(n, c, k) -> float`: equal to brute force over every k-subset on small cases, finite and exact
    where factorials overflow, 1 when n - c < k, and a ValueError for k > n. Then print the estimator's expectation
    beside the plug-in's and the truth's."""
    for n, c, k in _SMALL:
        _check_value(pass_at_k, n, c, k, _brute_force(n, c, k))
    for n, c, k in _LARGE:
        _check_value(pass_at_k, n, c, k, _exact(n, c, k))
    try:
        result, error = _call(pass_at_k, 3, 1, 5, "n=3, c=1, k=5")
    except CheckFailed as failure:
        fail(f"k > n（n=3, k=5）时应抛出 ValueError，你的函数却出了别的错。{failure}")
    if error is None:
        fail(f"pass_at_k(n=3, c=1, k=5) 返回了 {result!r}。只有 3 个样本，没法从中取 5 个：这个估计量要求 n ≥ k，"
             "应抛出 ValueError（raise ValueError(...)），而不是返回一个数。要估计 pass@5，至少抽 5 个样本。")
    p, n, k = 0.1, 10, 5
    weights = [math.comb(n, c) * p**c * (1 - p) ** (n - c) for c in range(n + 1)]
    mean_estimate = sum(w * float(pass_at_k(n, c, k)) for c, w in enumerate(weights))
    mean_plug_in = sum(w * _plug_in(n, c, k) for c, w in enumerate(weights))
    passed(f"pass@k 估计正确：小例子与穷举所有 k 子集一致，大数不溢出，n − c < k 时为 1，k > n 时报错。"
           f"每个样本对的概率 p = {p}、n = {n}、k = {k} 时，真值 1 − (1 − p)^k = {1 - (1 - p) ** k:.4f}；"
           f"你的估计量的期望 = {mean_estimate:.4f}（无偏），plug-in 1 − (1 − c/n)^k 的期望 = {mean_plug_in:.4f}（偏低）。")


# ---- exercise 7e.2 (predict, then measure): how pass@n grows with n ------------------------------------------------

GROWTH_P = 0.2  # each sample is right with this probability, independently
GROWTH_N = 10
MIN_TRIALS = 1000


def check_pass_at_n_growth(prediction, trials) -> None:
    """Check the student's simulation of best-of-n with a perfect verifier: `trials[t]` holds the GROWTH_N verdicts
    (True = right) of one problem's samples, each right with probability GROWTH_P. The check confirms the verdicts
    look like independent draws, recomputes pass@n for n = 1 .. GROWTH_N (at least one right among the first n), and
    sets pass@GROWTH_N beside the student's `prediction` and the exact 1 - (1 - p)^n.

    Taught in: exercises/07e-best-of-n.ipynb
    """
    from decodelab.book.checks import as_prediction, compare_prediction

    guess = as_prediction(prediction, "PREDICTION", 0, 1)
    if trials is None:
        fail(f"还没有量：trials 还是 None。模拟至少 {MIN_TRIALS} 道题，每道题 {GROWTH_N} 个样本，"
             f"每个样本以概率 {GROWTH_P} 是对的（torch.rand(...) < {GROWTH_P}），每道题记下 {GROWTH_N} 个 True/False。")
    try:
        rows = [[bool(v) for v in row] for row in trials]
    except TypeError:
        fail(f"trials 里每一项应是一道题的 {GROWTH_N} 个判定（True = 对）。")
    if len(rows) < MIN_TRIALS:
        fail(f"只有 {len(rows)} 道题：至少 {MIN_TRIALS} 道，pass@n 的抽样误差才够小。")
    if any(len(row) != GROWTH_N for row in rows):
        fail(f"每道题要正好 {GROWTH_N} 个样本的判定。")
    verdicts = torch.tensor(rows, dtype=torch.float64)  # [trials, n]
    total = verdicts.numel()
    share = float(verdicts.mean())
    if abs(share - GROWTH_P) > 5 * math.sqrt(GROWTH_P * (1 - GROWTH_P) / total):
        fail(f"你的样本里对的比例是 {share:.3f}，和每个样本对的概率 {GROWTH_P} 对不上：每个判定要独立地以概率 {GROWTH_P} 为 True。")
    first = verdicts[:, 0]
    if float(((verdicts - first[:, None]).abs().sum())) == 0:
        fail("同一道题的样本全都一样：每个样本要各自独立地抽，不是每道题抽一次再复制。")
    curve = [float((verdicts[:, :n].sum(dim=1) > 0).double().mean()) for n in range(1, GROWTH_N + 1)]
    exact = 1 - (1 - GROWTH_P) ** GROWTH_N
    shown = "，".join(f"n={n}: {v:.2f}" for n, v in zip((1, 2, 5, GROWTH_N), (curve[0], curve[1], curve[4], curve[-1])))
    passed(f"pass@{GROWTH_N}：{compare_prediction(guess, curve[-1])}；精确值 1 − (1 − p)^n = {exact:.3f}。"
           f"从你的 {len(rows)} 道题数出的增长：{shown}。每多一个样本，只有前面全错的题才可能被它救回来，"
           "所以增长先快后慢，向 1 饱和；把 n 个样本的机会“加起来”（n·p = 2）会高估，只看一个样本又会低估。"
           "如果不同题的 p 不一样（难题的 p 接近 0），对题目平均的曲线会平得更早。")
