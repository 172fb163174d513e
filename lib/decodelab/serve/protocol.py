"""The OpenAI completions API as the server reads and writes it: request fields, errors, response JSON.

Fields follow OpenAI's `/v1/completions`; `top_k`, `min_p`, `repetition_penalty`, `stop_token_ids`, `ignore_eos`
and `structured_outputs` (`{"regex": ...}`, `{"choice": [...]}`, `{"json": schema}` or `{"grammar": lark}`, vLLM's
current names) are the extra fields vLLM accepts (the `openai` client sends them with `extra_body`). A field OpenAI
defines that this server cannot honour (`echo`, `suffix`, `best_of` != n) is refused with a 400 that
says so, never ignored; an unknown field is refused too, so a typo (`temprature`) is not silently the default.

    request = CompletionRequest.model_validate(body)      # pydantic: types
    params = request.sampling_params()                     # decodelab.SamplingParams: ranges (ParamError)

Used by: decodelab.serve.app. Taught in: chapters/07c-serving.ipynb
"""
from __future__ import annotations

import time
import uuid

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt

from decodelab.decoding.request import Completion, TokenLogprob
from decodelab.sampling.sampler import SamplingParams
from decodelab.validation import ParamError

MAX_STOP_STRINGS = 4  # as OpenAI


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: exactly one of a regex, a list of choices, a JSON schema or a Lark grammar."""
    model_config = ConfigDict(extra="forbid")
    regex: str | None = None
    choice: list[str] | None = None
    json_schema: dict | str | None = Field(default=None, alias="json")
    grammar: str | None = None

    def build(self, tokenizer, vocab_size: int):
        """The `decodelab.grammar.base` Grammar this asks for, compiled by llguidance against `tokenizer`."""
        from decodelab.grammar.backends import LLGuidanceGrammar

        given = [name for name in ("regex", "choice", "json_schema", "grammar") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ParamError("structured_outputs", f"structured_outputs takes exactly one of regex, choice, json, "
                                                   f"grammar; got {len(given)}")
        if self.choice is not None:
            if not self.choice or not all(isinstance(c, str) and c for c in self.choice):
                raise ParamError("structured_outputs", "structured_outputs.choice must be a non-empty list of "
                                                       "non-empty strings")
            return LLGuidanceGrammar.regex("|".join(_escape(c) for c in self.choice), tokenizer, vocab_size)
        try:
            if self.regex is not None:
                return LLGuidanceGrammar.regex(self.regex, tokenizer, vocab_size)
            if self.json_schema is not None:
                return LLGuidanceGrammar.json_schema(self.json_schema, tokenizer, vocab_size)
            return LLGuidanceGrammar.lark(self.grammar, tokenizer, vocab_size)
        except (ParamError, ValueError, RuntimeError) as error:
            raise ParamError("structured_outputs", f"structured_outputs: {error}") from error


def _escape(text: str) -> str:
    """`text` as a regex that matches it literally."""
    return "".join("\\" + ch if ch in r"\.+*?()|[]{}^$/" else ch for ch in text)


class CompletionRequest(BaseModel):
    """One POST /v1/completions body. Types are checked here; value ranges by `SamplingParams`."""
    model_config = ConfigDict(extra="forbid")

    model: str
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    max_tokens: StrictInt | None = 16
    temperature: StrictFloat | None = 1.0
    top_p: StrictFloat | None = 1.0
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    logprobs: StrictInt | None = None
    stop: str | list[str] | None = None
    presence_penalty: StrictFloat | None = 0.0
    frequency_penalty: StrictFloat | None = 0.0
    seed: StrictInt | None = None
    user: str | None = None
    echo: StrictBool = False
    suffix: str | None = None
    logit_bias: dict[str, StrictFloat | StrictInt] | None = None
    best_of: StrictInt | None = None
    # vLLM's extra sampling fields
    top_k: StrictInt | None = 0
    min_p: StrictFloat | None = 0.0
    repetition_penalty: StrictFloat | None = 1.0
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool = False
    structured_outputs: StructuredOutputs | None = None

    def prompts(self) -> list[str] | list[list[int]]:
        """The prompts as a list: OpenAI accepts one string, many strings, one token list or many token lists."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if not prompt:
            raise ParamError("prompt", "prompt must not be an empty list")
        if isinstance(prompt[0], int):
            return [prompt]
        return list(prompt)

    def sampling_params(self, grammar=None, room: int | None = None) -> SamplingParams:
        """The request as `SamplingParams` (with `grammar`, built from `structured_outputs` by the caller, who has
        the tokenizer); `max_tokens: null` means `room`, what the context leaves after the longest prompt (vLLM's
        rule). Raises ParamError naming the field for anything out of range or not supported."""
        unsupported = [("echo", self.echo), ("suffix", self.suffix)]
        for name, value in unsupported:
            if value:
                raise ParamError(name, f"{name} is not supported by this server, got {value!r}")
        if self.best_of is not None and self.best_of != self.n:
            raise ParamError("best_of", f"best_of must equal n ({self.n}) here: this server returns every sample it "
                                        f"draws, got best_of={self.best_of}")
        if self.stream_options is not None and not self.stream:
            raise ParamError("stream_options", "stream_options is only allowed with stream=true")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stop) > MAX_STOP_STRINGS:
            raise ParamError("stop", f"stop takes at most {MAX_STOP_STRINGS} strings, got {len(stop)}")
        max_tokens = room if self.max_tokens is None else self.max_tokens
        if max_tokens is None or max_tokens < 1:
            raise ParamError("max_tokens", f"max_tokens must be an int >= 1, got {self.max_tokens!r}"
                                           + ("" if self.max_tokens is not None else " and the prompt leaves no room"))
        top_k = self.top_k if self.top_k != -1 else 0          # vLLM's -1 means "off", as 0 does here
        defaults = {"temperature": 1.0, "top_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                    "min_p": 0.0, "repetition_penalty": 1.0, "top_k": 0}
        values = {name: getattr(self, name) for name in defaults} | {"top_k": top_k}
        values = {name: defaults[name] if value is None else value for name, value in values.items()}
        return SamplingParams(**values, n=self.n, max_tokens=max_tokens, seed=self.seed, stop=tuple(stop),
                              stop_token_ids=tuple(self.stop_token_ids or ()), ignore_eos=self.ignore_eos,
                              logprobs=self.logprobs, grammar=grammar, logit_bias=self._logit_bias())

    def _logit_bias(self) -> tuple[tuple[int, float], ...]:
        """OpenAI sends `logit_bias` with token ids as JSON object keys, so as strings: {"5": -100}."""
        pairs = []
        for key, bias in (self.logit_bias or {}).items():
            if not (key.isascii() and key.isdigit()):
                raise ParamError("logit_bias", f"logit_bias keys must be token ids, got {key!r}")
            pairs.append((int(key), bias))
        return tuple(pairs)


def error_body(message: str, param: str | None = None, kind: str = "invalid_request_error",
               code: str | None = None) -> dict:
    """OpenAI's error JSON: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"


def logprobs_json(entries: list[TokenLogprob], tokenizer, offset: int) -> dict:
    """The legacy completions `logprobs` object for `entries`, whose text starts at character `offset`. A special
    token (`</s>` after `ignore_eos`) is named in `tokens` but adds nothing to the text, so `text_offset` skips it."""
    tokens = [tokenizer.decode([e.token_id]) for e in entries]
    offsets, position = [], offset
    for entry in entries:
        offsets.append(position)
        position += len(tokenizer.decode([entry.token_id], skip_special_tokens=True))
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{tokenizer.decode([t]): lp for t, lp in e.top} for e in entries],
            "text_offset": offsets}


def choice_json(index: int, sample: Completion, tokenizer) -> dict:
    logprobs = None if sample.logprobs is None else logprobs_json(list(sample.logprobs), tokenizer, 0)
    return {"index": index, "text": sample.text, "logprobs": logprobs, "finish_reason": sample.finish_reason}


def usage_json(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_json(request_id: str, model: str, choices: list[dict], usage: dict | None) -> dict:
    body = {"id": request_id, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices}
    if usage is not None:
        body["usage"] = usage
    return body
