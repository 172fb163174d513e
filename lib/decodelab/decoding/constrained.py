"""Constrained decoding: every step, the tokens a grammar rules out get logit -inf before the sampler runs.

`constrained_generate` is the autoregressive loop of `decodelab.decoding.generate` with one change: before
`decodelab.sampling.sampler.sample` draws the next token (with the request's own `SamplingParams`), the logits of the tokens the
grammar's mask rules out (`decodelab.grammar.backends`) are set to -inf. The output is valid by construction, but it
does not follow the model's distribution conditioned on validity: the mask renormalises each step locally,

    q(x) = prod_t p(x_t | x_<t) / m_t(x_<t),   m_t = the probability the step's mask keeps (at any temperature),

while the conditional is p(x | valid) = p(x) 1[valid] / P(valid). So q / p(. | valid) = P(valid) / prod_t m_t: a
sequence whose steps lost much probability to the mask (the model wanted to go elsewhere and was forced) is drawn more
often than the conditional would. Each completion carries its exact log q(x) and log p(x) (p: the same sampler without
the mask), which is what `kl_importance` and `kl_exact` (in `decodelab.measure.constrained`) need.

    >>> from decodelab.decoding import constrained_generate
    >>> from decodelab.grammar import LLGuidanceGrammar
    >>> from decodelab.sampling import SamplingParams
    >>> grammar = LLGuidanceGrammar.regex("[^。！？]{0,15}北京[^。！？]{0,15}[。！？]", tokenizer)
    >>> out = constrained_generate(model, tokenizer, "", SamplingParams(seed=0, n=4, max_tokens=40), grammar)
    >>> [c.finish_reason for c in out]
    ['stop', 'stop', 'stop', 'stop']
    >>> all("北京" in c.text and c.text[-1] in "。！？" for c in out)   # every one names 北京 and ends with 。！ or ？
    True

Taught in: chapters/07d-constrained-decoding.ipynb
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from decodelab.grammar.backends import LLGuidanceGrammar, ToyLanguageGrammar
from decodelab.grammar.base import Grammar, check_token_ids
from decodelab.decoding.generate import model_context, model_step
from decodelab.decoding.request import check_prompt_fits
from decodelab.sampling.counter_rng import DEFAULT_RNG, check_rng
from decodelab.sampling.sampler import SamplingParams, make_generator, process_logits, sample, sample_seed
from decodelab.models.tokenizer import encode_prompt
from decodelab.validation import ParamError, as_int_list, check_model

__all__ = ["ConstrainedCompletion", "Grammar", "LLGuidanceGrammar", "ToyLanguageGrammar", "constrained_generate",
           "score_sequences"]


@dataclass(frozen=True)
class ConstrainedCompletion:
    """One sample: its token ids (EOS included when it ended on it), text, finish reason ("stop" at EOS, "length" at
    `max_tokens` or the model's context: then the text is not complete), log q (nats, under the masked sampler, what
    it was drawn from), log p (under the same sampler without the mask; -inf where that one could not have drawn it,
    e.g. greedy) and, per step, how many tokens the mask allowed and the probability p gave them (m_t)."""

    token_ids: list[int]
    text: str
    finish_reason: str
    log_q: float
    log_p: float
    allowed: tuple[int, ...]
    kept_mass: tuple[float, ...]


def _check_request(model, tokenizer, prompt, params, grammar, call: str) -> list[int]:
    """The prompt's ids, after every argument is checked; `call` is how the caller is called, for a swapped model."""
    vocab = check_model(model, call)
    if not isinstance(params, SamplingParams):
        raise ParamError("params", f"params must be a SamplingParams, got {type(params).__name__}")
    if params.ignore_eos or params.stop_token_ids or params.stop:
        raise ParamError("params", "with a grammar the grammar decides where the text ends: ignore_eos, "
                                   f"stop_token_ids and stop must be off, got {params!r}")
    if not isinstance(grammar, Grammar):
        raise ParamError("grammar", f"grammar must be a Grammar (ToyLanguageGrammar, LLGuidanceGrammar), got "
                                    f"{type(grammar).__name__}")
    if grammar.vocab_size != vocab:
        raise ParamError("grammar", f"the grammar's masks cover {grammar.vocab_size} tokens, the model's logits "
                                    f"{vocab}; build the grammar with vocab_size={vocab}")
    if getattr(tokenizer, "eos_token_id", None) != grammar.eos_token_id:
        raise ParamError("grammar", f"the grammar's EOS ({grammar.eos_token_id}) is not the tokenizer's "
                                    f"({getattr(tokenizer, 'eos_token_id', None)})")
    ids = encode_prompt(tokenizer, prompt) if isinstance(prompt, str) else as_int_list(prompt)
    if not ids or not all(0 <= t < vocab for t in ids):
        raise ParamError("prompt", f"prompt must be a str or a non-empty list of token ids in [0, {vocab}), "
                                   f"got {prompt!r}")
    check_prompt_fits(len(ids), model_context(model), "prompt")
    return ids


def _masked(logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """logits `[B, V]` with -inf where `masks` `[B, V]` is False."""
    return logits.masked_fill(~masks, float("-inf"))


def _seen(params: SamplingParams, prompts: list[list[int]], outputs: list[list[int]]) -> dict:
    """What the penalties see (`output_tokens`, `prompt_tokens` of `sample`), or nothing when none is on."""
    return {"output_tokens": outputs, "prompt_tokens": prompts} if params.has_penalties else {}


def _log_probs(logits: torch.Tensor, params: SamplingParams, seen: dict) -> torch.Tensor:
    """log of the distribution `sample` draws from, `[B, V]` float64 (-inf for removed tokens)."""
    return torch.log_softmax(process_logits(logits.double(), params, **seen), dim=-1)


def _dead_end(tokenizer, generated: list[int], row: int) -> ParamError:
    text = tokenizer.decode(generated, skip_special_tokens=True)
    return ParamError("grammar", f"the grammar allows no token after {text!r} (sample {row}, step {len(generated)}): "
                                 "it cannot be completed with this tokenizer's vocabulary (for example a JSON "
                                 "grammar, which needs ASCII braces and quotes that the course's vocabulary lacks)")


@torch.no_grad()
def constrained_generate(model, tokenizer, prompt: str | list[int], params: SamplingParams,
                         grammar: Grammar, rng: str = DEFAULT_RNG) -> list[ConstrainedCompletion]:
    """`params.n` samples for `prompt` (a string or token ids), each step masked by `grammar` (which sees the
    generated tokens only) and drawn by `decodelab.sampling.sampler.sample` with `params`; sample i draws from a
    stream of kind `rng` ("torch" or "counter", as `generate` takes it) seeded with `sample_seed(params.seed, i)`.
    The n samples share one batch and one prefill. Ends at EOS (the grammar allows it only where the text is complete),
    at `max_tokens`, or when the model's context is full. A step where the grammar allows nothing raises ParamError
    (never a silent EOS).

    Taught in: chapters/07d-constrained-decoding.ipynb
    """
    ids = _check_request(model, tokenizer, prompt, params, grammar,
                         "constrained_generate(model, tokenizer, prompt, params, grammar)")
    check_rng(rng)
    device = next(model.parameters()).device
    n, context = params.n, model_context(model)
    states = [grammar.start() for _ in range(n)]
    generators = [make_generator(sample_seed(params.seed, i), device, rng) for i in range(n)]
    generated: list[list[int]] = [[] for _ in range(n)]
    log_q, log_p = [0.0] * n, [0.0] * n
    allowed: list[list[int]] = [[] for _ in range(n)]
    kept: list[list[float]] = [[] for _ in range(n)]
    reasons: list[str | None] = [None] * n
    logits, cache = model_step(model, torch.tensor([ids] * n, device=device))  # prefill, [n, L, V]
    while True:
        running = [i for i in range(n) if reasons[i] is None]
        last = logits[:, -1, :].float()  # [n, V]
        masks = torch.ones_like(last, dtype=torch.bool)  # [n, V]; finished rows are fed padding, never read
        for i in running:
            masks[i] = states[i].mask().to(device)
            if not bool(masks[i].any()):
                raise _dead_end(tokenizer, generated[i], i)
        seen = _seen(params, [ids] * n, generated)
        tokens = sample(_masked(last, masks), params, generators, **seen).tolist()  # [n]
        lq = _log_probs(_masked(last, masks), params, seen)  # [n, V]
        lp = _log_probs(last, params, seen)  # [n, V]
        for i in running:
            token = tokens[i]
            log_q[i] += float(lq[i, token])
            log_p[i] += float(lp[i, token])
            allowed[i].append(int(masks[i].sum()))
            kept[i].append(float(lp[i][masks[i]].exp().sum()))
            generated[i].append(token)
            states[i].advance(token)
            if token == grammar.eos_token_id:
                reasons[i] = "stop"
            elif len(generated[i]) >= params.max_tokens or (context is not None and len(ids) + len(generated[i])
                                                             >= context):
                reasons[i] = "length"
        if all(r is not None for r in reasons):
            break
        fed = [generated[i][-1] if reasons[i] is None else grammar.eos_token_id for i in range(n)]
        logits, cache = model_step(model, torch.tensor(fed, device=device).unsqueeze(1), cache)  # [n, 1, V]
    return [ConstrainedCompletion(g, tokenizer.decode(g, skip_special_tokens=True), r, q, p, tuple(a), tuple(m))
            for g, r, q, p, a, m in zip(generated, reasons, log_q, log_p, allowed, kept)]


@torch.no_grad()
def score_sequences(model, tokenizer, prompt: str | list[int], sequences: Sequence[Sequence[int]],
                    params: SamplingParams, grammar: Grammar) -> list[tuple[float, float]]:
    """(log q, log p) of each token sequence after `prompt`, teacher-forced in one batch: q is what
    `constrained_generate` draws from with `grammar` and `params`, p the same sampler without the mask (so a whole
    finite grammar can be enumerated and compared exactly, `decodelab.measure.constrained.kl_exact`). A token the
    grammar rules out gives log q = -inf.

    Taught in: chapters/07d-constrained-decoding.ipynb
    """
    ids = _check_request(model, tokenizer, prompt, params, grammar,
                         "score_sequences(model, tokenizer, prompt, sequences, params, grammar)")
    if isinstance(sequences, (str, bytes)) or not isinstance(sequences, Sequence) or not sequences:
        raise ParamError("sequences", f"sequences must be a non-empty list of token-id lists, got {sequences!r}")
    rows = [check_token_ids(s, grammar.vocab_size, f"sequences[{i}]") for i, s in enumerate(sequences)]
    if any(not r for r in rows):
        raise ParamError("sequences", "every sequence needs at least one token")
    device = next(model.parameters()).device
    width = len(ids) + max(len(r) for r in rows)
    check_prompt_fits(width, model_context(model), "prompt + the longest sequence")
    pad = grammar.eos_token_id
    batch = torch.tensor([ids + r + [pad] * (width - len(ids) - len(r)) for r in rows], device=device)  # [B, W]
    mask = torch.tensor([[1] * (len(ids) + len(r)) + [0] * (width - len(ids) - len(r)) for r in rows], device=device)
    logits = model(input_ids=batch, attention_mask=mask).logits.float()  # [B, W, V]
    scores = []
    for b, row in enumerate(rows):
        state, lq, lp = grammar.start(), 0.0, 0.0
        for t, token in enumerate(row):
            step = logits[b, len(ids) + t - 1].unsqueeze(0)  # [1, V]: the logits that predict row[t]
            seen = _seen(params, [ids], [row[:t]])
            lp += float(_log_probs(step, params, seen)[0, token])
            if lq == -math.inf:
                continue
            allowed = state.mask().to(device).unsqueeze(0)  # [1, V]
            if not bool(allowed[0, token]):
                lq = -math.inf
                continue
            lq += float(_log_probs(_masked(step, allowed), params, seen)[0, token])
            state.advance(token)
        scores.append((lq, lp))
    return scores
