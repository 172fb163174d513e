"""The toy language is a proper distribution whose exact statistics match large fixed-seed samples."""
import math
import statistics

import pytest

from decodelab.toy.sentences import ToyLanguage


@pytest.fixture(scope="module")
def lang():
    return ToyLanguage()


@pytest.fixture(scope="module")
def sample(lang):
    return lang.sample(20_000, seed=123)


def test_size_of_the_language(lang, sample):
    from decodelab.toy import sentences as toylang

    assert len(lang.alphabet) >= 200
    assert lang.alphabet == sorted(set(lang.alphabet))
    assert len(toylang._TEMPLATES) >= 20
    lengths = [len(t) for t in sample]
    assert 7 <= min(lengths) and max(lengths) <= 30


def test_grammar_is_unambiguous(lang):
    assert lang.is_unambiguous()


def test_next_token_probs_sum_to_one(lang, sample):
    for text in sample[:300]:
        for i in range(len(text) + 1):
            probs = lang.next_token_probs(text[:i])
            assert math.isclose(sum(probs.values()), 1.0, abs_tol=1e-9)
            assert all(p > 0 for p in probs.values())
            assert set(probs) <= set(lang.alphabet) | {ToyLanguage.EOS}


def test_log_prob_is_sum_of_step_log_probs(lang, sample):
    for text in sample[:300]:
        steps = sum(math.log(lang.next_token_probs(text[:i])[text[i]]) for i in range(len(text)))
        steps += math.log(lang.next_token_probs(text)[ToyLanguage.EOS])
        assert math.isclose(lang.log_prob(text), steps, rel_tol=1e-9, abs_tol=1e-9)


def test_samples_are_valid_and_prefixes_viable(lang, sample):
    assert all(lang.is_valid(t) for t in sample)
    text = sample[0]
    assert all(lang.prefix_is_viable(text[:i]) for i in range(len(text) + 1))
    assert lang.sample(50, seed=7) == lang.sample(50, seed=7)
    assert lang.sample(50, seed=7) != lang.sample(50, seed=8)


def test_invalid_texts(lang):
    assert lang.log_prob("小明") == -math.inf  # a prefix, not a sentence
    assert not lang.is_valid("明小在公园跑步。")
    assert not lang.prefix_is_viable("明小")
    with pytest.raises(ValueError, match="cannot start"):
        lang.next_token_probs("明小")


def test_characters_outside_the_alphabet(lang):
    with pytest.raises(ValueError, match="'x'"):
        lang.next_token_probs("小明x")
    with pytest.raises(ValueError, match="text contains ' '"):
        lang.log_prob("小明 在")
    with pytest.raises(ValueError, match="'<'"):
        lang.is_valid("小明</s>")
    with pytest.raises(TypeError, match="prefix must be a str"):
        lang.prefix_is_viable(3)
    with pytest.raises(ValueError, match="n must be"):
        lang.sample(-1)
    with pytest.raises(TypeError, match="seed must be"):
        lang.sample(3, seed="a")


@pytest.mark.slow
def test_character_frequencies_match_exact_expectation(lang, sample):
    """Per-sentence counts are i.i.d. across sentences: each mean must lie within 5 standard errors."""
    expected = lang.expected_char_counts()
    assert math.isclose(sum(expected.values()), lang.expected_length(), rel_tol=1e-9)
    n = len(sample)
    z2 = []
    for ch in lang.alphabet:
        counts = [t.count(ch) for t in sample]
        mean = sum(counts) / n
        se = max(statistics.pstdev(counts), 1e-12) / math.sqrt(n)
        if expected[ch] * n >= 20:  # enough occurrences for the normal approximation
            z2.append(((mean - expected[ch]) / se) ** 2)
            assert abs(mean - expected[ch]) <= 5 * se, (ch, mean, expected[ch])
        else:
            assert sum(counts) <= 20 + 10 * math.sqrt(20)
    assert len(z2) >= 150
    assert statistics.mean(z2) < 1.5  # a chi-square mean far above 1 would reveal a systematic bias


def test_entropy_rate_matches_sample(lang, sample):
    nll = [-lang.log_prob(t) for t in sample]
    lengths = [len(t) + 1 for t in sample]
    n = len(sample)
    assert abs(statistics.mean(nll) - lang.sentence_entropy()) <= 5 * statistics.pstdev(nll) / math.sqrt(n)
    assert abs(statistics.mean(lengths) - (lang.expected_length() + 1)) <= 5 * statistics.pstdev(lengths) / math.sqrt(n)
    assert math.isclose(lang.entropy_rate(), lang.sentence_entropy() / (lang.expected_length() + 1))
    assert abs(sum(nll) / sum(lengths) - lang.entropy_rate()) < 0.02


def test_flat_and_peaked_contexts(lang):
    flat, peaked = lang.flat_context(), lang.peaked_context()
    assert lang.entropy(flat) > 3.0 and len(lang.next_token_probs(flat)) >= 24
    assert lang.entropy(peaked) < 1e-9
    entropies = [h for _, h in lang.example_contexts()]
    assert max(entropies) > 3.0 and min(entropies) < 1e-9
    assert lang.next_token_probs("")  # the empty prefix starts every sentence


def all_continuations(lang, prefix, logp=0.0, rest=""):
    """Every way to finish `prefix`, with its log-probability, by walking next_token_probs (small supports only)."""
    for ch, p in lang.next_token_probs(prefix + rest).items():
        if ch == lang.EOS:
            yield rest, logp + math.log(p)
        else:
            yield from all_continuations(lang, prefix, logp + math.log(p), rest + ch)


@pytest.mark.parametrize("prefix", ["小明喜欢吃", "祝", "你知道北"])
def test_most_probable_continuations_match_enumeration(lang, prefix):
    enumerated = sorted(all_continuations(lang, prefix), key=lambda item: -item[1])
    found = lang.most_probable_continuations(prefix, k=3)
    assert [text for text, _ in found] == [text for text, _ in enumerated[:3]]
    for (text, logp), (_, expected) in zip(found, enumerated):
        assert logp == pytest.approx(expected, abs=1e-9)
        assert logp == pytest.approx(lang.log_prob(prefix + text) - lang._forward(prefix)[1], abs=1e-9)


def test_most_probable_continuations_see_ties_and_short_supports(lang):
    (first, a), (second, b) = lang.most_probable_continuations("小明在", k=2)  # 30 equally likely places
    assert first != second and a == pytest.approx(b, abs=1e-12)
    assert lang.most_probable_continuations("床前明月光，疑是地上", k=5) == [("霜。", 0.0)]


@pytest.mark.parametrize("prefix, k, error, message", [
    ("小明", 0, ValueError, "k must be an int >= 1, got 0"),
    ("小明", 2.0, ValueError, "k must be an int >= 1, got 2.0"),
    ("小明", True, ValueError, "k must be an int >= 1, got True"),
    ("霜霜霜", 2, ValueError, "cannot start any sentence"),
    ("hello", 2, ValueError, "not in the alphabet"),
    (3, 2, TypeError, "prefix must be a str, got int"),
])
def test_most_probable_continuations_check_inputs(lang, prefix, k, error, message):
    with pytest.raises(error, match=message):
        lang.most_probable_continuations(prefix, k)
