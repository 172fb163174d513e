"""Exercise checkers: each runs a student's function on probing inputs and says, in Chinese, what is right
or what to look at. A failed check raises `CheckFailed` (an AssertionError) whose message is the hint.

One module per chapter: `decodelab.book.checks.ch01`, `decodelab.book.checks.ch02`, ...

How a check keeps itself honest:

- **Forbidden calls.** Where an exercise asks the student to write a function the library (or torch) already has,
  the check runs the student's function inside `forbid(...)`: for that call only, every spelling of the forbidden
  function raises `ForbiddenCall`. torch's functions are patched where they live (`torch.softmax`,
  `torch.nn.functional.softmax`, the method `torch.Tensor.softmax`, ...), so an alias bound before the check
  (`from torch.nn.functional import softmax`) is caught too, since F.softmax calls `Tensor.softmax`; a Python
  function of the library (`decodelab.sampling.probs.softmax`) has its `__code__` swapped, so every name bound to it
  raises, however it was imported. Each attempt is also recorded, so a student function that swallows the
  exception still fails. `call_student(..., forbidden=...)` turns either into a hint that names the function.
- **No leaked answers.** A failed check never prints the reference value or a number that would pass; the reference
  appears only in the message of a pass. A check that takes a bare number never says which way it is off.
  Measurement checks take the student's raw material (the texts, the per-position records, the samples) and
  recompute the statistic from it.
- **Fast hints for stuck code.** The student's function runs under a time budget (`TIME_LIMIT_S`, 5 s: every
  probe of a check is small); past it, the loop hint comes at once. The one heavier probe, `check_greedy_with_cache`
  (the model runs 13 forward passes), allows `MODEL_TIME_LIMIT_S`.
- **The hint alone.** In IPython / JupyterLab a `CheckFailed` renders as its Chinese hint only
  (`_render_traceback_`): no frames of the checks, no chained traceback. nbval still sees the exception's name and
  message in the cells tagged `raises-exception`.
- **Before the imports.** Each starter's check cell imports its check itself. Importing this package inside
  IPython also registers a handler that answers a `NameError` (a cell run before the one that defines the name)
  with a Chinese hint.

Taught in: exercises/*.ipynb
"""
from __future__ import annotations

import contextlib
import importlib
import numbers
import signal
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch


class CheckFailed(AssertionError):
    """A check found a mistake; the message tells the student what to look at."""

    def _render_traceback_(self) -> list[str]:
        """What IPython shows instead of a traceback: the hint, in red, and nothing of the checks' internals."""
        return ["\x1b[0;31m检查没有通过\x1b[0m", *str(self).splitlines()]


def fail(hint: str) -> None:
    """Stop the check with `hint`, the Chinese explanation of what went wrong (no chained traceback)."""
    raise CheckFailed(hint) from None


def passed(message: str) -> None:
    """Tell the student the check passed."""
    print(f"通过 ✔ {message}")


TIME_LIMIT_S = 5.0  # a student's function that runs longer on a check's small probe is stuck in a loop
MODEL_TIME_LIMIT_S = 60.0  # check_greedy_with_cache only: the probe runs tiny-zh 13 times


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


# ---- forbidden calls ----------------------------------------------------------------------------------------------

class ForbiddenCall(Exception):
    """Raised inside the student's function when it calls a function the exercise asks them to write."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


def _resolve(path: str) -> tuple[Any, str, Any]:
    """`"torch.nn.functional.softmax"` -> (owner object, attribute name, current value)."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:-1]:
            owner = getattr(owner, attribute)
        return owner, parts[-1], getattr(owner, parts[-1])
    raise ValueError(f"forbidden path must name a module attribute, got {path!r}")


def _raiser_code(name: str):
    """A code object with no free variables that records `name` and raises ForbiddenCall (for a `__code__` swap)."""
    namespace: dict[str, Any] = {}
    exec(compile("def raiser(*args, **kwargs):\n"
                 "    import decodelab.book.checks as checks\n"
                 f"    checks._record_forbidden({name!r})\n", "<forbidden>", "exec"), namespace)
    return namespace["raiser"].__code__


_attempts: list[str] = []


def _record_forbidden(name: str) -> None:
    _attempts.append(name)
    raise ForbiddenCall(name)


@contextlib.contextmanager
def forbid(paths: Iterable[str]):
    """Within the block, calling any of `paths` (dotted names such as "torch.softmax" or
    "decodelab.sampling.probs.softmax") raises ForbiddenCall; yields the list of attempted names."""
    restore: list[Callable[[], None]] = []
    start = len(_attempts)
    try:
        for path in paths:
            owner, attribute, value = _resolve(path)
            function = getattr(value, "__func__", value)
            if hasattr(function, "__code__") and not function.__code__.co_freevars:
                original = function.__code__
                function.__code__ = _raiser_code(path)
                restore.append(lambda f=function, c=original: setattr(f, "__code__", c))
            else:
                def raiser(*args, _name=path, **kwargs):
                    _record_forbidden(_name)
                own = attribute in vars(owner)  # False: a method torch.Tensor inherits from its C base
                setattr(owner, attribute, raiser)
                restore.append(lambda o=owner, a=attribute, v=value, own=own:
                               setattr(o, a, v) if own else delattr(o, a))
        attempts: list[str] = []
        yield attempts
    finally:
        for undo in reversed(restore):
            undo()
        attempts_here = _attempts[start:]
        del _attempts[start:]
        if "attempts" in locals():
            attempts.extend(attempts_here)


# torch's spellings of the functions chapter 01 asks the student to write
SOFTMAX_SPELLINGS = ("torch.softmax", "torch.special.softmax", "torch.nn.functional.softmax", "torch.Tensor.softmax",
                     "decodelab.sampling.probs.softmax")
LOG_SOFTMAX_SPELLINGS = ("torch.log_softmax", "torch.special.log_softmax", "torch.nn.functional.log_softmax",
                         "torch.Tensor.log_softmax", "decodelab.sampling.probs.log_softmax")


def _forbidden_hint(name: str, what: str) -> str:
    short = name.replace("torch.nn.functional.", "F.").replace("torch.Tensor.", "x.")
    spelled = f"`{short}`" if short == name else f"`{short}`（{name}）"
    if name.startswith("decodelab."):
        return (f"输入 {what} 时你的函数调用了库里现成的 `{name}`：这道题要你自己把它写出来，"
                "检查不接受直接调用库的答案。只用题目允许的基本运算。")
    return (f"输入 {what} 时你的函数调用了 {spelled}：这道题要你自己用基本运算把它写出来，"
            "检查不接受它的任何写法（torch.xxx、F.xxx、x.xxx() 都一样）。")


def call_student(fn: Callable[..., Any], *args: Any, what: str, time_limit: float = TIME_LIMIT_S,
                 forbidden: Sequence[str] = ()) -> Any:
    """Call the student's function; a crash becomes a hint that names the input (`what`), and so does a call that
    does not return within `time_limit` seconds (a loop that never ends) and a call of any function in `forbidden`
    (dotted names, see `forbid`)."""
    if not callable(fn):
        fail(f"要检查的应是你写的函数（可调用的对象），你给的是 {type(fn).__name__}：{fn!r}。"
             "传函数本身，不要加括号调用它。")
    copies = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]  # the probes stay untouched
    attempts: list[str] = []
    try:
        with forbid(forbidden) as attempts, _time_limit(time_limit):
            result = fn(*copies)
    except ForbiddenCall as error:
        fail(_forbidden_hint(error.name, what))
    except _TimeLimit:
        fail(f"输入 {what} 时函数 {time_limit:g} 秒还没有返回（这个输入很小，正确的写法一眨眼就算完）："
             "是不是有一个永远不会结束的循环（例如 while 的条件从不变为假，或循环变量没有更新）？")
    except NotImplementedError:
        fail("函数还没有实现：把 `raise NotImplementedError` 换成你的代码。")
    except NameError as error:
        fail(f"输入 {what} 时函数里用到了还没有定义的名字（{error}）：先运行上面定义它（或导入它）的单元。")
    except RuntimeError as error:
        if "size of tensor" in str(error) or "must match" in str(error):
            fail(f"输入 {what} 时形状不匹配（{error}）。提示：按行求 max 或 sum 时用 keepdim=True，"
                 "结果的形状是 [..., 1]，才能和 [..., V] 广播。")
        fail(f"输入 {what} 时函数出错：{type(error).__name__}: {error}")
    except (TypeError, ValueError, IndexError, ArithmeticError, AttributeError, KeyError) as error:
        fail(f"输入 {what} 时函数出错：{type(error).__name__}: {error}")
    if attempts:
        fail(_forbidden_hint(attempts[0], what))
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


# ---- predictions -------------------------------------------------------------------------------------------------

class _NoPrediction:
    """The default of a check's `prediction`: none was asked for (None means the student has not written it yet)."""

    def __repr__(self) -> str:
        return "NO_PREDICTION"


NO_PREDICTION = _NoPrediction()


def as_prediction(prediction: Any, name: str = "PREDICTION", lowest: float | None = None,
                  highest: float | None = None) -> float:
    """The student's stored prediction as a float; a missing one (None) or one outside [lowest, highest] (the values
    the quantity can take, not a reference) is a hint."""
    if prediction is None:
        fail(f"先写下你的预测：把 {name} = None 换成一个数，再运行测量。预测写错了没关系，它是拿来和结果对照的。")
    if isinstance(prediction, bool) or not isinstance(prediction, numbers.Real) or prediction != prediction:
        fail(f"{name} 应是一个数，你写的是 {prediction!r}。")
    value = float(prediction)
    if (lowest is not None and value < lowest) or (highest is not None and value > highest):
        fail(f"{name} = {value:g} 不在可能的范围 [{lowest:g}, {highest:g}] 里：再想一想这个量的单位和取值范围。")
    return value


def compare_prediction(prediction: float, result: float, fmt: str = "{:.3f}") -> str:
    """ "你预测 X，量到 Y（差 Z）" for the reply of an investigative check."""
    gap = result - prediction
    return f"你预测 {fmt.format(prediction)}，量到 {fmt.format(result)}（差 {gap:+.3g}）"


# ---- a NameError in a notebook cell: a hint instead of a bare English traceback -----------------------------------

def _name_error_hint(shell, etype, value, tb, tb_offset=None):
    name = getattr(value, "name", None) or str(value)
    stb = ["\x1b[0;31mNameError\x1b[0m",
           f"名字 `{name}` 还没有定义：先运行上面定义（或导入）它的单元，或者从头运行全部单元（Run All）。"]
    shell._showtraceback(etype, value, stb)
    return stb


def _register_name_error_hint() -> None:
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return
    if NameError not in getattr(shell, "custom_exceptions", ()):
        shell.set_custom_exc((NameError,), _name_error_hint)


_register_name_error_hint()

__all__ = ["CheckFailed", "ForbiddenCall", "LOG_SOFTMAX_SPELLINGS", "NO_PREDICTION", "SOFTMAX_SPELLINGS", "as_prediction",
           "call_student", "close", "compare_prediction", "expect_tensor", "fail", "forbid", "passed"]
