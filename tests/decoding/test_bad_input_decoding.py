"""Bad arguments to generate, beam_search, speculative_generate and constrained_generate: each refused in words
that name the argument, the value and what is allowed; numpy and torch scalars taken as the numbers they hold."""
import math
import re

import numpy as np
import pytest
import torch

from decodelab.decoding.beam import MAX_ABS_LENGTH_PENALTY, beam_search
from decodelab.decoding.constrained import constrained_generate
from decodelab.decoding.generate import generate
from decodelab.decoding.request import prompt_token_ids
from decodelab.decoding.speculative import ModelDraft, NgramDraft, speculative_generate
from decodelab.grammar.backends import ToyLanguageGrammar
from decodelab.sampling.sampler import SamplingParams
from decodelab.validation import ParamError

GREEDY = SamplingParams(temperature=0.0, max_tokens=4)


def test_beam_search_names_an_out_of_vocabulary_prompt(random_llama):
    vocab = random_llama.config.vocab_size
    with pytest.raises(ParamError, match=re.escape(f"input_ids token ids must be in [0, {vocab}), got 4..{vocab}")):
        beam_search(random_llama, [4, vocab], num_beams=2, max_tokens=3)
    with pytest.raises(ParamError, match=re.escape("input_ids must be one prompt: integer ids of shape [T] or [1, T], "
                                                   "got shape (2, 3)")):
        beam_search(random_llama, np.zeros((2, 3), dtype=np.int64), num_beams=2, max_tokens=3)


@pytest.mark.parametrize("length_penalty", [math.inf, -math.inf, math.nan, 1e6, -10.5])
def test_beam_search_bounds_the_length_penalty(random_llama, length_penalty):
    message = (f"length_penalty must be a number in [-{MAX_ABS_LENGTH_PENALTY}, {MAX_ABS_LENGTH_PENALTY}], "
               f"got {length_penalty!r} (beyond that")
    with pytest.raises(ParamError, match=re.escape(message)):
        beam_search(random_llama, [4, 5], num_beams=2, max_tokens=3, length_penalty=length_penalty)


@pytest.mark.parametrize("length_penalty", [MAX_ABS_LENGTH_PENALTY, -MAX_ABS_LENGTH_PENALTY])
def test_beam_scores_stay_finite_and_nonzero_at_the_bound(random_llama, length_penalty):
    result = beam_search(random_llama, [4, 5], num_beams=2, max_tokens=12, length_penalty=length_penalty)
    assert math.isfinite(result.score) and result.score < 0


def test_beam_search_takes_numpy_and_torch_scalars_as_their_numbers(random_llama):
    plain = beam_search(random_llama, [4, 5, 6], num_beams=3, max_tokens=5, length_penalty=0.5, early_stopping=True,
                        eos_token_id=7)
    scalars = beam_search(random_llama, np.array([4, 5, 6]), num_beams=np.int64(3), max_tokens=torch.tensor(5),
                          length_penalty=np.float64(0.5), early_stopping=np.True_, eos_token_id=np.int64(7))
    assert scalars == plain
    with pytest.raises(ParamError, match="early_stopping must be True, False or 'never', got 1"):
        beam_search(random_llama, [4, 5], num_beams=2, max_tokens=3, early_stopping=1)  # a bool is not an int


def test_a_missing_or_swapped_model_is_named(random_llama, tiny):
    model, tokenizer = tiny
    with pytest.raises(ParamError, match="^model must be a transformers causal LM, got NoneType$"):
        generate(None, tokenizer, ["小明"], GREEDY)
    with pytest.raises(ParamError, match=re.escape("got a tokenizer where the model goes: call "
                                                   "generate(model, tokenizer, prompts, params)")):
        generate(tokenizer, model, ["小明"], GREEDY)
    with pytest.raises(ParamError, match=re.escape("got a tokenizer where the model goes: call beam_search(")):
        beam_search(tokenizer, [4, 5], num_beams=2, max_tokens=3)
    with pytest.raises(ParamError, match="^target must be a transformers causal LM, got NoneType$"):
        speculative_generate(None, tokenizer, "小明", GREEDY, NgramDraft())
    with pytest.raises(ParamError, match=re.escape("got a tokenizer where the target goes")):
        speculative_generate(tokenizer, model, "小明", GREEDY, NgramDraft())
    with pytest.raises(ParamError, match=re.escape("got a tokenizer where the model goes: call ModelDraft(model)")):
        ModelDraft(tokenizer)
    with pytest.raises(ParamError, match=re.escape("call constrained_generate(model, tokenizer, prompt, params, "
                                                   "grammar)")):
        constrained_generate(tokenizer, model, "", SamplingParams(seed=0), ToyLanguageGrammar(tokenizer))


@pytest.mark.parametrize("prompt", [np.array([4, 5, 6]), torch.tensor([4, 5, 6]), [np.int64(4), 5, torch.tensor(6)],
                                    (4, np.int32(5), 6)])
def test_prompt_ids_may_be_numpy_or_torch_integers(prompt):
    ids = prompt_token_ids(prompt, None, "prompt", vocab_size=10)
    assert ids == [4, 5, 6] and all(type(t) is int for t in ids)


@pytest.mark.parametrize("prompt", [[True, 4], [4.0, 5], np.array([4.0]), np.array([[4, 5]]), b"45"])
def test_prompt_ids_refuse_bools_floats_and_matrices(prompt):
    with pytest.raises(TypeError, match="prompt must be a string or a list of token ids, got"):
        prompt_token_ids(prompt, None, "prompt", vocab_size=10)


def test_generate_takes_a_numpy_prompt_as_the_same_ids(random_llama):
    expected = generate(random_llama, None, [[4, 5, 6]], GREEDY)[0].token_ids
    assert generate(random_llama, None, np.array([4, 5, 6]), GREEDY)[0].token_ids == expected
    assert generate(random_llama, None, [np.int64(4), np.int64(5), np.int64(6)], GREEDY)[0].token_ids == expected
