"""The OpenAI completions and chat completions APIs as the server reads and writes them: request fields, errors,
response JSON.

Fields follow OpenAI's `/v1/completions` and `/v1/chat/completions`; `top_k`, `min_p`, `repetition_penalty`,
`stop_token_ids`, `ignore_eos`, `min_tokens`, `bad_words`, `allowed_token_ids`, `include_stop_str_in_output`,
`prompt_logprobs` and `structured_outputs` (`{"regex": ...}`, `{"choice": [...]}`, `{"json": schema}` or
`{"grammar": lark}`, vLLM's current names) are the extra fields vLLM accepts (the `openai` client sends them with
`extra_body`). `echo` on completions returns the prompt's text and, with `logprobs`, its token logprobs (null for the first
token, as OpenAI); on chat (vLLM's extra) it puts the last message's text before the reply when the two share a role,
and asks for the prompt's log-probabilities (`prompt_logprobs`, at the response's top level as vLLM returns them). A field OpenAI defines that this server cannot honour (`suffix`, `best_of` != n, `echo` with `stream`; on the
chat route `tools`, `tool_choice`, `functions`, `audio`, `modalities`, ... in `UNSUPPORTED_CHAT_FIELDS`) is refused
with a 400 that names it, never ignored; an unknown field is refused too, so a typo (`temprature`) is not silently
the default. As vLLM, n > 1 with greedy sampling (temperature 0) is refused.

    request = CompletionRequest.model_validate(body)      # pydantic: types
    params = request.sampling_params()                     # decodelab.SamplingParams: ranges (ParamError)

Used by: decodelab.serve.app. Taught in: chapters/07c-serving.ipynb
"""
from __future__ import annotations

import time
import uuid

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt

from decodelab.decoding.request import Completion, TokenLogprob
from decodelab.sampling.params import MAX_LOGPROBS
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


class SamplingFields(BaseModel):
    """The sampling fields both routes take (OpenAI's, then vLLM's extras). Types are checked here; value ranges by
    `SamplingParams`."""
    model_config = ConfigDict(extra="forbid")

    model: str
    temperature: StrictFloat | None = 1.0
    top_p: StrictFloat | None = 1.0
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    presence_penalty: StrictFloat | None = 0.0
    frequency_penalty: StrictFloat | None = 0.0
    seed: StrictInt | None = None
    user: str | None = None
    logit_bias: dict[str, StrictFloat | StrictInt] | None = None
    # vLLM's extra sampling fields
    top_k: StrictInt | None = 0
    min_p: StrictFloat | None = 0.0
    repetition_penalty: StrictFloat | None = 1.0
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool = False
    structured_outputs: StructuredOutputs | None = None
    min_tokens: StrictInt = 0
    bad_words: list[str] | None = None
    allowed_token_ids: list[StrictInt] | None = None
    include_stop_str_in_output: StrictBool = False

    def _common_params(self, max_tokens: int | None, room: int | None, logprobs: int | None, grammar,
                       max_tokens_name: str = "max_tokens", **extra) -> SamplingParams:
        """The request as `SamplingParams`; `max_tokens: null` means `room`, what the context leaves after the
        longest prompt (vLLM's rule). Raises ParamError naming the field for anything out of range."""
        if self.stream_options is not None and not self.stream:
            raise ParamError("stream_options", "stream_options is only allowed with stream=true")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stop) > MAX_STOP_STRINGS:
            raise ParamError("stop", f"stop takes at most {MAX_STOP_STRINGS} strings, got {len(stop)}")
        resolved = room if max_tokens is None else max_tokens
        if resolved is None or resolved < 1:
            raise ParamError(max_tokens_name, f"{max_tokens_name} must be an int >= 1, got {max_tokens!r}"
                                              + ("" if max_tokens is not None else " and the prompt leaves no room"))
        top_k = self.top_k if self.top_k != -1 else 0          # vLLM's -1 means "off", as 0 does here
        defaults = {"temperature": 1.0, "top_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                    "min_p": 0.0, "repetition_penalty": 1.0, "top_k": 0}
        values = {name: getattr(self, name) for name in defaults} | {"top_k": top_k}
        values = {name: defaults[name] if value is None else value for name, value in values.items()}
        if values["temperature"] == 0 and self.n > 1:            # vLLM's rule: n identical greedy samples
            raise ParamError("n", f"n must be 1 when using greedy sampling (temperature 0), got {self.n}")
        if self.min_tokens > resolved:
            raise ParamError("min_tokens", f"min_tokens must be <= {max_tokens_name}={resolved}, got {self.min_tokens}")
        return SamplingParams(**values, n=self.n, max_tokens=resolved, seed=self.seed, stop=tuple(stop),
                              stop_token_ids=tuple(self.stop_token_ids or ()), ignore_eos=self.ignore_eos,
                              logprobs=logprobs, grammar=grammar, logit_bias=self._logit_bias(),
                              min_tokens=self.min_tokens, bad_words=tuple(self.bad_words or ()),
                              allowed_token_ids=(None if self.allowed_token_ids is None
                                                 else tuple(self.allowed_token_ids)),
                              include_stop_str_in_output=self.include_stop_str_in_output, **extra)

    def _logit_bias(self) -> tuple[tuple[int, float], ...]:
        """OpenAI sends `logit_bias` with token ids as JSON object keys, so as strings: {"5": -100}."""
        pairs = []
        for key, bias in (self.logit_bias or {}).items():
            if not (key.isascii() and key.isdigit()):
                raise ParamError("logit_bias", f"logit_bias keys must be token ids, got {key!r}")
            pairs.append((int(key), bias))
        return tuple(pairs)

    def grammar_spec(self) -> StructuredOutputs | None:
        return self.structured_outputs


class CompletionRequest(SamplingFields):
    """One POST /v1/completions body."""
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    max_tokens: StrictInt | None = 16
    logprobs: StrictInt | None = None
    echo: StrictBool = False
    suffix: str | None = None
    best_of: StrictInt | None = None
    prompt_logprobs: StrictInt | None = None               # vLLM's

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
        the tokenizer). `echo` with `logprobs` asks for the prompt's log-probabilities too (OpenAI's way;
        `prompt_logprobs` is vLLM's). Raises ParamError naming the field for anything out of range or not supported."""
        if self.suffix:
            raise ParamError("suffix", f"suffix is not supported by this server, got {self.suffix!r}")
        if self.best_of is not None and self.best_of != self.n:
            raise ParamError("best_of", f"best_of must equal n ({self.n}) here: this server returns every sample it "
                                        f"draws, got best_of={self.best_of}")
        if self.echo and self.stream:
            raise ParamError("echo", "echo is not supported with stream=true by this server")
        prompt_logprobs = self.prompt_logprobs
        if self.echo and self.logprobs is not None and prompt_logprobs is None:
            prompt_logprobs = self.logprobs
        return self._common_params(self.max_tokens, room, self.logprobs, grammar, prompt_logprobs=prompt_logprobs)


# OpenAI chat fields this server does not honour: each is refused with a 400 naming it, never ignored
UNSUPPORTED_CHAT_FIELDS = {
    "tools": "tool calling", "tool_choice": "tool calling", "parallel_tool_calls": "tool calling",
    "functions": "function calling", "function_call": "function calling", "audio": "audio output",
    "modalities": "output modalities other than text", "prediction": "predicted outputs",
    "web_search_options": "web search", "reasoning_effort": "reasoning models", "service_tier": "service tiers",
    "store": "stored completions", "metadata": "stored completions", "verbosity": "verbosity",
}


class ChatMessage(BaseModel):
    """One message: a role and its text (a string or text parts); `name` is passed to the template."""
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict]
    name: str | None = None


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str
    description: str | None = None
    json_schema: dict | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ChatCompletionRequest(SamplingFields):
    """One POST /v1/chat/completions body."""
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
    response_format: ResponseFormat | None = None
    # vLLM's chat extras
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    echo: StrictBool = False
    prompt_logprobs: StrictInt | None = None

    def message_dicts(self) -> list[dict]:
        """The messages as the chat template reads them: role and text content (and name when given)."""
        from decodelab.serve.chat import message_text

        out = []
        for i, message in enumerate(self.messages):
            entry = {"role": message.role, "content": message_text(message.content, i)}
            if message.name is not None:
                entry["name"] = message.name
            out.append(entry)
        if self.continue_final_message and (self.add_generation_prompt or out[-1]["role"] != "assistant"):
            raise ParamError("continue_final_message", "continue_final_message needs add_generation_prompt=false "
                                                       "and an assistant message last")
        return out

    def grammar_spec(self) -> StructuredOutputs | None:
        """`structured_outputs` (vLLM's), or what `response_format` asks for (OpenAI's); not both."""
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return self.structured_outputs
        if self.structured_outputs is not None:
            raise ParamError("response_format", "give response_format or structured_outputs, not both")
        if fmt.type == "json_object":
            return StructuredOutputs.model_validate({"json": {"type": "object"}})
        if fmt.json_schema is None or fmt.json_schema.json_schema is None:
            raise ParamError("response_format", "response_format of type json_schema needs json_schema.schema")
        return StructuredOutputs.model_validate({"json": fmt.json_schema.json_schema})

    def sampling_params(self, grammar=None, room: int | None = None) -> SamplingParams:
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise ParamError("max_completion_tokens", "give max_completion_tokens or max_tokens (deprecated), not both")
        name = "max_tokens" if self.max_tokens is not None else "max_completion_tokens"
        limit = self.max_completion_tokens if self.max_tokens is None else self.max_tokens
        if self.top_logprobs is not None and not self.logprobs:
            raise ParamError("top_logprobs", "top_logprobs needs logprobs=true")
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= MAX_LOGPROBS:
            raise ParamError("top_logprobs", f"top_logprobs must be an int in [0, {MAX_LOGPROBS}], got "
                                             f"{self.top_logprobs}")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        if self.stream and self.prompt_logprobs is not None and self.prompt_logprobs != 0:
            raise ParamError("prompt_logprobs", f"prompt_logprobs are not available with stream=true (vLLM's rule), "
                                                f"got {self.prompt_logprobs}")
        return self._common_params(limit, room, logprobs, grammar, max_tokens_name=name,
                                   prompt_logprobs=None if self.stream else self.prompt_logprobs_asked())

    def prompt_logprobs_asked(self) -> int | None:
        """vLLM's chat rule: `prompt_logprobs`, or with `echo` the `top_logprobs` (0 when not given: the prompt
        tokens' own log-probabilities)."""
        if self.prompt_logprobs is None and self.echo:
            return self.top_logprobs or 0
        return self.prompt_logprobs

    def echo_role(self) -> str:
        """The role of the reply (vLLM's `get_chat_request_role`): the assistant's after a generation prompt, else
        the last message's, which the reply continues."""
        return "assistant" if self.add_generation_prompt else self.messages[-1].role

    def echoed_text(self, messages: list[dict]) -> str:
        """What `echo` puts before each reply (vLLM's chat echo): the last message's text (as the template read it,
        `messages` from `message_dicts`) when its role is the reply's, else nothing."""
        if not self.echo or messages[-1]["role"] != self.echo_role():
            return ""
        return messages[-1]["content"]


def error_body(message: str, param: str | None = None, kind: str = "invalid_request_error",
               code: str | None = None) -> dict:
    """OpenAI's error JSON: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"


def logprobs_json(entries: list[TokenLogprob], tokenizer, offset: int) -> dict:
    """The legacy completions `logprobs` object for `entries`, whose text starts at character `offset`. A special
    token (`</s>` after `ignore_eos`, `<s>` of an echoed prompt) is named in `tokens` but adds nothing to the text,
    so `text_offset` skips it. An entry whose logprob is None (an echoed prompt's first token) has null
    `token_logprobs` and `top_logprobs` (OpenAI's echo)."""
    tokens = [tokenizer.decode([e.token_id]) for e in entries]
    offsets, position = [], offset
    for entry in entries:
        offsets.append(position)
        position += len(tokenizer.decode([entry.token_id], skip_special_tokens=True))
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [None if e.logprob is None else {tokenizer.decode([t]): lp for t, lp in e.top}
                             for e in entries],
            "text_offset": offsets}


def choice_json(index: int, sample: Completion, tokenizer, echo: Completion | None = None) -> dict:
    """A completions choice. With `echo` (the request's Completion, which holds the prompt and, when asked, its
    log-probabilities) the text and the logprobs start with the prompt's, its first token's logprob null (OpenAI)."""
    text, entries = sample.text, None if sample.logprobs is None else list(sample.logprobs)
    if echo is not None:
        text = tokenizer.decode(echo.prompt_token_ids, skip_special_tokens=True) + text
        if entries is not None:
            prompt = echo.prompt_logprobs or (None,) * len(echo.prompt_token_ids)
            entries = [entry if entry is not None else TokenLogprob(token, None, ())
                       for token, entry in zip(echo.prompt_token_ids, prompt)] + entries
    logprobs = None if entries is None else logprobs_json(entries, tokenizer, 0)
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": sample.finish_reason}


def prompt_logprobs_json(completion: Completion, tokenizer) -> list[dict | None] | None:
    """vLLM's `prompt_logprobs`: per prompt token, None for the first, else {token id: {"logprob", "rank",
    "decoded_token"}} for the prompt's own token and the top alternatives."""
    if completion.prompt_logprobs is None:
        return None
    out: list[dict | None] = []
    for entry in completion.prompt_logprobs:
        if entry is None:
            out.append(None)
            continue
        ranked = {entry.token_id: (entry.logprob, entry.rank)}
        for rank, (token, logprob) in enumerate(entry.top, start=1):
            ranked.setdefault(token, (logprob, rank))
        out.append({str(token): {"logprob": logprob, "rank": rank, "decoded_token": tokenizer.decode([token])}
                    for token, (logprob, rank) in ranked.items()})
    return out


def chat_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def _token_json(tokenizer, token: int, logprob: float) -> dict:
    text = tokenizer.decode([token])
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs_json(entries: list[TokenLogprob], tokenizer) -> dict:
    """The chat `logprobs` object: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]}."""
    return {"content": [_token_json(tokenizer, e.token_id, e.logprob)
                        | {"top_logprobs": [_token_json(tokenizer, t, lp) for t, lp in e.top]} for e in entries],
            "refusal": None}


def chat_choice_json(index: int, sample: Completion, tokenizer, echoed: str = "") -> dict:
    """A chat choice: the reply's text after `echoed` (the echoed last message, vLLM's chat `echo`). The role stays
    "assistant", the only one OpenAI's response type allows (vLLM writes the last message's role when there is no
    generation prompt)."""
    logprobs = None if sample.logprobs is None else chat_logprobs_json(list(sample.logprobs), tokenizer)
    return {"index": index, "message": {"role": "assistant", "content": echoed + sample.text, "refusal": None},
            "logprobs": logprobs, "finish_reason": sample.finish_reason}


def chat_completion_json(request_id: str, model: str, choices: list[dict], usage: dict | None,
                         chunk: bool = False) -> dict:
    body = {"id": request_id, "object": "chat.completion.chunk" if chunk else "chat.completion",
            "created": int(time.time()), "model": model, "choices": choices}
    if usage is not None or not chunk:
        body["usage"] = usage
    return body


def usage_json(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_json(request_id: str, model: str, choices: list[dict], usage: dict | None) -> dict:
    body = {"id": request_id, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices}
    if usage is not None:
        body["usage"] = usage
    return body
