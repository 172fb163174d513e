"""The snowball channel: names in a text, the protagonist injection, the truth's slot share, the intervals, and the
next-true-character log p after a forced one (fixed seeds)."""
import math

import numpy as np
import pytest

from decodelab.measure.snowball import (Injection, injection_cases, paired_mean_difference, person_names,
                                        sentence_end_distance, slot_share, true_char_logprobs, wilson)
from decodelab.models.load import load_model
from decodelab.toy.documents import DocumentLanguage

DOCS = DocumentLanguage()


def test_names_are_found_longest_first_without_overlap():
    assert person_names("她的哥哥和小明在公园。", DOCS.protagonists) == ["她的哥哥", "小明"]
    assert person_names("今天天气很好。", DOCS.protagonists) == []


def test_the_slot_shares_of_one_protagonist_sum_to_one_and_favour_the_protagonist():
    shares = {n: slot_share(DOCS, "小红", n) for n in DOCS.protagonists}
    assert math.isclose(sum(shares.values()), 1.0, rel_tol=1e-12)
    assert max(shares, key=shares.get) == "小红"
    assert shares["小红"] > DOCS.PROTAGONIST_WEIGHT > shares["小明"]


def test_the_slot_share_matches_sentences_sampled_from_the_truth():
    # the counting rule applied to the truth's own sentences gives the exact share (seeded, 3,000 sentences)
    names = [n for s in DOCS.sample_sentences("老王", 3000, seed=5) for n in person_names(s, DOCS.protagonists)]
    share = names.count("老王") / len(names)
    assert abs(share - slot_share(DOCS, "老王", "老王")) < 0.03, share


def test_injection_swaps_the_protagonist_in_one_legal_body_sentence():
    cases = injection_cases(DOCS, DOCS.sample(30, seed=11), seed=1)
    assert len(cases) >= 20
    for case in cases:
        assert isinstance(case, Injection) and case.document.startswith(case.clean)
        assert case.injected_name != case.protagonist
        assert DOCS.prefix_is_viable(case.injected) and DOCS.protagonist(case.injected) == case.protagonist
        assert len(case.injected) - len(case.clean) == len(case.injected_name) - len(case.protagonist)
        assert case.clean.endswith("。") or case.clean.endswith("”")
    assert injection_cases(DOCS, DOCS.sample(30, seed=11), seed=1) == cases  # seeded


def test_wilson_covers_the_estimate_and_stays_in_unit_interval():
    for k, n in ((0, 10), (3, 10), (10, 10), (500, 1000)):
        low, high = wilson(k, n)
        assert 0.0 <= low <= k / n <= high <= 1.0
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == 1.0


def test_paired_difference_sees_a_shift_that_unpaired_noise_would_hide():
    rng = np.random.default_rng(0)
    base = rng.normal(0, 5, size=400)  # large between-unit spread
    shifted = base + 0.3 + rng.normal(0, 0.1, size=400)
    diff = paired_mean_difference(shifted, base, draws=1000, seed=1)
    assert diff["low"] > 0.2 and diff["high"] < 0.4 and diff["n"] == 400
    null = paired_mean_difference(base + rng.normal(0, 0.1, size=400), base, draws=1000, seed=2)
    assert null["low"] < 0 < null["high"]


def test_sentence_end_distance():
    text = "这是小明在北京的一天。小明问：“你今天跑步了吗？”小明"
    assert sentence_end_distance(text, 0) == 10
    assert sentence_end_distance(text, 10) == 0
    assert text[text.index("吗") + sentence_end_distance(text, text.index("吗"))] == "”"


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="text must be a str"):
        person_names(3, ["小明"])
    with pytest.raises(ValueError, match="names must be"):
        person_names("小明", [])
    with pytest.raises(ValueError, match="protagonist must be one of"):
        slot_share(DOCS, "小强", "小明")
    with pytest.raises(TypeError, match="docs must be a DocumentLanguage"):
        slot_share("docs", "小明", "小明")
    with pytest.raises(ValueError, match="successes must be at most n"):
        wilson(11, 10)
    with pytest.raises(ValueError, match="n must be"):
        wilson(0, 0)
    with pytest.raises(ValueError, match="equal length"):
        paired_mean_difference([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="weights must be"):
        paired_mean_difference([1.0, 2.0], [1.0, 2.0], weights=[0.0, 0.0])
    with pytest.raises(ValueError, match="position must index"):
        sentence_end_distance("小明。", 3)
    with pytest.raises(TypeError, match="docs must be a DocumentLanguage"):
        injection_cases("docs", [], seed=0)


@pytest.fixture(scope="module")
def doc_model():
    return load_model("tiny-zh-doc", device="cpu")


def test_a_forced_wrong_character_lowers_the_log_p_of_the_next_true_ones(doc_model):
    model, tokenizer = doc_model
    docs = DOCS.sample(8, seed=3)
    positions = [60] * len(docs)
    wrong = ["。" if d[60] != "。" else "的" for d in docs]
    as_written = true_char_logprobs(model, tokenizer, docs, positions, None, 5)
    forced = true_char_logprobs(model, tokenizer, docs, positions, wrong, 5)
    assert as_written.shape == (8, 5) and (as_written <= 0).all()
    assert forced[:, 0].mean() < as_written[:, 0].mean() - 1.0
    with pytest.raises(ValueError, match="runs past it"):
        true_char_logprobs(model, tokenizer, docs, [len(docs[0]) - 2] * 8, None, 5)
    with pytest.raises(ValueError, match="one entry per document"):
        true_char_logprobs(model, tokenizer, docs, positions[:3], None, 5)
