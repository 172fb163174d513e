"""vLLM's request fields in the engine and in `generate`: min_tokens, bad_words, allowed_token_ids,
include_stop_str_in_output and prompt_logprobs, each against a direct computation (a greedy loop over the model's own
forward with the mask applied by hand, or the model's log-softmax), and their bad values refused naming the field."""
import dataclasses

import pytest
import torch

from decodelab.decoding.detokenize import IncrementalDetokenizer, truncate_at_stop
from decodelab.decoding.generate import generate
from decodelab.decoding.request import output_text
from decodelab.engine.engine import Engine
from decodelab.engine.speculation import SpeculativeConfig
from decodelab.sampling.sampler import SamplingParams
from decodelab.validation import ParamError


@pytest.fixture(scope="module")
def engine(tiny):
    model, tokenizer = tiny
    return Engine(model, tokenizer, max_num_seqs=8)


def greedy_by_hand(model, ids: list[int], steps: int, banned) -> list[int]:
    """Greedy decoding by the model's full forward at every step, with `banned(output) -> set of ids` masked."""
    out: list[int] = []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([ids + out])).logits[0, -1].float()
            for token in banned(out):
                logits[token] = -float("inf")
            out.append(int(logits.argmax()))
    return out


def test_min_tokens_where_eos_is_the_argmax(tiny, engine):
    model, tokenizer = tiny
    eos = tokenizer.eos_token_id
    [plain] = engine.generate(["小明"], SamplingParams(temperature=0, max_tokens=30))
    assert plain.token_ids[-1] == eos and plain.finish_reason == "stop"   # unconstrained, EOS is the argmax here
    k = len(plain.token_ids) + 3
    params = SamplingParams(temperature=0, max_tokens=30, min_tokens=k)
    [held] = engine.generate(["小明"], params)
    expected = greedy_by_hand(model, plain.prompt_token_ids, k, lambda out: {eos} if len(out) < k else set())
    assert held.token_ids[:k] == expected and eos not in held.token_ids[:k]
    assert len(held.token_ids) >= k
    [again] = generate(model, tokenizer, ["小明"], params)
    assert again.token_ids == held.token_ids and again.text == held.text


def test_bad_words_and_allowed_token_ids_against_a_greedy_loop(tiny, engine):
    model, tokenizer = tiny
    prompt = tokenizer("小明")["input_ids"]
    word = tuple(tokenizer("喜欢", add_special_tokens=False)["input_ids"])
    [c] = engine.generate(["小明"], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, bad_words=("喜欢",)))
    expected = greedy_by_hand(model, prompt, 10, lambda out: {word[1]} if out[-1:] == [word[0]] else set())
    assert c.token_ids == expected and "喜欢" not in c.text
    allowed = tuple(tokenizer("小明红喜欢。", add_special_tokens=False)["input_ids"])
    [a] = engine.generate(["小明"], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True,
                                                  allowed_token_ids=allowed))
    everything_else = set(range(model.config.vocab_size)) - set(allowed)
    assert a.token_ids == greedy_by_hand(model, prompt, 10, lambda out: everything_else)
    [g] = generate(model, tokenizer, ["小明"], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True,
                                                            allowed_token_ids=allowed))
    assert g.token_ids == a.token_ids
    seeded = SamplingParams(temperature=1.0, seed=4, max_tokens=20, ignore_eos=True, allowed_token_ids=allowed, n=3)
    [s] = engine.generate(["小明"], seeded)
    assert all(set(x.token_ids) <= set(allowed) for x in s.samples)


def byte_level_tokenizer():
    """A GPT-2-style byte-level BPE tokenizer trained here on a few English lines (no download): "hello" and
    " hello" are two different single tokens (hello, Ġhello), as in the tokenizers vLLM's leading-space rule is for."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(["hello world", "say hello to the world", "hello there", "the world says hello"] * 20,
                                trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>")


def test_bad_words_ban_the_leading_space_spelling_where_the_tokenizer_has_one():
    """vLLM's rule: a bad word is banned as tokenized and, when one space before it gives another first token and as
    many tokens, spelled that way too; leading whitespace of the word itself is stripped first."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from decodelab.decoding.request import with_bad_word_ids

    tokenizer = byte_level_tokenizer()
    ids = lambda text: tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
    assert len(ids("hello")) == len(ids(" hello")) == 1 and ids("hello") != ids(" hello")
    assert len(ids("world")) == 2 and len(ids(" world")) == 1          # a space that merges: not the same spelling
    assert len(ids(" hel")) == len(ids("hel")) + 1                     # a space that adds a token: not either
    params = with_bad_word_ids(SamplingParams(bad_words=("hello", " world", "hel")), tokenizer, "p")
    assert params.bad_word_ids == (ids("hello"), ids(" hello"), ids("world"), ids("hel"))
    # end to end: a random model with both spellings of hello pushed to the top by logit_bias; greedy with
    # bad_words=["hello"] must avoid both, as a greedy loop with both masked by hand does
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=64,
                                         bos_token_id=0, eos_token_id=1, pad_token_id=1)).eval()
    bias = {ids("hello")[0]: 30.0, ids(" hello")[0]: 20.0}
    prompt = list(ids("say hello to the world"))
    base = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logit_bias=bias)
    [free] = generate(model, tokenizer, [prompt], base)
    assert set(free.token_ids) == {ids("hello")[0]}                    # unbanned, the bias wins every step
    expected, banned = [], {ids("hello")[0], ids(" hello")[0]}
    with torch.no_grad():
        for _ in range(6):
            logits = model(torch.tensor([prompt + expected])).logits[0, -1].float()
            for token, value in bias.items():
                logits[token] += value
            logits[list(banned)] = -float("inf")
            expected.append(int(logits.argmax()))
    held = dataclasses.replace(base, bad_words=("hello",))
    [by_generate] = generate(model, tokenizer, [prompt], held)
    [by_engine] = Engine(model, tokenizer, max_num_seqs=2).generate([prompt], held)
    assert by_generate.token_ids == by_engine.token_ids == expected and not banned & set(expected)
    with pytest.raises(ParamError, match="tokenizes to no token"):
        with_bad_word_ids(SamplingParams(bad_words=("   ",)), tokenizer, "p")


def test_include_stop_str_in_output_and_min_tokens_with_stop_strings(tiny, engine):
    model, tokenizer = tiny
    [plain] = engine.generate(["小明"], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    [cut] = engine.generate(["小明"], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=("饭",)))
    [kept] = engine.generate(["小明"], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=("饭",),
                                                     include_stop_str_in_output=True))
    assert plain.text.startswith(kept.text) and kept.text == cut.text + "饭"
    # a stop string completed before min_tokens does not stop the sample; the first after it does. Stop strings do
    # not change what is drawn, so the same seeded request without them gives the tokens to cut by hand.
    k = 11
    free = SamplingParams(temperature=1.0, seed=0, max_tokens=40, ignore_eos=True, min_tokens=k)
    [tokens] = engine.generate(["今天，"], free)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
    assert "。" in decode(tokens.token_ids[:k - 1]), "the test needs a stop string before min_tokens"
    expected, stopped = truncate_at_stop(decode(tokens.token_ids), ("。",), after=len(decode(tokens.token_ids[:k - 1])))
    params = dataclasses.replace(free, stop=("。",))
    [late] = engine.generate(["今天，"], params)
    assert stopped and late.text == expected and late.finish_reason == "stop"
    assert len(late.token_ids) >= k and late.token_ids == tokens.token_ids[:len(late.token_ids)]
    assert generate(model, tokenizer, ["今天，"], params)[0].text == late.text


def test_the_stream_pieces_join_to_the_text_with_the_new_options(tiny):
    _, tokenizer = tiny
    ids = tokenizer("小明喜欢吃米饭。小红喜欢吃米饭。", add_special_tokens=False)["input_ids"]
    for kwargs in (dict(include_stop=True), dict(min_tokens=9), dict(min_tokens=9, include_stop=True)):
        detok = IncrementalDetokenizer(tokenizer, ("米饭",), **kwargs)
        pieces = []
        for token in ids:
            pieces.append(detok.push(token))
            if detok.stopped:
                break
        pieces.append(detok.finish())
        assert "".join(pieces) == detok.text
        params = SamplingParams(stop=("米饭",), include_stop_str_in_output=kwargs.get("include_stop", False),
                                min_tokens=kwargs.get("min_tokens", 0), max_tokens=20)
        decode = lambda t: tokenizer.decode(t, skip_special_tokens=True)
        assert output_text(ids[:len(detok.token_ids)], params, decode) == detok.text
    assert IncrementalDetokenizer(tokenizer, ("米饭",), min_tokens=9).text == ""


def test_prompt_logprobs_equal_the_models_log_softmax_and_skip_the_prefix_cache(tiny):
    model, tokenizer = tiny
    engine = Engine(model, tokenizer, max_num_seqs=8, block_size=4)
    prompt = "小明喜欢吃米饭。小红坐火车去北京。"
    ids = tokenizer(prompt)["input_ids"]
    engine.generate([prompt], SamplingParams(temperature=0, max_tokens=2))            # fills the prefix cache
    hits = engine.stats.prefix_cache_hit_tokens
    [c, other] = engine.generate([prompt, "老师说"], SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=3))
    assert engine.stats.prefix_cache_hit_tokens == hits, "a prompt_logprobs request was served from the cache"
    with torch.no_grad():
        reference = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)   # [L, V]
    assert c.prompt_logprobs[0] is None and len(c.prompt_logprobs) == len(ids)
    for j, entry in enumerate(c.prompt_logprobs[1:], start=1):
        row = reference[j - 1]
        assert entry.token_id == ids[j]
        assert abs(entry.logprob - row[ids[j]].item()) < 1e-5
        assert entry.rank == 1 + int((row > row[ids[j]] + 1e-6).sum())
        top_ids = row.topk(3).indices.tolist()
        assert [t for t, _ in entry.top] == top_ids
        assert all(abs(v - row[t].item()) < 1e-5 for t, v in entry.top)
    assert other.prompt_logprobs is not None and len(other.prompt_logprobs) == len(tokenizer("老师说")["input_ids"])
    [plain] = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=3))
    assert plain.prompt_logprobs is None and plain.token_ids == c.token_ids


def test_n_samples_share_the_prompt_logprobs(tiny, engine):
    [c] = engine.generate(["小明喜欢"], SamplingParams(temperature=1.0, seed=1, n=3, max_tokens=4, prompt_logprobs=0))
    assert len(c.prompt_logprobs) == 5 and all(e.top == () for e in c.prompt_logprobs[1:])


@pytest.mark.parametrize("kwargs, field", [
    (dict(bad_words=("hello",)), "bad_words"),                       # characters outside the vocabulary
    (dict(allowed_token_ids=(10**6,)), "allowed_token_ids"),
    (dict(bad_word_ids=((10**6,),)), "bad_word_ids"),
])
def test_bad_request_values_are_refused_before_anything_runs(engine, tiny, kwargs, field):
    model, tokenizer = tiny
    for call in (lambda p: engine.generate(["小明"], p), lambda p: generate(model, tokenizer, ["小明"], p)):
        with pytest.raises(ParamError) as error:
            call(SamplingParams(max_tokens=4, **kwargs))
        assert error.value.param == field
    assert not engine.has_unfinished()


def test_generate_and_speculation_refuse_prompt_logprobs(tiny):
    model, tokenizer = tiny
    with pytest.raises(ParamError, match="generate reports no log-probabilities"):
        generate(model, tokenizer, ["小明"], SamplingParams(prompt_logprobs=1))
    speculative = Engine(model, tokenizer, speculative=SpeculativeConfig(draft="ngram", gamma=2))
    with pytest.raises(ParamError) as error:
        speculative.check_request("小明", SamplingParams(prompt_logprobs=0))
    assert error.value.param == "prompt_logprobs"
