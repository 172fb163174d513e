"""An OpenAI-compatible HTTP server over the engine: `python -m decodelab.serve --model tiny-zh`.

Routes: POST /v1/completions (streaming by server-sent events, n, seed, stop, logprobs, the penalties, vLLM's
top_k / min_p / repetition_penalty / ignore_eos), GET /v1/models, GET /health, GET /metrics (Prometheus text).
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

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from decodelab.engine.async_engine import BATCHING, AsyncEngine, EngineFailed, QueueFull, RequestStream
from decodelab.decoding.detokenize import IncrementalDetokenizer
from decodelab.engine.engine import Engine, TokenEvent
from decodelab.serve.protocol import (CompletionRequest, choice_json, completion_id, completion_json, error_body,
                                       logprobs_json, usage_json)
from decodelab.decoding.request import Completion
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


def create_app(engine: Engine, model_name: str, max_queue_len: int = 256, batching: str = "continuous") -> FastAPI:
    """The FastAPI app serving `engine` (which must have a tokenizer) under the model name `model_name`."""
    if engine.tokenizer is None:
        raise ValueError("the engine needs a tokenizer to serve text: Engine(model, tokenizer)")
    if not isinstance(model_name, str) or not model_name:
        raise ValueError(f"model_name must be a non-empty string, got {model_name!r}")
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

    @app.post("/v1/completions")
    async def completions(request: Request):
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            return _error(400, f"the body must be JSON: {error}")
        if not isinstance(body, dict):
            return _error(400, f"the body must be a JSON object, got {type(body).__name__}")
        try:
            parsed = CompletionRequest.model_validate(body)
        except ValidationError as error:
            return _validation_error(error)
        if parsed.model != model_name:
            return _error(404, f"the model {parsed.model!r} does not exist; this server serves {model_name!r}",
                          "model", code="model_not_found")
        try:
            grammar = None
            if parsed.structured_outputs is not None:
                grammar = parsed.structured_outputs.build(tokenizer, engine.runner.vocab_size)
                if not bool(grammar.start().mask().any()):
                    raise ParamError("structured_outputs", "structured_outputs allows no first token with this "
                                                           "model's vocabulary (JSON needs ASCII braces and quotes, "
                                                           "which tiny-zh lacks)")
            prompt_ids = [engine.check_prompt(p, "prompt") for p in parsed.prompts()]   # each part checked once
            params = parsed.sampling_params(grammar, engine.max_model_len - max(len(ids) for ids in prompt_ids))
            checked = [engine.check_params(ids, params, "prompt") for ids in prompt_ids]
            for ids in prompt_ids:        # as OpenAI and vLLM: refused, not cut short at the context
                if len(ids) + params.max_tokens > engine.max_model_len:
                    raise ParamError("max_tokens", f"this model's context is {engine.max_model_len} tokens; the prompt "
                                                   f"has {len(ids)} and max_tokens asks for {params.max_tokens} more")
        except ParamError as error:
            return _error(400, str(error), error.param)
        except (TypeError, ValueError) as error:
            return _error(400, str(error), "prompt")
        try:
            streams = runner.submit(checked)
        except QueueFull as error:
            return _error(503, f"the server is overloaded: {error}; retry later", kind="server_overloaded",
                          code="queue_full")
        request_id = completion_id()
        if parsed.stream:
            include_usage = parsed.stream_options is not None and parsed.stream_options.include_usage
            return StreamingResponse(_stream(runner, streams, request_id, model_name, tokenizer, include_usage),
                                     media_type="text/event-stream")
        return await _complete(request, runner, streams, request_id, model_name, tokenizer)

    return app


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _complete(request: Request, runner: AsyncEngine, streams: list[RequestStream], request_id: str,
                    model: str, tokenizer) -> JSONResponse:
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
            done = waiting.result()
        except EngineFailed as error:
            return _error(500, str(error), kind="server_error")
    finally:
        watcher.cancel()
    choices, prompt_tokens, completion_tokens = [], 0, 0
    for completion in done:
        samples = completion.samples or (completion,)
        prompt_tokens += len(completion.prompt_token_ids)
        for sample in samples:
            choices.append(choice_json(len(choices), sample, tokenizer))
            completion_tokens += len(sample.token_ids)
    return JSONResponse(completion_json(request_id, model, choices, usage_json(prompt_tokens, completion_tokens)))


def _sse(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


async def _stream(runner: AsyncEngine, streams: list[RequestStream], request_id: str, model: str, tokenizer,
                  include_usage: bool) -> AsyncIterator[bytes]:
    """Server-sent events: a chunk per token (text held back while it could be the start of a stop string), a
    last chunk per choice with its finish_reason, optionally the usage, then [DONE]. Choice i * n + j is sample j
    of prompt i. If the client disconnects, the generator is closed and every request is aborted."""
    merged: asyncio.Queue = asyncio.Queue()

    async def forward(index: int, stream: RequestStream) -> None:
        try:
            async for item in stream:
                await merged.put((index, item))
        except EngineFailed as error:
            await merged.put((index, error))

    n = streams[0].params.n
    stop = streams[0].params.stop
    texts: dict[int, IncrementalDetokenizer] = {}          # choice -> its text, decoded as the tokens come
    offsets: dict[int, int] = {}                           # choice -> text offset of the next logprobs entry
    forwarders = [asyncio.ensure_future(forward(i, s)) for i, s in enumerate(streams)]
    prompt_tokens = completion_tokens = 0
    try:
        remaining = len(streams)
        while remaining:
            index, item = await merged.get()
            if isinstance(item, Exception):
                yield _sse(error_body(str(item), kind="server_error"))
                return
            if isinstance(item, Completion):
                remaining -= 1
                prompt_tokens += len(item.prompt_token_ids)
                continue
            event: TokenEvent = item
            choice = index * n + event.sample_index
            completion_tokens += 1
            text = texts.setdefault(choice, IncrementalDetokenizer(tokenizer, stop))
            delta = text.push(event.token_id)
            if event.finish_reason is not None:
                delta += text.finish()
            logprobs = None
            if event.logprob is not None:
                logprobs = logprobs_json([event.logprob], tokenizer, offsets.get(choice, 0))
                offsets[choice] = offsets.get(choice, 0) + len(tokenizer.decode([event.token_id],
                                                                                skip_special_tokens=True))
            if delta or logprobs is not None or event.finish_reason is not None:
                chunk = {"index": choice, "text": delta, "logprobs": logprobs, "finish_reason": event.finish_reason}
                yield _sse(completion_json(request_id, model, [chunk], None))
        if include_usage:
            yield _sse(completion_json(request_id, model, [], usage_json(prompt_tokens, completion_tokens)))
        yield _sse("[DONE]")
    finally:
        for stream in streams:
            runner.abort(stream)                           # a no-op for finished requests
        for task in forwarders:
            task.cancel()


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
                        max_num_seqs=args.max_num_seqs)
        app = create_app(engine, args.served_model_name or args.model, args.max_queue_len, args.batching)
    except ValueError as error:
        parser.error(str(error))
    print(f"decodelab: serving {args.served_model_name or args.model} at http://{args.host}:{args.port}/v1 "
          f"({args.batching} batching, up to {args.max_num_seqs} sequences)", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)

