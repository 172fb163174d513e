"""An OpenAI-compatible HTTP server over the engine: `python -m decodelab.serve --model tiny-zh`.

Routes: POST /v1/completions (streaming by server-sent events, n, seed, stop, logprobs, echo, the penalties,
logit_bias, vLLM's top_k / min_p / repetition_penalty / ignore_eos / stop_token_ids / structured_outputs / min_tokens
/ bad_words / allowed_token_ids / include_stop_str_in_output / prompt_logprobs), POST /v1/chat/completions (the same
sampling fields; messages rendered by the chat template, `decodelab.serve.chat`; logprobs / top_logprobs,
max_completion_tokens, response_format, vLLM's echo and prompt_logprobs), GET /v1/models, GET /health, GET /metrics (Prometheus text).
The same `openai` client code talks to this server on a laptop and to `vllm serve` on a GPU:

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    client.completions.create(model="tiny-zh", prompt="小明", max_tokens=20, temperature=0)

One `AsyncEngine` (decodelab.engine.async_engine) runs the engine's steps while requests arrive, so continuous batching
spans HTTP requests; a client that disconnects has its request aborted and its KV blocks freed; beyond
`--max-queue-len` waiting requests a request gets 503 with an OpenAI-style error. Bad requests get 400 with the
error JSON naming the field (`param`), and the server stays up.

Taught in: chapters/07c-serving.ipynb
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from decodelab.decoding.detokenize import IncrementalDetokenizer, sample_detokenizer
from decodelab.decoding.request import Completion, TokenLogprob
from decodelab.engine.async_engine import BATCHING, AsyncEngine, EngineFailed, QueueFull, RequestStream
from decodelab.engine.engine import CheckedRequest, Engine, TokenEvent
from decodelab.sampling.counter_rng import DEFAULT_RNG, RNGS
from decodelab.serve.chat import render_chat, resolve_chat_template
from decodelab.serve.protocol import (UNSUPPORTED_CHAT_FIELDS, ChatCompletionRequest, CompletionRequest,
                                       SamplingFields, chat_choice_json, chat_completion_json, chat_id,
                                       chat_logprobs_json, choice_json, completion_id, completion_json, error_body,
                                       logprobs_json, prompt_logprobs_json, usage_json)
from decodelab.serve.prometheus import ServerMetrics
from decodelab.validation import ParamError

LOOPBACK = "127.0.0.1"


def _error(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
           code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, param, kind, code), status_code=status)


def _validation_error(error: ValidationError) -> JSONResponse:
    first = error.errors()[0]
    loc = [str(part) for part in first["loc"]]
    param = loc[0] if loc else None
    return _error(400, f"{'.'.join(loc) or 'body'}: {first['msg']}", param)


def create_app(engine: Engine, model_name: str, max_queue_len: int = 256, batching: str = "continuous",
               chat_template: str | None = None) -> FastAPI:
    """The FastAPI app serving `engine` (which must have a tokenizer) under the model name `model_name`.
    `chat_template` renders chat prompts (a Jinja template; None: the tokenizer's own, and without one the chat
    route answers 400; `decodelab.serve.chat.resolve_chat_template` picks it as `python -m decodelab.serve` does)."""
    if engine.tokenizer is None:
        raise ValueError("the engine needs a tokenizer to serve text: Engine(model, tokenizer)")
    if not isinstance(model_name, str) or not model_name:
        raise ValueError(f"model_name must be a non-empty string, got {model_name!r}")
    if chat_template is not None and (not isinstance(chat_template, str) or not chat_template.strip()):
        raise ValueError(f"chat_template must be None or a non-empty Jinja template, got {chat_template!r:.100}")
    metrics = ServerMetrics()
    runner = AsyncEngine(engine, max_queue_len, batching, metrics)
    tokenizer = engine.tokenizer
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await runner.start()
        yield
        await runner.stop()

    app = FastAPI(title="decodelab", lifespan=lifespan)
    app.state.runner, app.state.metrics = runner, metrics

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "decodelab", "max_model_len": engine.max_model_len}]}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    async def parse(request: Request, model: type[SamplingFields], refused: dict[str, str]):
        """The body as `model`, or the error response: not JSON, a field the server refuses, bad types, the
        wrong model name."""
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            return _error(400, f"the body must be JSON: {error}")
        if not isinstance(body, dict):
            return _error(400, f"the body must be a JSON object, got {type(body).__name__}")
        for name, feature in refused.items():
            if body.get(name) is not None:
                return _error(400, f"{name} is not supported by this server ({feature}), got {body[name]!r:.100}",
                              name)
        try:
            parsed = model.model_validate(body)
        except ValidationError as error:
            return _validation_error(error)
        if parsed.model != model_name:
            return _error(404, f"the model {parsed.model!r} does not exist; this server serves {model_name!r}",
                          "model", code="model_not_found")
        return parsed

    def check(parsed: SamplingFields, prompt_ids: list[list[int]], name: str) -> list[CheckedRequest]:
        """Each prompt with the request's params, checked by the engine (ParamError naming the field)."""
        grammar = None
        spec = parsed.grammar_spec()
        if spec is not None:
            grammar = spec.build(tokenizer, engine.runner.vocab_size)
            if not bool(grammar.start().mask().any()):
                raise ParamError(_grammar_field(parsed), f"{_grammar_field(parsed)} allows no first token with this "
                                                         f"model's vocabulary (JSON needs ASCII braces and quotes, "
                                                         f"which tiny-zh lacks)")
        params = parsed.sampling_params(grammar, engine.max_model_len - max(len(ids) for ids in prompt_ids))
        checked = [engine.check_params(ids, params, name) for ids in prompt_ids]
        for ids in prompt_ids:        # as OpenAI and vLLM: refused, not cut short at the context
            if len(ids) + params.max_tokens > engine.max_model_len:
                field = "max_completion_tokens" if getattr(parsed, "max_completion_tokens", None) else "max_tokens"
                raise ParamError(field, f"this model's context is {engine.max_model_len} tokens; the prompt "
                                        f"has {len(ids)} and {field} asks for {params.max_tokens} more")
        return checked

    def submit(checked: list[CheckedRequest]):
        try:
            return runner.submit(checked)
        except QueueFull as error:
            return _error(503, f"the server is overloaded: {error}; retry later", kind="server_overloaded",
                          code="queue_full")

    @app.post("/v1/completions")
    async def completions(request: Request):
        parsed = await parse(request, CompletionRequest, {})
        if isinstance(parsed, Response):
            return parsed
        try:
            prompt_ids = [engine.check_prompt(p, "prompt") for p in parsed.prompts()]   # each part checked once
            checked = check(parsed, prompt_ids, "prompt")
        except ParamError as error:
            return _error(400, str(error), error.param)
        except (TypeError, ValueError) as error:
            return _error(400, str(error), "prompt")
        streams = submit(checked)
        if isinstance(streams, Response):
            return streams
        request_id = completion_id()
        if parsed.stream:
            include_usage = parsed.stream_options is not None and parsed.stream_options.include_usage
            return StreamingResponse(_completion_chunks(runner, streams, request_id, model_name, tokenizer,
                                                        include_usage), media_type="text/event-stream")
        done = await _complete(request, runner, streams)
        if isinstance(done, Response):
            return done
        choices, usage = [], _usage(done)
        for completion in done:
            for sample in completion.samples or (completion,):
                choice = choice_json(len(choices), sample, tokenizer, completion if parsed.echo else None)
                if parsed.prompt_logprobs is not None:
                    choice["prompt_logprobs"] = prompt_logprobs_json(completion, tokenizer)
                choices.append(choice)
        return JSONResponse(completion_json(request_id, model_name, choices, usage))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        parsed = await parse(request, ChatCompletionRequest, UNSUPPORTED_CHAT_FIELDS)
        if isinstance(parsed, Response):
            return parsed
        try:
            messages = parsed.message_dicts()
            ids = render_chat(tokenizer, chat_template, messages, parsed.add_generation_prompt,
                              parsed.continue_final_message)
            checked = check(parsed, [engine.check_prompt(ids, "messages")], "messages")
        except ParamError as error:
            return _error(400, str(error), error.param)
        except (TypeError, ValueError) as error:
            return _error(400, str(error), "messages")
        streams = submit(checked)
        if isinstance(streams, Response):
            return streams
        request_id = chat_id()
        if parsed.stream:
            include_usage = parsed.stream_options is not None and parsed.stream_options.include_usage
            return StreamingResponse(_chat_chunks(runner, streams, request_id, model_name, tokenizer, include_usage,
                                                  parsed.echoed_text(messages)), media_type="text/event-stream")
        done = await _complete(request, runner, streams)
        if isinstance(done, Response):
            return done
        samples = [s for completion in done for s in (completion.samples or (completion,))]
        echoed = parsed.echoed_text(messages)
        choices = [chat_choice_json(i, sample, tokenizer, echoed) for i, sample in enumerate(samples)]
        body = chat_completion_json(request_id, model_name, choices, _usage(done))
        if done[0].prompt_logprobs is not None:                 # vLLM returns them at the top level on chat
            body["prompt_logprobs"] = prompt_logprobs_json(done[0], tokenizer)
        return JSONResponse(body)

    def openapi() -> dict:
        """FastAPI's document, with the two POST routes' request bodies (they read the body themselves, to answer
        400 with OpenAI's error JSON rather than FastAPI's 422) described by their pydantic models."""
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            for path, model in (("/v1/completions", CompletionRequest), ("/v1/chat/completions", ChatCompletionRequest)):
                body = model.model_json_schema(ref_template="#/components/schemas/{model}")
                schemas.update(body.pop("$defs", {}))
                schemas[model.__name__] = body
                document["paths"][path]["post"]["requestBody"] = {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi
    return app


def _grammar_field(parsed: SamplingFields) -> str:
    return "response_format" if getattr(parsed, "response_format", None) is not None else "structured_outputs"


def _usage(done: list[Completion]) -> dict:
    return usage_json(sum(len(c.prompt_token_ids) for c in done),
                      sum(len(s.token_ids) for c in done for s in (c.samples or (c,))))


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _complete(request: Request, runner: AsyncEngine,
                    streams: list[RequestStream]) -> list[Completion] | JSONResponse:
    """Wait for every prompt's Completion; abort them all if the client leaves first."""
    async def finish(stream: RequestStream) -> Completion:
        async for item in stream:
            if isinstance(item, Completion):
                return item
        raise EngineFailed("the request ended without a completion")

    waiting = asyncio.gather(*(finish(s) for s in streams))
    watcher = asyncio.ensure_future(_until_disconnect(request))
    try:
        await asyncio.wait({waiting, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not waiting.done():
            waiting.cancel()
            for stream in streams:
                runner.abort(stream)
            return _error(499, "the client closed the request", kind="client_closed")
        try:
            return waiting.result()
        except EngineFailed as error:
            return _error(500, str(error), kind="server_error")
    finally:
        watcher.cancel()


def _sse(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


@dataclass(frozen=True)
class _Piece:
    """What a stream sends for one token of one choice: the new text (held back while it could be the start of a
    stop string), the token's logprob entry, and the finish reason of a choice's last token."""
    choice: int
    text: str
    logprob: TokenLogprob | None
    finish_reason: str | None


async def _pieces(runner: AsyncEngine, streams: list[RequestStream], tokenizer,
                  usage: list[int]) -> AsyncIterator[_Piece | EngineFailed]:
    """Every choice's pieces as the engine makes them (choice i * n + j is sample j of prompt i), and at the end the
    prompt and completion token counts in `usage`. If the consumer stops early, every request is aborted."""
    merged: asyncio.Queue = asyncio.Queue()

    async def forward(index: int, stream: RequestStream) -> None:
        try:
            async for item in stream:
                await merged.put((index, item))
        except EngineFailed as error:
            await merged.put((index, error))

    params = streams[0].params
    texts: dict[int, IncrementalDetokenizer] = {}          # choice -> its text, decoded as the tokens come
    forwarders = [asyncio.ensure_future(forward(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            index, item = await merged.get()
            if isinstance(item, Exception):
                yield item
                return
            if isinstance(item, Completion):
                remaining -= 1
                usage[0] += len(item.prompt_token_ids)
                continue
            event: TokenEvent = item
            choice = index * params.n + event.sample_index
            usage[1] += 1
            text = texts.setdefault(choice, sample_detokenizer(tokenizer, params))
            delta = text.push(event.token_id) if not text.stopped else ""
            if event.finish_reason is not None:
                delta += text.finish()
            yield _Piece(choice, delta, event.logprob, event.finish_reason)
    finally:
        for stream in streams:
            runner.abort(stream)                           # a no-op for finished requests
        for task in forwarders:
            task.cancel()


async def _completion_chunks(runner: AsyncEngine, streams: list[RequestStream], request_id: str, model: str,
                             tokenizer, include_usage: bool) -> AsyncIterator[bytes]:
    """Server-sent events of /v1/completions: a chunk per token with text, a logprob or a finish reason, optionally
    the usage, then [DONE]."""
    usage = [0, 0]
    offsets: dict[int, int] = {}                           # choice -> text offset of the next logprobs entry
    async for piece in _pieces(runner, streams, tokenizer, usage):
        if isinstance(piece, EngineFailed):
            yield _sse(error_body(str(piece), kind="server_error"))
            return
        logprobs = None
        if piece.logprob is not None:
            token = piece.logprob.token_id
            logprobs = logprobs_json([piece.logprob], tokenizer, offsets.get(piece.choice, 0))
            offsets[piece.choice] = offsets.get(piece.choice, 0) + len(tokenizer.decode([token],
                                                                                        skip_special_tokens=True))
        if piece.text or logprobs is not None or piece.finish_reason is not None:
            chunk = {"index": piece.choice, "text": piece.text, "logprobs": logprobs,
                     "finish_reason": piece.finish_reason}
            yield _sse(completion_json(request_id, model, [chunk], None))
    if include_usage:
        yield _sse(completion_json(request_id, model, [], usage_json(*usage)))
    yield _sse("[DONE]")


async def _chat_chunks(runner: AsyncEngine, streams: list[RequestStream], request_id: str, model: str, tokenizer,
                       include_usage: bool, echoed: str = "") -> AsyncIterator[bytes]:
    """Server-sent events of /v1/chat/completions (OpenAI's `chat.completion.chunk`): first each choice's role,
    then (with vLLM's `echo`) each choice's echoed text, then its content deltas (with logprobs when asked), its
    finish reason in its last chunk, optionally a last chunk with the usage and no choices, then [DONE]."""
    usage = [0, 0]
    n = streams[0].params.n
    for choice in range(len(streams) * n):
        yield _sse(chat_completion_json(request_id, model, [{"index": choice, "delta": {"role": "assistant",
                                                                                         "content": ""},
                                                              "logprobs": None, "finish_reason": None}],
                                        None, chunk=True))
    for choice in range(len(streams) * n if echoed else 0):
        yield _sse(chat_completion_json(request_id, model, [{"index": choice, "delta": {"content": echoed},
                                                              "logprobs": None, "finish_reason": None}],
                                        None, chunk=True))
    async for piece in _pieces(runner, streams, tokenizer, usage):
        if isinstance(piece, EngineFailed):
            yield _sse(error_body(str(piece), kind="server_error"))
            return
        logprobs = None if piece.logprob is None else chat_logprobs_json([piece.logprob], tokenizer)
        if piece.text or logprobs is not None or piece.finish_reason is not None:
            delta = {"content": piece.text} if piece.text or logprobs is not None else {}
            chunk = {"index": piece.choice, "delta": delta, "logprobs": logprobs, "finish_reason": piece.finish_reason}
            yield _sse(chat_completion_json(request_id, model, [chunk], None, chunk=True))
    if include_usage:
        yield _sse(chat_completion_json(request_id, model, [], usage_json(*usage), chunk=True))
    yield _sse("[DONE]")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m decodelab.serve", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny-zh", help="tiny-zh, tiny-zh-doc, a hub id or a local path")
    parser.add_argument("--served-model-name", default=None, help="the name clients pass as `model` (default: --model)")
    parser.add_argument("--host", default=LOOPBACK, help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--num-blocks", type=int, default=None)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-queue-len", type=int, default=256)
    parser.add_argument("--batching", choices=BATCHING, default="continuous")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads for the engine")
    parser.add_argument("--rng", choices=RNGS, default=DEFAULT_RNG,
                        help="the requests' random streams: torch (a torch.Generator per seeded request, the book's "
                             "streams) or counter (counter-based, one hashed uniform per token; the same "
                             "distributions, other tokens for the same seed; decodelab.sampling.counter_rng)")
    parser.add_argument("--chat-template", default=None,
                        help="a Jinja chat template, or a file holding one, for /v1/chat/completions (default: the "
                             "tokenizer's; the shipped models, which have none, get decodelab.serve.chat.TOY_TURNS)")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)

    import torch
    import uvicorn

    from decodelab.models.load import load_model

    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    try:
        model, tokenizer = load_model(args.model, device=args.device)
    except (OSError, ValueError) as error:
        parser.error(f"cannot load --model {args.model!r}: {error}")
    try:
        engine = Engine(model, tokenizer, block_size=args.block_size, num_blocks=args.num_blocks,
                        max_num_seqs=args.max_num_seqs, rng=args.rng)
        template = resolve_chat_template(args.model, tokenizer, args.chat_template)
        app = create_app(engine, args.served_model_name or args.model, args.max_queue_len, args.batching, template)
    except ValueError as error:
        parser.error(str(error))
    print(f"decodelab: serving {args.served_model_name or args.model} at http://{args.host}:{args.port}/v1 "
          f"({args.batching} batching, up to {args.max_num_seqs} sequences, {args.rng} random streams)",
          file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)

