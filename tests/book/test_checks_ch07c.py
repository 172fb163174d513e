"""The exercise check of chapter 07c accepts a right answer and names the mistake in a wrong one."""
import functools
import statistics

import pytest

from decodelab.book.checks import CheckFailed, call_student, ch07c
from decodelab.book.checks.ch07c import check_latency_metrics


def latency_right(sent, token_times):
    ttft = token_times[0] - sent
    if len(token_times) == 1:
        return ttft, None
    return ttft, (token_times[-1] - token_times[0]) / (len(token_times) - 1)


def with_tpot(tpot):
    """The right TTFT, `tpot(sent, token_times)` for more than one token, None for one."""
    def latency(sent, token_times):
        return token_times[0] - sent, (tpot(sent, token_times) if len(token_times) > 1 else None)
    return latency


def with_single_token_tpot(value):
    """Right for more than one token; `value` as the TPOT of a single token."""
    def latency(sent, token_times):
        ttft, tpot = latency_right(sent, token_times)
        return ttft, (value if len(token_times) == 1 else tpot)
    return latency


def mean_gap_with_wait(sent, token_times):
    """Every gap in [sent, *token_times], the wait before the first token included."""
    times = [sent, *token_times]
    return statistics.fmean(b - a for a, b in zip(times, times[1:]))


def no_single_token_case(sent, token_times):
    return token_times[0] - sent, (token_times[-1] - token_times[0]) / (len(token_times) - 1)


def not_implemented(sent, token_times):
    raise NotImplementedError


def test_right_answer_passes(capsys):
    check_latency_metrics(latency_right)
    assert "通过" in capsys.readouterr().out


def test_a_mean_of_the_gaps_and_a_list_pass(capsys):
    def latency(sent, token_times):
        gaps = [b - a for a, b in zip(token_times, token_times[1:])]
        return [token_times[0] - sent, statistics.fmean(gaps) if gaps else None]
    check_latency_metrics(latency)
    assert "通过" in capsys.readouterr().out


@pytest.mark.parametrize("fn, hint", [
    (not_implemented, "还没有实现"),
    (lambda sent, t: (t[0], latency_right(sent, t)[1]), "从时刻 0 量起了"),
    (lambda sent, t: (sent - t[0], latency_right(sent, t)[1]), "减反了"),
    (lambda sent, t: (t[-1] - sent, latency_right(sent, t)[1]), "总延迟"),
    (lambda sent, t: latency_right(sent, t)[::-1], "顺序反了"),
    (with_tpot(lambda sent, t: (t[-1] - t[0]) / len(t)), "你除以了 n"),
    (with_tpot(lambda sent, t: (t[-1] - sent) / len(t)), "normalized latency"),
    (with_tpot(mean_gap_with_wait), "第一个 token 之前的等待也算作一个间隔"),
    (with_tpot(lambda sent, t: (t[-1] - sent) / (len(t) - 1)), "把 TTFT 也算进了 TPOT"),
    (with_tpot(lambda sent, t: t[-1] - t[0]), "还没有除以间隔数"),
    (with_tpot(lambda sent, t: t[1] - t[0]), "只用了第一个间隔"),
    (with_tpot(lambda sent, t: max(b - a for a, b in zip(t, t[1:]))), "TPOT 不对"),
    (lambda sent, t: (t[0] - sent, None), "有 5 个 token 时 TPOT 是有定义的"),
    (no_single_token_case, "ZeroDivisionError"),
    (lambda sent, t: (t[0] - sent, statistics.mean(b - a for a, b in zip(t, t[1:]))), "返回 (TTFT, None)"),
    (with_single_token_tpot(0.0), "不是 0"),
    (with_single_token_tpot(float("nan")), "不是 nan 或 inf"),
    (with_single_token_tpot(0.3), "TPOT 应为 None"),
    (lambda sent, t: t[0] - sent, "应返回两个数"),
    (lambda sent, t: (*latency_right(sent, t), len(t)), "应返回两个数"),
    (lambda sent, t: (str(t[0] - sent), None), "TTFT 应是一个数"),
    (with_tpot(lambda sent, t: "fast"), "TPOT 应是一个数"),
])
def test_mistakes_are_named(fn, hint):
    with pytest.raises(CheckFailed) as error:
        check_latency_metrics(fn)
    assert hint in str(error.value)


def test_a_loop_on_one_token_is_named_as_a_loop(monkeypatch):
    """A loop is not a crash: the single-token hint about dividing by 0 must not replace the loop hint."""
    monkeypatch.setattr(ch07c, "call_student", functools.partial(call_student, time_limit=0.2))

    def loops_on_one_token(sent, token_times):
        while len(token_times) == 1:
            pass
        return latency_right(sent, token_times)
    with pytest.raises(CheckFailed) as error:
        check_latency_metrics(loops_on_one_token)
    assert "永远不会结束的循环" in str(error.value)
