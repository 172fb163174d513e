"""Checks for the exercises of chapter 05 (Exposure bias): how small per-step errors compound over a free-running
generation, and the probability mass a model puts on what the true language forbids.

Taught in: chapters/05-exposure-bias.ipynb, exercises/05-exposure-bias.ipynb
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence

from decodelab.book.checks import NO_PREDICTION, call_student, fail, passed

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
    fail(f"输入 {what} 时结果不对，你的是 {[round(x, 6) for x in result]}。"
         "survival[t] 是第 0 … t 步都不出错的概率：各步独立，把每一步“不出错”的概率乘起来。")


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
        fail(f"输入 {what} 时结果不对，你的是 {result!r}。"
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


HAZARD_DOCUMENTS = 40  # DocumentLanguage().sample(40, seed=505_000_005)
HAZARD_SEED = 505_000_005


def _as_records(value, name: str) -> list[list[tuple[int, str, float]]]:
    """The student's per-document hazard records, `hazards(...)`'s (position, status, hazard) triples, or a hint."""
    if value is None:
        fail("还没有量：hazard_records 还没有写完。它要返回两份记录（真实文档上的、模型自己续写上的），"
             "每篇文档一个 hazards(...) 的结果。")
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        fail(f"{name} 应是每篇文档一份 hazards(...) 记录的列表，不是一个数：检查要你的原始记录，从里面自己算平均 hazard。")
    ok = isinstance(value, Sequence) and not isinstance(value, str) and all(
        isinstance(doc, Sequence) and all(isinstance(r, tuple) and len(r) == 3 for r in doc) for doc in value)
    if not ok:
        fail(f"{name} 应是一个列表，每篇文档一项：hazards(model, tokenizer, lang, text, start, temperature) 返回的 "
             "(位置, 状态, hazard) 列表。")
    if len(value) != HAZARD_DOCUMENTS:
        fail(f"{name} 里有 {len(value)} 篇文档的记录，应是 {HAZARD_DOCUMENTS} 篇（DocumentLanguage().sample(40, seed=505_000_005)）。")
    for doc in value:
        for position, status, hazard in doc:
            if isinstance(hazard, bool) or not isinstance(hazard, numbers.Real) or not 0.0 <= hazard <= 1.0:
                fail(f"{name} 里有一个 hazard 不是 0 到 1 之间的概率：{hazard!r}。")
    return [list(doc) for doc in value]


def check_hazard_gap(temperature: float, data_records, own_records, prediction=NO_PREDICTION) -> None:
    """Check a measurement of tiny-zh-doc-small at `temperature` from the student's raw records: `data_records[i]`
    and `own_records[i]` are `hazards(...)`'s (position, status, hazard) triples after the first sentence of document
    i, on the document itself and on the model's own continuation of that sentence. The check pools them itself (all
    positions of the documents; the "clean" positions of the continuations) and compares with the stored run: the data
    hazard is deterministic, the own hazard depends on the samples, so it is accepted in a range. A failure may say
    which way a mean is off (it is the student's own), never the reference; a pass shows it, and the measured gap
    (own − data) beside the student's `prediction` of it."""
    from decodelab.measure.dagger import first_sentence
    from decodelab.toy.documents import DocumentLanguage

    from decodelab.book.checks import as_prediction, compare_prediction

    guess = None if prediction is NO_PREDICTION else as_prediction(prediction, "PREDICTION", -1, 1)
    if temperature not in HAZARD_REFERENCE:
        fail(f"temperature 应是 {sorted(HAZARD_REFERENCE)} 之一（脚本只为这几个温度存了参考值），你给的是 {temperature!r}。")
    data, own = _as_records(data_records, "data_records"), _as_records(own_records, "own_records")
    if data == own:
        fail("own_records 和 data_records 一模一样：你把真实文档上的 hazard 当成了模型自己的。"
             "模型自己的前缀要先用 continue_texts(...) 从每篇的第一句续写，再对续写的文字调用 hazards(...)。")
    starts = [len(first_sentence(doc)) for doc in DocumentLanguage().sample(HAZARD_DOCUMENTS, seed=HAZARD_SEED)]
    for name, records in (("data_records", data), ("own_records", own)):
        firsts = [doc[0][0] for doc in records if doc]
        if firsts and min(firsts) == 0 and min(starts) > 0:
            fail(f"{name} 从位置 0 就开始了：第一句是提示本身，要从它之后算起，hazards(..., start=len(first_sentence(doc)), ...)。")
        if any(doc and doc[0][0] != start for doc, start in zip(records, starts)):
            fail(f"{name} 的记录不是从每篇第一句之后开始的：第 i 篇从 len(first_sentence(docs[i])) 算起，"
                 "文档的顺序要和 DocumentLanguage().sample(40, seed=505_000_005) 一样。")
    if any(status != "clean" for doc in data for _, status, _ in doc):
        fail("data_records 里有不是 \"clean\" 的位置：真实文档里不该有错。hazards 的第三个参数是文档本身吗？")
    data_values = [h for doc in data for _, _, h in doc]
    own_values = [h for doc in own for _, status, h in doc if status == "clean"]
    if not data_values or not own_values:
        fail("记录是空的：hazards(...) 对每篇文档（和每条续写）都应给出第一句之后每个位置的一条记录。")
    data_hazard, own_hazard = sum(data_values) / len(data_values), sum(own_values) / len(own_values)
    ref = HAZARD_REFERENCE[temperature]
    if not math.isclose(data_hazard, ref["data"], rel_tol=0.02, abs_tol=1e-4):
        direction = "偏低" if data_hazard < ref["data"] else "偏高"
        fail(f"从你的 data_records 算出的平均 hazard 是 {data_hazard:.4f}，{direction}。这一项是确定的（不随 seed 变）："
             f"hazards 要用模型 tiny-zh-doc-small、同一个 temperature（{temperature}），文档是那 40 篇。")
    half = (ref["gap_high"] - ref["gap_low"]) / 2
    low, high = ref["own_clean"] - 1.5 * half, ref["own_clean"] + 1.5 * half
    if not low <= own_hazard <= high:
        direction = "偏高" if own_hazard > high else "偏低"
        fail(f"从你的 own_records 的 \"clean\" 位置算出的平均 hazard 是 {own_hazard:.4f}，{direction}，超出了抽样误差。"
             f"续写要用同一个 temperature（{temperature}）采样，从每篇文档的第一句接着写（continue_texts），"
             "再对续写的全文调用 hazards(..., start=len(第一句), temperature=...)。")
    gap = own_hazard - data_hazard
    passed(f"T={temperature}：从你的记录算出，自己的前缀上 {own_hazard:.4f}，真实前缀上 {data_hazard:.4f}，差 {gap:+.4f}"
           f"（脚本的参考值 {ref['own_clean']:.4f} 和 {ref['data']:.4f}，差的 95% 区间 "
           f"[{ref['gap_low']:+.4f}, {ref['gap_high']:+.4f}]）。区间"
           f"{'不含' if ref['gap_low'] > 0 or ref['gap_high'] < 0 else '包含'} 0："
           "比较不同温度下这个差的符号和大小，想一想它量的是“没见过的前缀”，还是“模型偏爱的前缀”。"
           + (f"\n差（自己 − 真实）：{compare_prediction(guess, gap, '{:+.4f}')}。如果你预测自己的前缀上 hazard 明显更高，"
              "那是 exposure bias 的标准说法；量出来的差很小甚至为负，说明模型自己写出的无错前缀正是它偏爱的那些。"
              if guess is not None else ""))
