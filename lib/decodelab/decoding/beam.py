"""Beam search over a transformers causal LM, step for step the rule of `model.generate(num_beams=...)`.

Each step every running beam proposes its continuations; the best `max(2, 1 + #EOS ids) * num_beams` are kept
(twice as many so that `num_beams` stay running even if the best ones end with EOS). A continuation ending in EOS (or
reaching `max_tokens`) is a finished hypothesis, scored `sum log p / generated_length ** length_penalty`; only those
ranked among the first `num_beams` may enter the finished list. The search stops when no running beam can beat the
worst of `num_beams` finished hypotheses (transformers' heuristic: the running score divided by the current length),
when `early_stopping=True` and `num_beams` hypotheses are finished, or at `max_tokens`.

Differences from transformers by design: one prompt per call (no padding between prompts), no logits processors, no
sampling variant, and only the best hypothesis is returned, with its score.

Taught in: chapters/03-strategies.ipynb
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from decodelab.decoding.generate import model_context, model_step
from decodelab.decoding.request import prompt_token_ids
from decodelab.validation import ParamError, as_int_list, as_scalar, check_int, check_model

NEG = -1.0e9  # transformers' "impossible" score; kept identical so ties break the same way
# |length_penalty| at most 10 (translation uses 0.6 to 2): at 10, 8 tokens already weigh 8 ** 10 = 1e9 against a sum
# log p of tens, so the length all but decides the ranking; much further, L ** length_penalty leaves even float64
MAX_ABS_LENGTH_PENALTY = 10
FLOAT32_TINY, FLOAT32_MAX = torch.finfo(torch.float32).tiny, torch.finfo(torch.float32).max


@dataclass(frozen=True)
class BeamResult:
    """The best hypothesis: its generated token ids (EOS included when it ended on one) and its score.

    `steps` is the search's family tree, one entry per forward after the prefill: for each running beam, the beam of
    the previous step it continues and the token it adds, `(parent, token)`. Every beam of one step shares its
    ancestors' K/V, which is what a paged cache can share (chapter 07 counts the blocks).
    """

    token_ids: list[int]
    score: float
    steps: tuple[tuple[tuple[int, int], ...], ...] = ()


def _prompt_ids(input_ids, vocab_size: int, context: int | None) -> list[int]:
    """One prompt's ids, checked as `generate` checks its prompts; a `[1, T]` tensor or array is one prompt too."""
    if getattr(input_ids, "ndim", None) == 2:
        if input_ids.shape[0] != 1:
            raise ParamError("input_ids", f"input_ids must be one prompt: integer ids of shape [T] or [1, T], got "
                                          f"shape {tuple(input_ids.shape)}")
        input_ids = input_ids[0]
    return prompt_token_ids(input_ids, None, "input_ids", vocab_size, context)


def _length_normalised(sum_log_probs: torch.Tensor, length: int, length_penalty: float) -> float:
    """`sum_log_probs / length ** length_penalty`: in float32, as transformers divides, while the divisor is a
    float32 number; past that (thousands of tokens at |length_penalty| near the bound) in float64, where it is."""
    divisor = float(length) ** length_penalty
    if not FLOAT32_TINY <= divisor <= FLOAT32_MAX:
        return float(sum_log_probs.double() / divisor)
    return float(sum_log_probs / divisor)


@torch.no_grad()
def beam_search(model, input_ids, num_beams: int, max_tokens: int, length_penalty: float = 1.0,
                early_stopping: bool | str = False, eos_token_id: int | Sequence[int] | None = None) -> BeamResult:
    """Beam search for one prompt; returns the sequence `model.generate(input_ids, num_beams=num_beams,
    max_new_tokens=max_tokens, do_sample=False, length_penalty=..., early_stopping=..., eos_token_id=...)` returns.

    `early_stopping` is True, False or "never", as in transformers. `eos_token_id` is None (the model's config value
    is not read: pass it), an id or a list of ids.

        >>> from decodelab.decoding import beam_search
        >>> result = beam_search(model, [1, 17, 42], num_beams=4, max_tokens=20, eos_token_id=2)
        >>> result.token_ids, round(result.score, 3)
        ([99, 147, 302, 223, 133, 231, 84, 6, 2], -0.301)

    Taught in: chapters/03-strategies.ipynb
    """
    vocab_size = check_model(model, "beam_search(model, input_ids, num_beams, max_tokens)")
    num_beams = check_int(num_beams, "num_beams")
    max_tokens = check_int(max_tokens, "max_tokens")
    length_penalty = as_scalar(length_penalty)
    if (not isinstance(length_penalty, (int, float)) or isinstance(length_penalty, bool)
            or not abs(length_penalty) <= MAX_ABS_LENGTH_PENALTY):
        raise ParamError("length_penalty", f"length_penalty must be a number in [-{MAX_ABS_LENGTH_PENALTY}, "
                                           f"{MAX_ABS_LENGTH_PENALTY}], got {length_penalty!r} (beyond that the "
                                           "length alone ranks the hypotheses, and length ** length_penalty leaves "
                                           "the float range)")
    early_stopping = as_scalar(early_stopping)
    if not (isinstance(early_stopping, bool) or early_stopping == "never"):
        raise ParamError("early_stopping", f"early_stopping must be True, False or 'never', got {early_stopping!r}")
    eos = [] if eos_token_id is None else as_int_list([eos_token_id]) or as_int_list(eos_token_id)
    if eos is None or not all(t >= 0 for t in eos):
        raise ParamError("eos_token_id", f"eos_token_id must be None, an id >= 0 or a list of them, "
                                         f"got {eos_token_id!r}")
    device = next(model.parameters()).device
    context = model_context(model)
    prompt = torch.tensor(_prompt_ids(input_ids, vocab_size, context), dtype=torch.long, device=device)  # [T]
    prompt_len = prompt.shape[0]
    # as Engine and generate do, no sequence grows past the model's context
    max_length = prompt_len + max_tokens
    if context is not None:  # a prompt that fills the context still gets one token, as in generate
        max_length = min(max_length, max(context, prompt_len + 1))
    keep = max(2, 1 + len(eos)) * num_beams  # candidates kept per step
    eos_ids = torch.tensor(eos, dtype=torch.long, device=device)

    running = prompt.repeat(num_beams, 1)  # [num_beams, T]
    running_scores = torch.full((num_beams,), NEG, device=device)
    running_scores[0] = 0.0  # all beams start identical: let only the first one propose
    finished: list[tuple[float, list[int]]] = []  # (score, generated ids), at most num_beams, best first
    improvable = True
    steps: list[tuple[tuple[int, int], ...]] = []  # per forward: (parent beam, token) of each running beam

    logits, cache = model_step(model, running)  # prefill, one copy of the prompt per beam as transformers does
    cur_len = prompt_len
    while True:
        log_probs = torch.log_softmax(logits[:, -1, :].float(), dim=-1)  # [num_beams, V]
        vocab_size = log_probs.shape[-1]
        total = (log_probs + running_scores.unsqueeze(1)).reshape(-1)  # [num_beams * V]
        top_scores, top_index = torch.topk(total, keep)  # [keep]
        beam_of, token = top_index // vocab_size, top_index % vocab_size
        hits = torch.isin(token, eos_ids) | torch.tensor(cur_len + 1 >= max_length, device=device)  # [keep]

        # finished hypotheses: only candidates ranked within the first num_beams may enter
        generated_len = cur_len + 1 - prompt_len
        all_full = len(finished) == num_beams
        if improvable and not (all_full and early_stopping is True):
            for rank in range(num_beams):
                if bool(hits[rank]):
                    ids = running[beam_of[rank], prompt_len:].tolist() + [int(token[rank])]
                    finished.append((_length_normalised(top_scores[rank], generated_len, length_penalty), ids))
            finished.sort(key=lambda item: -item[0])  # stable: earlier hypotheses win ties, as topk over the merge
            del finished[num_beams:]

        # running beams: the best num_beams candidates that did not finish
        alive = top_scores + hits.float() * NEG
        next_rank = torch.topk(alive, num_beams).indices  # [num_beams]
        running = torch.cat([running[beam_of[next_rank]], token[next_rank].unsqueeze(1)], dim=1)
        running_scores = alive[next_rank]
        cur_len += 1

        if len(finished) == num_beams:  # can the best running beam still beat the worst finished one?
            if early_stopping == "never" and length_penalty > 0.0:
                best_length = max_length - prompt_len
            else:
                best_length = cur_len - prompt_len
            improvable = improvable and _length_normalised(running_scores[0], best_length,
                                                           length_penalty) > finished[-1][0]
        done_early = len(finished) == num_beams and early_stopping is True
        if not improvable or done_early or bool(hits.all()):
            break
        steps.append(tuple(zip(beam_of[next_rank].tolist(), token[next_rank].tolist())))
        cache.reorder_cache(beam_of[next_rank])
        logits, cache = model_step(model, running[:, -1:], cache)
    score, ids = finished[0]
    return BeamResult(token_ids=ids, score=score, steps=tuple(steps))
