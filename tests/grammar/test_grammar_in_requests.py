"""A grammar as a field of SamplingParams: Engine and generate mask each step of that request, and draw what
constrained_generate draws; requests without one in the same batch are untouched."""
import pytest

from decodelab.decoding.constrained import constrained_generate
from decodelab.grammar.backends import LLGuidanceGrammar, ToyLanguageGrammar
from decodelab.engine.engine import Engine
from decodelab.decoding.generate import generate
from decodelab.sampling.sampler import SamplingParams
from decodelab.validation import ParamError

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def city(tiny):
    return LLGuidanceGrammar.regex("(小明|小红)(喜欢吃北京烤鸭|坐(飞机|火车)去北京)。", tiny[1])


@pytest.mark.parametrize("rng", ["torch", "counter"])
@pytest.mark.parametrize("temperature", [0.0, 1.0, 2.0])
def test_engine_and_generate_draw_what_constrained_generate_draws(tiny, city, temperature, rng):
    model, tokenizer = tiny
    params = SamplingParams(temperature=temperature, seed=3, max_tokens=30, grammar=city)
    [expected] = constrained_generate(model, tokenizer, "今天，", SamplingParams(temperature=temperature, seed=3,
                                                                                   max_tokens=30), city, rng=rng)
    [from_engine] = Engine(model, tokenizer, rng=rng).generate(["今天，"], params)
    [from_generate] = generate(model, tokenizer, "今天，", params, rng=rng)
    assert from_engine.token_ids == from_generate.token_ids == expected.token_ids
    if temperature > 0:   # the kind of stream reaches the draw: the other kind picks another of the six sentences here
        other = {"torch": "counter", "counter": "torch"}[rng]
        [theirs] = constrained_generate(model, tokenizer, "今天，", SamplingParams(temperature=temperature, seed=3,
                                                                                    max_tokens=30), city, rng=other)
        assert theirs.token_ids != expected.token_ids
    assert city.accepts(from_engine.token_ids) and from_engine.finish_reason == "stop"


def test_a_grammar_request_shares_the_batch_with_free_ones(tiny):
    model, tokenizer = tiny
    toy = ToyLanguageGrammar(tokenizer, prefix="小明")             # the output must finish a sentence begun by 小明
    free = SamplingParams(temperature=2.0, seed=5, max_tokens=40)
    strict = SamplingParams(temperature=2.0, seed=5, max_tokens=40, grammar=toy)
    engine = Engine(model, tokenizer)
    mixed = engine.generate(["小明", "小明"], [free, strict])
    [alone] = engine.generate(["小明"], free)
    assert mixed[0].token_ids == alone.token_ids                 # the free request is untouched by its neighbour
    assert toy.accepts(mixed[1].token_ids) and mixed[1].finish_reason == "stop"


def test_n_samples_each_follow_the_grammar(tiny, city):
    model, tokenizer = tiny
    [c] = Engine(model, tokenizer).generate(["今天，"], SamplingParams(temperature=1.5, seed=1, n=4, max_tokens=30,
                                                                     grammar=city))
    assert len(c.samples) == 4 and all(city.accepts(s.token_ids) for s in c.samples)


def test_a_grammar_is_checked(tiny):
    model, tokenizer = tiny
    with pytest.raises(ParamError, match="grammar must be None or a decodelab grammar") as error:
        SamplingParams(grammar="小明.*")
    assert error.value.param == "grammar"
    json_only = LLGuidanceGrammar.json_schema({"type": "object"}, tokenizer)
    engine = Engine(model, tokenizer)
    with pytest.raises(ParamError, match="allows no token"):
        engine.generate(["小明"], SamplingParams(max_tokens=5, grammar=json_only))
    assert not engine.has_unfinished()


def test_constrained_generate_refuses_an_unknown_kind_of_stream(tiny, city):
    with pytest.raises(ValueError, match=r"rng must be one of \('torch', 'counter'\), got 'numpy'"):
        constrained_generate(*tiny, "今天，", SamplingParams(seed=3, max_tokens=5), city, rng="numpy")
