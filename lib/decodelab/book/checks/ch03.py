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
from collections.abc import Callable, Sequence

import torch

from decodelab.book.checks import NO_PREDICTION, call_student, expect_tensor, fail, passed
from decodelab.decoding.generate import generate
from decodelab.sampling.sampler import SamplingParams, process_logits
from decodelab.measure.repetition import ending_loop as _ending_loop
from decodelab.measure.repetition import loop_rate as _loop_rate
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
# the library's own filters: they raise while the student's function runs
FILTER_FORBIDDEN = ("decodelab.sampling.sampler.process_logits", "decodelab.sampling.sampler.sample",
                    "decodelab.sampling.truncation.top_p_filter", "decodelab.sampling.truncation.top_p_descending",
                    "decodelab.sampling.truncation.top_k_filter")


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
        out = expect_tensor(call_student(fn, logits, p, what=what, forbidden=FILTER_FORBIDDEN), tuple(logits.shape), what)
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
        fail(f"输入 {what} 时保留的 token 不对：你保留了 {_kept(out).int().tolist()}（1 = 保留）。"
             "按概率从大到小排，一个 token 留下当且仅当比它更可能的 token 的概率之和 < p。")
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
        out = expect_tensor(call_student(fn, logits, k, what=what, forbidden=FILTER_FORBIDDEN), tuple(logits.shape), what)
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
        fail(f"输入 {what} 时保留的 token 不对：你保留了 {_kept(out).int().tolist()}（1 = 保留）。"
             "每一行留下它自己最大的 k 个 logits。")
    passed("top-k 正确：每一行用自己的第 k 大值（形状 [B, 1]），batch 为 1、3 还是 B == V 都对，k = V 时全部保留。")


# ---- a measured loop rate: top-k on long continuations -------------------------------------------------------------

LOOP_PROMPT_SEED = 2026  # the documents of chapter 03's long-form table (scripts/long_form.py): same first n prompts
LOOP_MAX_TOKENS = 256
MAX_LOOP_K = 100
MAX_LOOP_PROMPTS = 200  # keeps the reference run under half a minute on one CPU thread
LOOP_CONTEXT = 512  # tiny-zh-doc's context: the check scores at most this many tokens of prompt + text
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
        _reference_loop_rates[key] = _loop_rate([c.text for c in completions])
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


def _is_completion(x) -> bool:
    return hasattr(x, "token_ids") and hasattr(x, "finish_reason")


def _completion_hint(name: str) -> str:
    return (f"{name} 里是 Completion 对象（generate(...) 返回的是一个 Completion 列表，每个提示一个），不是文字。"
            "每个 Completion 的续写文字在 .text 里：texts = [c.text for c in completions]。")


def loop_rate(texts) -> float:
    """`decodelab.measure.repetition.loop_rate` for the exercise, with a Chinese hint when it is handed the
    `Completion` objects of `generate(...)` instead of their texts.

    >>> loop_rate(["小明在公园。小明在公园。", "小明在公园。"])
    0.5

    Taught in: exercises/03-strategies.ipynb
    """
    if isinstance(texts, Sequence) and not isinstance(texts, str) and any(_is_completion(t) for t in texts):
        fail(_completion_hint("传给 loop_rate(...) 的列表"))
    if _is_completion(texts):
        fail(_completion_hint("传给 loop_rate(...) 的列表"))
    return _loop_rate(texts)


def _as_texts(texts, num_prompts: int | None) -> list[str]:
    """The student's continuations as a list of str, or a hint."""
    if texts is None:
        fail("还没有结果：texts 还是 None。用 loop_prompts() 的提示生成续写，把续写的文字列表交给检查"
             "（检查会自己数以循环结尾的续写）。")
    if isinstance(texts, (numbers.Real, torch.Tensor)) and not isinstance(texts, bool):
        fail("检查要的是你生成的续写本身（一个字符串列表，每个提示一条），不是一个数："
             "它会从你的续写里自己数出循环率，并确认它们真是 top-k 采样写出来的。")
    if _is_completion(texts) or (isinstance(texts, Sequence) and any(_is_completion(t) for t in texts)):
        fail(_completion_hint("texts"))
    if isinstance(texts, str) or not isinstance(texts, Sequence) or not all(isinstance(t, str) for t in texts):
        fail(f"texts 应是一个字符串列表（每个提示一条续写），你给的是 {type(texts).__name__}。")
    texts = list(texts)
    if num_prompts is not None and len(texts) != num_prompts:
        fail(f"你给了 {len(texts)} 条续写，检查等的是 {num_prompts} 条（loop_prompts({num_prompts}) 的每个提示一条）。")
    if not 1 <= len(texts) <= MAX_LOOP_PROMPTS:
        fail(f"续写的条数应在 1 到 {MAX_LOOP_PROMPTS} 之间，你给了 {len(texts)} 条。")
    return texts


def _ranks(k: int, texts: list[str]) -> tuple[float, float, float, int]:
    """Shares of the continuations' tokens that are not among tiny-zh-doc's k most likely after prompt i and the
    text so far, that are not its most likely, and that are exactly its k-th most likely; and the number of
    characters outside the vocabulary."""
    model, tokenizer = _tiny_zh_doc()
    prompts = loop_prompts(len(texts))
    outside = not_first = at_k = total = unknown = 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            for prompt, text in zip(prompts, texts):
                if not text:
                    continue
                prompt_ids = tokenizer(prompt)["input_ids"]
                ids = tokenizer.convert_tokens_to_ids(list(text))
                unknown += sum(i == tokenizer.unk_token_id for i in ids)
                full = (prompt_ids + ids)[:LOOP_CONTEXT]
                logits = model(input_ids=torch.tensor([full])).logits[0, len(prompt_ids) - 1:-1]  # [n, V]
                chosen = logits.gather(-1, torch.tensor(full[len(prompt_ids):]).unsqueeze(-1))  # [n, 1]
                rank = (logits > chosen + 1e-4).sum(dim=-1)  # [n]: tokens strictly more likely than the chosen one
                outside += int((rank >= k).sum())
                not_first += int((rank >= 1).sum())
                at_k += int((rank == k - 1).sum())
                total += len(full) - len(prompt_ids)
    finally:
        torch.set_num_threads(threads)
    share = (lambda n: n / total if total else 0.0)  # noqa: E731
    return share(outside), share(not_first), share(at_k), unknown


def check_loop_rate(k: int, texts, num_prompts: int | None = None, prediction=NO_PREDICTION) -> None:
    """Check a measured loop rate from the student's own continuations: `texts[i]` is tiny-zh-doc's continuation
    of `loop_prompts(len(texts))[i]`, decoded with `SamplingParams(top_k=k, max_tokens=256)`.

    The check recomputes the loop rate from `texts` (`loop_rate`: the share that ends in a repeated phrase), confirms
    that the texts are top-k continuations of those prompts (each token among the model's k most likely there), and
    accepts a rate within max(0.1, 2 sqrt(p (1 - p) / n)) of the library's own rate p (prompt i with seed i), so any
    seeds pass. A failure names which way the student's rate is off, never the reference; a pass shows it, beside
    the student's `prediction` (the loop rate they wrote down before measuring) when one is given.

    Taught in: exercises/03-strategies.ipynb
    """
    from decodelab.book.checks import as_prediction, compare_prediction

    k = _as_top_k(k)
    guess = None if prediction is NO_PREDICTION else as_prediction(prediction, "PREDICTION", 0, 1)
    if num_prompts is not None:
        check_int(num_prompts, "num_prompts")
    texts = _as_texts(texts, num_prompts)
    num_prompts = len(texts)
    lengths = [len(t) for t in texts]
    if max(lengths) <= 16:
        fail("所有续写都不超过 16 个字：SamplingParams 里有没有 max_tokens=256？默认只有 16 个 token，续写太短，循环还来不及出现。")
    if max(lengths) > LOOP_MAX_TOKENS:
        fail(f"有一条续写长 {max(lengths)} 个字，超过了 max_tokens=256：texts 里应只有续写（completion.text），"
             "不要把提示也拼进去。")
    outside, not_first, at_k, unknown = _ranks(k, texts)
    if unknown:
        fail(f"续写里有 {unknown} 个字不在 tiny-zh-doc 的词表里：texts 应是 generate(...) 写出来的 completion.text。")
    if k > 1 and not_first <= 0.01:
        fail(f"你的续写几乎每一步都取了最可能的 token：那是 greedy（k = 1），不是 top-{k} 采样。temperature 是不是 0，"
             "top_k 是不是传成了 1，或者你自己取了 argmax？")
    if 1 < k <= 5 and at_k == 0 and outside <= 0.01:
        fail(f"你的续写里没有一个 token 是模型当时第 {k} 可能的：像是用更小的 k 采样的。"
             f"SamplingParams 里的 top_k 是不是你报告的 k = {k}？")
    if outside > 0.01:
        fail(f"你的续写里有 {outside:.0%} 的 token 不在模型当时最可能的 {k} 个里：它们不是 top-{k} 采样写出来的。逐项看看："
             "① 模型是不是 tiny-zh-doc：load_model() 默认加载的 tiny-zh 只学过单句；"
             "② top_k=k 有没有传给 SamplingParams：默认 top_k=0 表示不截断（纯采样）；"
             "③ 提示是不是 loop_prompts() 给的那些，第 i 条续写对应第 i 个提示；"
             "④ temperature 保持默认的 1。")
    rate = _loop_rate(texts)
    reference = _reference_loop_rate(k, num_prompts)
    tolerance = max(0.1, 2 * math.sqrt(reference * (1 - reference) / num_prompts))
    if abs(rate - reference) <= tolerance + 1e-9:
        passed(f"你的 {num_prompts} 条续写里，{sum(_ending_loop(t) is not None for t in texts)} 条以循环结尾，"
               f"循环率 {rate:.2f}；k = {k} 时参考循环率是 {reference:.2f}（提示 i 用 seed i，max_tokens=256），"
               f"容许范围 ±{tolerance:.2f}。换了 seed 数字会变：{num_prompts} 个提示的抽样误差约 2·√(p(1−p)/n)，"
               "检查至少容许 ±0.1。"
               + (f"\n{compare_prediction(guess, rate, '{:.2f}')}。greedy 几乎每次都循环，纯采样几乎从不："
                  "你的预测落在哪一边？想一想 top-k 在一句已经重复过的话后面，把它原样再写一遍的概率是多少。"
                  if guess is not None else ""))
        return
    direction = "偏低" if rate < reference else "偏高"
    fail(f"从你的续写数出来的循环率是 {rate:.2f}，比 k = {k} 时应有的{direction}，超出了抽样误差。"
         "续写确实是 top-k 采样写的，所以看看别的设置：max_tokens 是不是 256（太短，循环来不及出现；太长会更多）；"
         "temperature 是不是默认的 1（小于 1 分布更尖，更容易重复）；提示是不是 loop_prompts(...) 给的文档前两句。")
