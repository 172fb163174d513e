"""The OpenAI-compatible server, called with the official `openai` client over 127.0.0.1: the same tokens as
`Engine.generate`, streams that join to the same text, seeded sampling that repeats, a 400 naming the field for every
bad request (and the server stays up), a 503 when the queue is full, and no KV block held after a client leaves."""
import concurrent.futures
import os
import subprocess
import sys
import json
import socket
import threading
import time

import httpx
import openai
import pytest

from decodelab.engine.engine import Engine
from decodelab.sampling.sampler import SamplingParams
from decodelab.serve.local_server import LocalServer, free_port

pytestmark = pytest.mark.slow  # servers over HTTP, several in child processes

MODEL = "tiny-zh"
PROMPTS = ["小明", "小红在学校", "老师说", "我们明天", "妈妈买了"]


def texts(response) -> list[str]:
    return [c.text for c in sorted(response.choices, key=lambda c: c.index)]


def streamed(client, **kwargs) -> tuple[dict[int, str], dict[int, str], object]:
    """Join a stream's text per choice; also the finish reasons and the usage chunk."""
    joined, reasons, usage = {}, {}, None
    for chunk in client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
        usage = chunk.usage or usage
        for choice in chunk.choices:
            joined[choice.index] = joined.get(choice.index, "") + choice.text
            if choice.finish_reason is not None:
                reasons[choice.index] = choice.finish_reason
    return joined, reasons, usage


def test_models_health_and_metrics_routes(server, client):
    [model] = client.models.list().data
    assert model.id == MODEL
    assert server.get("/health").json() == {"status": "ok"}
    text = server.get("/metrics").text
    for name in ("num_requests_waiting", "num_requests_running", "kv_cache_usage_perc", "num_preemptions_total",
                 "time_to_first_token_seconds_bucket", "inter_token_latency_seconds_bucket"):
        assert f"decodelab:{name}" in text


def test_greedy_equals_engine_generate(client, engine):
    for stop in ([], ["。"], ["喜欢", "了"]):
        params = SamplingParams(temperature=0, max_tokens=40, stop=tuple(stop))
        reference = engine.generate(PROMPTS, params)
        response = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=40, temperature=0, stop=stop)
        assert texts(response) == [r.text for r in reference]
        assert [c.finish_reason for c in sorted(response.choices, key=lambda c: c.index)] == \
               [r.finish_reason for r in reference]
        assert response.usage.completion_tokens == sum(len(r.token_ids) for r in reference)
        assert response.usage.prompt_tokens == sum(len(r.prompt_token_ids) for r in reference)


def test_seeded_sampling_equals_the_engine_and_repeats(client, engine):
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=7, n=2, max_tokens=30)
    reference = engine.generate(PROMPTS[:3], params)
    expected = [s.text for r in reference for s in r.samples]      # choice i * n + j is sample j of prompt i
    kwargs = dict(model=MODEL, prompt=PROMPTS[:3], temperature=0.9, top_p=0.95, seed=7, n=2, max_tokens=30)
    first, second = client.completions.create(**kwargs), client.completions.create(**kwargs)
    assert texts(first) == texts(second) == expected
    other = client.completions.create(**{**kwargs, "seed": 8})
    assert texts(other) != texts(first)


def test_streamed_chunks_join_to_the_same_text(client):
    for kwargs in (dict(temperature=0, max_tokens=40, stop=["喜欢"]),
                   dict(temperature=1.0, seed=3, n=3, max_tokens=40, stop=["。", "了"], logprobs=1),
                   dict(temperature=0.8, seed=5, max_tokens=25, extra_body={"ignore_eos": True})):
        whole = client.completions.create(model=MODEL, prompt=PROMPTS[:2], **kwargs)
        joined, reasons, usage = streamed(client, model=MODEL, prompt=PROMPTS[:2], **kwargs)
        assert [joined[i] for i in range(len(whole.choices))] == texts(whole)
        assert [reasons[c.index] for c in whole.choices] == [c.finish_reason for c in whole.choices]
        assert usage.completion_tokens == whole.usage.completion_tokens


def test_logprobs_match_tokens_and_text(client):
    response = client.completions.create(model=MODEL, prompt="小明", temperature=0, max_tokens=8, logprobs=2,
                                         extra_body={"ignore_eos": True})
    [choice] = response.choices
    lp = choice.logprobs
    assert "".join(lp.tokens).replace("</s>", "") == choice.text   # ignore_eos: </s> is a token, not text
    assert len(lp.token_logprobs) == response.usage.completion_tokens
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) <= 2 and max(top.values()) == pytest.approx(logprob)   # greedy picks the most likely
        assert logprob <= 0
    visible = [t.replace("</s>", "") for t in lp.tokens]
    assert lp.text_offset == [sum(len(t) for t in visible[:i]) for i in range(len(visible))]


def test_max_tokens_null_fills_the_context(client):
    response = client.completions.create(model=MODEL, prompt="小明", max_tokens=None, temperature=0,
                                         extra_body={"ignore_eos": True})
    assert response.usage.prompt_tokens + response.usage.completion_tokens == 256
    assert response.choices[0].finish_reason == "length"


def test_vllm_extra_fields(client, engine):
    params = SamplingParams(temperature=0.7, top_k=5, min_p=0.05, repetition_penalty=1.2, seed=2, max_tokens=20)
    [reference] = engine.generate(["小明"], params)
    response = client.completions.create(model=MODEL, prompt="小明", temperature=0.7, seed=2, max_tokens=20,
                                         extra_body={"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.2})
    assert texts(response) == [reference.text]
    token_prompt = client.completions.create(model=MODEL, prompt=reference.prompt_token_ids, temperature=0.7, seed=2,
                                             max_tokens=20, extra_body={"top_k": 5, "min_p": 0.05,
                                                                        "repetition_penalty": 1.2})
    assert texts(token_prompt) == [reference.text]


def test_logit_bias_moves_the_tokens_as_in_the_engine(client, engine, tiny):
    _, tokenizer = tiny
    banned = tokenizer.convert_tokens_to_ids("。")
    forced = tokenizer.convert_tokens_to_ids("猫")
    params = SamplingParams(temperature=0, max_tokens=12, logit_bias={banned: -100, forced: 7.5})
    [reference] = engine.generate(["小明"], params)
    [plain] = engine.generate(["小明"], SamplingParams(temperature=0, max_tokens=12))
    response = client.completions.create(model=MODEL, prompt="小明", temperature=0, max_tokens=12,
                                         logit_bias={str(banned): -100, str(forced): 7.5})
    assert texts(response) == [reference.text] and reference.text != plain.text
    assert "。" not in reference.text and "猫" in reference.text


BAD_REQUESTS = [
    ({"temperature": -1}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"extra_body": {"top_k": -2}}, "top_k"),
    ({"extra_body": {"min_p": 2}}, "min_p"),
    ({"n": 0}, "n"),
    ({"n": 9}, "n"),                                    # more than the server's max_num_seqs=8
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 300}, "max_tokens"),                # prompt + max_tokens beyond the model's context (256)
    ({"seed": -1}, "seed"),
    ({"stop": [""]}, "stop"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"logprobs": 50}, "logprobs"),
    ({"frequency_penalty": 3}, "frequency_penalty"),
    ({"extra_body": {"repetition_penalty": 0}}, "repetition_penalty"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [10**6]}, "prompt"),                    # a token id outside the vocabulary
    ({"prompt": "小" * 300}, "prompt"),                  # longer than the model's context
    ({"prompt": "hello"}, "prompt"),                    # characters outside the vocabulary
    ({"echo": True, "stream": True}, "echo"),
    ({"best_of": 3}, "best_of"),
    ({"logit_bias": {"x": 1.0}}, "logit_bias"),
    ({"logit_bias": {"5": 500}}, "logit_bias"),
    ({"logit_bias": {"100000": 1}}, "logit_bias"),        # a token id outside the vocabulary
    ({"suffix": "。"}, "suffix"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"extra_body": {"temprature": 0.5}}, "temprature"),
    ({"extra_body": {"stop_token_ids": [10**6]}}, "stop_token_ids"),
]


@pytest.mark.parametrize("fields, param", BAD_REQUESTS, ids=[p for _, p in BAD_REQUESTS])
def test_bad_request_gets_400_naming_the_field(server, client, fields, param):
    kwargs = {"model": MODEL, "prompt": "小明", "max_tokens": 5} | fields
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(**kwargs)
    body = error.value.body
    assert error.value.status_code == 400 and body["type"] == "invalid_request_error"
    assert body["param"] == param and param in body["message"], body
    assert server.get("/health").status_code == 200


def test_malformed_bodies_and_unknown_model(server):
    url = server.base_url + "/completions"
    for content, fragment in [(b"{not json", "must be JSON"), (b"[1, 2]", "must be a JSON object"),
                              (json.dumps({"prompt": "小明"}).encode(), "model")]:
        response = httpx.post(url, content=content, headers={"content-type": "application/json"})
        assert response.status_code == 400 and fragment in response.json()["error"]["message"]
    response = httpx.post(url, json={"model": "gpt-4", "prompt": "小明"})
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
    assert server.get("/health").status_code == 200


def wait_until_idle(server, timeout=15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (server.metric("decodelab:num_requests_running") == 0
                and server.metric("decodelab:kv_cache_usage_perc") == 0):
            return
        time.sleep(0.05)
    raise AssertionError("the server still holds sequences or KV blocks: " + server.get("/metrics").text[:2000])


class GatedEngine(Engine):
    """An engine whose steps run only when the test lets them, so what a client sees never depends on how fast the
    machine is: `allow(k)` lets k more steps run, `open()` lets every step run."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._permits = threading.Semaphore(0)
        self._open = False
        self.waiting = threading.Event()                 # a step (so an admitted request) waits at the gate

    def allow(self, steps: int) -> None:
        for _ in range(steps):
            self._permits.release()

    def open(self) -> None:
        self._open = True
        self._permits.release()

    def step(self):
        if not self._open:
            self.waiting.set()
            self._permits.acquire()
            self.waiting.clear()
        return super().step()


class GatedServer:
    """The server's app over a GatedEngine, served by uvicorn in a thread of this process on 127.0.0.1."""

    def __init__(self, engine: GatedEngine, max_queue_len: int = 256) -> None:
        import uvicorn

        from decodelab.serve.app import create_app

        self.engine = engine
        self.app = create_app(engine, MODEL, max_queue_len)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.aborted = threading.Event()                 # set when the app aborts a request (its client left)
        runner = self.app.state.runner
        abort = runner.abort

        def recording_abort(stream):
            abort(stream)
            self.aborted.set()

        runner.abort = recording_abort
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "GatedServer":
        self.thread.start()
        while not self.server.started:
            assert self.thread.is_alive(), "uvicorn stopped before it started"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.engine.open()
        self.server.should_exit = True
        self.thread.join()

    get = LocalServer.get                                # both read 127.0.0.1:self.port
    metric = LocalServer.metric

    def wait_for_abort(self) -> None:
        """Until the app has aborted a request; the deadline only turns a broken server into a failure, not a hang."""
        assert self.aborted.wait(120), "the server never noticed that the client left"


@pytest.fixture
def gated(tiny):
    model, tokenizer = tiny
    with GatedServer(GatedEngine(model, tokenizer, max_num_seqs=8)) as running:
        yield running


def test_client_that_disconnects_mid_stream_leaves_no_block_held(gated):
    """One step runs (the first token of both samples), the next waits at the gate until the client has left."""
    body = {"model": MODEL, "prompt": "小明", "max_tokens": 250, "ignore_eos": True, "stream": True, "n": 2}
    gated.engine.allow(1)
    with httpx.stream("POST", gated.base_url + "/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        while not next(lines).startswith("data: "):
            pass
        assert gated.metric("decodelab:num_requests_running") == 2     # both samples still running
        lines.close()                                                   # closing the stream disconnects
    gated.wait_for_abort()
    gated.engine.open()
    wait_until_idle(gated)
    assert gated.metric("decodelab:request_aborted_total") == 1


def test_client_that_disconnects_before_a_plain_response_leaves_no_block_held(gated):
    """No step runs until the client has sent the request and closed its connection."""
    body = json.dumps({"model": MODEL, "prompt": "小明", "max_tokens": 200, "ignore_eos": True}).encode()
    with socket.create_connection(("127.0.0.1", gated.port)) as client:
        client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                       b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        assert gated.engine.waiting.wait(120), "the request never reached the engine"
    gated.wait_for_abort()
    gated.engine.open()
    wait_until_idle(gated)
    assert gated.metric("decodelab:request_aborted_total") == 1
    assert gated.metric("decodelab:num_requests_running") == 0


def test_metrics_count_what_was_served(server, client):
    before = server.metric("decodelab:time_to_first_token_seconds_count")
    itl_before = server.metric("decodelab:inter_token_latency_seconds_count")
    client.completions.create(model=MODEL, prompt=PROMPTS[:2], max_tokens=6, temperature=0,
                              extra_body={"ignore_eos": True})
    assert server.metric("decodelab:time_to_first_token_seconds_count") == before + 2
    assert server.metric("decodelab:inter_token_latency_seconds_count") == itl_before + 2 * 5


def test_full_queue_gets_503_and_nothing_is_lost(tiny):
    """With the engine held at its first step, one sequence at a time and a queue of 2: of 8 requests, 2 wait and
    6 are refused, whatever the machine's speed; once the engine runs, the 2 are served in full."""
    model, tokenizer = tiny
    with GatedServer(GatedEngine(model, tokenizer, max_num_seqs=1), max_queue_len=2) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)

        def one(i):
            try:
                response = client.completions.create(model=MODEL, prompt="小明", max_tokens=60, temperature=0,
                                                     extra_body={"ignore_eos": True})
                return "ok", len(response.choices[0].text) > 0
            except openai.APIStatusError as error:
                return error.status_code, error.body

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(one, i) for i in range(8)]
            done, pending = set(), set(futures)
            while len(done) < 6:                                # the refusals come back while the engine waits
                finished, pending = concurrent.futures.wait(pending, timeout=120,
                                                            return_when=concurrent.futures.FIRST_COMPLETED)
                assert finished, f"only {len(done)} of 8 requests were answered while the engine waited"
                done |= finished
            server.engine.open()
            results = [future.result() for future in futures]
        refused = [body for status, body in results if status == 503]
        served = [ok for status, ok in results if status == "ok"]
        assert len(refused) == 6 and len(served) == 2 and all(served), results
        assert all(body["code"] == "queue_full" and body["type"] == "server_overloaded" for body in refused)
        assert server.metric("decodelab:request_refused_total") == 6
        wait_until_idle(server)
        assert server.get("/health").status_code == 200


@pytest.mark.parametrize("args, message", [
    (["--max-num-seqs", "0"], "max_num_seqs must be an int >= 1, got 0"),
    (["--max-queue-len", "0"], "max_queue_len must be an int >= 1, got 0"),
    (["--threads", "0"], "--threads must be >= 1"),
    (["--model", "no-such-model"], "cannot load --model 'no-such-model'"),
    (["--batching", "dynamic"], "invalid choice: 'dynamic'"),
    (["--rng", "philox"], "invalid choice: 'philox'"),
])
def test_bad_command_line_exits_with_a_message(args, message):
    done = subprocess.run([sys.executable, "-m", "decodelab.serve", *args, "--port", "9"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]


def test_structured_outputs_follow_the_grammar(client, tiny):
    import re

    from decodelab.grammar.backends import LLGuidanceGrammar

    pattern = "(小明|小红)(喜欢吃北京烤鸭|坐(飞机|火车)去北京)。"
    response = client.completions.create(model=MODEL, prompt="今天，", max_tokens=30, temperature=1.0, seed=2, n=3,
                                         extra_body={"structured_outputs": {"regex": pattern}})
    assert all(re.fullmatch(pattern, c.text) and c.finish_reason == "stop" for c in response.choices)
    model, tokenizer = tiny
    grammar = LLGuidanceGrammar.regex(pattern, tokenizer)
    [local] = Engine(model, tokenizer).generate(["今天，"], SamplingParams(temperature=1.0, seed=2, n=3,
                                                                          max_tokens=30, grammar=grammar))
    assert texts(response) == [s.text for s in local.samples]
    choice = client.completions.create(model=MODEL, prompt="小明喜欢", max_tokens=10, temperature=0,
                                       extra_body={"structured_outputs": {"choice": ["苹果", "北京烤鸭"]}})
    assert choice.choices[0].text in ("苹果", "北京烤鸭")


@pytest.mark.parametrize("structured, fragment", [
    ({"json": {"type": "object"}}, "allows no first token"),
    ({"regex": "(unclosed"}, "structured_outputs"),
    ({"regex": "小明", "choice": ["小红"]}, "exactly one of"),
    ({"choice": []}, "non-empty list"),
    ({"regexp": "小明"}, "structured_outputs"),
])
def test_bad_structured_outputs_get_400(server, client, structured, fragment):
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=MODEL, prompt="小明", max_tokens=5,
                                  extra_body={"structured_outputs": structured})
    assert error.value.body["param"] == "structured_outputs" and fragment in error.value.body["message"]
    assert server.get("/health").status_code == 200


def test_a_counter_stream_server_draws_what_the_engine_draws(tiny):
    """`--rng counter`: a seeded request gets the counter-based stream's tokens, the same as Engine(rng="counter")
    gives (and not, in general, what the default torch streams give)."""
    model, tokenizer = tiny
    params = SamplingParams(temperature=1.0, seed=7, max_tokens=12, ignore_eos=True)
    wanted = {rng: Engine(model, tokenizer, rng=rng).generate(["小明"], params)[0].text for rng in ("torch", "counter")}
    with LocalServer("--model", MODEL, "--max-num-seqs", "4", "--rng", "counter") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
        texts = [client.completions.create(model=MODEL, prompt="小明", max_tokens=12, temperature=1.0, seed=7,
                                           extra_body={"ignore_eos": True}).choices[0].text for _ in range(2)]
    assert texts == [wanted["counter"]] * 2
    assert wanted["counter"] != wanted["torch"]
