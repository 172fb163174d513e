"""What a server needs from the engine: stop strings, logprobs, per-token events, and the async loop over it
(continuous and static batching), without HTTP."""
import asyncio
import math

import pytest
import torch

from decodelab.engine.async_engine import AsyncEngine, EngineFailed, QueueFull
from decodelab.engine.engine import Engine, TokenEvent
from decodelab.decoding.request import Completion
from decodelab.sampling.sampler import SamplingParams
from decodelab.validation import ParamError

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["小明", "小红在", "老师说", "我们"]


def test_stop_strings_end_the_text_before_them(tiny):
    model, tokenizer = tiny
    engine = Engine(model, tokenizer)
    [free] = engine.generate(["小明"], SamplingParams(temperature=0, max_tokens=40))
    cut = free.text.index("欢") + 1
    stop = free.text[cut:cut + 2]
    [stopped] = engine.generate(["小明"], SamplingParams(temperature=0, max_tokens=40, stop=(stop,)))
    assert stopped.finish_reason == "stop" and stopped.text == free.text[:cut]
    assert tokenizer.decode(stopped.token_ids).startswith(free.text[:cut] + stop)   # the tokens include the stop
    with pytest.raises(ParamError, match="stop must be a tuple of non-empty strings") as error:
        SamplingParams(stop=("",))
    assert error.value.param == "stop"


def test_logprobs_are_the_raw_model_distribution(tiny):
    model, tokenizer = tiny
    engine = Engine(model, tokenizer)
    [c] = engine.generate(["小明"], SamplingParams(temperature=0.7, seed=3, max_tokens=6, logprobs=3))
    assert len(c.logprobs) == len(c.token_ids)
    ids = tokenizer("小明").input_ids
    with torch.no_grad():
        for step, entry in enumerate(c.logprobs):
            context = torch.tensor([ids + c.token_ids[:step]])
            reference = torch.log_softmax(model(context).logits[0, -1].float(), -1)
            assert entry.token_id == c.token_ids[step]
            assert math.isclose(entry.logprob, reference[entry.token_id].item(), abs_tol=1e-4)
            assert [t for t, _ in entry.top] == reference.topk(3).indices.tolist()
    [plain] = engine.generate(["小明"], SamplingParams(temperature=0.7, seed=3, max_tokens=6))
    assert plain.logprobs is None and plain.token_ids == c.token_ids   # asking for logprobs changes no token
    with pytest.raises(ParamError, match=r"logprobs must be None or an int in \[0, 20\], got 21"):
        SamplingParams(logprobs=21)


def test_step_events_name_request_and_sample(tiny):
    model, tokenizer = tiny
    engine = Engine(model, tokenizer)
    request = engine.add_request("小明", SamplingParams(n=3, seed=1, max_tokens=5, ignore_eos=True))
    seen: dict[int, list[int]] = {}
    finished = []
    while engine.has_unfinished():
        out = engine.step()
        for event in out.events:
            assert isinstance(event, TokenEvent) and event.request_id == request
            seen.setdefault(event.sample_index, []).append(event.token_id)
        finished += out.finished
    [done] = finished
    assert sorted(seen) == [0, 1, 2]
    assert [seen[i] for i in range(3)] == [s.token_ids for s in done.samples]


def test_check_request_names_the_field(tiny):
    model, tokenizer = tiny
    engine = Engine(model, tokenizer, max_num_seqs=4)
    for prompt, params, field in [("小明", SamplingParams(n=5), "n"), ("小x", SamplingParams(), "prompt"),
                                  ([], SamplingParams(), "prompt"),
                                  ("小明", SamplingParams(stop_token_ids=(10**6,)), "stop_token_ids")]:
        with pytest.raises(ParamError) as error:
            engine.check_request(prompt, params)
        assert error.value.param == field and field in str(error.value)
    assert not engine.has_unfinished()


async def _serve_all(runner: AsyncEngine, prompts, params) -> tuple[list[Completion], int]:
    """Submit all prompts at once and collect their completions; also the most sequences seen running at once."""
    await runner.start()
    streams = runner.submit([runner.engine.check_request(p, params) for p in prompts])
    peak = 0

    async def collect(stream):
        nonlocal peak
        async for item in stream:
            peak = max(peak, runner.num_running)
            if isinstance(item, Completion):
                return item

    try:
        return list(await asyncio.gather(*(collect(s) for s in streams))), peak
    finally:
        await runner.stop()


@pytest.mark.parametrize("batching", ["continuous", "static"])
def test_async_engine_equals_engine_generate(tiny, batching):
    model, tokenizer = tiny
    params = SamplingParams(temperature=0.8, seed=11, max_tokens=12)
    reference = Engine(model, tokenizer).generate(PROMPTS, params)
    runner = AsyncEngine(Engine(model, tokenizer, max_num_seqs=2), max_queue_len=8, batching=batching)
    completions, peak = asyncio.run(_serve_all(runner, PROMPTS, params))
    assert [c.text for c in completions] == [r.text for r in reference]
    assert peak <= 2
    assert runner.engine.stats.free_blocks == runner.engine.stats.num_blocks


def test_static_batching_waits_for_the_whole_batch(tiny):
    """Static: the second pair starts only when both of the first pair have finished. Each engine step's output is
    logged on the engine's own thread, so the check reads the order the engine made, not when the event loop got to
    the streams (reading `engine.stats.steps` from the loop raced with the next step)."""
    model, tokenizer = tiny
    engine = Engine(model, tokenizer, max_num_seqs=2)
    steps = []            # per engine step: (request ids that got a token, request ids that finished)
    step = engine.step

    def logged_step():
        output = step()
        steps.append(({event.request_id for event in output.events}, {done.request_id for done in output.finished}))
        return output

    engine.step = logged_step
    runner = AsyncEngine(engine, batching="static")
    lengths = [3, 20, 3, 3]
    ids = {}

    async def run():
        await runner.start()
        streams = runner.submit([engine.check_request("小明", SamplingParams(max_tokens=m, ignore_eos=True))
                                 for m in lengths])

        async def watch(i, stream):
            async for item in stream:
                ids[i] = item.request_id

        await asyncio.gather(*(watch(i, s) for i, s in enumerate(streams)))
        await runner.stop()

    asyncio.run(run())
    assert sorted(ids) == [0, 1, 2, 3]
    first = {i: min(k for k, (got, _) in enumerate(steps) if ids[i] in got) for i in ids}
    finished = {i: next(k for k, (_, done) in enumerate(steps) if ids[i] in done) for i in ids}
    assert first[2] > finished[1] and first[3] > finished[1], (first, finished)
    assert first[2] > finished[0] and first[3] > finished[0], (first, finished)
    assert first[1] < finished[0]          # the first pair ran together: the batch was static, not one at a time


def test_queue_limit_refuses_all_or_nothing(tiny):
    model, tokenizer = tiny
    engine = Engine(model, tokenizer, max_num_seqs=1)
    runner = AsyncEngine(engine, max_queue_len=2)
    params = SamplingParams(max_tokens=4)
    request = engine.check_request("小明", params)

    async def run():
        await runner.start()
        with pytest.raises(QueueFull, match="the limit is 2"):
            runner.submit([request] * 3)
        streams = runner.submit([request] * 2)
        for stream in streams:
            async for _ in stream:
                pass
        await runner.stop()

    asyncio.run(run())
    assert engine.stats.free_blocks == engine.stats.num_blocks
    with pytest.raises(ValueError, match="batching must be one of"):
        AsyncEngine(engine, batching="dynamic")
    with pytest.raises(ValueError, match="max_queue_len must be an int >= 1, got 0"):
        AsyncEngine(engine, max_queue_len=0)
    with pytest.raises(TypeError, match="engine must be a decodelab Engine"):
        AsyncEngine(model)


def test_abort_while_waiting_and_while_running_frees_everything(tiny):
    model, tokenizer = tiny
    engine = Engine(model, tokenizer, max_num_seqs=1)
    runner = AsyncEngine(engine)
    long = SamplingParams(max_tokens=200, ignore_eos=True)
    request = engine.check_request("小明", long)

    async def run():
        await runner.start()
        running, waiting = runner.submit([request, request])
        async for item in running:             # the first token: it runs, the second waits behind it
            break
        runner.abort(waiting)
        runner.abort(running)
        while engine.has_unfinished() or runner.queue_length:
            await asyncio.sleep(0.01)
        await runner.stop()

    asyncio.run(run())
    assert engine.stats.free_blocks == engine.stats.num_blocks and not engine.has_unfinished()


def test_a_failed_step_fails_its_requests_and_the_loop_goes_on(tiny, monkeypatch):
    model, tokenizer = tiny
    engine = Engine(model, tokenizer)
    runner = AsyncEngine(engine)
    params = SamplingParams(temperature=0, max_tokens=5)
    request = engine.check_request("小明", params)
    real_step, calls = engine.step, []

    def flaky_step():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("out of memory (simulated)")
        return real_step()

    monkeypatch.setattr(engine, "step", flaky_step)

    async def run():
        await runner.start()
        [doomed] = runner.submit([request])
        with pytest.raises(EngineFailed, match="engine step failed: RuntimeError: out of memory"):
            async for _ in doomed:
                pass
        [after] = runner.submit([request])
        items = [item async for item in after]
        await runner.stop()
        return items[-1]

    completion = asyncio.run(run())
    assert completion.text == Engine(model, tokenizer).generate(["小明"], params)[0].text
    assert engine.stats.free_blocks == engine.stats.num_blocks
