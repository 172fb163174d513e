"""Exercise checkers: each runs a student's function on probing inputs and says, in Chinese, what is right
or what to look at. A failed check raises `CheckFailed` (an AssertionError) whose message is the hint.

One module per chapter: `decodelab.book.checks.ch01`, `decodelab.book.checks.ch02`, ...
Taught in: exercises/*.ipynb
"""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable
from typing import Any

import torch


class CheckFailed(AssertionError):
    """A check found a mistake; the message tells the student what to look at."""


def fail(hint: str) -> None:
    """Stop the check with `hint`, the Chinese explanation of what went wrong."""
    raise CheckFailed(hint)


def passed(message: str) -> None:
    """Tell the student the check passed."""
    print(f"通过 ✔ {message}")


TIME_LIMIT_S = 60.0  # a student's function that runs longer on a check's small probe is stuck in a loop


class _TimeLimit(Exception):
    """Raised inside the student's function when it runs past the check's time limit."""


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Interrupt the block after `seconds` (SIGALRM: the main thread of a Unix process, as a notebook kernel runs
    cells); elsewhere the block runs without a limit."""
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def interrupt(signum, frame):
        raise _TimeLimit()

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def call_student(fn: Callable[..., Any], *args: Any, what: str, time_limit: float = TIME_LIMIT_S) -> Any:
    """Call the student's function; a crash becomes a hint that names the input (`what`), and so does a call that
    does not return within `time_limit` seconds (a loop that never ends)."""
    if not callable(fn):
        raise TypeError(f"fn must be the function you wrote (callable), got {type(fn).__name__}")
    copies = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]  # the probes stay untouched
    try:
        with _time_limit(time_limit):
            result = fn(*copies)
    except _TimeLimit:
        fail(f"输入 {what} 时函数 {time_limit:g} 秒还没有返回：是不是有一个永远不会结束的循环"
             "（例如 while 的条件从不变为假，或循环变量没有更新）？")
    except NotImplementedError:
        fail("函数还没有实现：把 `raise NotImplementedError` 换成你的代码。")
    except RuntimeError as error:
        if "size of tensor" in str(error) or "must match" in str(error):
            fail(f"输入 {what} 时形状不匹配（{error}）。提示：按行求 max 或 sum 时用 keepdim=True，"
                 "结果的形状是 [..., 1]，才能和 [..., V] 广播。")
        fail(f"输入 {what} 时函数出错：{type(error).__name__}: {error}")
    except (TypeError, ValueError, IndexError, ArithmeticError) as error:
        fail(f"输入 {what} 时函数出错：{type(error).__name__}: {error}")
    for original, copy in zip(args, copies):
        if isinstance(original, torch.Tensor) and not torch.equal(original, copy):
            fail(f"输入 {what} 被原地修改了（例如 `x -= x.max()`）。请不要改动调用者的张量：写成 `x = x - ...`。")
    return result


def expect_tensor(result: Any, shape: tuple[int, ...], what: str) -> torch.Tensor:
    """The result must be a floating tensor of `shape`."""
    if not isinstance(result, torch.Tensor):
        fail(f"输入 {what} 时应返回 torch.Tensor，实际返回了 {type(result).__name__}。")
    if tuple(result.shape) != shape:
        fail(f"输入 {what} 时输出形状应为 {list(shape)}，实际是 {list(result.shape)}。")
    if not result.is_floating_point():
        fail(f"输入 {what} 时输出应为浮点张量，实际 dtype 是 {result.dtype}。")
    return result


def close(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-5) -> bool:
    """Equal up to float32 rounding, with matching inf/nan positions treated as unequal."""
    a64, b64 = a.detach().to(torch.float64), b.detach().to(torch.float64)
    return a64.shape == b64.shape and bool(torch.isfinite(a64).all()) and torch.allclose(a64, b64, atol=atol, rtol=1e-4)


__all__ = ["CheckFailed", "call_student", "close", "expect_tensor", "fail", "passed"]
