"""One request layer for `generate` and `Engine` (and the server over it): the token ids a prompt becomes, the rule
that ends a sample, and the `Completion` a request returns.

Both paths call these same functions, so the same prompt and `SamplingParams` are refused with the same words and
end for the same reason:

    ids = prompt_token_ids("小明", tokenizer, "prompt", vocab_size=473, context=256)
    finish_reason(params, token, len(output_ids), len(ids) + len(output_ids), eos_ids, 256, detokenizer)

Taught in: chapters/07c-serving.ipynb
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
import dataclasses
from dataclasses import dataclass

from decodelab.decoding.detokenize import IncrementalDetokenizer, truncate_at_stop
from decodelab.sampling.params import SamplingParams
from decodelab.models.tokenizer import encode_prompt
from decodelab.validation import ParamError, as_int_list


@dataclass(frozen=True)
class TokenLogprob:
    """A sampled token's log-probability under the model (raw logits, before temperature or truncation, as vLLM
    reports them by default) and the `params.logprobs` most likely tokens with theirs, most likely first. `rank` is
    the token's rank under the model (1 for the most likely), where the engine computed it (prompt logprobs)."""
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]
    rank: int | None = None


@dataclass(frozen=True)
class Completion:
    """One finished request. `token_ids` are the generated tokens only (a stop or EOS token included); `text` is
    their text (special tokens skipped; None without a tokenizer), ending before the first stop string if one was
    hit; `finish_reason` is "stop" (EOS, a stop token or stop string) or "length" (max_tokens or the context).

    For n > 1, `token_ids`, `text`, `finish_reason` and `logprobs` are sample 0's and `samples` holds all n samples
    (each a Completion with empty `samples`); for n = 1, `samples` is empty. `logprobs` has one entry per token when
    the request asked for them (`SamplingParams.logprobs`), else None. `request_id` is the engine's id, or the
    prompt's index in a `generate` call.
    """
    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str | None
    finish_reason: str
    samples: tuple[Completion, ...] = ()
    logprobs: tuple[TokenLogprob, ...] | None = None
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None   # per prompt token (None for the first), when
                                                                     # the request asked (`params.prompt_logprobs`)


def check_prompt_fits(prompt_len: int, context: int | None, name: str) -> None:
    """A prompt longer than the model's context is refused (ParamError naming `name`), in the engine's words."""
    if context is not None and prompt_len > context:
        raise ParamError(name, f"{name} has {prompt_len} tokens, longer than the model's context of {context}")


def check_vocabulary_ids(params: SamplingParams, vocab_size: int, name: str) -> None:
    """The token ids a request names besides its prompt (`stop_token_ids`, `logit_bias`, `allowed_token_ids`,
    `bad_word_ids`) must be in the vocabulary: refused when the request is made (ParamError naming the field), not in
    the middle of a batch."""
    for field, ids in (("stop_token_ids", list(params.stop_token_ids)),
                       ("logit_bias", [token for token, _ in params.logit_bias]),
                       ("allowed_token_ids", list(params.allowed_token_ids or ())),
                       ("bad_word_ids", [t for word in params.bad_word_ids for t in word])):
        outside = [t for t in ids if t >= vocab_size]
        if outside:
            raise ParamError(field, f"{field} for {name} must be < the vocabulary size {vocab_size}, got {outside}")


def with_bad_word_ids(params: SamplingParams, tokenizer, name: str) -> SamplingParams:
    """`params` with its `bad_words` (strings) added to `bad_word_ids` as token ids, by vLLM's rule
    (`SamplingParams.update_from_tokenizer`): each word, its leading whitespace stripped, is tokenized as it is (no
    special tokens) and again after one space, because a tokenizer that folds the space into the word's first token
    (GPT-2's "Ġhello", SentencePiece's "▁hello") spells the same word two ways, at the start of a text and after a
    space. The spaced spelling is banned too when it starts with another token and has as many tokens as the plain one
    (a space that only adds a token of its own is not the word spelled differently). The character tokenizers of the
    shipped models have no space at all, so for them only the plain spelling counts. A bad word needs a tokenizer and
    characters it knows (ParamError naming `bad_words`).

    >>> with_bad_word_ids(SamplingParams(bad_words=(" 小明",)), tokenizer, "p").bad_word_ids    # tiny-zh's
    ((147, 219),)
    """
    if not params.bad_words:
        return params
    if tokenizer is None:
        raise ParamError("bad_words", f"bad_words for {name} are text: give a tokenizer, or use bad_word_ids")
    unk = getattr(tokenizer, "unk_token_id", None)

    def encode(text: str) -> tuple[int, ...] | None:
        """The ids of `text`, or None when a character of it is outside the vocabulary."""
        ids = tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
        return None if unk is not None and unk in ids and tokenizer.unk_token not in text else ids

    words = []
    for word in params.bad_words:
        plain = encode(word.lstrip())
        if not plain:
            raise ParamError("bad_words", f"bad_words for {name}: {word!r} " + (
                "tokenizes to no token" if plain == () else
                "has characters outside the tokenizer's vocabulary (it could never be generated)"))
        words.append(plain)
        spaced = encode(" " + word.lstrip())
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            words.append(spaced)
    words = tuple(w for w in dict.fromkeys((*params.bad_word_ids, *words)))
    return dataclasses.replace(params, bad_words=(), bad_word_ids=words)


def prompt_token_ids(prompt, tokenizer, name: str, vocab_size: int | None = None,
                     context: int | None = None) -> list[int]:
    """The token ids of one prompt (a string, or token ids as a list, a 1-d numpy array or tensor; numpy and torch
    integers count as ints), checked: a string needs a tokenizer and only characters it knows; ids are ints in
    [0, vocab_size); at least one token, at most `context`. Errors are ParamError (a ValueError) naming `name`, or
    TypeError for a value of the wrong type."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise TypeError(f"{name} is text but there is no tokenizer; pass token ids, or a tokenizer")
        prompt = encode_prompt(tokenizer, prompt, name)
    ids = as_int_list(prompt)
    if ids is None:
        raise TypeError(f"{name} must be a string or a list of token ids, got {prompt!r}")
    if not ids:
        raise ParamError(name, f"{name} must hold at least one token, got an empty prompt")
    if min(ids) < 0 or (vocab_size is not None and max(ids) >= vocab_size):
        raise ParamError(name, f"{name} token ids must be in [0, {vocab_size}), got {min(ids)}..{max(ids)}")
    check_prompt_fits(len(ids), context, name)
    return ids


def eos_token_ids(model, tokenizer=None) -> set[int]:
    """The ids that end a sample: the model's generation config, else its config, else the tokenizer's EOS."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(getattr(model, "config", None), "eos_token_id", None)
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return set()
    return {int(eos)} if isinstance(eos, int) else {int(t) for t in eos}


def finish_reason(params: SamplingParams, token: int, num_output: int, num_tokens: int,
                  eos_ids: set[int], context: int | None,
                  text: IncrementalDetokenizer | None) -> str | None:
    """Why a sample ends with `token` (the last of its `num_output` output tokens; prompt + output is `num_tokens`
    long), or None (the counts, not the lists: an engine asks at every token of every sample):
    "stop" for EOS (unless `ignore_eos`), a stop token, or a stop string in the output text (`text`: the sample's
    IncrementalDetokenizer, already pushed `token`; stop strings need one); "length" for `max_tokens` or a full
    context. Before the output holds `min_tokens` tokens only "length" can end it (the sampler masks EOS and the stop
    tokens until then, and `text` matches no stop string)."""
    if num_output < params.min_tokens:
        return "length" if context is not None and num_tokens >= context else None
    if token in params.stop_token_ids or (token in eos_ids and not params.ignore_eos):
        return "stop"
    if params.stop and text is not None and text.stopped:
        return "stop"
    if num_output >= params.max_tokens or (context is not None and num_tokens >= context):
        return "length"
    return None


def quiet_finish(params: SamplingParams, num_prompt_tokens: int, eos_ids: set[int],
                 context: int | None) -> tuple[frozenset[int], int] | None:
    """What `finish_reason` guarantees of a sample without stop strings: (the tokens that may end it, the length in
    tokens that ends it). Below that length any other token leaves it running, so an engine need not ask the rule
    at every token (`SequenceState.quiet`). None with stop strings, which the output's text decides."""
    if params.stop:
        return None
    ends = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else frozenset(eos_ids))
    length = num_prompt_tokens + params.max_tokens
    return ends, length if context is None else min(length, context)


def text_decoder(tokenizer) -> Callable[[list[int]], str] | None:
    """Token ids -> text with special tokens skipped, or None without a tokenizer."""
    if tokenizer is None:
        return None
    return lambda token_ids: tokenizer.decode(token_ids, skip_special_tokens=True)


def output_text(token_ids: list[int], params: SamplingParams, decode: Callable[[list[int]], str] | None) -> str | None:
    """The text of an output: decoded with special tokens skipped, and cut before the first stop string (after it
    with `include_stop_str_in_output`); with `min_tokens`, a stop string that ends within the text of the first
    `min_tokens - 1` tokens does not count, as in `IncrementalDetokenizer`."""
    if decode is None:
        return None
    text = decode(token_ids)
    if not params.stop:
        return text
    after = len(decode(token_ids[:params.min_tokens - 1])) if params.min_tokens > 1 else 0
    return truncate_at_stop(text, params.stop, params.include_stop_str_in_output, after)[0]
