"""Check for the exercise of chapter 07c (serving): TTFT and TPOT of one streamed request, from the time it was sent
and the arrival time of each output token.

TTFT = token_times[0] - sent (queueing + prefill + the first sample); TPOT = (token_times[-1] - token_times[0]) /
(n - 1), the time per output token after the first (vLLM's benchmark and the course glossary: (total - TTFT) / (n - 1));
one token leaves TPOT undefined: None.

Taught in: chapters/07c-serving.ipynb, exercises/07c-serving.ipynb
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Callable

from decodelab.book.checks import NO_PREDICTION, CheckFailed, call_student, fail, passed

# (label, sent, token_times): uneven gaps, a long wait in the queue before a fast stream, two tokens, one token.
_CASES = [
    ("一个普通的流式请求", 3.0, [3.2, 3.25, 3.33, 3.36, 3.44]),
    ("一个排了很久队的请求：第一个 token 等了 2.5 秒，之后很快", 100.0, [102.5, 102.52, 102.54, 102.56, 102.58, 102.6]),
    ("只有两个 token 的请求", 0.5, [0.9, 1.0]),
    ("只有一个 token 的请求", 7.0, [7.3]),
]


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, abs_tol=1e-9)


def _is_number(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _call(latency_metrics: Callable, sent: float, times: list[float], what: str) -> object:
    """The student's result; a crash on a single token gets its own hint (n - 1 = 0 there)."""
    try:
        return call_student(latency_metrics, sent, list(times), what=what)
    except CheckFailed as error:
        crash = error.__context__  # the student's exception that call_student turned into a hint
        crashed = isinstance(crash, (ArithmeticError, IndexError, RuntimeError, TypeError, ValueError))
        if len(times) == 1 and crashed and not isinstance(crash, NotImplementedError):
            fail(f"输入 {what} 时函数出错：{type(crash).__name__}: {crash}。只有一个 token 时第一个 token 之后没有间隔，"
                 "n − 1 = 0，TPOT 没有定义（max_tokens=1，或第一个 token 就是 EOS，都会这样）：先判断 len(token_times) == 1，"
                 "这时返回 (TTFT, None)，不要去除以 0。")
        raise


def _check_ttft(ttft: float, sent: float, times: list[float], what: str) -> None:
    right = times[0] - sent
    if _close(ttft, right):
        return
    if _close(ttft, times[0]):
        fail(f"输入 {what} 时 TTFT 你返回了 {ttft:.4g}，正好是 token_times[0]：你从时刻 0 量起了。"
             "token_times 里是时钟的读数，不是时长；TTFT 要从请求发出的时刻 sent 量起：token_times[0] − sent。")
    if _close(ttft, -right):
        fail(f"输入 {what} 时 TTFT 是 {ttft:.4g} 秒，符号不对：减反了。TTFT = token_times[0] − sent（后到的减先到的）。")
    if _close(ttft, times[-1] - sent):
        fail(f"输入 {what} 时 TTFT 你返回的 {ttft:.4g} 是整个请求的总延迟（最后一个 token − sent）。"
             "TTFT 只算到第一个 token：用户等多久才看到第一个字。")
    fail(f"输入 {what} 时 TTFT 不对，你的结果是 {ttft:.4g}。公式：TTFT = token_times[0] − sent。")


def _check_single_token_tpot(tpot: object, what: str) -> None:
    if tpot is None:
        return
    if _is_number(tpot) and tpot == 0:
        fail(f"输入 {what} 时 TPOT 你返回了 0。只有一个 token 时 TPOT 没有定义，不是 0：0 会被当成一次真实的测量，"
             "把很多请求的 TPOT 平均值、p50 拉低。返回 None，统计时跳过这样的请求。")
    if _is_number(tpot) and not math.isfinite(tpot):
        fail(f"输入 {what} 时 TPOT 你返回了 {tpot}。只有一个 token 时 TPOT 没有定义，返回 None（不是 nan 或 inf，"
             "它们混进统计会让平均值也变成 nan/inf）。")
    fail(f"输入 {what} 时 TPOT 应为 None（只有一个 token，第一个 token 之后没有间隔，TPOT 没有定义），你返回了 {tpot!r}。")


def _check_tpot(tpot: object, sent: float, times: list[float], what: str) -> None:
    n = len(times)
    first, last = times[0], times[-1]
    right = (last - first) / (n - 1)
    if tpot is None:
        fail(f"输入 {what} 时 TPOT 你返回了 None。有 {n} 个 token 时 TPOT 是有定义的，"
             "只有一个 token 时才返回 None。")
    if not _is_number(tpot):
        fail(f"输入 {what} 时 TPOT 应是一个数（秒）或 None，你返回了 {type(tpot).__name__}：{tpot!r}。")
    if _close(tpot, right):
        return
    if _close(tpot, (last - first) / n):
        fail(f"输入 {what} 时 TPOT 你返回了 {tpot:.4g}：你除以了 n = {n}。"
             f"第一个 token 之后只有 n − 1 = {n - 1} 个间隔：TPOT = (token_times[-1] − token_times[0]) / (n − 1)。")
    if _close(tpot, (last - sent) / n):
        fail(f"输入 {what} 时 TPOT 你返回了 {tpot:.4g} = (最后一个 token − sent) / n。"
             "这是另一个指标 normalized latency（端到端时间 / 输出 token 数，vLLM 论文图 12 用的就是它），"
             "也等于把第一个 token 之前的等待也算作一个间隔后 n 个间隔的平均。它把排队和 prefill 摊进了每个 token，排队越久差得越多；"
             "TPOT 只看第一个 token 之后的节奏：(token_times[-1] − token_times[0]) / (n − 1)。")
    if _close(tpot, (last - sent) / (n - 1)):
        fail(f"输入 {what} 时 TPOT 你返回了 {tpot:.4g} = (最后一个 token − sent) / (n − 1)："
             "你把 TTFT 也算进了 TPOT。分子应是总延迟减去 TTFT，即 token_times[-1] − token_times[0]。"
             "排队和 prefill 已经记在 TTFT 里了，TPOT 只量 decode 的节奏。")
    if _close(tpot, last - first):
        fail(f"输入 {what} 时 TPOT 你返回了 {tpot:.4g}：这是第一个 token 之后的总时间，"
             f"还没有除以间隔数 n − 1 = {n - 1}。")
    if n > 2 and _close(tpot, times[1] - first):
        fail(f"输入 {what} 时 TPOT 你返回了 {tpot:.4g}：你只用了第一个间隔 token_times[1] − token_times[0]。"
             "间隔有长有短，TPOT 是第一个 token 之后所有间隔的平均。")
    fail(f"输入 {what} 时 TPOT 不对，你的结果是 {tpot:.4g}。"
         "公式：TPOT = (token_times[-1] − token_times[0]) / (len(token_times) − 1)。")


def check_latency_metrics(latency_metrics: Callable[[float, list[float]], tuple[float, float | None]],
                          prediction=NO_PREDICTION) -> None:
    """Check `latency_metrics(sent, token_times) -> (ttft, tpot)` of one streamed request: `sent` is when it was
    sent, `token_times` when each output token arrived (seconds, increasing); tpot is None for a single token.
    Given a `prediction` of how many times the queued request's normalized latency ((last - sent) / n) exceeds its
    TPOT, the pass sets it beside the ratio computed from the student's own TPOT."""
    from decodelab.book.checks import as_prediction, compare_prediction

    guess = None if prediction is NO_PREDICTION else as_prediction(prediction, "PREDICTION", 0, 10_000)
    measured = {}
    for label, sent, times in _CASES:
        what = f"{label}，sent={sent!r}，token_times={times!r}"
        result = _call(latency_metrics, sent, times, what)
        if not isinstance(result, (tuple, list)):
            fail(f"输入 {what} 时应返回两个数 (TTFT, TPOT)，例如 return ttft, tpot；"
                 f"你返回了 {type(result).__name__}：{result!r}。")
        if len(result) != 2:
            fail(f"输入 {what} 时应返回两个数 (TTFT, TPOT)，你返回了 {len(result)} 个值：{result!r}。")
        ttft, tpot = result
        if not _is_number(ttft):
            fail(f"输入 {what} 时 TTFT 应是一个数（秒），你返回了 {type(ttft).__name__}：{ttft!r}。")
        right_ttft = times[0] - sent
        if len(times) > 1 and _is_number(tpot) and not _close(ttft, right_ttft):
            right_tpot = (times[-1] - times[0]) / (len(times) - 1)
            if _close(ttft, right_tpot) and _close(tpot, right_ttft):
                fail(f"输入 {what} 时你返回了 ({ttft:.4g}, {tpot:.4g})：两个值的顺序反了。应返回 (TTFT, TPOT)。")
        _check_ttft(ttft, sent, times, what)
        if len(times) == 1:
            _check_single_token_tpot(tpot, what)
        else:
            _check_tpot(tpot, sent, times, what)
            measured[label] = (sent, times, tpot)
    queued = _CASES[1][0]
    sent, times, tpot = measured[queued]
    ratio = (times[-1] - sent) / len(times) / tpot
    passed("TTFT = token_times[0] − sent（排队 + prefill，用户等到第一个字的时间）；"
           "TPOT = (token_times[-1] − token_times[0]) / (n − 1)（第一个 token 之后 decode 的节奏）；"
           "只有一个 token 时 TPOT 没有定义，返回 None。"
           + (f"\n排了 2.5 秒队的那个请求：normalized latency 是 TPOT 的几倍？{compare_prediction(guess, ratio, '{:.1f}')}。"
              "排队的 2.5 秒被摊进了每个 token；TPOT 只看出字的节奏，所以两者差了一个数量级。看延迟的表要先问：它除的是什么？"
              if guess is not None else ""))
