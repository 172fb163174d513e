"""What each penalty sees, as transformers and vLLM define it, and the same tokens from `generate` and `Engine` for
the same SamplingParams; top_k = 1 is the argmax even when the top logits tie."""
import pytest
import torch

from decodelab.engine.engine import Engine
from decodelab.decoding.generate import generate
from decodelab.sampling.penalties import apply_penalties
from decodelab.sampling.sampler import SamplingParams, sample

pytestmark = pytest.mark.usefixtures("one_thread")


def test_repetition_sees_the_prompt_frequency_and_presence_do_not():
    logits = torch.tensor([[2.0, 2.0, 2.0, 2.0]])
    prompt, output = [[0]], [[1, 1]]
    rep = apply_penalties(logits, [SamplingParams(repetition_penalty=2.0)], output, prompt)
    assert rep.tolist() == [[1.0, 1.0, 2.0, 2.0]]                 # token 0 (prompt) and 1 (output) both penalised
    freq = apply_penalties(logits, [SamplingParams(frequency_penalty=0.5)], output, prompt)
    assert freq.tolist() == [[2.0, 1.0, 2.0, 2.0]]                # only the output counts: token 1 twice
    pres = apply_penalties(logits, [SamplingParams(presence_penalty=0.5)], output, prompt)
    assert pres.tolist() == [[2.0, 1.5, 2.0, 2.0]]


def test_the_ngram_ban_spans_prompt_and_output():
    logits = torch.zeros(1, 5)
    # prompt ... 1 2 3, output 1 2: the 3-gram (1, 2, 3) of the prompt bans 3 after the output's (1, 2)
    banned = apply_penalties(logits, [SamplingParams(no_repeat_ngram_size=3)], [[1, 2]], [[4, 1, 2, 3]])
    assert torch.isinf(banned[0, 3]) and torch.isfinite(banned[0, [0, 1, 2, 4]]).all()


def test_top_k_1_is_the_argmax_even_on_ties():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0]] * 64)
    for seed in range(5):
        tokens = sample(logits, SamplingParams(top_k=1, temperature=1.3, seed=seed))
        assert tokens.tolist() == [1] * 64


@pytest.mark.parametrize("fields", [
    dict(temperature=0, repetition_penalty=1.3),
    dict(temperature=0, frequency_penalty=0.6, presence_penalty=0.4),
    dict(temperature=0, no_repeat_ngram_size=3),
    dict(temperature=0.9, seed=5, repetition_penalty=1.2, frequency_penalty=0.3),
    dict(temperature=1.0, seed=9, top_p=0.9, presence_penalty=0.8),
])
def test_generate_and_engine_give_the_same_tokens(tiny, fields):
    model, tokenizer = tiny
    prompts = ["小明喜欢吃苹果。小明", "老师说", "小红在北京"]
    params = SamplingParams(max_tokens=40, **fields)
    expected = [c.token_ids for c in generate(model, tokenizer, prompts, params)]
    got = [c.token_ids for c in Engine(model, tokenizer, max_num_seqs=4).generate(prompts, params)]
    assert got == expected
