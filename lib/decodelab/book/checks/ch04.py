"""Checks for the exercises of chapter 04 (自回归生成): the sequence log-probability from one forward pass, the
greedy loop over a KV cache, and the error rate after a forced wrong token at a temperature the student picks.

Taught in: chapters/04-autoregressive.ipynb, exercises/04-autoregressive.ipynb
"""
from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Sequence

import numpy as np
import torch

from decodelab.book.checks import MODEL_TIME_LIMIT_S, NO_PREDICTION, CheckFailed, call_student, close, expect_tensor, fail, passed

# the library's own loops: they raise while the student's greedy_generate runs
GREEDY_FORBIDDEN = ("decodelab.decoding.generate.generate", "decodelab.decoding.beam.beam_search")

_GEN = torch.Generator().manual_seed(4)
_SHORT_LOGITS = torch.randn(2, 6, 10, generator=_GEN) * 2.0  # [B=2, L=6, V=10]
_SHORT_IDS = torch.randint(0, 10, (2, 6), generator=_GEN)  # [B, L]
_LONG_LOGITS = torch.randn(1, 400, 50, generator=_GEN)  # [1, 400, 50]: the product of 399 probabilities underflows
_LONG_IDS = torch.randint(0, 50, (1, 400), generator=_GEN)


def _gather_sum(scores: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return scores.gather(-1, ids.unsqueeze(-1)).squeeze(-1).sum(-1)  # [B, T, V] x [B, T] -> [B]


def _sequence_mistake(out: torch.Tensor, logits: torch.Tensor, ids: torch.Tensor) -> str | None:
    log_probs = torch.log_softmax(logits, dim=-1)  # [B, L, V]
    reference = _gather_sum(log_probs[:, :-1], ids[:, 1:])
    if close(out, _gather_sum(log_probs, ids)) or close(out, _gather_sum(log_probs[:, 1:], ids[:, 1:])):
        return ("错位了：位置 t 的 logits 预测的是下一个 token，即第 t+1 个。"
                "要用 logits[:, :-1] 去给 input_ids[:, 1:] 打分（第一个 token <s> 没有谁预测它，最后一个位置的 logits 没有要打分的 token）。")
    if close(out, reference / (ids.shape[1] - 1)):
        return "你求的是平均每个 token 的 log 概率；整个序列的 log 概率是各步 log 概率之和（乘积取 log）。不要除以长度。"
    if close(out, _gather_sum(logits[:, :-1], ids[:, 1:])):
        return "你直接把 logits 加起来了。logits 不是 log 概率：先沿最后一维做 log_softmax（减去 logsumexp），再取每一步真实 token 的那一项。"
    if close(out, _gather_sum(torch.log_softmax(logits, dim=1)[:, :-1], ids[:, 1:])):
        return "log_softmax 的维度不对：要沿词表维（dim=-1）归一化，不是沿序列维（dim=1）。"
    if close(out, -reference):
        return "符号反了：log 概率 ≤ 0；你返回的是负对数似然（NLL）。"
    return None


def check_sequence_log_prob(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """Check `fn(logits [B, L, V], input_ids [B, L]) -> [B]`: log P(input_ids[:, 1:] | input_ids[:, 0])."""
    for logits, ids, what in ((_SHORT_LOGITS, _SHORT_IDS, "logits [2, 6, 10] 和 input_ids [2, 6]"),
                              (_LONG_LOGITS, _LONG_IDS, "长度 400 的序列（logits [1, 400, 50]）")):
        batch = ids.shape[0]
        out = expect_tensor(call_student(fn, logits, ids, what=what), (batch,), what)
        reference = _gather_sum(torch.log_softmax(logits, dim=-1)[:, :-1], ids[:, 1:])
        if close(out, reference, atol=1e-3):
            continue
        if bool(torch.isinf(out).any()) or bool(torch.isnan(out).any()):
            fail(f"输入 {what} 时得到了 -inf 或 nan：399 个约 1/50 的概率连乘是 10^-680，连 float64 也会下溢成 0，"
                 "log(0) = -inf。在 log 空间里求和：log P = Σ log_softmax(logits)[token]，不要先把概率乘起来。")
        hint = _sequence_mistake(out, logits, ids)
        fail(f"输入 {what} 时：{hint}" if hint else
             f"输入 {what} 时结果不对，你的是 {[round(v, 4) for v in out.tolist()]}。"
             "log P = Σ_t log_softmax(logits[:, t])[input_ids[:, t + 1]]，t 从 0 到 L − 2。")
    passed("序列的 log 概率正确：logits[:, :-1] 对应 input_ids[:, 1:]，在 log 空间求和，400 步也不会下溢。")


@functools.lru_cache(maxsize=1)
def _tiny_zh():
    from decodelab.models.load import load_model

    return load_model("tiny-zh", device="cpu")


@torch.no_grad()
def _greedy_without_cache(model, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    ids = input_ids
    for _ in range(max_new_tokens):
        next_token = model(input_ids=ids).logits[:, -1, :].argmax(dim=-1, keepdim=True)  # [B, 1]
        ids = torch.cat([ids, next_token], dim=1)
    return ids


def check_greedy_with_cache(fn: Callable, model=None, input_ids: torch.Tensor | None = None,
                            max_new_tokens: int = 12) -> None:
    """Check `fn(model, input_ids [B, T], max_new_tokens) -> ids [B, T + max_new_tokens]`: greedy decoding that
    prefills the prompt once and then feeds one token per step with the cache (`decodelab.decoding.generate.model_step`).

    Without `model`, the shipped tiny-zh model is used with two prompts of equal length.
    """
    if model is None:
        model, tokenizer = _tiny_zh()
        input_ids = torch.tensor(tokenizer(["小明在", "今天，"])["input_ids"])  # [2, 4], equal lengths: no padding
    elif input_ids is None:
        raise ValueError("input_ids must be given with a model of your own, got None")
    batch, prompt_len = input_ids.shape
    expected = _greedy_without_cache(model, input_ids, max_new_tokens)  # [B, T + N]
    calls: list[tuple[int, bool]] = []  # (tokens fed, a cache was passed) per forward call

    def record(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        calls.append((int(ids.shape[1]) if ids is not None else -1, cache is not None))

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        what = f"{batch} 个长度为 {prompt_len} 的提示，max_new_tokens={max_new_tokens}"
        try:
            with torch.no_grad():
                out = call_student(fn, model, input_ids, max_new_tokens, what=what, time_limit=MODEL_TIME_LIMIT_S,
                                   forbidden=GREEDY_FORBIDDEN)
        except CheckFailed as error:
            if "same number of dimensions" in str(error) or "Expected 2D" in str(error):
                fail(f"{error}\n提示：argmax(dim=-1) 的结果形状是 [B]；用 argmax(dim=-1, keepdim=True) 得到 [B, 1]，"
                     "才能和 [B, T] 的序列拼接，也才能作为下一步的 input_ids 送进模型。")
            raise
    finally:
        handle.remove()
    if not isinstance(out, torch.Tensor):
        fail(f"应返回 torch.Tensor（token id），实际返回了 {type(out).__name__}。")
    if tuple(out.shape) == (batch, max_new_tokens):
        fail(f"你只返回了新生成的 {max_new_tokens} 个 token：请返回整个序列 torch.cat([input_ids, new_tokens], dim=1)，"
             f"形状 [{batch}, {prompt_len + max_new_tokens}]。")
    if tuple(out.shape) != tuple(expected.shape):
        fail(f"输出形状应为 [{batch}, {prompt_len} + {max_new_tokens}]（提示 + {max_new_tokens} 个新 token），"
             f"实际是 {list(out.shape)}。")
    if out.is_floating_point():
        fail(f"输出应是整数 token id（dtype torch.long），实际 dtype 是 {out.dtype}。")
    if not torch.equal(out[:, :prompt_len], input_ids):
        fail("输出的前几列应是原来的提示 input_ids，然后才是新 token。")
    fed_after_prefill = calls[1:]
    if fed_after_prefill and any(n > 1 and has_cache for n, has_cache in fed_after_prefill):
        fail("有了 KV cache 之后，每一步只送入刚选出的那一个 token（形状 [B, 1]）："
             "前面的 token 已经在 cache 里了，再送一遍它们会被重复写进 cache，位置也错了。")
    if not torch.equal(out, expected):
        if not torch.equal(out[:, prompt_len], expected[:, prompt_len]):
            fail("第一个新 token 就不对：预填充（prefill）要送入整个提示，并取最后一个位置的 logits[:, -1, :] 的 argmax。")
        fail("第一个新 token 对了，后面的不对：每一步把刚选出的 token 送进模型，并把 model_step 返回的新 cache 传给下一步。")
    if not calls:
        fail("没有调用模型：请用 decodelab.decoding.generate.model_step(model, ids, cache) 做前向计算。")
    if any(n > 1 for n, _ in fed_after_prefill) or any(not has_cache for _, has_cache in fed_after_prefill):
        fail("结果对了，但没有用 KV cache：每一步都把整个序列重新送进了模型，计算量随长度平方增长。"
             "先 prefill 一次拿到 cache，之后每步只送入新 token：logits, cache = model_step(model, next_token, cache)。")
    if calls[0][0] != prompt_len:
        fail(f"第一次前向应送入整个提示（{prompt_len} 个 token），你送入了 {calls[0][0]} 个。")
    if len(calls) > max_new_tokens + 1:
        fail(f"生成 {max_new_tokens} 个 token 只需要 1 次 prefill + {max_new_tokens - 1} 次 decode，你调用了模型 {len(calls)} 次。")
    passed(f"贪心生成正确，并且用上了 KV cache：1 次 prefill（{prompt_len} 个 token），之后每步只送入 1 个 token，"
           f"共 {len(calls)} 次前向。")


# ---- exercise 4.3: the error rate after a forced wrong token, measured at a temperature of the student's choice ----

SNOWBALL_DOCUMENTS = 100  # the exercise's sample: forced_inputs(..., n=100, seed=DOCUMENT_SEED)
SNOWBALL_TOKENS = 50  # continue_and_judge(..., max_tokens=50, seed=0)
_MIN_TOLERANCE = 0.002  # the accepted range is the library's measurement ± max(0.002, 3 bootstrap standard errors)


@functools.lru_cache(maxsize=1)
def _tiny_zh_doc():
    from decodelab.models.load import load_model

    return load_model("tiny-zh-doc", device="cpu")


@functools.lru_cache(maxsize=1)
def _snowball_inputs():
    from decodelab.measure.forced_token import DOCUMENT_SEED, forced_inputs
    from decodelab.toy.documents import DocumentLanguage

    model, tokenizer = _tiny_zh_doc()
    return forced_inputs(model, tokenizer, DocumentLanguage(), SNOWBALL_DOCUMENTS, DOCUMENT_SEED)


@functools.lru_cache(maxsize=8)
def _snowball_reference(temperature: float) -> dict[str, dict[str, np.ndarray]]:
    """The library's own run of the exercise at `temperature`: per condition and per document, the counts of
    "error", "ok" and "skip" verdicts."""
    from decodelab.measure.forced_token import continue_and_judge
    from decodelab.toy.sentences import ToyLanguage

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is fastest and does not fight other jobs for the cores
    try:
        model, tokenizer = _tiny_zh_doc()
        inputs = _snowball_inputs()
        out = {}
        for name, forced in (("clean", None), ("wrong", inputs.wrong)):
            judged = continue_and_judge(model, tokenizer, ToyLanguage(), inputs.prefixes, forced, temperature,
                                        SNOWBALL_TOKENS, seed=0)
            out[name] = {verdict: np.array([j.statuses.count(verdict) for j in judged], dtype=float)
                         for verdict in ("error", "ok", "skip")}
    finally:
        torch.set_num_threads(threads)
    return out


def _rate_and_error(counts: dict[str, np.ndarray]) -> tuple[float, float]:
    """Errors per judged character, and its bootstrap standard error over documents (1,000 resamples, seed 0)."""
    errors, judged = counts["error"], counts["error"] + counts["ok"]
    resample = np.random.default_rng(0).integers(0, len(errors), size=(1000, len(errors)))  # [1000, N]
    return float(errors.sum() / judged.sum()), float((errors[resample].sum(1) / judged[resample].sum(1)).std())


def _snowball_mistake(value: float, counts: dict[str, np.ndarray]) -> str | None:
    """The hint for a value computed from the library's own verdicts with a known mistake (same seeds), else None."""
    errors, ok, skip = counts["error"].sum(), counts["ok"].sum(), counts["skip"].sum()
    same = lambda x: math.isclose(value, x, rel_tol=1e-9, abs_tol=1e-12)  # noqa: E731
    if same(errors / (errors + ok)):
        return None
    if same(100 * errors / (errors + ok)):
        return "像是百分数：请给比例（0 到 1 之间），例如 0.02 而不是 2。"
    if same(errors / (errors + ok + skip)):
        return ("你把 \"skip\" 的位置也算进了分母。skip 的字没法判断对错（它们在一个已经出错的句子里），"
                "既不算对也不算错：分母只数 \"ok\" 和 \"error\"。")
    if same((errors + skip) / (errors + ok + skip)):
        return "你把 \"skip\" 当成了错误。skip 是没法判断的字，不算错；只数 \"error\"，分母只数 \"ok\" 和 \"error\"。"
    if same(float((counts["error"] > 0).mean())):
        return ("你算的是“有错的续写占多少”（每段续写一个数）。题目要的是每个被判断的字出错的比例："
                "把所有续写的 \"error\" 加起来，除以所有续写的 \"ok\" 与 \"error\" 之和。")
    if same(float((counts["error"] / np.maximum(counts["error"] + counts["ok"], 1)).mean())):
        return ("你先算了每段续写自己的错误率，再取平均：短的续写和长的续写权重一样了。"
                "把所有续写的 \"error\" 加起来，再除以所有续写的 \"ok\" 与 \"error\" 之和。")
    return None


def _counts_of(judged) -> dict[str, np.ndarray]:
    return {verdict: np.array([j.statuses.count(verdict) for j in judged], dtype=float)
            for verdict in ("error", "ok", "skip")}


def _as_judged(value, name: str) -> list:
    """The student's per-document records of one condition, or a hint."""
    from decodelab.measure.forced_token import Judged

    if value is None:
        fail("还没有量：把 clean_judged 和 wrong_judged 换成 continue_and_judge(...) 返回的列表"
             "（每篇文档一个 Judged），检查会从里面自己数错误率。")
    if isinstance(value, (numbers.Real, np.floating)) and not isinstance(value, bool):
        fail(f"{name} 应是 continue_and_judge(...) 返回的列表（每篇文档一个 Judged），不是一个数："
             "检查要你的原始记录，从里面自己数错误率。")
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or \
            not all(isinstance(j, Judged) for j in value):
        fail(f"{name} 应是 continue_and_judge(...) 返回的 Judged 列表，你给的是 {type(value).__name__}。")
    if len(value) != SNOWBALL_DOCUMENTS:
        fail(f"{name} 里有 {len(value)} 篇文档的记录，应是 {SNOWBALL_DOCUMENTS} 篇："
             f"forced_inputs(..., n={SNOWBALL_DOCUMENTS}, seed=DOCUMENT_SEED) 的全部前缀。")
    return list(value)


def _pooled(counts: dict[str, np.ndarray]) -> float:
    judged = counts["error"].sum() + counts["ok"].sum()
    return float(counts["error"].sum() / judged) if judged else float("nan")


def check_later_error_rate(temperature: float, clean_judged, wrong_judged,
                           later_error_rate: Callable | None = None, prediction=NO_PREDICTION) -> None:
    """Check the student's measurement after the forced position at `temperature`: `clean_judged` (nothing forced)
    and `wrong_judged` (the forced wrong character) are the lists `continue_and_judge(..., max_tokens=50, seed=...)`
    returned for the 100 exercise documents. The check recomputes each error rate (errors / judged characters,
    pooled) from the records, and, given the student's `later_error_rate`, runs it on them too. Accepted: the
    library's own measurement ± max(0.002, three bootstrap standard errors), so another seed passes too. A failure
    may say which way a rate is off (it is computed from the student's records), never the reference. A pass
    sets the measured gap (wrong − clean, percentage points) beside the student's `prediction` of it.
    """
    from decodelab.book.checks import as_prediction, compare_prediction
    from decodelab.sampling.sampler import SamplingParams

    guess = None if prediction is NO_PREDICTION else as_prediction(prediction, "PREDICTION", -100, 100)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 3:
        fail(f"TEMPERATURE 应是 0（greedy）到 3 之间的一个数，你给的是 {temperature!r}。")
    try:
        SamplingParams(temperature=temperature)
    except ValueError as error:
        fail(f"TEMPERATURE = {temperature!r} 不能用来采样：{error}")
    records = {"clean_judged": _as_judged(clean_judged, "clean_judged"),
               "wrong_judged": _as_judged(wrong_judged, "wrong_judged")}
    inputs = _snowball_inputs()
    clean, wrong = records["clean_judged"], records["wrong_judged"]
    if clean is wrong or [j.tail for j in clean] == [j.tail for j in wrong]:
        fail("clean_judged 和 wrong_judged 是同一份续写：对照要用 forced=None（什么也不强制），"
             "错字要用 forced=inputs.wrong，分别调用 continue_and_judge。")
    if [j.tail[:1] for j in wrong] != [(w,) for w in inputs.wrong]:
        if [j.tail[:1] for j in clean] == [(w,) for w in inputs.wrong]:
            fail("两组记录放反了：clean_judged 里强制了错字，wrong_judged 里没有。检查调用的参数顺序是 (TEMPERATURE, 对照, 错字)。")
        fail("wrong_judged 里强制的字不是 inputs.wrong：续写要从 inputs.prefixes 接着写，forced=inputs.wrong，"
             "两者都来自 forced_inputs(..., n=100, seed=DOCUMENT_SEED)。")
    counts = {name: _counts_of(value) for name, value in records.items()}
    if later_error_rate is not None:
        for name, value in records.items():
            mine = call_student(later_error_rate, value, what=f"你的 {name}")
            if isinstance(mine, bool) or not isinstance(mine, (int, float, np.floating)) or math.isnan(mine):
                fail(f"later_error_rate({name}) 应返回一个数（错误的比例），你的函数返回了 {mine!r}。")
            hint = _snowball_mistake(float(mine), counts[name])
            if hint:
                fail(f"later_error_rate({name}) = {float(mine):g}：{hint}")
            if not math.isclose(float(mine), _pooled(counts[name]), rel_tol=1e-9, abs_tol=1e-12):
                fail(f"later_error_rate({name}) = {float(mine):g}，可从同一份记录数出来的比例不是这个数。"
                     "比例 = 所有文档的 \"error\" 之和 / 所有文档的 \"ok\" 与 \"error\" 之和（\"skip\" 不算）。")
    reference = _snowball_reference(float(temperature))
    expected = {}
    for (name, condition) in (("clean_judged", "clean"), ("wrong_judged", "wrong")):
        value = _pooled(counts[name])
        rate, error = _rate_and_error(reference[condition])
        tolerance = max(_MIN_TOLERANCE, 3 * error)
        expected[name] = (rate, tolerance)
        if abs(value - rate) <= tolerance:
            continue
        if temperature != 1 and abs(value - _rate_and_error(_snowball_reference(1.0)[condition])[0]) <= tolerance / 3:
            fail(f"从你的 {name} 数出的错误率 {value:.4f} 正好像 T = 1 时的结果：TEMPERATURE 传进 continue_and_judge 了吗？")
        direction = "偏低" if value < rate else "偏高"
        fail(f"从你的 {name} 数出的错误率是 {value:.4f}，比 T = {temperature:g} 时应有的{direction}，超出了抽样误差。"
             f"检查：temperature 是不是 {temperature:g}；续写 max_tokens={SNOWBALL_TOKENS}；"
             f"前缀和错字来自 forced_inputs(..., n={SNOWBALL_DOCUMENTS}, seed=DOCUMENT_SEED)。")
    clean_rate, wrong_rate = _pooled(counts["clean_judged"]), _pooled(counts["wrong_judged"])
    resample = np.random.default_rng(1).integers(0, SNOWBALL_DOCUMENTS, size=(1000, SNOWBALL_DOCUMENTS))
    rate = lambda c: c["error"][resample].sum(1) / (c["error"] + c["ok"])[resample].sum(1)  # noqa: E731
    low, high = 100 * np.quantile(rate(reference["wrong"]) - rate(reference["clean"]), [0.025, 0.975])
    verdict = ("区间包含 0：在这个 temperature 下，看不出错字让之后的错误变多" if low <= 0 <= high else
               "区间在 0 以上：错字之后的错误更多了" if low > 0 else "区间在 0 以下：错字之后的错误反而更少")
    (clean_ref, clean_tol), (wrong_ref, wrong_tol) = expected["clean_judged"], expected["wrong_judged"]
    passed(f"T = {temperature:g}：从你的记录数出对照 {clean_rate:.2%}、错字之后 {wrong_rate:.2%}，在库的测量范围内"
           f"（{clean_ref:.2%} ± {100 * clean_tol:.2f} 和 {wrong_ref:.2%} ± {100 * wrong_tol:.2f} 个百分点）。"
           f"库的 100 篇文档上，错字 − 对照的 95% 区间是 [{low:+.2f}, {high:+.2f}] 个百分点；{verdict}。"
           + (f"\n差（错字 − 对照，百分点）：{compare_prediction(guess, 100 * (wrong_rate - clean_rate), '{:+.2f}')}。"
              "预测和结果差得多，说明你心里的“滚雪球”比模型真实的行为强：这个模型的句子语法在句末重新开始，"
              "一个错字之后，它下一句照样按自己学到的分布写。" if guess is not None else ""))
