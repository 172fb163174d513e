"""Checks for the exercises of chapter 05 (Exposure bias): how small per-step errors compound over a free-running
generation, and the probability mass a model puts on what the true language forbids.

Taught in: chapters/05-exposure-bias.ipynb, exercises/05-exposure-bias.ipynb
"""
from __future__ import annotations

import math
from collections.abc import Callable

from decodelab.book.checks import call_student, fail, passed

_RATES = [0.01, 0.02, 0.05, 0.0, 0.1]


def _survival(rates: list[float]) -> list[float]:
    alive, out = 1.0, []
    for rate in rates:
        alive *= 1.0 - rate
        out.append(alive)
    return out


def check_survival(fn: Callable[[list[float]], list[float]]) -> None:
    """Check `fn(error_rates) -> survival`: survival[t] = P(no error in steps 0..t) for independent steps."""
    what = f"每一步出错的概率 {_RATES}"
    result = call_student(fn, list(_RATES), what=what)
    try:
        result = [float(x) for x in result]
    except (TypeError, ValueError):
        fail(f"输入 {what} 时应返回一个数的列表（每一步一个），实际返回了 {result!r}。")
    expected = _survival(_RATES)
    if len(result) != len(_RATES):
        if len(result) == len(_RATES) + 1 and math.isclose(result[0], 1.0):
            fail("你在开头多放了一个 1.0（第 0 步之前）。题目要的是每一步**之后**仍未出错的概率，长度与输入相同。")
        fail(f"输入 {what} 时应返回 {len(_RATES)} 个数，你返回了 {len(result)} 个。")
    if all(math.isclose(a, b, abs_tol=1e-12) for a, b in zip(result, expected)):
        passed("正确：每一步都不出错的概率是 (1 − ε_0)(1 − ε_1)…，小错误会乘起来，长度一长，整句正确的概率就掉下去。")
        return
    running_sum = [1.0 - sum(_RATES[:t + 1]) for t in range(len(_RATES))]
    if all(math.isclose(a, b, abs_tol=1e-9) for a, b in zip(result, running_sum)):
        fail("你用的是 1 − (ε_0 + ε_1 + …)：这是一个近似，只在错误率很小、步数很少时接近。各步独立时，"
             "“每一步都不出错”的概率是各步“不出错”的概率相乘：Π (1 − ε_t)。")
    shifted = [1.0] + expected[:-1]
    if all(math.isclose(a, b, abs_tol=1e-12) for a, b in zip(result, shifted)):
        fail("结果错了一位：survival[t] 要把第 t 步本身也算进去，即 Π_{s ≤ t} (1 − ε_s)。")
    product_of_errors = [math.prod(_RATES[:t + 1]) for t in range(len(_RATES))]
    if all(math.isclose(a, b, abs_tol=1e-12) for a, b in zip(result, product_of_errors)):
        fail("你把出错的概率 ε 乘了起来，那是“每一步都出错”的概率。要乘的是不出错的概率 1 − ε。")
    fail(f"输入 {what} 时应得 {[round(x, 6) for x in expected]}，你的结果是 {[round(x, 6) for x in result]}。")


_MODEL = {"园": 0.55, "校": 0.25, "馆": 0.12, "</s>": 0.05, "吃": 0.03}
_TRUTH = {"园": 0.6, "校": 0.4}
_CASES = [
    (_MODEL, _TRUTH, "模型 {园 0.55, 校 0.25, 馆 0.12, </s> 0.05, 吃 0.03}，真实分布 {园 0.6, 校 0.4}"),
    ({"。": 0.9, "！": 0.1}, {"。": 1.0}, "模型 {。 0.9, ！ 0.1}，真实分布 {。 1.0}"),
    ({"霜": 1.0}, {"霜": 1.0}, "模型与真实分布都是 {霜 1.0}"),
    ({"a": 0.5, "b": 0.5}, {"a": 0.999, "b": 0.001}, "模型 {a 0.5, b 0.5}，真实分布 {a 0.999, b 0.001}"),
]


def check_invalid_mass(fn: Callable[[dict, dict], float]) -> None:
    """Check `fn(model_probs, true_probs) -> float`: model mass on tokens whose true probability is 0."""
    for model_probs, true_probs, what in _CASES:
        result = call_student(fn, dict(model_probs), dict(true_probs), what=what)
        if isinstance(result, bool) or not isinstance(result, (int, float)):
            fail(f"输入 {what} 时应返回一个数，实际返回了 {type(result).__name__}：{result!r}。")
        expected = sum(p for token, p in model_probs.items() if true_probs.get(token, 0.0) == 0.0)
        if math.isclose(result, expected, abs_tol=1e-9):
            continue
        allowed = sum(p for token, p in model_probs.items() if true_probs.get(token, 0.0) > 0.0)
        if math.isclose(result, allowed, abs_tol=1e-9):
            fail(f"输入 {what} 时你算的是模型放在**合法** token 上的质量（{allowed:g}）。题目要的是放在真实分布里概率为 0 的 "
                 "token 上的质量，也就是 1 减去它。")
        if math.isclose(result, sum(p for t, p in true_probs.items() if t not in model_probs or model_probs[t] == 0),
                        abs_tol=1e-9):
            fail(f"输入 {what} 时你把两个分布的角色弄反了：要加的是**模型**的概率，加在真实分布不允许的 token 上。")
        total_variation = 0.5 * sum(abs(model_probs.get(t, 0.0) - true_probs.get(t, 0.0)) for t in {*model_probs, *true_probs})
        if math.isclose(result, total_variation, abs_tol=1e-9):
            fail(f"输入 {what} 时你算的是 total variation 距离（{total_variation:g}），它也数了合法 token 上概率的差。"
                 "这里只要模型放在非法 token（真实概率为 0）上的质量。")
        fail(f"输入 {what} 时应得 {expected:g}，你的结果是 {result!r}。"
             "把 model_probs 里那些在 true_probs 中不存在（或概率为 0）的 token 的概率加起来；别漏了 </s>。")
    passed("正确：只有真实分布里概率为 0 的 token 算“非法”，真实概率很小但不为 0 的 token 不算。")


# Reference of exercise 5.3, written by scripts/ch05_exposure.py into chapters/data/05-exposure.json
# ("exercise" of tiny-zh-doc-small): the 40 documents DocumentLanguage().sample(40, seed=505_000_005), pooled hazard
# on the data and on the model's own error-free prefixes, and the 95% bootstrap interval of the gap.
HAZARD_REFERENCE: dict[float, dict[str, float]] = {
    0.7: {"data": 0.001342, "own_clean": 0.001037, "gap_low": -0.000915, "gap_high": 0.000273},
    1.0: {"data": 0.009713, "own_clean": 0.008826, "gap_low": -0.001795, "gap_high": 2.2e-05},
    1.3: {"data": 0.048967, "own_clean": 0.05229, "gap_low": -0.000373, "gap_high": 0.008004},
}


def check_hazard_gap(temperature: float, data_hazard: float, own_hazard: float) -> None:
    """Check a measured (data_hazard, own_hazard) of tiny-zh-doc-small at `temperature` against the stored run:
    the data hazard is deterministic, the own hazard depends on the samples, so it is accepted in a range."""
    if temperature not in HAZARD_REFERENCE:
        fail(f"temperature 应是 {sorted(HAZARD_REFERENCE)} 之一（脚本只为这几个温度存了参考值），你给的是 {temperature!r}。")
    for name, value in (("data_hazard", data_hazard), ("own_hazard", own_hazard)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
            fail(f"{name} 应是一个 0 到 1 之间的概率（每个位置的 hazard 的平均），你给的是 {value!r}。")
    ref = HAZARD_REFERENCE[temperature]
    if not math.isclose(data_hazard, ref["data"], rel_tol=0.02, abs_tol=1e-4):
        hint = ("偏低：是不是把第一句（提示本身）的位置也算进去了？从 len(first_sentence(doc)) 开始算。"
                if data_hazard < ref["data"] else
                "偏高：hazard 要用模型在同一个 temperature 下的分布，且只数真实分布不允许的 token。")
        fail(f"在 40 篇真实文档上，T={temperature} 时 data_hazard 应约为 {ref['data']:.4f}，你得到 {data_hazard:.4f}，{hint}")
    half = (ref["gap_high"] - ref["gap_low"]) / 2
    low, high = ref["own_clean"] - 1.5 * half, ref["own_clean"] + 1.5 * half
    if not low <= own_hazard <= high:
        hint = ("偏高：是不是把出错之后的位置也算进去了？只要 status == \"clean\" 的位置。" if own_hazard > high else
                "偏低：续写要用同一个 temperature 采样，并从每篇文档的第一句接着写。")
        fail(f"T={temperature} 时，模型自己的无错前缀上的 hazard 应在 [{low:.4f}, {high:.4f}] 之间"
             f"（参考值 {ref['own_clean']:.4f}），你得到 {own_hazard:.4f}，{hint}")
    gap = own_hazard - data_hazard
    passed(f"T={temperature}：自己的前缀上 {own_hazard:.4f}，真实前缀上 {data_hazard:.4f}，差 {gap:+.4f}；脚本的 95% 区间是 "
           f"[{ref['gap_low']:+.4f}, {ref['gap_high']:+.4f}]。区间{'不含' if ref['gap_low'] > 0 or ref['gap_high'] < 0 else '包含'} 0："
           "比较不同温度下这个差的符号和大小，想一想它量的是“没见过的前缀”，还是“模型偏爱的前缀”。")
