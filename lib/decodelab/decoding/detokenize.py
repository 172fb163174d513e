"""Text out of token ids while a request runs: where a stop string ends the text, and what a stream may send yet.

A stop string is matched on the decoded text, not on tokens (a stop string can span tokens, and a token can hold
more than one). The text a request returns ends just before its first stop string, as in OpenAI's API and vLLM.
A stream must never send text it may have to take back, so `TextStream` holds back the last `len(stop) - 1`
characters (they could be the start of a stop string) and a trailing U+FFFD (half of a multi-byte character that
the next byte-level token completes). The chunks a stream sends then join to exactly the final text.

    >>> truncate_at_stop("小明喜欢苹果。小红", ("。",))
    ('小明喜欢苹果', True)
    >>> stream = TextStream(stop=("。小",))
    >>> stream.push("小明喜欢"), stream.push("小明喜欢苹果。"), stream.finish("小明喜欢苹果")
    ('小明喜', '欢苹果', '')

Used by: decodelab.engine.engine (stop strings), decodelab.serve.app (streamed text).
"""
from __future__ import annotations

from collections.abc import Sequence

REPLACEMENT_CHAR = "\ufffd"


def truncate_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """`text` cut before the earliest occurrence of any stop string, and whether one occurred."""
    hits = [i for i in (text.find(s) for s in stop) if i >= 0]
    return (text[:min(hits)], True) if hits else (text, False)


class TextStream:
    """The text of one streamed sample, sent in pieces that never have to be taken back."""

    def __init__(self, stop: Sequence[str] = ()) -> None:
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.sent = ""

    def push(self, text: str) -> str:
        """The new piece to send now that the whole text so far (stop strings already cut) is `text`."""
        safe = text[:len(text) - self.holdback] if self.holdback else text
        safe = safe.rstrip(REPLACEMENT_CHAR)
        if len(safe) <= len(self.sent) or not safe.startswith(self.sent):
            return ""
        delta, self.sent = safe[len(self.sent):], safe
        return delta

    def finish(self, text: str) -> str:
        """The last piece, given the request's final text; what was sent is always a prefix of it."""
        if not text.startswith(self.sent):
            raise AssertionError(f"streamed text {self.sent!r} is not a prefix of the final text {text!r}")
        delta, self.sent = text[len(self.sent):], text
        return delta
