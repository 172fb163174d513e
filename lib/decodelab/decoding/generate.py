"""The autoregressive loop: prefill the prompts once, then one token per step over the model's KV cache.

Works on any transformers causal LM (it uses the model's own cache, a `DynamicCache`). Prompts of different lengths
are left-padded, with an attention mask and position ids that start at 0 on each prompt's first real token, so a
batch gives every prompt the tokens it would get alone. Each prompt has its own `SamplingParams`; a finished prompt
stays in the batch (fed its padding token, as `model.generate` does) until all are done.

    >>> from decodelab.decoding import generate
    >>> from decodelab.sampling import SamplingParams
    >>> completions = generate(model, tokenizer, ["小明", "今天"], SamplingParams(temperature=0.0, max_tokens=8))
    >>> completions[0].text, completions[0].finish_reason
    ('喜欢吃米饭。', 'stop')
    >>> completions[1].text, completions[1].finish_reason
    ('，小明在机场打篮', 'length')

Taught in: chapters/04-autoregressive.ipynb
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from decodelab.sampling.counter_rng import DEFAULT_RNG, check_rng
from decodelab.sampling.sampler import SamplingBatch, SamplingParams, make_generator, sample
from decodelab.decoding.detokenize import sample_detokenizer
from decodelab.grammar.base import mask_logits
from decodelab.decoding.request import (Completion, check_vocabulary_ids, eos_token_ids, finish_reason, output_text,
                                prompt_token_ids, text_decoder, with_bad_word_ids)
from decodelab.validation import ParamError, as_int_list, check_model


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


def model_context(model) -> int | None:
    """The model's context length (`max_position_embeddings`), or None when its config does not say."""
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return context if isinstance(context, int) and context > 0 else None


def prompt_batch(model, tokenizer, prompts) -> list[list[int]]:
    """The token ids of `prompts`: one string or token-id list, or a list of them; each checked by
    `decodelab.decoding.request.prompt_token_ids` as the engine checks its prompts (named prompts[i])."""
    if isinstance(prompts, (str, torch.Tensor)) or as_int_list(prompts):  # one prompt
        prompts = [prompts]
    if not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise ValueError(f"prompts must be a non-empty list of strings or of token-id lists, got {prompts!r}")
    vocab_size = getattr(getattr(model, "config", None), "vocab_size", None)
    return [prompt_token_ids(p, tokenizer, f"prompts[{i}]", vocab_size, model_context(model))
            for i, p in enumerate(prompts)]


def generate(model, tokenizer, prompts, params: SamplingParams | Sequence[SamplingParams],
             stream: bool = False, rng: str = DEFAULT_RNG) -> list[Completion] | Iterator[StepEvent]:
    """Generate for `prompts` (a string, a list of strings, or token-id lists) with one `SamplingParams` for all or
    one per prompt. Returns a `decodelab.decoding.request.Completion` per prompt (its `request_id` is the prompt's index), or
    with `stream=True` an iterator of `StepEvent`s, one per still-running prompt per step (in prompt order). Prompts
    are checked and samples end by the engine's rules (`decodelab.decoding.request`): at EOS (unless `ignore_eos`), a stop
    token or a stop string ("stop"; the text ends before the stop string), or after `max_tokens` tokens or when
    prompt + output fill the model's context ("length"; a longer prompt is an error). With temperature 0 the tokens equal
    `model.generate(do_sample=False)` token for token. The repetition penalty and `no_repeat_ngram_size` see the prompt
    and the generated tokens (as transformers' processors do, its padding excluded), frequency and presence penalties
    the generated tokens only (as vLLM and OpenAI define them); `Engine` applies the same rule. `rng` is the kind of
    random stream each prompt draws from, "torch" or "counter", as `Engine(rng=...)` takes it
    (`decodelab.sampling.sampler.make_generator`): with the same `rng` and seeds, `generate` and `Engine` draw the
    same tokens.

    Taught in: chapters/04-autoregressive.ipynb
    """
    check_model(model, "generate(model, tokenizer, prompts, params)")
    ids = prompt_batch(model, tokenizer, prompts)
    if isinstance(params, SamplingParams):
        params = [params] * len(ids)
    if isinstance(params, (str, bytes)) or not isinstance(params, Sequence) or len(params) != len(ids):
        raise ValueError(f"params must be a SamplingParams or one per prompt ({len(ids)}), got {params!r}")
    vocab_size = getattr(getattr(model, "config", None), "vocab_size", None)
    params = list(params)
    for i, p in enumerate(params):
        if not isinstance(p, SamplingParams):
            raise TypeError(f"params[{i}] must be a SamplingParams, got {type(p).__name__}")
        if p.prompt_logprobs is not None:
            raise ParamError("prompt_logprobs", f"params[{i}].prompt_logprobs: generate reports no log-probabilities; "
                                                f"use Engine (or the server's echo / prompt_logprobs)")
        params[i] = p = with_bad_word_ids(p, tokenizer, f"params[{i}]")
        if vocab_size is not None:
            check_vocabulary_ids(p, vocab_size, f"params[{i}]")
    if not isinstance(stream, bool):
        raise ValueError(f"stream must be a bool, got {stream!r}")
    check_rng(rng)
    events = _run(model, tokenizer, ids, params, stream_text=stream, rng=rng)
    if stream:
        return events
    tokens: list[list[int]] = [[] for _ in ids]
    reasons: list[str] = [""] * len(ids)
    for event in events:
        tokens[event.index].append(event.token_id)
        if event.finish_reason is not None:
            reasons[event.index] = event.finish_reason
    decode = text_decoder(tokenizer)
    return [Completion(i, prompt, t, output_text(t, p, decode), r)
            for i, (prompt, t, r, p) in enumerate(zip(ids, tokens, reasons, params))]


@torch.no_grad()
def _run(model, tokenizer, ids: list[list[int]], params: list[SamplingParams],
         stream_text: bool, rng: str = DEFAULT_RNG) -> Iterator[StepEvent]:
    device = next(model.parameters()).device
    eos = eos_token_ids(model, tokenizer)
    pad_id = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
    pad_id = pad_id if pad_id is not None else (getattr(model.config, "pad_token_id", None) or 0)
    batch, width = len(ids), max(len(p) for p in ids)
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in ids], device=device)  # [B, L] left-padded
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids], device=device)  # [B, L]
    positions = (mask.cumsum(-1) - 1).clamp_min(0)  # [B, L]: 0 at each prompt's first real token
    generators = [make_generator(p.seed, device, rng) for p in params]
    sampling_batch = SamplingBatch(params, device)  # the rows' parameters as tensors, once for the whole generation
    # the penalties' view of the text: the prompts, -1 where a row is padded, and the output so far (no padding)
    prompt_history = (torch.tensor([[-1] * (width - len(p)) + p for p in ids], device=device)  # [B, L]
                      if any(p.has_penalties for p in params) else None)
    output_history = torch.empty(batch, 0, dtype=torch.long, device=device)  # [B, t]
    # min_tokens and bad words of several tokens read the output too (decodelab.sampling.constraints)
    with_history = prompt_history is not None or sampling_batch.needs_output_tokens
    context = model_context(model)  # as the engine does, a sequence stops ("length") when it fills the context
    generated: list[list[int]] = [[] for _ in ids]
    # each row's text as it grows (stop strings, and what a stream may send: never text a stop string takes back)
    texts = None if tokenizer is None else [sample_detokenizer(tokenizer, p) for p in params]
    running = [True] * batch

    grammars = [None if p.grammar is None else p.grammar.start() for p in params]  # one state per row, or None

    logits, cache = model_step(model, input_ids, None, mask, positions)  # prefill
    while True:
        last = mask_logits(logits[:, -1, :], [g if running[i] else None for i, g in enumerate(grammars)])  # [B, V]
        if not with_history:
            sampled = sample(last, sampling_batch, generators, eos_token_ids=eos)  # [B]
        else:
            sampled = sample(last, sampling_batch, generators, output_history, prompt_tokens=prompt_history,
                             eos_token_ids=eos)
            output_history = torch.cat([output_history, sampled.unsqueeze(1)], dim=1)
        next_tokens = sampled.tolist()
        for i in range(batch):
            if not running[i]:
                continue
            token = next_tokens[i]
            generated[i].append(token)
            piece = None if texts is None else texts[i].push(token)
            reason = finish_reason(params[i], token, len(generated[i]), len(ids[i]) + len(generated[i]), eos, context,
                                   None if texts is None else texts[i])
            running[i] = reason is None
            if grammars[i] is not None and running[i]:
                grammars[i].advance(token)
            delta = None
            if stream_text and texts is not None:
                delta = piece if reason is None else piece + texts[i].finish()
            yield StepEvent(i, token, delta, reason)
        if not any(running):
            return
        fed = [next_tokens[i] if running[i] else pad_id for i in range(batch)]
        mask = torch.cat([mask, torch.ones(batch, 1, dtype=mask.dtype, device=device)], dim=1)  # [B, L + t]
        positions = positions[:, -1:] + 1  # [B, 1]
        logits, cache = model_step(model, torch.tensor(fed, device=device).unsqueeze(1), cache, mask, positions)
