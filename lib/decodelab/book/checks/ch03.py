"""Checks for the exercises of chapter 03 (常见解码策略): a top-p filter, a batched top-k filter, and a measured
loop rate of top-k decoding.

Both filters take logits `[B, V]` and return logits `[B, V]` in which removed tokens are -inf; the kept tokens keep
their logits (a constant shift per row is accepted too: softmax does not see it). The loop rate is a number the
student measures with any seeds, so its check accepts a range around the library's own measurement.

Taught in: chapters/03-strategies.ipynb, exercises/03-strategies.ipynb
"""
from __future__ import annotations

import functools
import math
import numbers
import operator
from collections.abc import Callable

import torch

from decodelab.book.checks import call_student, expect_tensor, fail, passed
from decodelab.decoding.generate import generate
from decodelab.sampling.sampler import SamplingParams, process_logits
from decodelab.measure.repetition import loop_rate
from decodelab.toy.documents import DocumentLanguage
from decodelab.validation import check_int


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


# ---- a measured loop rate: top-k on long continuations -------------------------------------------------------------

LOOP_PROMPT_SEED = 2026  # the documents of chapter 03's long-form table (scripts/long_form.py): same first n prompts
LOOP_MAX_TOKENS = 256
MAX_LOOP_K = 100
MAX_LOOP_PROMPTS = 200  # keeps the reference run under half a minute on one CPU thread
_reference_loop_rates: dict[tuple[int, int], float] = {}  # (k, num_prompts) -> rate, so a re-run check is instant


def loop_prompts(n: int = 30) -> list[str]:
    """The prompts of the loop-rate exercise: the first two sentences of `n` documents of `DocumentLanguage`,
    drawn with the fixed seed `LOOP_PROMPT_SEED` (the intro that names the protagonist, and one more sentence).

    >>> loop_prompts(1)[0].startswith("这是")
    True

    Taught in: exercises/03-strategies.ipynb
    """
    check_int(n, "n")
    if n > MAX_LOOP_PROMPTS:
        raise ValueError(f"n must be an int in [1, {MAX_LOOP_PROMPTS}], got {n}")
    language = DocumentLanguage()
    return ["".join(language.split_sentences(doc)[:2]) for doc in language.sample(n, seed=LOOP_PROMPT_SEED)]


@functools.lru_cache(maxsize=1)
def _tiny_zh_doc():
    from decodelab.models.load import load_model

    return load_model("tiny-zh-doc", device="cpu")


def _reference_loop_rate(k: int, num_prompts: int) -> float:
    """Share of tiny-zh-doc's continuations (top_k=k, prompt i with seed i, 256 tokens at most) that end in a loop."""
    key = (k, num_prompts)
    if key not in _reference_loop_rates:
        model, tokenizer = _tiny_zh_doc()
        params = [SamplingParams(top_k=k, max_tokens=LOOP_MAX_TOKENS, seed=i) for i in range(num_prompts)]
        completions = generate(model, tokenizer, loop_prompts(num_prompts), params)
        _reference_loop_rates[key] = loop_rate([c.text for c in completions])
    return _reference_loop_rates[key]


def _as_top_k(k) -> int:
    """`k` as a Python int in [1, MAX_LOOP_K]; numpy and one-element torch integers are accepted."""
    if isinstance(k, bool) or (isinstance(k, torch.Tensor) and k.dtype == torch.bool):
        raise TypeError(f"k must be an int in [1, {MAX_LOOP_K}] (the top_k you measured with), got {k!r}")
    try:
        value = operator.index(k)
    except TypeError:
        raise TypeError(f"k must be an int in [1, {MAX_LOOP_K}] (the top_k you measured with), "
                        f"got {k!r} of type {type(k).__name__}") from None
    if not 1 <= value <= MAX_LOOP_K:
        raise ValueError(f"k must be an int in [1, {MAX_LOOP_K}] (the top_k you measured with), got {value}")
    return value


def _as_rate(rate) -> float:
    """`rate` as a float; numpy numbers and one-element torch tensors are accepted, the range is checked by the caller."""
    if isinstance(rate, torch.Tensor) and rate.numel() == 1 and rate.dtype != torch.bool:
        rate = rate.item()
    if isinstance(rate, (bool, torch.Tensor)) or not isinstance(rate, numbers.Real):
        raise TypeError(f"rate must be a float in [0, 1] (the share of continuations that end in a loop), "
                        f"got {rate!r} of type {type(rate).__name__}")
    value = float(rate)
    if math.isnan(value) or not 0 <= value <= 100:
        raise ValueError(f"rate must be a float in [0, 1] (the share of continuations that end in a loop), got {rate!r}")
    return value


def check_loop_rate(k: int, rate: float, num_prompts: int = 30) -> None:
    """Check a measured loop rate: the share of tiny-zh-doc's continuations of `loop_prompts(num_prompts)`, decoded
    with `SamplingParams(top_k=k, max_tokens=256)`, that end in a repeated phrase (`text_metrics.loop_rate`).

    The student may use any seeds, so the check accepts `rate` within max(0.1, 2 sqrt(p (1 - p) / n)) of the
    library's own rate p (prompt i with seed i); the reference is computed once per (k, num_prompts) and cached.

    Taught in: exercises/03-strategies.ipynb
    """
    k = _as_top_k(k)
    check_int(num_prompts, "num_prompts")
    if num_prompts > MAX_LOOP_PROMPTS:
        raise ValueError(f"num_prompts must be an int in [1, {MAX_LOOP_PROMPTS}], got {num_prompts}")
    if rate is None:
        fail("还没有结果：rate 还是 None。用 loop_prompts() 的提示生成续写，再用 loop_rate 算出以循环结尾的续写所占的比例"
             "（0 到 1 之间的小数）。")
    rate = _as_rate(rate)
    if rate > 1:
        fail(f"rate 应是 0 到 1 之间的比例，你的 {rate:g} 看起来像百分数（或以循环结尾的续写的个数）："
             f"百分数要除以 100，个数要除以提示数 {num_prompts}。")
    reference = _reference_loop_rate(k, num_prompts)
    tolerance = max(0.1, 2 * math.sqrt(reference * (1 - reference) / num_prompts))
    measured = (f"k = {k} 时参考循环率是 {reference:.2f}（{num_prompts} 个提示，提示 i 用 seed i，max_tokens=256），"
                f"容许范围 ±{tolerance:.2f}，你的是 {rate:.2f}")
    if abs(rate - reference) <= tolerance + 1e-9:
        passed(f"{measured}。换了 seed 数字会变：{num_prompts} 个提示的抽样误差约 2·√(p(1−p)/n)，检查至少容许 ±0.1。")
        return
    if rate < reference:
        fail(f"{measured}，偏低。逐项看看："
             "① 模型是不是 tiny-zh-doc：load_model() 默认加载的 tiny-zh 只学过单句，写完一句就结束，来不及循环；"
             "② SamplingParams 里有没有 max_tokens=256：默认只有 16 个 token，续写太短，循环还没出现；"
             "③ top_k=k 有没有传给 SamplingParams：默认 top_k=0 表示不截断，那是纯采样，几乎从不循环；"
             "④ 提示是不是 loop_prompts(...) 给的文档前两句；数的是不是续写 completion.text 结尾的循环"
             "（ending_loop(text) 不是 None，或直接 loop_rate(texts)）。"
             f"如果用了别的提示个数 n，把 num_prompts=n 传给检查（现在是 {num_prompts}）。")
    if k > 1:
        greedy = _reference_loop_rate(1, num_prompts)
        if abs(rate - greedy) <= 0.1:
            fail(f"{measured}，却和 greedy（k = 1）的 {greedy:.2f} 差不多。temperature 是不是 0？"
                 "temperature=0 就是 greedy，这时 top_k 不起作用；或者传进去的 top_k 其实是 1，或者你自己取了 argmax。"
                 "用 SamplingParams(top_k=k, max_tokens=256, seed=i)，temperature 保持默认的 1。")
    fail(f"{measured}，偏高。逐项看看："
         "① 数的是不是以循环结尾的续写（ending_loop / loop_rate）：repetition_rate 会把中途重复过、后来又走出来的续写也算进去；"
         "② temperature 是不是小于 1：分布更尖，更容易重复；"
         "③ 传给 SamplingParams 的 top_k 是不是比你报告的 k 小；"
         "④ 提示是不是 loop_prompts(...) 给的文档前两句。"
         f"如果用了别的提示个数 n，把 num_prompts=n 传给检查（现在是 {num_prompts}）。")
