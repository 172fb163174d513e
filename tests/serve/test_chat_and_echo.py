"""/v1/chat/completions and prompt log-probabilities (echo, prompt_logprobs) with the official `openai` client over
127.0.0.1, every response body validated against the `openai` SDK's own pydantic types (ChatCompletion,
ChatCompletionChunk, Completion): chat equals the completion of the template's prompt, streams join to the plain text,
seeds repeat, echo equals the model's own log-softmax, min_tokens holds EOS back, 200 concurrent chat streams all
arrive whole, and every bad request gets a 400 naming its field."""
import concurrent.futures
import json
import os
import subprocess
import sys

import httpx
import openai
import pytest
import torch
from fastapi.testclient import TestClient
from openai.types import Completion as OpenAICompletion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from decodelab.engine.engine import Engine
from decodelab.sampling.sampler import SamplingParams
from decodelab.serve.app import create_app
from decodelab.serve.chat import TOY_TURNS, load_chat_template, render_chat, resolve_chat_template
from decodelab.serve.local_server import LocalServer

pytestmark = pytest.mark.slow  # a server in a child process, over HTTP

MODEL = "tiny-zh"


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def chat_prompt(tokenizer, messages: list[dict], **kwargs) -> list[int]:
    """The prompt ids the server renders for `messages` with the shipped models' default template."""
    return render_chat(tokenizer, TOY_TURNS, messages, **kwargs)


def post(server, route: str, body: dict) -> httpx.Response:
    return httpx.post(server.base_url + route, json={"model": MODEL} | body, timeout=120)


def sse(server, route: str, body: dict) -> list[dict]:
    """The JSON payloads of a streamed response, checking that it ends with [DONE]."""
    payloads = []
    with httpx.stream("POST", server.base_url + route, json={"model": MODEL, "stream": True} | body,
                      timeout=120) as response:
        assert response.status_code == 200, response.read()
        lines = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]" and "[DONE]" not in lines[:-1]
    for line in lines[:-1]:
        payloads.append(json.loads(line))
    return payloads


def joined(chunks: list[ChatCompletionChunk]) -> dict[int, str]:
    out: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            out[choice.index] = out.get(choice.index, "") + (choice.delta.content or "")
    return out


# -- chat -----------------------------------------------------------------------------------------------------

def test_chat_equals_the_completion_of_the_templates_prompt(server, client, engine, tiny):
    _, tokenizer = tiny
    messages = [{"role": "system", "content": "今天，"}, {"role": "user", "content": "小明"}]
    body = post(server, "/chat/completions", {"messages": messages, "temperature": 0, "max_tokens": 30})
    assert body.status_code == 200
    chat = ChatCompletion.model_validate(body.json())                 # the SDK's own response type
    assert chat.object == "chat.completion" and chat.id.startswith("chatcmpl-") and chat.model == MODEL
    prompt = chat_prompt(tokenizer, messages)                         # <s>今天，小明</s><s>: the reply is a new text
    assert prompt[-2:] == [tokenizer.eos_token_id, tokenizer.bos_token_id]
    [reference] = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=30))
    [choice] = chat.choices
    assert choice.message.role == "assistant" and choice.message.content == reference.text
    assert choice.finish_reason == reference.finish_reason
    assert chat.usage.prompt_tokens == len(reference.prompt_token_ids)
    assert chat.usage.completion_tokens == len(reference.token_ids)
    via_client = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=30)
    assert via_client.choices[0].message.content == reference.text


def test_the_reply_marker_starts_a_new_sentence_and_continue_final_message_continues(client, engine, tiny):
    """The measured behaviour TOY_TURNS documents: after the user turn 小明 the greedy reply is a new sentence (the
    completion of 小明 is its rest, 喜欢吃米饭。); continue_final_message is the completion of the open text."""
    _, tokenizer = tiny
    reply = client.chat.completions.create(model=MODEL, messages=user("小明"), temperature=0, max_tokens=30)
    assert reply.choices[0].message.content == "小明喜欢吃米饭。" and reply.usage.prompt_tokens == 5
    [rest] = engine.generate(["小明"], SamplingParams(temperature=0, max_tokens=30))
    assert rest.text == "喜欢吃米饭。"
    whole = client.chat.completions.create(model=MODEL, messages=user("今天天气很好。"), temperature=0, max_tokens=30)
    assert whole.choices[0].message.content != ""             # without the marker the reply was empty (EOS first)
    [ended] = engine.generate(["今天天气很好。"], SamplingParams(temperature=0, max_tokens=30))
    assert ended.text == ""
    continued = client.chat.completions.create(
        model=MODEL, messages=user("小明") + [{"role": "assistant", "content": "喜欢"}], temperature=0, max_tokens=30,
        extra_body={"add_generation_prompt": False, "continue_final_message": True})
    prompt = chat_prompt(tokenizer, user("小明") + [{"role": "assistant", "content": "喜欢"}],
                         add_generation_prompt=False, continue_final_message=True)
    [reference] = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=30))
    assert prompt[-2:] == tokenizer("喜欢", add_special_tokens=False)["input_ids"]
    assert continued.choices[0].message.content == reference.text


@pytest.mark.parametrize("kwargs", [
    dict(temperature=0, max_tokens=40),
    dict(temperature=1.0, seed=3, n=3, max_tokens=40, stop=["。", "了"], logprobs=True, top_logprobs=2),
    dict(temperature=0.8, seed=5, max_tokens=25, extra_body={"ignore_eos": True, "min_tokens": 20}),
], ids=["greedy", "n-stop-logprobs", "ignore-eos-min-tokens"])
def test_chat_stream_joins_to_the_plain_text(server, client, kwargs):
    plain = client.chat.completions.create(model=MODEL, messages=user("小红在学校"), **kwargs)
    chunks = list(client.chat.completions.create(model=MODEL, messages=user("小红在学校"), stream=True,
                                                 stream_options={"include_usage": True}, **kwargs))
    texts = joined(chunks)
    assert [texts[c.index] for c in plain.choices] == [c.message.content for c in plain.choices]
    reasons = {c.index: c.finish_reason for chunk in chunks for c in chunk.choices if c.finish_reason}
    assert reasons == {c.index: c.finish_reason for c in plain.choices}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert {chunk.id for chunk in chunks} == {chunks[0].id} and all(c.model == MODEL for c in chunks)
    if kwargs.get("logprobs"):
        streamed = [lp for chunk in chunks for c in chunk.choices if c.logprobs for lp in c.logprobs.content]
        assert len(streamed) == plain.usage.completion_tokens
        for choice in plain.choices:
            content = choice.logprobs.content
            assert "".join(e.token for e in content).startswith(choice.message.content)
            assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in content)


def test_raw_chat_chunks_validate_as_the_sdks_types(server):
    body = {"messages": user("小明"), "temperature": 1.0, "seed": 1, "n": 2, "max_tokens": 10, "logprobs": True,
            "stream_options": {"include_usage": True}}
    payloads = sse(server, "/chat/completions", body)
    chunks = [ChatCompletionChunk.model_validate(p) for p in payloads]
    assert all(c.object == "chat.completion.chunk" and isinstance(c.created, int) for c in chunks)
    first = {c.choices[0].index: c.choices[0].delta for c in chunks[:2]}
    assert all(delta.role == "assistant" for delta in first.values()) and set(first) == {0, 1}
    plain = ChatCompletion.model_validate(post(server, "/chat/completions", body | {"stream_options": None}).json())
    assert [joined(chunks)[i] for i in (0, 1)] == [c.message.content for c in plain.choices]


def test_chat_seed_repeats_and_n_samples_equal_the_engine(client, engine, tiny):
    _, tokenizer = tiny
    kwargs = dict(model=MODEL, messages=user("老师说"), temperature=0.9, top_p=0.95, seed=7, n=2, max_tokens=30)
    first, second = client.chat.completions.create(**kwargs), client.chat.completions.create(**kwargs)
    texts = [c.message.content for c in first.choices]
    assert texts == [c.message.content for c in second.choices] and len(set(texts)) == 2
    prompt = chat_prompt(tokenizer, user("老师说"))
    [reference] = engine.generate([prompt], SamplingParams(temperature=0.9, top_p=0.95, seed=7, n=2, max_tokens=30))
    assert texts == [s.text for s in reference.samples]
    other = client.chat.completions.create(**{**kwargs, "seed": 8})
    assert [c.message.content for c in other.choices] != texts


def test_chat_takes_the_penalties_bias_and_vllm_extras(client, engine, tiny):
    _, tokenizer = tiny
    banned = tokenizer.convert_tokens_to_ids("。")
    params = SamplingParams(temperature=0.7, seed=2, max_tokens=20, top_k=5, min_p=0.05, repetition_penalty=1.2,
                            frequency_penalty=0.5, presence_penalty=0.3, logit_bias={banned: -100},
                            bad_words=("喜欢",), min_tokens=5)
    [reference] = engine.generate([chat_prompt(tokenizer, user("小明"))], params)
    response = client.chat.completions.create(
        model=MODEL, messages=user("小明"), temperature=0.7, seed=2, max_completion_tokens=20, frequency_penalty=0.5,
        presence_penalty=0.3, logit_bias={str(banned): -100},
        extra_body={"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.2, "bad_words": ["喜欢"], "min_tokens": 5})
    assert response.choices[0].message.content == reference.text
    assert "。" not in reference.text and "喜欢" not in reference.text


def test_chat_min_tokens_holds_back_eos_where_it_is_the_argmax(client, engine, tiny):
    _, tokenizer = tiny
    prompt = chat_prompt(tokenizer, user("小明"))
    [plain] = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=40))
    assert plain.token_ids[-1] == tokenizer.eos_token_id            # greedy ends at EOS here
    k = len(plain.token_ids) + 4
    response = client.chat.completions.create(model=MODEL, messages=user("小明"), temperature=0, max_tokens=40,
                                              extra_body={"min_tokens": k})
    [held] = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=40, min_tokens=k))
    assert response.usage.completion_tokens >= k and response.choices[0].message.content == held.text
    assert tokenizer.eos_token_id not in held.token_ids[:k]


def test_200_concurrent_chat_streams_arrive_whole(client, engine, tiny):
    """Each seeded stream must equal the engine's own sample for its seed: nothing lost, nothing mixed up. The
    requests wait in the server's queue as long as they need; nothing here depends on the machine's speed."""
    _, tokenizer = tiny
    prompt = chat_prompt(tokenizer, user("小明"))
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=6, ignore_eos=True) for i in range(200)]
    expected = [c.text for c in engine.generate([prompt] * 200, params)]

    def one(seed: int) -> tuple[str, str | None, int]:
        chunks = list(client.chat.completions.create(model=MODEL, messages=user("小明"), temperature=1.0, seed=seed,
                                                     max_tokens=6, stream=True, extra_body={"ignore_eos": True},
                                                     stream_options={"include_usage": True}))
        reasons = [c.finish_reason for chunk in chunks for c in chunk.choices if c.finish_reason]
        return joined(chunks).get(0, ""), reasons, chunks[-1].usage.completion_tokens

    with concurrent.futures.ThreadPoolExecutor(50) as pool:
        results = list(pool.map(one, range(200)))
    assert [text for text, _, _ in results] == expected
    assert all(reasons == ["length"] and tokens == 6 for _, reasons, tokens in results)


BAD_CHAT = [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "小明"}]}, "messages"),
    ({"messages": [{"role": "user"}]}, "messages"),
    ({"messages": [{"role": "user", "content": "小明", "tool_calls": []}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
    ({"messages": "小明"}, "messages"),
    ({"messages": user("hello")}, "messages"),                      # characters outside the vocabulary
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"n": 2, "temperature": 0}, "n"),                              # vLLM: greedy samples are all the same
    ({"top_logprobs": 2}, "top_logprobs"),                          # without logprobs=true
    ({"logprobs": True, "top_logprobs": 30}, "top_logprobs"),
    ({"max_tokens": 5, "max_completion_tokens": 5}, "max_completion_tokens"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"max_tokens": 300}, "max_tokens"),
    ({"min_tokens": 10, "max_tokens": 5}, "min_tokens"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"allowed_token_ids": []}, "allowed_token_ids"),
    ({"allowed_token_ids": [10**6]}, "allowed_token_ids"),
    ({"bad_words": ["hello"]}, "bad_words"),
    ({"include_stop_str_in_output": "yes"}, "include_stop_str_in_output"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}},
     "response_format"),                                            # tiny-zh has no ASCII braces
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"temperature": -1}, "temperature"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"temprature": 0.5}, "temprature"),
]


@pytest.mark.parametrize("fields, param", BAD_CHAT, ids=[f"{p}-{i}" for i, (_, p) in enumerate(BAD_CHAT)])
def test_bad_chat_request_gets_400_naming_the_field(server, fields, param):
    response = post(server, "/chat/completions", {"messages": user("小明"), "max_tokens": 5} | fields)
    body = response.json()["error"]
    assert response.status_code == 400 and body["type"] == "invalid_request_error", body
    assert body["param"] == param and param in body["message"], body
    assert server.get("/health").status_code == 200


def test_the_official_clients_chat_errors(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=[], max_tokens=5)
    assert error.value.body["param"] == "messages"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=user("小明"))


def test_a_model_without_a_template_gets_400_and_a_given_template_is_used(tiny):
    model, tokenizer = tiny
    assert tokenizer.chat_template is None
    assert resolve_chat_template("some/hub-model", tokenizer, None) is None       # only shipped models default
    assert resolve_chat_template(MODEL, tokenizer, None) == TOY_TURNS
    engine = Engine(model, tokenizer, max_num_seqs=2)
    with TestClient(create_app(engine, MODEL)) as bare:
        response = bare.post("/v1/chat/completions", json={"model": MODEL, "messages": user("小明")})
        assert response.status_code == 400 and "no chat template" in response.json()["error"]["message"]
        assert bare.post("/v1/completions", json={"model": MODEL, "prompt": "小明"}).status_code == 200
    template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}，{% endfor %}"
    with TestClient(create_app(Engine(model, tokenizer, max_num_seqs=2), MODEL, chat_template=template)) as custom:
        response = custom.post("/v1/chat/completions", json={"model": MODEL, "messages": user("小明"),
                                                              "temperature": 0, "max_tokens": 5})
        assert response.status_code == 200 and response.json()["usage"]["prompt_tokens"] == 4   # <s>小明，


def test_chat_template_flag_takes_a_file_or_a_template(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text(TOY_TURNS, encoding="utf-8")
    assert load_chat_template(str(path)) == TOY_TURNS == load_chat_template(TOY_TURNS)
    with pytest.raises(ValueError, match="neither a readable file nor a template"):
        load_chat_template(str(tmp_path / "missing.jinja"))
    done = subprocess.run([sys.executable, "-m", "decodelab.serve", "--chat-template", str(tmp_path / "nope"),
                           "--port", "9"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2 and "--chat-template" in done.stderr, done.stderr[-2000:]


# -- echo and prompt_logprobs -----------------------------------------------------------------------------------

def direct_logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)     # [L, V]


def test_echo_on_batched_prompts_equals_the_models_log_softmax(server, client, tiny):
    model, tokenizer = tiny
    prompts = ["小明喜欢吃米饭。", "小红坐火车去北京。", "老师说"]
    raw = post(server, "/completions", {"prompt": prompts, "echo": True, "logprobs": 2, "max_tokens": 1,
                                        "temperature": 0})
    body = raw.json()
    # OpenAI's API and vLLM send null as the first token's logprob with echo (and lm-evaluation-harness reads it so);
    # the SDK's type declares list[float], so the nulls are checked here and the rest is validated as the SDK's type
    stripped = json.loads(json.dumps(body))
    for choice in stripped["choices"]:
        assert choice["logprobs"]["token_logprobs"][0] is None and choice["logprobs"]["top_logprobs"][0] is None
        for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            del choice["logprobs"][key][0]
    OpenAICompletion.model_validate(stripped)
    response = client.completions.create(model=MODEL, prompt=prompts, echo=True, logprobs=2, max_tokens=1,
                                         temperature=0)
    assert [c["text"] for c in body["choices"]] == [c.text for c in response.choices]
    for prompt, choice in zip(prompts, sorted(response.choices, key=lambda c: c.index)):
        ids = tokenizer(prompt)["input_ids"]
        reference = direct_logprobs(model, ids)
        lp = choice.logprobs
        assert choice.text.startswith(prompt) and len(lp.tokens) == len(ids) + 1
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None          # nothing predicts the first
        for j in range(1, len(ids)):
            assert abs(lp.token_logprobs[j] - reference[j - 1, ids[j]].item()) < 1e-5
            top = reference[j - 1].topk(2)
            assert [tokenizer.decode([t]) for t in top.indices.tolist()] == list(lp.top_logprobs[j])
        generated = lp.token_logprobs[len(ids)]
        assert abs(generated - reference[-1].max().item()) < 1e-5                   # greedy: the argmax
        visible = [t.replace("<s>", "").replace("</s>", "") for t in lp.tokens]
        assert lp.text_offset == [sum(len(t) for t in visible[:i]) for i in range(len(visible))]


def test_vllm_prompt_logprobs(server, client, tiny):
    model, tokenizer = tiny
    prompt = "小明在机场打篮球。"
    body = post(server, "/completions", {"prompt": prompt, "prompt_logprobs": 1, "max_tokens": 2,
                                         "temperature": 0}).json()
    [choice] = OpenAICompletion.model_validate(body).choices
    entries = choice.model_extra["prompt_logprobs"]
    ids = tokenizer(prompt)["input_ids"]
    reference = direct_logprobs(model, ids)
    assert entries[0] is None and len(entries) == len(ids)
    for j, entry in enumerate(entries[1:], start=1):
        own = entry[str(ids[j])]
        assert abs(own["logprob"] - reference[j - 1, ids[j]].item()) < 1e-5
        assert own["rank"] == 1 + int((reference[j - 1] > reference[j - 1, ids[j]] + 1e-6).sum())
        assert own["decoded_token"] == tokenizer.decode([ids[j]])
        assert len(entry) in (1, 2)                                    # the prompt's token and the top 1
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    assert choice.text == plain.choices[0].text                        # prompt_logprobs alone does not echo


def test_harness_loglikelihood_through_the_server_equals_the_exact_value(client, tiny):
    """As lm-evaluation-harness's local-completions scores a continuation: echo, max_tokens=1, logprobs=1, and the
    sum of the continuation's token_logprobs (the last entry, the generated token, left out)."""
    model, tokenizer = tiny
    context, continuation = "小明喜欢", "吃米饭。"
    response = client.completions.create(model=MODEL, prompt=context + continuation, echo=True, max_tokens=1,
                                         logprobs=1, temperature=0)
    lp = response.choices[0].logprobs
    n_context = len(tokenizer(context)["input_ids"])
    served = sum(lp.token_logprobs[n_context:-1])
    ids = tokenizer(context + continuation)["input_ids"]
    reference = direct_logprobs(model, ids)
    exact = sum(reference[j - 1, ids[j]].item() for j in range(n_context, len(ids)))
    assert abs(served - exact) < 1e-5


def check_prompt_logprobs(entries: list, model, tokenizer, ids: list[int], k: int) -> None:
    """vLLM's prompt_logprobs against a direct forward: None first, then each prompt token's log-softmax (within
    1e-5) and rank, and the k most likely tokens."""
    reference = direct_logprobs(model, ids)
    assert entries[0] is None and len(entries) == len(ids)
    for j, entry in enumerate(entries[1:], start=1):
        own = entry[str(ids[j])]
        assert abs(own["logprob"] - reference[j - 1, ids[j]].item()) < 1e-5
        assert own["rank"] == 1 + int((reference[j - 1] > reference[j - 1, ids[j]] + 1e-6).sum())
        top = reference[j - 1].topk(k).indices.tolist() if k else []
        assert set(entry) == {str(t) for t in [ids[j], *top]}
        assert all(abs(entry[str(t)]["logprob"] - reference[j - 1, t].item()) < 1e-5 for t in top)


def test_chat_prompt_logprobs_equal_the_models_log_softmax(server, tiny):
    """vLLM's chat route returns prompt_logprobs at the response's top level, for the rendered prompt: the template's
    <s> and </s> markers are prompt tokens like the others."""
    model, tokenizer = tiny
    messages = [{"role": "system", "content": "今天，"}, {"role": "user", "content": "小明在公园"},
                {"role": "assistant", "content": "跑步。"}, {"role": "user", "content": "小红"}]
    raw = post(server, "/chat/completions", {"messages": messages, "prompt_logprobs": 2, "max_tokens": 3,
                                             "temperature": 0}).json()
    chat = ChatCompletion.model_validate(raw)
    check_prompt_logprobs(chat.model_extra["prompt_logprobs"], model, tokenizer, chat_prompt(tokenizer, messages), 2)
    plain = post(server, "/chat/completions", {"messages": messages, "max_tokens": 3, "temperature": 0}).json()
    assert "prompt_logprobs" not in plain
    assert plain["choices"][0]["message"] == raw["choices"][0]["message"]    # prompt_logprobs alone do not echo


def test_chat_echo_prepends_the_last_message_of_the_replys_role(server, client, engine, tiny):
    """vLLM's chat echo: the last message's text goes before the reply when its role is the reply's (the last
    message's own role without a generation prompt, the assistant's with one), plain and streamed alike; echo also
    asks for the prompt's log-probabilities, top_logprobs of them (0: the prompt tokens' own)."""
    model, tokenizer = tiny
    messages = user("小明") + [{"role": "assistant", "content": "喜欢"}]
    open_text = {"add_generation_prompt": False, "continue_final_message": True}
    ids = chat_prompt(tokenizer, messages, add_generation_prompt=False, continue_final_message=True)
    [reference] = engine.generate([ids], SamplingParams(temperature=0, max_tokens=20))
    body = {"messages": messages, "echo": True, "temperature": 0, "max_tokens": 20} | open_text
    raw = post(server, "/chat/completions", body).json()
    chat = ChatCompletion.model_validate(raw)
    assert chat.choices[0].message.content == "喜欢" + reference.text and chat.choices[0].message.role == "assistant"
    check_prompt_logprobs(raw["prompt_logprobs"], model, tokenizer, ids, 0)
    chunks = [ChatCompletionChunk.model_validate(p) for p in sse(server, "/chat/completions", body)]
    assert joined(chunks)[0] == chat.choices[0].message.content
    via_client = client.chat.completions.create(model=MODEL, messages=messages, temperature=0.8, seed=4, n=2,
                                                max_tokens=20, extra_body={"echo": True} | open_text)
    [sampled] = engine.generate([ids], SamplingParams(temperature=0.8, seed=4, n=2, max_tokens=20))
    assert [c.message.content for c in via_client.choices] == ["喜欢" + s.text for s in sampled.samples]
    # the last message is the user's and the reply the assistant's: nothing is echoed
    asked = post(server, "/chat/completions", {"messages": user("小明"), "echo": True, "temperature": 0,
                                               "max_tokens": 20}).json()
    [reply] = engine.generate([chat_prompt(tokenizer, user("小明"))], SamplingParams(temperature=0, max_tokens=20))
    assert asked["choices"][0]["message"]["content"] == reply.text
    check_prompt_logprobs(asked["prompt_logprobs"], model, tokenizer, chat_prompt(tokenizer, user("小明")), 0)


@pytest.mark.parametrize("fields, param", [
    ({"prompt_logprobs": 2, "stream": True}, "prompt_logprobs"),    # vLLM: not with a stream
    ({"prompt_logprobs": 21}, "prompt_logprobs"),
    ({"prompt_logprobs": -1}, "prompt_logprobs"),
    ({"echo": "yes"}, "echo"),
    ({"echo": True, "top_logprobs": 2}, "top_logprobs"),            # top_logprobs still needs logprobs=true
])
def test_bad_chat_echo_requests_get_400(server, fields, param):
    response = post(server, "/chat/completions", {"messages": user("小明"), "max_tokens": 3} | fields)
    body = response.json()["error"]
    assert response.status_code == 400 and body["param"] == param and param in body["message"], body


@pytest.mark.parametrize("fields, param", [
    ({"echo": True, "stream": True}, "echo"),
    ({"prompt_logprobs": 21}, "prompt_logprobs"),
    ({"prompt_logprobs": -1}, "prompt_logprobs"),
    ({"echo": "yes"}, "echo"),
    ({"n": 2, "temperature": 0}, "n"),
])
def test_bad_echo_requests_get_400(server, fields, param):
    response = post(server, "/completions", {"prompt": "小明", "max_tokens": 3} | fields)
    body = response.json()["error"]
    assert response.status_code == 400 and body["param"] == param and param in body["message"], body


def test_raw_completion_bodies_validate_as_the_sdks_types(server):
    body = {"prompt": ["小明", "老师说"], "temperature": 1.0, "seed": 2, "n": 2, "max_tokens": 8, "logprobs": 1}
    plain = OpenAICompletion.model_validate(post(server, "/completions", body).json())
    assert plain.object == "text_completion" and len(plain.choices) == 4
    payloads = sse(server, "/completions", body | {"stream_options": {"include_usage": True}})
    # OpenAI streams "finish_reason": null until a choice's last chunk; the SDK's Completion type (which it also uses
    # for stream chunks) declares it required, so a null is checked and stood in for before validating
    chunks = []
    for payload in payloads:
        filled = json.loads(json.dumps(payload))
        for choice in filled["choices"]:
            choice["finish_reason"] = choice["finish_reason"] or "length"
        chunks.append(OpenAICompletion.model_validate(filled))
        assert all(c["finish_reason"] in (None, "stop", "length") for c in payload["choices"])
    ends = [c for p in payloads for c in p["choices"] if c["finish_reason"] is not None]
    assert sorted(c["index"] for c in ends) == [0, 1, 2, 3]           # each choice finishes once
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert [texts[c.index] for c in plain.choices] == [c.text for c in plain.choices]
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
