"""The autoregressive loop: prefill the prompts once, then one token per step over the model's KV cache.

Works on any transformers causal LM (it uses the model's own cache, a `DynamicCache`). Prompts of different lengths
are left-padded, with an attention mask and position ids that start at 0 on each prompt's first real token, so a
batch gives every prompt the tokens it would get alone. Each prompt has its own `SamplingParams`; a finished prompt
stays in the batch (fed its padding token, as `model.generate` does) until all are done.

    >>> completions = generate(model, tokenizer, ["小明", "今天"], SamplingParams(temperature=0.0, max_tokens=8))
    >>> completions[0].text, completions[0].finish_reason

Taught in: chapters/04-autoregressive.ipynb
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from decodelab.sampling import SamplingParams, make_generator, sample
from decodelab.tokenizer import encode_prompt


@dataclass(frozen=True)
class Completion:
    """One prompt's result: the generated token ids (EOS or the stop token included when it ended on one), their
    text (special tokens skipped; None without a tokenizer), and why it ended: "stop" or "length"."""

    token_ids: list[int]
    text: str | None
    finish_reason: str


@dataclass(frozen=True)
class StepEvent:
    """What `generate(..., stream=True)` yields: prompt `index` got `token_id`; `text` is the new text it adds
    (None without a tokenizer); `finish_reason` is None while the prompt goes on, else "stop" or "length"."""

    index: int
    token_id: int
    text: str | None
    finish_reason: str | None


def model_step(model, input_ids: torch.Tensor, cache=None, attention_mask: torch.Tensor | None = None,
               position_ids: torch.Tensor | None = None):
    """One forward pass of a transformers causal LM over its cache: returns (logits `[B, T, V]`, cache).

    transformers 5.24 names the cache argument `cache`; earlier 5.x releases call it `past_key_values`.
    """
    name = _cache_argument(type(model).forward)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True,
                **{name: cache})
    new_cache = getattr(out, "cache", None)
    return out.logits, new_cache if new_cache is not None else out.past_key_values


@functools.lru_cache(maxsize=None)
def _cache_argument(forward) -> str:
    """The name a model class's `forward` gives its cache argument, looked up once per class."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def _eos_ids(model, tokenizer) -> set[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return set()
    return {int(eos)} if isinstance(eos, int) else {int(t) for t in eos}


def model_context(model) -> int | None:
    """The model's context length (`max_position_embeddings`), or None when its config does not say."""
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return context if isinstance(context, int) and context > 0 else None


def check_prompt_fits(prompt_len: int, context: int | None, name: str) -> None:
    """A prompt longer than the model's context is refused, with the engine's wording."""
    if context is not None and prompt_len > context:
        raise ValueError(f"{name} has {prompt_len} tokens, longer than the model's context of {context}")


def _prompt_ids(tokenizer, prompts) -> list[list[int]]:
    if isinstance(prompts, str) or (isinstance(prompts, Sequence) and prompts and isinstance(prompts[0], int)):
        prompts = [prompts]
    if not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise ValueError(f"prompts must be a non-empty list of strings or of token-id lists, got {prompts!r}")
    ids = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if tokenizer is None:
                raise ValueError(f"prompts[{i}] is text, which needs a tokenizer; got tokenizer=None")
            ids.append(encode_prompt(tokenizer, prompt, f"prompts[{i}]"))
        elif isinstance(prompt, Sequence) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                   for t in prompt):
            ids.append(list(prompt))
        else:
            raise ValueError(f"prompts[{i}] must be a string or a list of token ids >= 0, got {prompt!r}")
        if not ids[-1]:
            raise ValueError(f"prompts[{i}] is empty; every prompt needs at least one token")
    return ids


def generate(model, tokenizer, prompts, params: SamplingParams | Sequence[SamplingParams],
             stream: bool = False) -> list[Completion] | Iterator[StepEvent]:
    """Generate for `prompts` (a string, a list of strings, or token-id lists) with one `SamplingParams` for all or
    one per prompt. Returns a `Completion` per prompt, or with `stream=True` an iterator of `StepEvent`s, one per
    still-running prompt per step (in prompt order). Each prompt stops at EOS (unless `ignore_eos`), at one of its
    `stop_token_ids` ("stop"), or after `max_tokens` tokens or when prompt + output fill the model's context
    ("length"; a longer prompt is an error), as `Engine` does. With temperature 0 the tokens equal
    `model.generate(do_sample=False)` token for token. The repetition penalty and `no_repeat_ngram_size` see the prompt
    and the generated tokens (as transformers' processors do, its padding excluded), frequency and presence penalties
    the generated tokens only (as vLLM and OpenAI define them); `Engine` applies the same rule.

    Taught in: chapters/04-autoregressive.ipynb
    """
    ids = _prompt_ids(tokenizer, prompts)
    for i, prompt in enumerate(ids):
        check_prompt_fits(len(prompt), model_context(model), f"prompts[{i}]")
    if isinstance(params, SamplingParams):
        params = [params] * len(ids)
    if isinstance(params, (str, bytes)) or not isinstance(params, Sequence) or len(params) != len(ids):
        raise ValueError(f"params must be a SamplingParams or one per prompt ({len(ids)}), got {params!r}")
    for i, p in enumerate(params):
        if not isinstance(p, SamplingParams):
            raise TypeError(f"params[{i}] must be a SamplingParams, got {type(p).__name__}")
    if not isinstance(stream, bool):
        raise ValueError(f"stream must be a bool, got {stream!r}")
    events = _run(model, tokenizer, ids, list(params), stream_text=stream)
    if stream:
        return events
    tokens: list[list[int]] = [[] for _ in ids]
    reasons: list[str] = [""] * len(ids)
    for event in events:
        tokens[event.index].append(event.token_id)
        if event.finish_reason is not None:
            reasons[event.index] = event.finish_reason
    return [Completion(t, None if tokenizer is None else tokenizer.decode(t, skip_special_tokens=True), r)
            for t, r in zip(tokens, reasons)]


@torch.no_grad()
def _run(model, tokenizer, ids: list[list[int]], params: list[SamplingParams],
         stream_text: bool) -> Iterator[StepEvent]:
    device = next(model.parameters()).device
    eos = _eos_ids(model, tokenizer)
    pad_id = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
    pad_id = pad_id if pad_id is not None else (getattr(model.config, "pad_token_id", None) or 0)
    batch, width = len(ids), max(len(p) for p in ids)
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in ids], device=device)  # [B, L] left-padded
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids], device=device)  # [B, L]
    positions = (mask.cumsum(-1) - 1).clamp_min(0)  # [B, L]: 0 at each prompt's first real token
    generators = [make_generator(p.seed, device) for p in params]
    # the penalties' view of the text: the prompts, -1 where a row is padded, and the output so far (no padding)
    prompt_history = (torch.tensor([[-1] * (width - len(p)) + p for p in ids], device=device)  # [B, L]
                      if any(p.has_penalties for p in params) else None)
    output_history = torch.empty(batch, 0, dtype=torch.long, device=device)  # [B, t]
    context = model_context(model)  # as the engine does, a sequence stops ("length") when it fills the context
    generated: list[list[int]] = [[] for _ in ids]
    texts = [""] * batch
    running = [True] * batch

    logits, cache = model_step(model, input_ids, None, mask, positions)  # prefill
    while True:
        if prompt_history is None:
            sampled = sample(logits[:, -1, :], params, generators)  # [B]
        else:
            sampled = sample(logits[:, -1, :], params, generators, output_history, prompt_tokens=prompt_history)
            output_history = torch.cat([output_history, sampled.unsqueeze(1)], dim=1)
        next_tokens = sampled.tolist()
        for i in range(batch):
            if not running[i]:
                continue
            token = next_tokens[i]
            generated[i].append(token)
            reason = None
            if (token in eos and not params[i].ignore_eos) or token in params[i].stop_token_ids:
                reason = "stop"
            elif len(generated[i]) >= params[i].max_tokens or (
                    context is not None and len(ids[i]) + len(generated[i]) >= context):
                reason = "length"
            running[i] = reason is None
            delta = None
            if stream_text and tokenizer is not None:  # decode the whole text: a token alone may not be printable
                text = tokenizer.decode(generated[i], skip_special_tokens=True)
                delta, texts[i] = text[len(texts[i]):], text
            yield StepEvent(i, token, delta, reason)
        if not any(running):
            return
        fed = [next_tokens[i] if running[i] else pad_id for i in range(batch)]
        mask = torch.cat([mask, torch.ones(batch, 1, dtype=mask.dtype, device=device)], dim=1)  # [B, L + t]
        positions = positions[:, -1:] + 1  # [B, 1]
        logits, cache = model_step(model, torch.tensor(fed, device=device).unsqueeze(1), cache, mask, positions)
