"""One request layer (decodelab.decoding.request) under generate and Engine: the same prompt errors, the same stop rule
(stop strings included), the same Completion."""
import pytest

from decodelab.engine.engine import Engine
from decodelab.decoding.generate import generate
from decodelab.decoding.request import Completion, prompt_token_ids
from decodelab.sampling.sampler import SamplingParams
from decodelab.validation import ParamError

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("prompt, error, message", [
    ([], ParamError, "must hold at least one token"),
    ([1, 10**6], ParamError, r"token ids must be in \[0, 473\)"),
    ([1, -1], ParamError, r"token ids must be in \[0, 473\)"),
    ("小" * 300, ParamError, "longer than the model's context of 256"),
    ("小x", ParamError, "outside the tokenizer's vocabulary"),
    ([1, 2.5], TypeError, "must be a string or a list of token ids"),
    ([True], TypeError, "must be a string or a list of token ids"),
])
def test_generate_and_engine_refuse_a_prompt_in_the_same_words(tiny, prompt, error, message):
    model, tokenizer = tiny
    engine = Engine(model, tokenizer)
    with pytest.raises(error, match=message) as from_engine:
        engine.generate([prompt], SamplingParams(max_tokens=2))
    with pytest.raises(error, match=message) as from_generate:
        generate(model, tokenizer, [prompt], SamplingParams(max_tokens=2))
    assert str(from_engine.value) == str(from_generate.value)
    assert not engine.has_unfinished()


def test_prompt_errors_name_the_field():
    with pytest.raises(ParamError) as error:
        prompt_token_ids([], None, "prompt")
    assert error.value.param == "prompt"


@pytest.mark.parametrize("rng", ["torch", "counter"])
def test_stop_strings_end_generate_and_engine_alike(tiny, rng):
    model, tokenizer = tiny
    prompts = ["小明", "老师说", "小红在北京"]
    params = SamplingParams(temperature=0.8, seed=4, max_tokens=40, stop=("。", "喜欢"))
    from_generate = generate(model, tokenizer, prompts, params, rng=rng)
    from_engine = Engine(model, tokenizer, rng=rng).generate(prompts, params)
    assert [(c.token_ids, c.text, c.finish_reason) for c in from_generate] == \
           [(c.token_ids, c.text, c.finish_reason) for c in from_engine]
    assert all(isinstance(c, Completion) for c in from_generate)
    assert [c.prompt_token_ids for c in from_generate] == [c.prompt_token_ids for c in from_engine]
    assert all("。" not in c.text and "喜欢" not in c.text for c in from_generate)
    assert any(c.finish_reason == "stop" and tokenizer.decode(c.token_ids) != c.text for c in from_generate)


def test_streamed_text_holds_back_a_possible_stop_string(tiny):
    model, tokenizer = tiny
    params = SamplingParams(temperature=0, max_tokens=30, stop=("米饭",))
    [whole] = generate(model, tokenizer, "小明", params)
    pieces = [e.text for e in generate(model, tokenizer, "小明", params, stream=True)]
    assert "".join(pieces) == whole.text and "米" not in "".join(pieces)
