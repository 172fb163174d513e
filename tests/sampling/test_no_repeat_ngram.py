"""no_repeat_ngram_size: equal to transformers' NoRepeatNGramLogitsProcessor, in the samplers, generate and the engine."""
import pytest
import torch
from transformers.generation.logits_process import NoRepeatNGramLogitsProcessor

import decodelab.sampling.penalties
from decodelab.engine.engine import Engine
from decodelab.decoding.generate import generate
from decodelab.sampling.penalties import apply_penalties
from decodelab.sampling.sampler import SamplingParams, process_logits, sample

pytestmark = pytest.mark.usefixtures("one_thread")  # a tiny model (tests/conftest.py)

VOCAB = 7  # small, so that random histories repeat n-grams often
SIZES = [0, 1, 2, 3, 4, 2, 3, 4, 1, 0, 3, 2]  # one batch, sizes mixed per row


def random_histories(seed: int, count: int) -> list[list[int]]:
    """Histories of 0 to 24 tokens: some shorter than their row's n, most with repeated n-grams."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (int(torch.randint(0, 25, (1,), generator=gen)),), generator=gen).tolist()
            for _ in range(count)]


def transformers_row(scores: torch.Tensor, history: list[int], size: int) -> torch.Tensor:
    """One row `[V]` through transformers' processor, fed the row's history alone (it knows no padding)."""
    if size == 0:
        return scores
    return NoRepeatNGramLogitsProcessor(size)(torch.tensor([history], dtype=torch.long), scores.unsqueeze(0))[0]


def left_padded(histories: list[list[int]]) -> torch.Tensor:
    width = max(len(h) for h in histories)
    return torch.tensor([[-1] * (width - len(h)) + h for h in histories])  # [B, T]


@pytest.mark.parametrize("seed", range(6))
def test_ban_equals_transformers_with_mixed_sizes(seed):
    histories = random_histories(seed, len(SIZES))
    logits = torch.randn(len(SIZES), VOCAB, generator=torch.Generator().manual_seed(100 + seed))
    rows = [SamplingParams(no_repeat_ngram_size=n) for n in SIZES]
    expected = torch.stack([transformers_row(logits[i], histories[i], n) for i, n in enumerate(SIZES)])
    for form in (histories, left_padded(histories)):  # lists (padded at the end inside) and a left-padded tensor
        assert torch.equal(apply_penalties(logits, rows, form), expected)
    assert expected.isinf().any(1).sum() >= 4, "the histories should repeat some n-grams"
    for i, n in enumerate(SIZES):
        if n == 0:
            assert torch.equal(apply_penalties(logits, rows, histories)[i], logits[i]), "size 0 leaves a row alone"


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_ban_equals_transformers_on_a_whole_batch(size):
    gen = torch.Generator().manual_seed(size)
    history = torch.randint(0, VOCAB, (16, 20), generator=gen)  # [B, T], no padding: transformers' own input
    logits = torch.randn(16, VOCAB, generator=gen)
    expected = NoRepeatNGramLogitsProcessor(size)(history, logits.clone())
    assert torch.equal(apply_penalties(logits, [SamplingParams(no_repeat_ngram_size=size)] * 16, history), expected)
    assert expected.isinf().any(), "the histories should repeat some n-grams"


def test_ban_with_the_repetition_penalty_in_process_logits_and_sample():
    logits = torch.tensor([[0.0, 5.0, 4.0, 1.0]])
    history = [[2, 1, 2]]  # the 2-gram (2, 1) is there, so 1 is banned after 2; tokens 1 and 2 are penalised
    params = SamplingParams(repetition_penalty=2.0, no_repeat_ngram_size=2)
    assert process_logits(logits, params, history)[0].tolist() == [0.0, float("-inf"), 2.0, 1.0]
    greedy = SamplingParams(temperature=0.0, repetition_penalty=2.0, no_repeat_ngram_size=2)
    assert sample(logits, greedy, output_tokens=history).tolist() == [2]


def test_no_history_or_a_history_alone_is_refused():
    with pytest.raises(ValueError, match="output_tokens"):
        sample(torch.randn(1, 5), SamplingParams(no_repeat_ngram_size=2))
    with pytest.raises(ValueError, match="prompt_tokens goes with output_tokens"):
        sample(torch.randn(1, 5), SamplingParams(), prompt_tokens=[[1, 2]])
    with pytest.raises(ValueError, match=r"prompt_tokens\[0\]"):
        sample(torch.randn(1, 5), SamplingParams(no_repeat_ngram_size=2), output_tokens=[[1]], prompt_tokens=[[-3]])


def test_nan_at_a_banned_token_is_still_reported():
    logits = torch.tensor([[0.0, float("nan"), 1.0]])
    with pytest.raises(ValueError, match="NaN"):
        sample(logits, SamplingParams(no_repeat_ngram_size=1), output_tokens=[[1]])


def test_size_zero_costs_nothing(monkeypatch):
    def fail(*args):
        raise AssertionError("banned_ngram_tokens ran for rows with no_repeat_ngram_size=0")

    monkeypatch.setattr(decodelab.sampling.penalties, "banned_ngram_tokens", fail)
    logits = torch.randn(3, 10, generator=torch.Generator().manual_seed(0))
    sample(logits, [SamplingParams(repetition_penalty=1.5)] * 3, output_tokens=[[1, 2, 1, 2]] * 3)
    assert not SamplingParams().has_penalties and SamplingParams(no_repeat_ngram_size=3).has_penalties


@pytest.mark.parametrize("value", [-1, 1.5, True, "2", None])
def test_bad_sizes_are_refused(value):
    with pytest.raises(ValueError, match=r"no_repeat_ngram_size must be an int >= 0, got"):
        SamplingParams(no_repeat_ngram_size=value)


# prompts whose greedy continuation repeats a 3-gram of the prompt, and plain ones
PROMPTS = ["小明喜欢吃米饭。小明喜欢吃", "小猫在树上睡觉。小猫在", "今天天气很好，我们", "老师说"]
BAN = SamplingParams(temperature=0.0, max_tokens=40, no_repeat_ngram_size=3, ignore_eos=True)


def transformers_greedy(model, prompt: list[int], **kwargs) -> list[int]:
    """`model.generate` greedy for one prompt; an EOS id past the vocabulary never ends it (our ignore_eos)."""
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=BAN.max_tokens,
                         eos_token_id=model.config.vocab_size, pad_token_id=model.config.pad_token_id, **kwargs)
    return out[0, len(prompt):].tolist()


def repeated_ngrams(tokens: list[int], start: int, n: int = 3) -> list[tuple[int, ...]]:
    """The n-grams ending at or after `start` that occur earlier in `tokens`."""
    seen, repeats = set(), []
    for end in range(n, len(tokens) + 1):
        gram = tuple(tokens[end - n:end])
        if end > start and gram in seen:
            repeats.append(gram)
        seen.add(gram)
    return repeats


@pytest.fixture(scope="module")
def tiny_references(tiny):
    model, tokenizer = tiny
    prompts = [tokenizer(text).input_ids for text in PROMPTS]
    return prompts, [transformers_greedy(model, p, no_repeat_ngram_size=3) for p in prompts]


def test_generate_greedy_equals_transformers(tiny, tiny_references):
    model, tokenizer = tiny
    prompts, expected = tiny_references
    completions = generate(model, tokenizer, prompts, BAN)  # one left-padded batch
    assert [c.token_ids for c in completions] == expected
    free = transformers_greedy(model, prompts[0])
    assert repeated_ngrams(prompts[0] + free, len(prompts[0])), "without the ban greedy repeats itself"
    assert expected[0][0] != free[0], "the prompt's own 3-grams are banned too"


def test_engine_greedy_equals_transformers(tiny, tiny_references):
    model, tokenizer = tiny
    prompts, expected = tiny_references
    engine = Engine(model, tokenizer, block_size=8, max_num_seqs=2)
    assert [c.token_ids for c in engine.generate(prompts, BAN)] == expected


def test_sampled_text_never_repeats_a_3gram(tiny):
    model, tokenizer = tiny
    for seed, text in enumerate(PROMPTS):
        prompt = tokenizer(text).input_ids
        params = SamplingParams(temperature=1.2, max_tokens=60, no_repeat_ngram_size=3, ignore_eos=True, seed=seed)
        out = generate(model, tokenizer, [prompt], params)[0].token_ids
        assert len(out) == 60 and repeated_ngrams(prompt + out, len(prompt)) == []
