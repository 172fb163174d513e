"""decodelab.measure.exposure (error hazard by prefix provenance), decodelab.measure.dagger and the small document models."""
import math
import re

import numpy as np
import pytest
import torch

from decodelab.measure.exposure import (RESTART, Binned, bin_by_position, count_errors, expert_probs, gap_and_interval,
                                hazards, judge, mean_and_interval, recovered)
from decodelab.models.load import load_model
from decodelab.toy.documents import DocumentLanguage
from decodelab.models.train import ASSETS, HELDOUT_SEED, cross_entropy_per_char

LANG = DocumentLanguage()
DOC = LANG.sample(1, seed=3)[0]
INTRO = "这是小明在北京的一天。"


def test_judge_on_a_true_document_is_clean_and_error_free():
    steps = judge(LANG, DOC)
    assert len(steps) == len(DOC) + 1
    assert all(s.status == "clean" and not s.error for s in steps)
    assert [s.repaired for s in steps] == [DOC[:t] for t in range(len(DOC) + 1)]
    assert steps[-1].at_boundary


def test_judge_drops_the_broken_sentence_and_restarts_after_it():
    text = INTRO + "小明喜欢吃书。小明"
    steps = judge(LANG, text)
    wrong = text.index("书")
    assert steps[wrong].error and steps[wrong].status == "clean"
    assert steps[wrong + 1].status == "broken"  # inside the broken sentence: no truth
    assert steps[len(text)].status == "after_error" and steps[len(text)].repaired == INTRO + "小明"
    assert sum(s.error for s in steps) == 1


def test_expert_probs_is_the_truth_on_clean_prefixes_and_restart_inside_a_broken_sentence():
    for t in (0, 5, len(DOC)):
        truth = LANG.next_token_probs(DOC[:t])
        expert = expert_probs(LANG, judge(LANG, DOC)[t], t)
        assert expert.keys() == truth.keys()
        assert all(math.isclose(expert[k], truth[k], rel_tol=1e-9) for k in truth)
    broken = judge(LANG, INTRO + "小明喜欢吃书")[-1]
    assert expert_probs(LANG, broken, len(INTRO) + 6) == {RESTART: 1.0}


def test_the_end_is_allowed_by_the_length_as_written_not_the_repaired_length():
    long_text = DOC + "小明喜欢吃书。"  # a broken last sentence: the repaired prefix is DOC, as long as written minus 7
    step = judge(LANG, long_text)[-1]
    assert step.status == "after_error" and step.at_boundary
    probs = expert_probs(LANG, step, len(long_text))
    assert math.isclose(probs[LANG.EOS], LANG.STOP_PROB) and math.isclose(sum(probs.values()), 1.0)
    assert LANG.EOS not in expert_probs(LANG, judge(LANG, INTRO)[-1], len(INTRO))  # too short to end


def test_recovered_and_count_errors():
    after = "小明喜欢吃米饭。小明喜欢吃米饭。"
    forced = INTRO + "小明喜欢书"
    assert recovered(LANG, forced + "。" + after, len(forced) - 1, ended=False)
    assert not recovered(LANG, forced + "。小明喜欢吃书。" + after, len(forced) - 1, ended=False)
    assert not recovered(LANG, forced + "喜欢喜欢喜欢", len(forced) - 1, ended=False)  # the sentence never ends
    assert count_errors(LANG, DOC, ended=True) == 0
    assert count_errors(LANG, INTRO + "小明喜欢吃米饭。", ended=True) == 1  # ends before MIN_CHARS
    assert count_errors(LANG, INTRO + "小明喜欢吃书。小明喜欢吃书。", ended=False) == 2


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="lang must be a DocumentLanguage"):
        judge(object(), DOC)
    with pytest.raises(TypeError, match="text must be a str"):
        judge(LANG, ["这"])
    with pytest.raises(ValueError, match="forced_at must index a token"):
        recovered(LANG, DOC, len(DOC), ended=True)
    with pytest.raises(ValueError, match="sentences must be an int >= 1"):
        recovered(LANG, DOC, 3, ended=True, sentences=0)
    with pytest.raises(ValueError, match="edges must be at least two increasing"):
        bin_by_position([[(1, 0.5)]], [5, 5])
    a = bin_by_position([[(1, 0.5)]], [0, 10])
    with pytest.raises(ValueError, match="same bins"):
        gap_and_interval(a, bin_by_position([[(1, 0.5)]], [0, 20]))


def test_bootstrap_means_pool_positions_and_resample_texts():
    binned = bin_by_position([[(1, 1.0), (2, 1.0), (15, 0.0)], [(3, 0.0)]], [0, 10, 20])
    assert binned.counts.tolist() == [[2, 1], [1, 0]]
    (mean, low, high), (mean2, _, _) = mean_and_interval(binned, draws=200)
    assert math.isclose(mean, 2 / 3) and 0 <= low <= mean <= high <= 1 and mean2 == 0.0
    gap = gap_and_interval(binned, Binned(binned.edges, np.zeros((1, 2)), np.ones((1, 2))), draws=200)
    assert math.isclose(gap[0][0], 2 / 3)


@pytest.fixture(scope="module")
def small():
    return load_model(str(ASSETS / "tiny-zh-doc-small"), device="cpu")


def test_hazards_are_probabilities_and_temperature_is_checked(small):
    model, tokenizer = small
    records = hazards(model, tokenizer, LANG, DOC, start=11)
    assert [t for t, _, _ in records] == list(range(11, len(DOC) + 1))
    assert all(0.0 <= h <= 1.0 and s == "clean" for _, s, h in records)
    with pytest.raises(ValueError, match="temperature must be a number > 0"):
        hazards(model, tokenizer, LANG, DOC, temperature=0)
    with pytest.raises(ValueError, match="start must be an int"):
        hazards(model, tokenizer, LANG, DOC, start=len(DOC) + 1)


def test_continue_texts_samples_the_nucleus_it_is_given(small):
    """A nucleus of one token (top_p tiny) is the argmax: the same texts as greedy; top_p out of range is refused."""
    from decodelab.measure.exposure import continue_texts
    model, tokenizer = small
    prompts = ["这是小明在北京的一天。", "这是老王在成都的一天。"]
    nucleus = continue_texts(model, tokenizer, prompts, seed=3, max_tokens=30, temperature=1.0, top_p=1e-9)
    assert nucleus == continue_texts(model, tokenizer, prompts, seed=3, max_tokens=30, temperature=0.0)
    assert nucleus != continue_texts(model, tokenizer, prompts, seed=3, max_tokens=30, temperature=1.0)
    with pytest.raises(ValueError, match="top_p"):
        continue_texts(model, tokenizer, prompts, seed=3, max_tokens=5, top_p=1.5)


# The shipped small models against their model cards: the card's figure was measured by the training script on the
# same 400 held-out documents, so the shipped weights must give it again within 0.002 nats/char.
@pytest.mark.parametrize("name", ["tiny-zh-doc-small", "tiny-zh-doc-small-soft", "tiny-zh-doc-small-dagger",
                                  "tiny-zh-doc-small-4xdata", "tiny-zh-doc-small-scheduled",
                                  "tiny-zh-doc-small-dagger-fulldata", "tiny-zh-doc-small-dagger-fulldata-noend"])
def test_shipped_small_models_match_their_model_cards(name):
    torch.set_num_threads(1)
    card = (ASSETS / name / "README.md").read_text(encoding="utf-8")
    stated = float(re.search(r"(?:model cross-entropy \| |Held-out cross-entropy \(400 documents\): )([\d.]+)",
                             card).group(1))
    model, tokenizer = load_model(str(ASSETS / name), device="cpu")
    texts = LANG.sample(400, seed=HELDOUT_SEED)
    assert abs(cross_entropy_per_char(model, tokenizer, texts, batch_size=32) - stated) < 0.002


def test_at_positions_keeps_the_data_at_the_survivors_positions_only():
    from decodelab.measure.exposure import at_positions
    data = [(t, 0.01 * t) for t in range(10, 20)]
    own = [(t, 0.5) for t in range(10, 14)]  # the own text erred at 13: its clean positions are 10..13
    assert at_positions(data, own) == data[:4]
    assert at_positions(data, []) == []


def test_survival_weights_are_the_running_product_and_check_their_input():
    from decodelab.measure.exposure import survival_weighted
    rows = survival_weighted([(2, 0.2), (0, 0.5), (1, 0.0)])  # sorted by position first
    assert [t for t, _, _ in rows] == [0, 1, 2]
    assert [w for _, _, w in rows] == pytest.approx([1.0, 0.5, 0.5])
    with pytest.raises(ValueError, match="hazards must be probabilities"):
        survival_weighted([(0, 1.5)])


def test_paired_ratio_difference_is_paired_and_checks_its_input():
    from decodelab.measure.exposure import paired_ratio_difference
    rng = np.random.default_rng(0)
    counts = rng.integers(5, 50, size=300).astype(float)
    level = rng.uniform(0.0, 0.2, size=300)  # documents differ a lot in how hard they are
    data = level * counts
    own = (level + 0.01) * counts  # every document's own text 0.01 worse
    value, low, high = paired_ratio_difference(own, counts, data, counts, draws=500, seed=1)
    assert value == pytest.approx(0.01) and 0.009 < low < high < 0.011  # pairing removes the between-document spread
    same = paired_ratio_difference(data, counts, data, counts, draws=100, seed=2)
    assert same == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="one length"):
        paired_ratio_difference(own, counts, data[:3], counts)
    with pytest.raises(ValueError, match="draws must be"):
        paired_ratio_difference(own, counts, data, counts, draws=0)
