"""vLLM's request constraints in the sampler: allowed_token_ids, bad words and min_tokens mask exactly the tokens a
direct computation masks, and every bad value is refused with an error naming the field."""
import math

import pytest
import torch

from decodelab.sampling.batch import SamplingBatch
from decodelab.sampling.constraints import apply_constraints
from decodelab.sampling.sampler import SamplingParams, process_logits, sample
from decodelab.validation import ParamError

V = 12
EOS = 2


def masked(logits: torch.Tensor, banned: set[int]) -> torch.Tensor:
    """The direct computation: the row with `banned` set to -inf."""
    out = logits.clone()
    out[list(banned)] = -math.inf
    return out


@pytest.fixture
def logits():
    generator = torch.Generator().manual_seed(0)
    return torch.randn(3, V, generator=generator)


def test_allowed_token_ids_keeps_only_those(logits):
    params = SamplingParams(allowed_token_ids=(1, 5, 7))
    out = process_logits(logits, params)
    for row in range(3):
        assert torch.equal(out[row], masked(logits[row], set(range(V)) - {1, 5, 7}))
    drawn = sample(logits.repeat(200, 1), SamplingParams(allowed_token_ids=[5, 7, 1], seed=3))
    assert set(drawn.tolist()) <= {1, 5, 7}


def test_bad_words_ban_single_tokens_always_and_the_last_token_after_its_prefix(logits):
    params = SamplingParams(bad_word_ids=((4,), (6, 8), (6, 9, 10)))
    outputs = [[], [1, 6], [6, 9]]
    out = process_logits(logits, params, outputs)
    expected = [{4}, {4, 8}, {4, 10}]          # (6, 8) needs the output to end with 6; (6, 9, 10) with 6, 9
    for row in range(3):
        assert torch.equal(out[row], masked(logits[row], expected[row])), row
    # the prompt is not searched (vLLM): only the output's last tokens complete a bad word
    prompt_only = process_logits(logits[:1], params, [[]], prompt_tokens=[[6]])
    assert torch.equal(prompt_only[0], masked(logits[0], {4}))


def test_min_tokens_masks_eos_and_stop_tokens_until_the_output_is_long_enough(logits):
    params = SamplingParams(min_tokens=3, stop_token_ids=(9,), max_tokens=10)
    outputs = [[], [1, 1], [1, 1, 1]]
    out = process_logits(logits, params, outputs, eos_token_ids={EOS})
    for row, banned in enumerate([{EOS, 9}, {EOS, 9}, set()]):
        assert torch.equal(out[row], masked(logits[row], banned)), row


def test_min_tokens_with_eos_as_the_argmax_takes_the_next_best():
    row = torch.tensor([[0.0, 1.0, 9.0, 3.0, 2.0]])            # EOS (2) is the argmax, then token 3
    params = SamplingParams(temperature=0, min_tokens=2, max_tokens=4)
    assert sample(row, params, output_tokens=[[]], eos_token_ids={EOS}).item() == 3
    assert sample(row, params, output_tokens=[[1, 1]], eos_token_ids={EOS}).item() == EOS
    # a tensor history with negative padding counts only the real tokens
    padded = torch.tensor([[1, -1]])
    assert sample(row, params, output_tokens=padded, eos_token_ids={EOS}).item() == 3


def test_rows_without_constraints_are_untouched(logits):
    batch = SamplingBatch([SamplingParams(), SamplingParams(allowed_token_ids=(0,)), SamplingParams()])
    out = apply_constraints(logits, batch, None, None)
    assert torch.equal(out[0], logits[0]) and torch.equal(out[2], logits[2])
    assert out[1, 0] == logits[1, 0] and torch.isinf(out[1, 1:]).all()
    assert torch.equal(apply_constraints(logits, SamplingBatch([SamplingParams()] * 3), None, None), logits)


@pytest.mark.parametrize("kwargs, call, message", [
    (dict(min_tokens=1), dict(output_tokens=[[]] * 3), "pass eos_token_ids"),
    (dict(min_tokens=1), dict(eos_token_ids={EOS}), "output_tokens is None"),
    (dict(bad_word_ids=((1, 2),)), dict(), "output_tokens is None"),
    (dict(allowed_token_ids=(V,)), dict(), "outside the vocabulary"),
    (dict(bad_word_ids=((V + 3,),)), dict(), "outside the vocabulary"),
    (dict(bad_words=("小",)), dict(), "pass bad_word_ids"),             # strings are never silently ignored
])
def test_what_a_constraint_needs_is_asked_for(logits, kwargs, call, message):
    with pytest.raises(ValueError, match=message):
        process_logits(logits, SamplingParams(**kwargs), **call)


@pytest.mark.parametrize("kwargs, field, fragment", [
    (dict(min_tokens=-1), "min_tokens", "min_tokens must be an int >= 0, got -1"),
    (dict(min_tokens=1.5), "min_tokens", "min_tokens must be an int >= 0"),
    (dict(min_tokens=20, max_tokens=16), "min_tokens", "min_tokens must be <= max_tokens=16, got 20"),
    (dict(allowed_token_ids=()), "allowed_token_ids", "non-empty"),
    (dict(allowed_token_ids=(1, -2)), "allowed_token_ids", "ints >= 0"),
    (dict(allowed_token_ids="12"), "allowed_token_ids", "ints >= 0"),
    (dict(allowed_token_ids=(3,), bad_word_ids=((3,),)), "allowed_token_ids", "all banned"),
    (dict(bad_words=("",)), "bad_words", "non-empty strings"),
    (dict(bad_words="坏"), "bad_words", "tuple of non-empty strings"),
    (dict(bad_word_ids=((),)), "bad_word_ids", "non-empty"),
    (dict(bad_word_ids=((1.0,),)), "bad_word_ids", "ints >= 0"),
    (dict(include_stop_str_in_output=1), "include_stop_str_in_output", "must be a bool"),
    (dict(prompt_logprobs=-1), "prompt_logprobs", "prompt_logprobs must be an int >= 0, got -1"),
    (dict(prompt_logprobs=21), "prompt_logprobs", "in [0, 20]"),
])
def test_bad_values_are_refused_naming_the_field(kwargs, field, fragment):
    with pytest.raises(ParamError) as error:
        SamplingParams(**kwargs)
    assert error.value.param == field and fragment in str(error.value)


def test_values_are_normalised():
    params = SamplingParams(allowed_token_ids=[5, 1, 5], bad_words=["坏"], bad_word_ids=[[3, 4]], min_tokens=2)
    assert params.allowed_token_ids == (1, 5) and params.bad_words == ("坏",) and params.bad_word_ids == ((3, 4),)
    assert params.has_constraints and params.needs_output_tokens
    assert not SamplingParams(allowed_token_ids=(1,)).needs_output_tokens       # needs no history
    assert not SamplingParams().has_constraints
