"""vLLM's token constraints on a request: `allowed_token_ids`, bad words and `min_tokens`, as -inf masks on a row.

- `allowed_token_ids`: every token not in the list is masked.
- `bad_word_ids` (token sequences; an engine makes them from the `bad_words` strings): a one-token word is always
  masked; the last token of a longer one is masked when the output so far ends with the rest of it, so the word is
  never completed (vLLM's rule: only the output is searched, not the prompt).
- `min_tokens`: while the output holds fewer tokens, the EOS tokens and `stop_token_ids` are masked (vLLM masks
  EOS even with `ignore_eos`); the engine also matches no stop string until then.

`decodelab.sampling.sampler` applies them after the penalties, so nothing later can bring a masked token back.

    >>> params = SamplingParams(allowed_token_ids=(1, 3), min_tokens=2, max_tokens=4)
    >>> apply_constraints(torch.zeros(1, 5), SamplingBatch([params]), [[]], eos_token_ids={3})[0].tolist()
    [-inf, 0.0, -inf, -inf, -inf]

Used by: decodelab.sampling.sampler (and so `generate`, the engine and the server's vLLM fields).
"""
from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from decodelab.sampling.batch import SamplingBatch
from decodelab.sampling.params import SamplingParams  # noqa: F401 (the docstring's example)
from decodelab.sampling.penalties import token_tensor


def _outputs(output_tokens, batch: SamplingBatch, vocab_size: int, device: torch.device) -> list[list[int]]:
    """Each row's output so far as a list (a tensor's negative padding dropped)."""
    ids = token_tensor(output_tokens, len(batch), vocab_size, device)   # [B, T], negative = padding
    return [[t for t in row if t >= 0] for row in ids.tolist()]


def apply_constraints(x: torch.Tensor, batch: SamplingBatch, output_tokens: torch.Tensor | Sequence[Sequence[int]] | None,
                      eos_token_ids: Collection[int] | None) -> torch.Tensor:
    """`x` `[B, V]` with each row's constrained tokens set to -inf (a new tensor; `x` is not modified).
    `output_tokens` (as for the penalties) is needed when a row sets min_tokens or a bad word of several tokens;
    `eos_token_ids` when a row sets min_tokens."""
    rows = [i for i, p in enumerate(batch.params) if p.has_constraints]
    if not rows:
        return x
    vocab_size = x.shape[1]
    needs_history = any(batch.params[i].needs_output_tokens for i in rows)
    if needs_history and output_tokens is None:
        raise ValueError("output_tokens is None but some params set min_tokens or a bad word of several tokens; "
                         "pass the tokens each row has generated")
    if any(batch.params[i].min_tokens > 0 for i in rows) and eos_token_ids is None:
        raise ValueError("some params set min_tokens: pass eos_token_ids, the tokens that end a sample, to be masked")
    outputs = _outputs(output_tokens, batch, vocab_size, x.device) if needs_history else None
    mask = torch.zeros(x.shape, dtype=torch.bool)                        # [B, V], built on the host
    for i in rows:
        params = batch.params[i]
        named = sorted(t for t in {*(params.allowed_token_ids or ()), *(w[-1] for w in params.bad_word_ids)}
                       if t >= vocab_size)
        if named:
            raise ValueError(f"row {i} names token ids {named}, outside the vocabulary of {vocab_size}")
        banned: set[int] = set()
        if params.allowed_token_ids is not None:
            mask[i] = True
            mask[i, list(params.allowed_token_ids)] = False
        for word in params.bad_word_ids:
            prefix = list(word[:-1])
            if not prefix or (len(outputs[i]) >= len(prefix) and outputs[i][len(outputs[i]) - len(prefix):] == prefix):
                banned.add(word[-1])
        if params.min_tokens > 0 and len(outputs[i]) < params.min_tokens:
            banned |= set(eos_token_ids) | set(params.stop_token_ids)
        banned = {t for t in banned if t < vocab_size}        # an EOS id the model's head lacks
        if banned:
            mask[i, sorted(banned)] = True
    return x.masked_fill(mask.to(x.device), float("-inf"))
