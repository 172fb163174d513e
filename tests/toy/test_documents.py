"""The document language: exact next-character probabilities, the protagonist carried across sentences, the exact
entropy rate against a Monte Carlo estimate, and clear errors for bad input."""
import math
import random

import pytest

from decodelab.toy.sentences import ToyLanguage
from decodelab.toy.automaton import compile_automaton
from decodelab.toy.documents import DocumentLanguage
from decodelab.toy.templates import _CLASSES, _TEMPLATE_ALPHA, _TEMPLATES


@pytest.fixture(scope="module")
def docs():
    return DocumentLanguage()


def test_documents_are_long_multi_sentence_and_valid(docs):
    for text in docs.sample(200, seed=1):
        sentences = docs.split_sentences(text)
        assert len(text) >= 150 and len(sentences) >= 5
        assert "".join(sentences) == text and docs.is_valid(text)
        assert sentences[0].startswith(f"这是{docs.protagonist(text)}在") and sentences[0].endswith("的一天。")


def test_sentence_grammar_is_prefix_free():
    """The assumption that makes sentence boundaries unambiguous: a finished sentence cannot go on."""
    automaton = compile_automaton(_CLASSES, _TEMPLATES, _TEMPLATE_ALPHA)
    for edges in automaton:
        if any(e.char is None for e in edges):
            assert len(edges) == 1


def test_chain_rule_and_normalisation(docs):
    """sum of log next-char probabilities along a document, plus its end, equals log_prob; every step sums to 1."""
    rng = random.Random(0)
    for text in docs.sample(5, seed=2):
        total = 0.0
        for i in range(len(text) + 1):
            probs = docs.next_token_probs(text[:i])
            assert math.isclose(sum(probs.values()), 1.0, abs_tol=1e-9)
            total += math.log(probs[text[i]] if i < len(text) else probs[docs.EOS])
        assert math.isclose(total, docs.log_prob(text), rel_tol=1e-9)
        cut = rng.randrange(20, len(text))
        assert docs.prefix_is_viable(text[:cut]) and not docs.is_valid(text[:cut] + "霜")


def test_end_only_after_min_chars(docs):
    short = "这是小明在北京的一天。小明喜欢吃米饭。"
    assert docs.EOS not in docs.next_token_probs(short) and docs.log_prob(short) == -math.inf
    text = next(t for t in docs.sample(50, seed=3) if len(t) > 170)
    ends = [i for i in range(len(text)) if docs.EOS in docs.next_token_probs(text[:i])]
    assert ends and min(ends) >= docs.MIN_CHARS
    assert all(math.isclose(docs.next_token_probs(text[:i])[docs.EOS], docs.STOP_PROB) for i in ends)


def test_protagonist_carries_across_sentences(docs):
    """After the intro, a sentence opens with the protagonist far more often than a free sentence names that person."""
    free = ToyLanguage().next_token_probs("")
    bound = docs.next_token_probs("这是陈阿姨在北京的一天。")
    assert bound["陈"] > 5 * free["陈"]
    assert docs.protagonist("这是陈阿姨在北京的一天。今天") == "陈阿姨" and docs.protagonist("这是") is None
    texts = docs.sample(300, seed=4)
    named = sum(t.count(docs.protagonist(t)) - 1 for t in texts) / len(texts)
    assert named > 4  # the protagonist is named again several times per document


@pytest.mark.slow
def test_exact_entropy_rate_matches_monte_carlo(docs):
    """The renewal recursion against 3,000 sampled documents (fixed seed): within 4 standard errors."""
    texts = docs.sample(3000, seed=5)
    nll = [-docs.log_prob(t) for t in texts]
    mean = sum(nll) / len(nll)
    se = math.sqrt(sum((x - mean) ** 2 for x in nll) / (len(nll) - 1) / len(nll))
    assert abs(mean - docs.document_entropy()) < 4 * se, (mean, docs.document_entropy(), se)
    mean_len = sum(map(len, texts)) / len(texts)
    assert abs(mean_len - docs.expected_length()) < 1.0
    assert math.isclose(docs.entropy_rate(), docs.document_entropy() / (docs.expected_length() + 1))
    assert 0.5 < docs.entropy_rate() < ToyLanguage().entropy_rate()  # the carried state makes text more predictable


def test_sample_sentences_are_sentences_of_the_protagonist(docs):
    lang = ToyLanguage()
    sentences = docs.sample_sentences("小明", 50, seed=6)
    assert all(lang.is_valid(s) for s in sentences)
    assert sum("小明" in s for s in sentences) > 20
    assert sentences == docs.sample_sentences("小明", 50, seed=6)


def test_bad_input(docs):
    with pytest.raises(TypeError, match="prefix must be a str"):
        docs.next_token_probs(3)
    with pytest.raises(ValueError, match="'x', which is not in the alphabet"):
        docs.log_prob("这是x")
    with pytest.raises(ValueError, match="cannot start any document"):
        docs.next_token_probs("小明")
    with pytest.raises(ValueError, match="n must be a non-negative int, got -1"):
        docs.sample(-1)
    with pytest.raises(TypeError, match="seed must be an int"):
        docs.sample(1, seed=True)
    with pytest.raises(ValueError, match="not a prefix of any document"):
        docs.split_sentences("小明喜欢吃米饭。")
    with pytest.raises(ValueError, match="protagonist must be one of"):
        docs.sample_sentences("孙悟空", 3)
    assert docs.is_valid("这是小明") is False and docs.prefix_is_viable("这是小明")
