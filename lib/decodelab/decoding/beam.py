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

import math

import torch

from decodelab.decoding.generate import model_context, model_step
from decodelab.decoding.request import check_prompt_fits
from decodelab.validation import check_int

NEG = -1.0e9  # transformers' "impossible" score; kept identical so ties break the same way


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


def _prompt_tensor(input_ids, device: torch.device) -> torch.Tensor:
    if isinstance(input_ids, torch.Tensor):
        ids = input_ids
        if ids.dim() == 2 and ids.shape[0] == 1:
            ids = ids[0]
        if ids.dim() != 1 or ids.is_floating_point():
            raise ValueError(f"input_ids must be one prompt: integer ids of shape [T] or [1, T], got "
                             f"{ids.dtype} {tuple(input_ids.shape)}")
    elif isinstance(input_ids, Sequence) and all(isinstance(t, int) and not isinstance(t, bool) for t in input_ids):
        ids = torch.tensor(list(input_ids), dtype=torch.long)
    else:
        raise TypeError(f"input_ids must be a list of ints or a LongTensor [T] / [1, T], got {input_ids!r}")
    if ids.numel() == 0:
        raise ValueError("input_ids must hold at least one token, got an empty prompt")
    return ids.to(device=device, dtype=torch.long)


@torch.no_grad()
def beam_search(model, input_ids, num_beams: int, max_tokens: int, length_penalty: float = 1.0,
                early_stopping: bool | str = False, eos_token_id: int | Sequence[int] | None = None) -> BeamResult:
    """Beam search for one prompt; returns the sequence `model.generate(input_ids, num_beams=num_beams,
    max_new_tokens=max_tokens, do_sample=False, length_penalty=..., early_stopping=..., eos_token_id=...)` returns.

    `early_stopping` is True, False or "never", as in transformers. `eos_token_id` is None (the model's config value
    is not read: pass it), an id or a list of ids.

        >>> result = beam_search(model, [1, 17, 42], num_beams=4, max_tokens=20, eos_token_id=2)
        >>> result.token_ids, result.score

    Taught in: chapters/03-strategies.ipynb
    """
    check_int(num_beams, "num_beams")
    check_int(max_tokens, "max_tokens")
    if not isinstance(length_penalty, (int, float)) or isinstance(length_penalty, bool) or math.isnan(length_penalty):
        raise ValueError(f"length_penalty must be a number, got {length_penalty!r}")
    if early_stopping not in (True, False, "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")
    eos = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in eos):
        raise ValueError(f"eos_token_id must be None, an id >= 0 or a list of them, got {eos_token_id!r}")
    device = next(model.parameters()).device
    prompt = _prompt_tensor(input_ids, device)
    prompt_len = prompt.shape[0]
    context = model_context(model)
    check_prompt_fits(prompt_len, context, "input_ids")
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
                    score = top_scores[rank] / generated_len**length_penalty  # in float32, as transformers
                    finished.append((float(score), ids))
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
            improvable = improvable and float(running_scores[0] / best_length ** length_penalty) > finished[-1][0]
        done_early = len(finished) == num_beams and early_stopping is True
        if not improvable or done_early or bool(hits.all()):
            break
        steps.append(tuple(zip(beam_of[next_rank].tolist(), token[next_rank].tolist())))
        cache.reorder_cache(beam_of[next_rank])
        logits, cache = model_step(model, running[:, -1:], cache)
    score, ids = finished[0]
    return BeamResult(token_ids=ids, score=score, steps=tuple(steps))
