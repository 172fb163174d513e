"""Repetition, frequency and presence penalties and the no-repeat-n-gram ban over the tokens each row has seen, one
value per row; and `logit_bias`, added before them. What changes a whole row before the processors run.

What each one sees is what transformers and vLLM define: the repetition penalty and the n-gram ban see the prompt
and the output (transformers' processors read all of `input_ids`), frequency and presence penalties the output only
(OpenAI's and vLLM's definition: they count what the model has written). `generate` and `Engine` pass both, so the
same `SamplingParams` give the same tokens in either.

`decodelab.sampling.sampler` applies them first, before temperature and truncation (transformers' order:
repetition penalty, then the n-gram ban; frequency and presence, which transformers lacks, sit between the two).

    >>> from decodelab.sampling.params import SamplingParams
    >>> apply_penalties(torch.ones(1, 5), [SamplingParams(repetition_penalty=2.0)], [[1, 1]])[0, 1].item()
    0.5

Taught in: chapters/03-strategies.ipynb
"""
from __future__ import annotations

from collections.abc import Sequence
import torch

from decodelab.sampling.params import SamplingParams
from decodelab.sampling.batch import SamplingBatch


def is_token_id(value) -> bool:
    """A Python int >= 0 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def token_tensor(tokens, batch: int, vocab_size: int, device: torch.device,
                 name: str = "output_tokens") -> torch.Tensor:
    """`tokens` (a `[B, T]` integer tensor with negative padding, or B lists of ids) as a LongTensor `[B, T]` on
    `device`, negative where a row is padded (-1 for lists); a wrong shape or id raises ValueError naming `name`."""
    if isinstance(tokens, torch.Tensor):
        if tokens.dim() != 2 or tokens.shape[0] != batch or tokens.is_floating_point():
            raise ValueError(f"{name} must be an integer tensor [B={batch}, T], got "
                             f"{tokens.dtype} {tuple(tokens.shape)}")
        ids = tokens.to(device=device, dtype=torch.long)
    else:
        if not isinstance(tokens, Sequence) or len(tokens) != batch:
            raise ValueError(f"{name} must be a [B, T] tensor or {batch} lists of token ids, got {tokens!r}")
        for i, row in enumerate(tokens):
            if not isinstance(row, Sequence) or not all(is_token_id(t) for t in row):
                raise ValueError(f"{name}[{i}] must be a list of token ids >= 0, got {row!r}")
        width = max((len(row) for row in tokens), default=0)
        ids = torch.tensor([list(row) + [-1] * (width - len(row)) for row in tokens], dtype=torch.long,
                           device=device).view(batch, width)
    if ids.numel() and bool((ids >= vocab_size).any()):
        raise ValueError(f"{name} must hold ids < vocab size {vocab_size}, got max {int(ids.max())}")
    return ids


def token_counts(output_tokens, batch: int, vocab_size: int, device: torch.device) -> torch.Tensor:
    """How often each token occurs in each row's `output_tokens`, `[B, V]`; negative ids in a tensor are padding."""
    ids = token_tensor(output_tokens, batch, vocab_size, device)  # [B, T]
    ids = torch.where(ids < 0, vocab_size, ids)  # padding goes to a spare column, dropped below
    counts = torch.zeros(batch, vocab_size + 1, device=device)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=counts.dtype))
    return counts[:, :vocab_size]


def banned_ngram_tokens(history: torch.Tensor, sizes: Sequence[int], vocab_size: int) -> torch.Tensor:
    """The tokens that would complete an n-gram already in a row's history, as transformers'
    `NoRepeatNGramLogitsProcessor` finds them: a BoolTensor `[B, V]`.

    `history` `[B, T]` holds token ids with negative padding (anywhere in a row: it is dropped, the tokens keep their
    order); `sizes[b]` is row b's n, 0 bans nothing. A window of n tokens whose first n - 1 equal the row's last
    n - 1 tokens bans its own last token; a row shorter than n bans nothing.

        >>> banned_ngram_tokens(torch.tensor([[1, 2, 3, 1, 2]]), [3], 5)[0].nonzero().flatten().tolist()
        [3]
    """
    batch, width = history.shape
    banned = torch.zeros(batch, vocab_size, dtype=torch.bool, device=history.device)  # [B, V]
    for size in sorted({n for n in sizes if 0 < n <= width}):  # one pass per distinct n
        index = torch.tensor([i for i, n in enumerate(sizes) if n == size], device=history.device)
        ids = history.index_select(0, index)  # [b, T]
        # padding to the front, real tokens in order after it, so each row ends with its own last tokens
        ids = ids.gather(1, torch.sort((ids >= 0).to(torch.int8), dim=1, stable=True).indices)
        windows = ids.unfold(1, size, 1)  # [b, T - n + 1, n]
        context = ids[:, width - size + 1:].unsqueeze(1)  # [b, 1, n - 1]: the last n - 1 tokens
        matches = (windows[..., :-1] == context).all(-1) & (windows >= 0).all(-1)  # [b, T - n + 1]
        # windows that do not match go to a spare column past the vocabulary, dropped below
        hit = torch.zeros(len(index), vocab_size + 1, dtype=torch.bool, device=history.device)  # [b, V + 1]
        hit.scatter_(1, torch.where(matches, windows[..., -1], vocab_size), True)
        banned.index_copy_(0, index, hit[:, :vocab_size])
    return banned


def add_logit_bias(x: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """`x` `[B, V]` plus each row's `logit_bias` (OpenAI's and vLLM's: added before penalties and sampling, so it
    moves the argmax too); a new tensor. A biased id outside the vocabulary raises ValueError."""
    if not batch.logit_bias:
        return x
    rows, ids, values = zip(*batch.logit_bias)
    if max(ids) >= x.shape[1]:
        raise ValueError(f"logit_bias names token {max(ids)}, outside the vocabulary (ids 0..{x.shape[1] - 1})")
    index = (torch.tensor(rows, device=x.device), torch.tensor(ids, device=x.device))
    return x.index_put(index, torch.tensor(values, dtype=x.dtype, device=x.device), accumulate=True)


def apply_penalties(x: torch.Tensor, rows: Sequence[SamplingParams] | SamplingBatch, output_tokens,
                    prompt_tokens=None) -> torch.Tensor:
    """Repetition (divide positive logits, multiply negative ones, as transformers) over prompt + output, then
    frequency and presence (subtract count * frequency + [count > 0] * presence, as vLLM and OpenAI) over the output,
    then the no-repeat-n-gram ban (-inf for each token that would repeat an n-gram of prompt + output, as
    transformers). `x` `[B, V]`; `rows` the rows' parameters (a `SamplingBatch` or one `SamplingParams` per row);
    `output_tokens` and `prompt_tokens` as `token_tensor` takes them (None: no prompt)."""
    batch, vocab_size = x.shape
    params = rows if isinstance(rows, SamplingBatch) else SamplingBatch(rows, x.device)
    ids = token_tensor(output_tokens, batch, vocab_size, x.device)  # [B, T]
    prompt = None if prompt_tokens is None else token_tensor(prompt_tokens, batch, vocab_size, x.device,
                                                             "prompt_tokens")  # [B, L]
    counts = token_counts(ids, batch, vocab_size, x.device).to(x.dtype)  # [B, V], the output only
    seen = counts > 0
    if params.uses("repetition_penalty"):
        penalty = params.column("repetition_penalty", x.dtype)  # [B, 1]
        seen_anywhere = seen if prompt is None else seen | (token_counts(prompt, batch, vocab_size, x.device) > 0)
        x = torch.where(seen_anywhere, torch.where(x < 0, x * penalty, x / penalty), x)
    if params.uses("frequency_penalty") or params.uses("presence_penalty"):
        x = (x - counts * params.column("frequency_penalty", x.dtype)
             - seen * params.column("presence_penalty", x.dtype))
    if any(params.ngram_sizes):
        history = ids if prompt is None else torch.cat([prompt, ids], dim=1)  # [B, L + T]; padding is dropped
        banned = banned_ngram_tokens(history, params.ngram_sizes, vocab_size)
        x = x.masked_fill(banned & torch.isfinite(x), float("-inf"))  # NaN and +inf stay, for the caller's check
    return x
