"""Checks for the exercises of chapter 04 (自回归生成): the sequence log-probability from one forward pass, and the
greedy loop over a KV cache.

Taught in: chapters/04-autoregressive.ipynb, exercises/04-autoregressive.ipynb
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from decodelab.checks import CheckFailed, call_student, close, expect_tensor, fail, passed

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
             f"输入 {what} 时结果不对：应为 {reference.tolist()}，你的是 {out.tolist()}。")
    passed("序列的 log 概率正确：logits[:, :-1] 对应 input_ids[:, 1:]，在 log 空间求和，400 步也不会下溢。")


@functools.lru_cache(maxsize=1)
def _tiny_zh():
    from decodelab.models import load_model

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
    prefills the prompt once and then feeds one token per step with the cache (`decodelab.generate.model_step`).

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
                out = call_student(fn, model, input_ids, max_new_tokens, what=what)
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
        fail(f"输出形状应为 {list(expected.shape)}（提示 + {max_new_tokens} 个新 token），实际是 {list(out.shape)}。")
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
        fail("没有调用模型：请用 decodelab.generate.model_step(model, ids, cache) 做前向计算。")
    if any(n > 1 for n, _ in fed_after_prefill) or any(not has_cache for _, has_cache in fed_after_prefill):
        fail("结果对了，但没有用 KV cache：每一步都把整个序列重新送进了模型，计算量随长度平方增长。"
             "先 prefill 一次拿到 cache，之后每步只送入新 token：logits, cache = model_step(model, next_token, cache)。")
    if calls[0][0] != prompt_len:
        fail(f"第一次前向应送入整个提示（{prompt_len} 个 token），你送入了 {calls[0][0]} 个。")
    if len(calls) > max_new_tokens + 1:
        fail(f"生成 {max_new_tokens} 个 token 只需要 1 次 prefill + {max_new_tokens - 1} 次 decode，你调用了模型 {len(calls)} 次。")
    passed(f"贪心生成正确，并且用上了 KV cache：1 次 prefill（{prompt_len} 个 token），之后每步只送入 1 个 token，"
           f"共 {len(calls)} 次前向。")
