"""Constrained decoding: masks from the toy language's automaton and from llguidance equal brute-force masks, the
sampler never leaves the grammar, a grammar that allows nothing is a clear error, the log-probabilities the loop
reports equal teacher-forced scores, the KL estimators agree with exact sums, every input is checked, and the
benchmark runs."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import regex
import torch

from decodelab.decoding.constrained import ConstrainedCompletion, constrained_generate, score_sequences
from decodelab.grammar.backends import LLGuidanceGrammar, ToyLanguageGrammar
from decodelab.grammar.base import check_token_ids
from decodelab.measure.constrained import (enumerate_grammar, kl_exact, kl_to_conditional, mean_log_ratio,
                                           wilson_interval)
from decodelab.decoding.generate import generate
from decodelab.models.load import load_model
from decodelab.sampling.sampler import SamplingParams
from decodelab.toy.sentences import ToyLanguage
from decodelab.validation import ParamError

ROOT = Path(__file__).resolve().parents[2]
CITY = "[^。！？]*北京[^。！？]*[。！？]"
FORM = "(小明|小红)(喜欢吃北京烤鸭|坐(飞机|火车)去北京)。"
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return load_model("tiny-zh", device="cpu")


@pytest.fixture(scope="module")
def tokenizer(model_and_tokenizer):
    return model_and_tokenizer[1]


@pytest.fixture(scope="module")
def lang():
    return ToyLanguage()


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def text_tokens(tokenizer) -> list[tuple[int, str]]:
    special = set(tokenizer.all_special_ids)
    return [(t, tokenizer.convert_ids_to_tokens(t)) for t in range(len(tokenizer)) if t not in special]


def brute_force_regex_mask(tokenizer, pattern: str, text: str) -> torch.Tensor:
    """Allowed: a token after which some completion still matches `pattern` as a whole (regex's partial matching),
    and EOS where `text` matches. Every literal of the patterns tested is in the vocabulary, so a partial match can
    be completed with its tokens."""
    mask = torch.zeros(len(tokenizer), dtype=torch.bool)
    compiled = regex.compile(pattern)
    for token, char in text_tokens(tokenizer):
        mask[token] = compiled.fullmatch(text + char, partial=True) is not None
    mask[tokenizer.eos_token_id] = compiled.fullmatch(text) is not None
    return mask


def brute_force_toy_mask(tokenizer, lang: ToyLanguage, text: str) -> torch.Tensor:
    mask = torch.zeros(len(tokenizer), dtype=torch.bool)
    for token, char in text_tokens(tokenizer):
        mask[token] = lang.in_alphabet(char) and lang.prefix_is_viable(text + char)
    mask[tokenizer.eos_token_id] = lang.is_valid(text)
    return mask


# ---- masks against brute force -------------------------------------------------------------------------------------

@pytest.mark.parametrize("pattern, texts", [
    (CITY, ["", "小明", "小明坐飞机去北", "小明坐飞机去北京", "北京", "你知道北京在哪里吗", "“北京”"]),
    (FORM, ["", "小", "小明", "小红喜欢吃", "小明坐飞机去北京", "小明坐飞机去北京。"]),
    ("(一|两|三)+个苹果。", ["", "一", "一两三", "一两三个", "一两三个苹果。"]),
])
def test_llguidance_mask_equals_brute_force(tokenizer, pattern, texts):
    grammar = LLGuidanceGrammar.regex(pattern, tokenizer)
    for text in texts:
        mask = grammar.mask(ids_of(tokenizer, text))
        assert torch.equal(mask, brute_force_regex_mask(tokenizer, pattern, text)), text


def test_llguidance_mask_on_sampled_prefixes(model_and_tokenizer):
    """Every prefix of constrained samples: the engine's mask equals the brute-force one."""
    model, tokenizer = model_and_tokenizer
    grammar = LLGuidanceGrammar.regex(CITY, tokenizer)
    for completion in constrained_generate(model, tokenizer, "", SamplingParams(seed=3, n=3, max_tokens=12), grammar):
        ids = [t for t in completion.token_ids if t != tokenizer.eos_token_id]
        for end in range(len(ids) + 1):
            text = tokenizer.decode(ids[:end])
            assert torch.equal(grammar.mask(ids[:end]), brute_force_regex_mask(tokenizer, CITY, text)), text


def test_toy_mask_equals_brute_force(tokenizer, lang):
    grammar = ToyLanguageGrammar(tokenizer, lang)
    for sentence in lang.sample(6, seed=1):
        for end in range(len(sentence) + 1):
            text = sentence[:end]
            assert torch.equal(grammar.mask(ids_of(tokenizer, text)), brute_force_toy_mask(tokenizer, lang, text))
    after = ToyLanguageGrammar(tokenizer, lang, prefix="床前明月光，疑是地上").mask([])
    assert after.nonzero().flatten().tolist() == ids_of(tokenizer, "霜")


def test_accepts_judges_whole_texts(tokenizer, lang):
    toy, city = ToyLanguageGrammar(tokenizer, lang), LLGuidanceGrammar.regex(CITY, tokenizer)
    good, eos = ids_of(tokenizer, "小明坐飞机去北京。"), tokenizer.eos_token_id
    assert toy.accepts(good) and toy.accepts(good + [eos]) and city.accepts(good)
    assert not toy.accepts(good[:-1]) and not city.accepts(good[:-1])
    assert not toy.accepts(ids_of(tokenizer, "北京小明。")) and city.accepts(ids_of(tokenizer, "北京小明。"))
    assert not city.accepts(ids_of(tokenizer, "小明喜欢吃米饭。"))


def test_json_is_out_of_reach_of_the_course_vocabulary(model_and_tokenizer):
    """No ASCII braces or quotes in the vocabulary: a JSON grammar allows no first token, and generation says so."""
    model, tokenizer = model_and_tokenizer
    grammar = LLGuidanceGrammar.json_schema({"type": "object"}, tokenizer)
    assert not grammar.mask([]).any()
    with pytest.raises(ParamError, match="allows no token after ''") as error:
        constrained_generate(model, tokenizer, "", SamplingParams(seed=0), grammar)
    assert error.value.param == "grammar" and "ASCII braces" in str(error.value)


def test_a_dead_end_mid_text_is_an_error_not_a_silent_eos(model_and_tokenizer):
    """The regex needs 'x' after 小明, which no token spells: the error names the text so far."""
    model, tokenizer = model_and_tokenizer
    grammar = LLGuidanceGrammar.regex("小明x。", tokenizer)
    assert not grammar.mask(ids_of(tokenizer, "小明")).any()
    state = grammar.start()
    for token in ids_of(tokenizer, "小明"):
        state.advance(token)
    raw = np.frombuffer(state.matcher.compute_logit_bias(), dtype=np.uint8)
    assert raw.nonzero()[0].tolist() == [tokenizer.eos_token_id]  # llguidance alone would end the text here
    with pytest.raises(ParamError, match="allows no token after '小明'"):
        constrained_generate(model, tokenizer, "", SamplingParams(seed=0, max_tokens=8), grammar)


# ---- the sampling loop ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("params", [SamplingParams(seed=0, n=6, max_tokens=60),
                                    SamplingParams(seed=1, n=6, max_tokens=60, temperature=2.0),
                                    SamplingParams(seed=2, n=4, max_tokens=60, top_p=0.9, repetition_penalty=1.3),
                                    SamplingParams(temperature=0.0, max_tokens=60)])
def test_constrained_samples_are_valid(model_and_tokenizer, lang, params):
    model, tokenizer = model_and_tokenizer
    out = constrained_generate(model, tokenizer, "", params, ToyLanguageGrammar(tokenizer, lang))
    assert len(out) == params.n
    for completion in out:
        assert isinstance(completion, ConstrainedCompletion) and completion.finish_reason == "stop"
        assert completion.token_ids[-1] == tokenizer.eos_token_id and lang.is_valid(completion.text)
        assert len(completion.allowed) == len(completion.kept_mass) == len(completion.token_ids)
        assert completion.log_q >= completion.log_p or params.greedy


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0, max_tokens=40),
                                    SamplingParams(temperature=0.0, max_tokens=40, repetition_penalty=1.5,
                                                   frequency_penalty=1.0, presence_penalty=0.5)])
def test_a_mask_that_keeps_the_greedy_path_changes_nothing(model_and_tokenizer, params):
    """Greedy from 小明 is a sentence of the language, so the mask never removes the argmax: the tokens equal
    generate's, penalties included (they see the prompt and the output as generate's do)."""
    model, tokenizer = model_and_tokenizer
    grammar = ToyLanguageGrammar(tokenizer, prefix="小明")
    assert constrained_generate(model, tokenizer, "小明", params, grammar)[0].token_ids == \
        generate(model, tokenizer, "小明", params)[0].token_ids


def test_regex_samples_match_and_prompt_ids_work(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    out = constrained_generate(model, tokenizer, [tokenizer.bos_token_id], SamplingParams(seed=4, n=8, max_tokens=20),
                               LLGuidanceGrammar.regex(FORM, tokenizer))
    assert all(regex.fullmatch(FORM, c.text) and c.finish_reason == "stop" for c in out)


def test_seeded_samples_repeat_and_differ_across_seeds(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    grammar = ToyLanguageGrammar(tokenizer)
    first, again, other = (constrained_generate(model, tokenizer, "", SamplingParams(seed=s, n=4, max_tokens=40),
                                                grammar) for s in (5, 5, 6))
    assert [c.token_ids for c in first] == [c.token_ids for c in again] != [c.token_ids for c in other]


def test_length_finish_when_max_tokens_runs_out(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    out = constrained_generate(model, tokenizer, "", SamplingParams(seed=0, n=2, max_tokens=3),
                               LLGuidanceGrammar.regex(CITY, tokenizer))
    assert [len(c.token_ids) for c in out] == [3, 3] and {c.finish_reason for c in out} == {"length"}


def test_reported_log_probs_equal_teacher_forced_scores(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    params = SamplingParams(seed=7, n=5, max_tokens=30, temperature=1.5)
    grammar = LLGuidanceGrammar.regex(FORM, tokenizer)
    out = constrained_generate(model, tokenizer, "", params, grammar)
    scores = score_sequences(model, tokenizer, "", [c.token_ids for c in out], params, grammar)
    for completion, (log_q, log_p) in zip(out, scores):
        assert log_q == pytest.approx(completion.log_q, abs=1e-4) and log_p == pytest.approx(completion.log_p, abs=1e-4)
        # at any temperature q / p = 1 / prod(m_t): the mask renormalises each step by the mass it kept
        assert completion.log_q - completion.log_p == pytest.approx(-sum(math.log(m) for m in completion.kept_mass),
                                                                    abs=1e-4)
    outside = score_sequences(model, tokenizer, "", [ids_of(tokenizer, "小明喜欢吃米饭。")], params, grammar)
    assert outside[0][0] == -math.inf and outside[0][1] > -math.inf


def test_sample_frequencies_follow_q(model_and_tokenizer):
    """Over the six strings of FORM, 600 samples' frequencies are within sampling error of q, exactly scored."""
    model, tokenizer = model_and_tokenizer
    grammar = LLGuidanceGrammar.regex(FORM, tokenizer)
    params = SamplingParams(seed=11, n=600, max_tokens=20)
    strings = enumerate_grammar(grammar)
    assert [tokenizer.decode(s, skip_special_tokens=True) for s in strings] and len(strings) == 6
    q = np.exp([lq for lq, _ in score_sequences(model, tokenizer, "", strings, params, grammar)])
    counts = {tuple(s): 0 for s in strings}
    for completion in constrained_generate(model, tokenizer, "", params, grammar):
        counts[tuple(completion.token_ids)] += 1
    expected = 600 * q
    chi2 = float(((np.array(list(counts.values())) - expected) ** 2 / expected).sum())
    assert chi2 < 20.5  # the 0.999 quantile of chi-square with 5 degrees of freedom


# ---- measurements ---------------------------------------------------------------------------------------------------

def test_wilson_interval():
    rate = wilson_interval(97, 100)
    assert rate.value == 0.97 and 0.915 < rate.low < 0.916 and 0.989 < rate.high < 0.990  # 91.5%, 99.0%
    assert wilson_interval(0, 50).low == 0.0 and wilson_interval(50, 50).high == 1.0 and wilson_interval(50, 50).low > 0.92


def test_kl_exact_and_estimates_agree():
    """q and p over three strings: exact KL, and the two sampling estimators close to it on 20,000 draws of q."""
    q, p = np.array([0.6, 0.3, 0.1]), np.array([0.05, 0.1, 0.05])  # Z = 0.2
    kl, log_z = kl_exact(np.log(q), np.log(p))
    conditional = p / p.sum()
    assert log_z == pytest.approx(math.log(0.2)) and kl == pytest.approx(float((q * np.log(q / conditional)).sum()))
    draws = np.random.default_rng(0).choice(3, size=20_000, p=q)
    by_weights = kl_to_conditional(np.log(q)[draws], np.log(p)[draws])
    valid = list(np.random.default_rng(1).random(20_000) < 0.2)
    by_rate = kl_to_conditional(np.log(q)[draws], np.log(p)[draws], valid=valid)
    for estimate in (by_weights, by_rate):
        assert estimate.kl.low < kl < estimate.kl.high and estimate.log_z.low < log_z < estimate.log_z.high
    assert 0 < by_weights.ess < 20_000
    assert mean_log_ratio([-1.0, -3.0], [-2.0, -2.0]).value == 0.0


def test_kl_is_zero_when_nothing_is_masked():
    estimate = kl_to_conditional([-1.0, -2.5, -0.5], [-1.0, -2.5, -0.5])
    assert estimate.kl.value == 0.0 and estimate.log_z.value == 0.0 and estimate.ess == pytest.approx(3.0)


def test_enumerate_grammar(tokenizer):
    texts = [tokenizer.decode(s, skip_special_tokens=True)
             for s in enumerate_grammar(LLGuidanceGrammar.regex("(一|两)(本书|个苹果)。", tokenizer))]
    assert sorted(texts) == sorted(["一本书。", "一个苹果。", "两本书。", "两个苹果。"])
    with pytest.raises(ParamError, match="more than limit=3"):
        enumerate_grammar(LLGuidanceGrammar.regex("(一|两)(本书|个苹果)。", tokenizer), limit=3)
    with pytest.raises(ParamError, match="sum to 1"):  # too short to reach the end: the list is incomplete
        kl_exact([math.log(0.5)], [math.log(0.1)])


# ---- every input is checked -----------------------------------------------------------------------------------------

def test_grammar_inputs_are_checked(tokenizer):
    with pytest.raises(ParamError, match="pattern must be a non-empty str"):
        LLGuidanceGrammar.regex("", tokenizer)
    with pytest.raises(ParamError, match="pattern does not compile"):
        LLGuidanceGrammar.regex("((", tokenizer)
    with pytest.raises(ParamError, match="schema is not valid JSON"):
        LLGuidanceGrammar.json_schema("{", tokenizer)
    with pytest.raises(ParamError, match="schema must be a JSON object"):
        LLGuidanceGrammar.json_schema([1], tokenizer)
    with pytest.raises(ParamError, match="grammar does not compile"):
        LLGuidanceGrammar.lark("start: missing_rule", tokenizer)
    with pytest.raises(ParamError, match="tokenizer must be a transformers tokenizer"):
        LLGuidanceGrammar.regex("小明", "not a tokenizer")
    with pytest.raises(ParamError, match="vocab_size must be None or an int >= the tokenizer's 473"):
        ToyLanguageGrammar(tokenizer, vocab_size=10)
    with pytest.raises(ParamError, match="language must be a ToyLanguage"):
        ToyLanguageGrammar(tokenizer, language="toy")
    with pytest.raises(ParamError, match="prefix must be text that starts a sentence"):
        ToyLanguageGrammar(tokenizer, prefix="霜霜")
    with pytest.raises(ParamError, match=r"token_ids must hold token ids in \[0, 473\), got \[999\]"):
        ToyLanguageGrammar(tokenizer).mask([999])
    with pytest.raises(ParamError, match="token_ids must be a list of token ids"):
        ToyLanguageGrammar(tokenizer).mask("小明")
    with pytest.raises(ParamError, match=r"token_ids\[0\] = .* is not allowed"):
        LLGuidanceGrammar.regex(FORM, tokenizer).mask(ids_of(tokenizer, "北京"))
    with pytest.raises(ParamError, match="token_ids must hold token ids"):
        LLGuidanceGrammar.regex(FORM, tokenizer).accepts([-1])
    assert check_token_ids(torch.tensor([4, 5]), 473, "ids") == [4, 5]


def test_a_byte_level_vocabulary_is_refused_with_a_pointer():
    """Tokens that are pieces of UTF-8 cannot be handed over as text: the error says what to use instead."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={"<s>": 0, "</s>": 1, **{c: i + 2 for i, c in enumerate(symbols)}}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    byte_level = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>")
    with pytest.raises(ParamError, match="is not whole text.*llguidance.hf.from_tokenizer"):
        LLGuidanceGrammar.regex("小明", byte_level)


def test_document_language_as_a_grammar(tokenizer):
    from decodelab.toy.documents import DocumentLanguage

    docs = DocumentLanguage()
    grammar = ToyLanguageGrammar(tokenizer, docs)
    opening = ids_of(tokenizer, "这是小明在北京的一天。")
    assert not grammar.mask(opening)[tokenizer.eos_token_id]  # too short to end a document
    assert torch.equal(grammar.mask(opening[:4]), brute_force_toy_mask(tokenizer, docs, "这是小明"))


def test_a_padded_vocabulary_is_masked_beyond_the_tokenizer(tokenizer):
    grammar = LLGuidanceGrammar.regex(FORM, tokenizer, vocab_size=480)
    mask = grammar.mask([])
    assert mask.shape == (480,) and not mask[473:].any() and mask.sum() == 1  # 小


def test_generation_inputs_are_checked(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    grammar, params = ToyLanguageGrammar(tokenizer), SamplingParams(seed=0)
    cases = [
        (("not a model", tokenizer, "", params, grammar), "model must be a transformers causal LM"),
        ((model, tokenizer, "", {"temperature": 1}, grammar), "params must be a SamplingParams"),
        ((model, tokenizer, "", SamplingParams(ignore_eos=True), grammar), "the grammar decides where the text ends"),
        ((model, tokenizer, "", SamplingParams(stop=("。",)), grammar), "the grammar decides where the text ends"),
        ((model, tokenizer, "", params, "[^。]*"), "grammar must be a Grammar"),
        ((model, tokenizer, "", params, ToyLanguageGrammar(tokenizer, vocab_size=500)), "build the grammar with "
                                                                                          "vocab_size=473"),
        ((model, tokenizer, [], params, grammar), "prompt must be a str or a non-empty list"),
        ((model, tokenizer, [1, 9999], params, grammar), "prompt must be a str or a non-empty list"),
        ((model, tokenizer, "abc", params, grammar), "outside the tokenizer's vocabulary"),
        ((model, tokenizer, [1] * 300, params, grammar), "longer than the model's context"),
    ]
    for args, message in cases:
        with pytest.raises((ParamError, ValueError), match=message):
            constrained_generate(*args)
    with pytest.raises(ParamError, match="sequences must be a non-empty list"):
        score_sequences(model, tokenizer, "", [], params, grammar)
    with pytest.raises(ParamError, match="every sequence needs at least one token"):
        score_sequences(model, tokenizer, "", [[]], params, grammar)


def test_measure_inputs_are_checked(tokenizer):
    with pytest.raises(ParamError, match="successes must be <= trials"):
        wilson_interval(5, 4)
    with pytest.raises(ParamError, match="trials must be an int >= 1"):
        wilson_interval(0, 0)
    with pytest.raises(ParamError, match="log_q must be a non-empty list"):
        kl_to_conditional([], [])
    with pytest.raises(ParamError, match="log_p must hold log-probabilities"):
        kl_to_conditional([-1.0], [0.5])
    with pytest.raises(ParamError, match="log_q and log_p must pair up"):
        kl_to_conditional([-1.0], [-1.0, -2.0])
    with pytest.raises(ParamError, match="valid must be a non-empty list of bools"):
        kl_to_conditional([-1.0], [-1.0], valid=[1, 0])
    with pytest.raises(ParamError, match="none of the 2 unconstrained samples is valid"):
        kl_to_conditional([-1.0], [-1.0], valid=[False, False])
    with pytest.raises(ParamError, match="draws must be an int >= 1"):
        kl_to_conditional([-1.0], [-1.0], draws=0)
    with pytest.raises(ParamError, match="log_a and log_b must pair up"):
        mean_log_ratio([-1.0], [-1.0, -2.0])
    with pytest.raises(ParamError, match="seed must be an int >= 0"):
        mean_log_ratio([-1.0], [-1.0], seed=-1)
    with pytest.raises(ParamError, match="grammar must be a Grammar"):
        enumerate_grammar("(一|两)。")
    with pytest.raises(ParamError, match="max_tokens must be an int >= 1"):
        enumerate_grammar(ToyLanguageGrammar(tokenizer), max_tokens=0)


# ---- the benchmark --------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_benchmark_quick_run(tmp_path):
    out = tmp_path / "constrained.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "constrained.py"), "--quick", "--out", str(out)],
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert "| " in result.stdout and data["quick"] is True
    for row in data["validity"]:
        assert row["constrained"]["value"] == 1.0 and 0.0 <= row["unconstrained"]["value"] <= 1.0
    for row in data["overhead"]:
        assert row["mask_ms"] > 0 and row["forward_ms"] > 0
