"""Text out of token ids while a request runs: where a stop string ends the text, and what a stream may send yet.

A stop string is matched on the decoded text, not on tokens (a stop string can span tokens, and a token can hold
more than one). The text a request returns ends just before its first stop string, as in OpenAI's API and vLLM.

`IncrementalDetokenizer` decodes a sample as its tokens arrive, a few tokens at a time (vLLM's incremental
detokenizer, in its plain `decode` form): each new token decodes a window that starts at the last point where the
text was whole, so a sample of n tokens costs O(n) decoding, not the O(n²) of decoding the whole output at every
token. A window ending in U+FFFD (half of a multi-byte character that a later byte-level token completes) is held
until it is whole. Stop strings are searched only in the text that the newest piece could have completed.

A stream must never send text it may have to take back, so `push` also holds back the last `len(stop) - 1`
characters (they could be the start of a stop string). The pieces `push` and `finish` return join to exactly
`.text`, the request's final text.

    >>> truncate_at_stop("小明喜欢苹果。小红", ("。",))
    ('小明喜欢苹果', True)
    >>> from decodelab.models import load_model
    >>> _, tokenizer = load_model("tiny-zh", device="cpu")
    >>> detok = IncrementalDetokenizer(tokenizer, stop=("。小",))
    >>> [detok.push(t) for t in tokenizer.encode("小明喜欢苹果。小", add_special_tokens=False)]
    ['', '小', '明', '喜', '欢', '苹', '果', '']
    >>> detok.stopped, detok.text, detok.finish()
    (True, '小明喜欢苹果', '')

Used by: decodelab.decoding.generate and decodelab.engine (stop strings, streamed text), decodelab.serve.app.
Taught in: chapters/07c-serving.ipynb
"""
from __future__ import annotations

from collections.abc import Sequence

REPLACEMENT_CHAR = "\ufffd"


def truncate_at_stop(text: str, stop: Sequence[str], include_stop: bool = False,
                     after: int = 0) -> tuple[str, bool]:
    """`text` cut before the earliest occurrence of any stop string (after it when `include_stop`, vLLM's
    `include_stop_str_in_output`), and whether one occurred. Only occurrences that end past character `after` count
    (a stop string completed before `min_tokens` does not stop a sample).

    >>> truncate_at_stop("甲。乙。丙", ("。",), include_stop=True), truncate_at_stop("甲。乙。丙", ("。",), after=2)
    (('甲。', True), ('甲。乙', True))
    """
    hit = first_stop(text, stop, after)
    if hit is None:
        return text, False
    return text[:hit[1] if include_stop else hit[0]], True


def first_stop(text: str, stop: Sequence[str], after: int = 0) -> tuple[int, int] | None:
    """(start, end) of the earliest stop string in `text` that ends past character `after` (the first listed wins a
    tie), or None."""
    best = None
    for s in stop:
        start = text.find(s, max(0, after - len(s) + 1))
        if start >= 0 and (best is None or start < best[0]):
            best = (start, start + len(s))
    return best


class IncrementalDetokenizer:
    """The text of one sample, decoded token by token, cut before its first stop string.

    tokenizer: anything with `decode(ids, skip_special_tokens=...)` (a transformers tokenizer).
    stop: the stop strings; `stopped` turns True at the token that completes one, and `text` ends before it (after
    it with `include_stop`, vLLM's `include_stop_str_in_output`; nothing is held back from a stream then).
    min_tokens: a stop string completed by one of the first `min_tokens - 1` tokens does not count (vLLM matches no
    stop string until the output holds `min_tokens` tokens).
    """

    def __init__(self, tokenizer, stop: Sequence[str] = (), skip_special_tokens: bool = True,
                 include_stop: bool = False, min_tokens: int = 0) -> None:
        if not callable(getattr(tokenizer, "decode", None)):
            raise TypeError(f"tokenizer must have a decode method (a transformers tokenizer), "
                            f"got {type(tokenizer).__name__}")
        if isinstance(stop, str) or not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop must be a sequence of non-empty strings, got {stop!r}")
        if not isinstance(skip_special_tokens, bool):
            raise TypeError(f"skip_special_tokens must be True or False, got {skip_special_tokens!r}")
        if not isinstance(include_stop, bool):
            raise TypeError(f"include_stop must be True or False, got {include_stop!r}")
        if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or min_tokens < 0:
            raise ValueError(f"min_tokens must be an int >= 0, got {min_tokens!r}")
        self.include_stop = include_stop
        self.min_tokens = min_tokens
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []
        self.stopped = False
        # characters a stream holds back: the start of a stop string that may yet complete (none when it is kept)
        self._held = 0 if include_stop else max(max((len(s) for s in self.stop), default=0) - 1, 0)
        self._decoded = ""            # the text of token_ids[:_read_offset], whole (never ends in half a character)
        self._prefix_offset = 0       # the window a new token is decoded in starts here ...
        self._read_offset = 0         # ... and the text of the tokens before this one is already in _decoded
        self._cut: int | None = None  # where the first stop string starts in _decoded, once one has matched
        self._sent = 0                # characters of text that push() has handed out

    @property
    def text(self) -> str:
        """The output text so far: whole characters only, cut before the first stop string."""
        return self._decoded if self._cut is None else self._decoded[:self._cut]

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=self.skip_special_tokens)

    def _append(self, piece: str) -> None:
        """Add whole text to the sample; search for a stop string where `piece` could have completed one."""
        before = len(self._decoded)
        self._decoded += piece
        if self.stop and not self.stopped and len(self.token_ids) >= self.min_tokens:
            hit = first_stop(self._decoded, self.stop, before)    # only a stop string `piece` completes
            if hit is not None:
                self.stopped = True
                self._cut = hit[1] if self.include_stop else hit[0]

    def _window_text(self) -> tuple[str, str]:
        """The decoded window before and after the newest tokens (the window starts where the text was whole)."""
        window = self.token_ids[self._prefix_offset:]
        return self._decode(window[:self._read_offset - self._prefix_offset]), self._decode(window)

    def push(self, token_id: int) -> str:
        """Add the sample's next token; return the new text a stream may send now (possibly "")."""
        if self.stopped:
            raise RuntimeError("this sample already ended at a stop string; it takes no more tokens")
        self.token_ids.append(int(token_id))
        before, after = self._window_text()
        if len(after) > len(before) and not after.endswith(REPLACEMENT_CHAR):
            self._append(after[len(before):])
            self._prefix_offset, self._read_offset = self._read_offset, len(self.token_ids)
        final = len(self.text) if self.stopped else len(self._decoded) - self._held
        piece = self.text[self._sent:max(final, self._sent)]
        self._sent += len(piece)
        return piece

    def finish(self) -> str:
        """The rest of the text once the sample has ended (what push held back); the pieces join to `text`."""
        if not self.stopped and self._read_offset < len(self.token_ids):   # an unfinished character at the end
            before, after = self._window_text()
            self._append(after[len(before):])
            self._prefix_offset = self._read_offset = len(self.token_ids)
        piece = self.text[self._sent:]
        self._sent += len(piece)
        return piece


def sample_detokenizer(tokenizer, params) -> IncrementalDetokenizer:
    """The `IncrementalDetokenizer` of one sample of a request with `params` (a SamplingParams): its stop strings,
    `include_stop_str_in_output` and `min_tokens`."""
    return IncrementalDetokenizer(tokenizer, params.stop, include_stop=params.include_stop_str_in_output,
                                  min_tokens=params.min_tokens)
