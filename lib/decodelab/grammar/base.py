"""What a grammar is to the sampler: a `Grammar` starts a `GrammarState` per sequence, whose `mask()` `[V]` says which
tokens keep the text completable and which `advance(token)` moves past a chosen token.

Any object with `vocab_size`, `eos_token_id` and `start()` is a grammar here; `decodelab.grammar.backends` has
the toy language's automaton and llguidance's regex/JSON/Lark grammars. Set one as `SamplingParams(grammar=...)` and
`Engine` and `generate` mask every step of that request with `mask_logits`, as `constrained_generate` does.

Taught in: chapters/07d-constrained-decoding.ipynb
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from decodelab.validation import ParamError, as_scalar


def check_token_ids(token_ids: Sequence[int], vocab_size: int, name: str) -> list[int]:
    """`token_ids` as a list of ints in [0, vocab_size) (a tensor or numpy ints are accepted), else a ParamError
    naming `name`."""
    if isinstance(token_ids, torch.Tensor):
        token_ids = token_ids.tolist()
    if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, Sequence):
        raise ParamError(name, f"{name} must be a list of token ids, got {type(token_ids).__name__}")
    ids = [as_scalar(t) for t in token_ids]
    bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size]
    if bad:
        raise ParamError(name, f"{name} must hold token ids in [0, {vocab_size}), got {bad[:5]!r}")
    return ids


class GrammarState:
    """One sequence's place in a grammar: `mask()` `[V]` bool, `advance(token_id)` after a token is chosen."""

    def mask(self) -> torch.Tensor:
        raise NotImplementedError

    def advance(self, token_id: int) -> None:
        raise NotImplementedError


class Grammar:
    """What `constrained_generate` needs: `vocab_size`, `eos_token_id` and `start()`; `mask` and `accepts` follow."""

    vocab_size: int
    eos_token_id: int

    def start(self) -> GrammarState:
        raise NotImplementedError

    def mask(self, token_ids: Sequence[int]) -> torch.Tensor:
        """The mask `[V]` (bool) after `token_ids`, the tokens generated so far (no BOS, no prompt). A token the
        grammar did not allow at its step is an error naming its position.

        >>> from decodelab.grammar import ToyLanguageGrammar
        >>> mask = ToyLanguageGrammar(tokenizer).mask([])
        >>> mask.shape, mask.dtype
        (torch.Size([473]), torch.bool)
        >>> int(mask.sum())    # the first characters of the toy language's sentences
        50
        """
        ids = check_token_ids(token_ids, self.vocab_size, "token_ids")
        state = self.start()
        for position, token in enumerate(ids):
            if not bool(state.mask()[token]):
                raise ParamError("token_ids", f"token_ids[{position}] = {token} is not allowed by the grammar after "
                                              f"the {position} tokens before it")
            state.advance(token)
        return state.mask()

    def accepts(self, token_ids: Sequence[int]) -> bool:
        """True when `token_ids` (a trailing EOS allowed) is a whole string of the grammar: every token was allowed
        at its step and EOS is allowed at the end. Judges unconstrained samples without raising."""
        ids = check_token_ids(token_ids, self.vocab_size, "token_ids")
        if ids and ids[-1] == self.eos_token_id:
            ids = ids[:-1]
        state = self.start()
        for token in ids:
            if not bool(state.mask()[token]):
                return False
            state.advance(token)
        return bool(state.mask()[self.eos_token_id])



def is_grammar(value) -> bool:
    """Whether `value` can serve as a grammar: `vocab_size`, `eos_token_id` and a callable `start`."""
    return (callable(getattr(value, "start", None)) and isinstance(getattr(value, "vocab_size", None), int)
            and isinstance(getattr(value, "eos_token_id", None), int))


def mask_logits(logits: torch.Tensor, states: Sequence[GrammarState | None]) -> torch.Tensor:
    """`logits` `[B, V]` with -inf wherever row b's grammar state forbids a token (rows whose state is None are
    left as they are). A row whose grammar allows no token raises ParamError: a grammar that cannot be completed is
    an error, never a silent EOS."""
    rows = [b for b, state in enumerate(states) if state is not None]
    if not rows:
        return logits
    masks = torch.ones_like(logits, dtype=torch.bool)              # [B, V]
    for b in rows:
        allowed = states[b].mask().to(logits.device)
        if not bool(allowed.any()):
            raise ParamError("grammar", f"the grammar of row {b} allows no token here: it cannot be completed with "
                                        f"this vocabulary")
        masks[b, :allowed.shape[0]] = allowed
        masks[b, allowed.shape[0]:] = False                        # a model vocabulary padded past the grammar's
    return logits.masked_fill(~masks, float("-inf"))
