"""decodelab.decoding.generate: greedy equals model.generate token for token; stops, streaming, seeds, bad input."""
import pytest
import torch

from decodelab.decoding.generate import Completion, StepEvent, generate
from decodelab.sampling.sampler import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


def random_prompts(count: int, seed: int, vocab: int = 300) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (int(torch.randint(1, 10, (1,), generator=gen)),), generator=gen).tolist()
            for _ in range(count)]


def transformers_greedy(model, prompts, max_tokens, eos=None):
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    kwargs = {} if eos is None else dict(eos_token_id=eos)
    out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_tokens, pad_token_id=0,
                         **kwargs)
    return [row[width:].tolist() for row in out]


def test_greedy_batch_with_left_padding_equals_transformers(random_llama):
    prompts = random_prompts(10, seed=0)
    expected = transformers_greedy(random_llama, prompts, 12)
    completions = generate(random_llama, None, prompts, GREEDY)
    assert [c.token_ids for c in completions] == expected
    assert all(isinstance(c, Completion) and c.finish_reason == "length" and c.text is None for c in completions)
    alone = [generate(random_llama, None, [p], GREEDY)[0].token_ids for p in prompts[:3]]
    assert alone == expected[:3], "a prompt must get the same tokens alone and in a padded batch"


def test_eos_and_stop_tokens_end_a_prompt(random_llama):
    prompts = random_prompts(4, seed=1)
    free = generate(random_llama, None, prompts, GREEDY)
    eos = free[0].token_ids[4]  # a token the first prompt produces at step 5
    random_llama.generation_config.eos_token_id = eos
    try:
        with_eos = generate(random_llama, None, prompts, GREEDY)
        ignoring = generate(random_llama, None, prompts, SamplingParams(temperature=0.0, max_tokens=12,
                                                                         ignore_eos=True))
        expected = transformers_greedy(random_llama, prompts, 12, eos=eos)
    finally:
        random_llama.generation_config.eos_token_id = 2
    first_eos = free[0].token_ids.index(eos)
    assert with_eos[0].token_ids == free[0].token_ids[: first_eos + 1] and with_eos[0].finish_reason == "stop"
    assert [c.token_ids for c in ignoring] == [c.token_ids for c in free]
    for completion, reference in zip(with_eos, expected):  # transformers pads after EOS
        assert completion.token_ids == reference[: len(completion.token_ids)]
    stop = free[1].token_ids[2]
    stopped = generate(random_llama, None, prompts[1], SamplingParams(temperature=0.0, max_tokens=12,
                                                                     stop_token_ids=[stop]))[0]
    assert stopped.token_ids[-1] == stop and stopped.finish_reason == "stop" and len(stopped.token_ids) <= 3


def test_streaming_yields_the_same_tokens_step_by_step(random_llama):
    prompts = random_prompts(3, seed=2)
    params = [SamplingParams(temperature=0.0, max_tokens=4), SamplingParams(seed=3, max_tokens=2),
              SamplingParams(seed=4, top_k=20, max_tokens=5)]
    events = list(generate(random_llama, None, prompts, params, stream=True))
    assert all(isinstance(e, StepEvent) for e in events)
    completions = generate(random_llama, None, prompts, params)
    for i, completion in enumerate(completions):
        mine = [e for e in events if e.index == i]
        assert [e.token_id for e in mine] == completion.token_ids
        assert [e.finish_reason for e in mine] == [None] * (len(mine) - 1) + ["length"]
    assert [e.index for e in events[:3]] == [0, 1, 2]  # one event per running prompt per step


def test_seeded_sampling_is_reproducible_and_batch_independent(random_llama):
    prompts = random_prompts(3, seed=3)
    mine = SamplingParams(temperature=1.0, top_p=0.9, seed=7, max_tokens=8)
    alone = generate(random_llama, None, [prompts[0]], mine)[0].token_ids
    together = generate(random_llama, None, prompts, [mine, SamplingParams(max_tokens=3), GREEDY])[0].token_ids
    assert alone == together
    assert generate(random_llama, None, [prompts[0]], SamplingParams(seed=8, max_tokens=8))[0].token_ids != alone


def test_repetition_penalty_changes_greedy_output(random_llama):
    prompt = random_prompts(1, seed=4)
    plain = generate(random_llama, None, prompt, SamplingParams(temperature=0.0, max_tokens=20))[0].token_ids
    penalised = generate(random_llama, None, prompt, SamplingParams(temperature=0.0, max_tokens=20,
                                                                    repetition_penalty=3.0))[0].token_ids
    expected = random_llama.generate(torch.tensor(prompt), do_sample=False, max_new_tokens=20, pad_token_id=0,
                                     repetition_penalty=3.0)[0, len(prompt[0]):].tolist()
    assert penalised == expected and penalised != plain


def test_penalties_in_a_padded_batch_equal_each_prompt_alone(random_llama):
    # prompts of different lengths are left-padded together: padding must not count as a repeated token
    gen = torch.Generator().manual_seed(10)
    prompts = [torch.randint(3, 300, (n,), generator=gen).tolist() for n in (3, 9, 5)]
    params = [SamplingParams(temperature=0.0, max_tokens=12, repetition_penalty=2.0),
              SamplingParams(temperature=0.0, max_tokens=12, frequency_penalty=0.8, presence_penalty=0.5),
              SamplingParams(temperature=0.0, max_tokens=12)]
    together = [c.token_ids for c in generate(random_llama, None, prompts, params)]
    assert together == [generate(random_llama, None, [p], q)[0].token_ids for p, q in zip(prompts, params)]
    expected = random_llama.generate(torch.tensor([prompts[0]]), do_sample=False, max_new_tokens=12, pad_token_id=0,
                                     repetition_penalty=2.0)[0, len(prompts[0]):].tolist()
    assert together[0] == expected


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(prompts=[]), ValueError, "prompts"), (dict(prompts=[[1, -2]]), ValueError, r"prompts\[0\]"),
    (dict(prompts=[[]]), ValueError, "empty"), (dict(prompts=["hi"]), TypeError, "no tokenizer"),
    (dict(params=[GREEDY, GREEDY]), ValueError, "one per prompt"), (dict(params=["x"]), TypeError, r"params\[0\]"),
    (dict(stream="yes"), ValueError, "stream"),
])
def test_generate_rejects_bad_input(random_llama, kwargs, error, pattern):
    args = dict(prompts=[[4, 5]], params=GREEDY, stream=False)
    args.update(kwargs)
    with pytest.raises(error, match=pattern):
        generate(random_llama, None, args["prompts"], args["params"], stream=args["stream"])


TINY_PROMPTS = ["小明", "今天", "我们", "他", "你", "天气", "小红", "明天", "老师", "我"]


def test_greedy_on_the_shipped_model_equals_transformers(tiny):
    model, tokenizer = tiny
    batch = tokenizer(TINY_PROMPTS, padding=True, return_tensors="pt")
    assert tokenizer.unk_token_id not in batch["input_ids"]
    out = model.generate(**batch, do_sample=False, max_new_tokens=24)
    completions = generate(model, tokenizer, TINY_PROMPTS, SamplingParams(temperature=0.0, max_tokens=24))
    ended = 0
    for completion, row in zip(completions, out[:, batch["input_ids"].shape[1]:].tolist()):
        assert completion.token_ids == row[: len(completion.token_ids)]
        assert all(t == tokenizer.pad_token_id for t in row[len(completion.token_ids):])
        assert completion.text == tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        ended += completion.finish_reason == "stop"
    assert ended > 0, "the shipped model should end some sentences with EOS"
    streamed = "".join(e.text for e in generate(model, tokenizer, TINY_PROMPTS[0], GREEDY, stream=True))
    assert streamed == generate(model, tokenizer, TINY_PROMPTS[0], GREEDY)[0].text


def test_unknown_characters_and_context_are_errors_as_in_the_engine(tiny):
    """Characters the vocabulary lacks are named, not read as <unk>; a prompt longer than the context is refused, and
    generation stops ("length") when prompt + output fill the context, as Engine does."""
    from decodelab.decoding.beam import beam_search

    model, tokenizer = tiny
    with pytest.raises(ValueError, match=r"prompts\[1\] has characters outside the tokenizer's vocabulary: \['x'\]"):
        generate(model, tokenizer, ["小明", "小x明"], SamplingParams(temperature=0.0))
    context = model.config.max_position_embeddings
    with pytest.raises(ValueError, match=f"prompts\\[0\\] has {context + 1} tokens, longer than the model's context"):
        generate(model, tokenizer, [[1] + [5] * context], SamplingParams(temperature=0.0))
    with pytest.raises(ValueError, match="longer than the model's context"):
        beam_search(model, [1] + [5] * context, num_beams=2, max_tokens=4, eos_token_id=2)
    prompt = tokenizer("小明")["input_ids"] + [tokenizer.convert_tokens_to_ids("好")] * (context - 10)
    out = generate(model, tokenizer, [prompt], SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True))[0]
    assert len(prompt) + len(out.token_ids) == context and out.finish_reason == "length"
    beams = beam_search(model, prompt, num_beams=2, max_tokens=50, eos_token_id=None)
    assert len(prompt) + len(beams.token_ids) <= context
