"""Text statistics of decodelab.measure.scoring against brute-force definitions, the toy language and a random model."""
import math
import random
from collections import Counter

import pytest
import torch

from decodelab.measure import scoring as M
from decodelab.models.tokenizer import build_tokenizer
from decodelab.toy.sentences import ToyLanguage


@pytest.fixture(scope="module")
def lang():
    return ToyLanguage()


# ---- repetition ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "loop"), [
    ("小明在公园在公园在公园", "在公园"),
    ("好好好", "好"),
    ("好好", ""),
    ("小明在公园跑步。", ""),
    ("", ""),
    ("ab" * 3 + "c" * 9, "ccc"),
])
def test_longest_loop(text, loop):
    assert M.longest_loop(text) == loop


def test_repetition_rate_counts_texts_with_a_loop():
    assert M.repetition_rate(["小明在公园跑步。", "在公园在公园在公园", "好好好。", "妈妈"]) == 0.5
    assert M.repetition_rate(["妈妈"], min_repeats=2) == 1.0


def test_the_true_language_never_loops(lang):
    assert M.repetition_rate(lang.sample(3000, seed=7)) == 0.0


# ---- diversity -------------------------------------------------------------------------------------------------

def test_distinct_n_matches_its_definition():
    rng = random.Random(0)
    texts = ["".join(rng.choice("abcd") for _ in range(rng.randint(0, 9))) for _ in range(50)]
    for n in (1, 2, 3):
        grams = [t[i:i + n] for t in texts for i in range(len(t) - n + 1)]
        assert M.distinct_n(texts, n) == pytest.approx(len(set(grams)) / len(grams))
    assert M.distinct_n(["a", "b"], n=2) == 0.0
    assert M.distinct_n(["同一句话。"] * 10, n=2) == pytest.approx(0.1)


def _bleu_brute_force(hyp, refs, max_n=4):
    log_p = 0.0
    for n in range(1, max_n + 1):
        counts = Counter(hyp[i:i + n] for i in range(len(hyp) - n + 1))
        total = sum(counts.values())
        if total == 0:
            return 0.0
        ref_counts = [Counter(r[i:i + n] for i in range(len(r) - n + 1)) for r in refs]
        matched = sum(min(c, max(rc[g] for rc in ref_counts)) for g, c in counts.items())
        log_p += math.log((matched or 0.1) / total) / max_n
    closest = min((len(r) for r in refs), key=lambda r: (abs(r - len(hyp)), r))
    return (1.0 if len(hyp) > closest else math.exp(1 - closest / len(hyp))) * math.exp(log_p)


def test_self_bleu_equals_brute_force_over_references():
    rng = random.Random(1)
    texts = ["".join(rng.choice("甲乙丙丁") for _ in range(rng.randint(1, 12))) for _ in range(40)]
    expected = sum(_bleu_brute_force(t, texts[:i] + texts[i + 1:]) for i, t in enumerate(texts)) / len(texts)
    assert M.self_bleu(texts) == pytest.approx(expected, rel=1e-12)


def test_self_bleu_orders_sets_by_similarity(lang):
    same = ["今天，小明在公园跑步。"] * 5
    varied = lang.sample(200, seed=3)
    assert M.self_bleu(same) == pytest.approx(1.0)
    assert 0.0 < M.self_bleu(varied) < 0.95


# ---- model likelihood ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def random_model_and_tokenizer(random_llama):
    return random_llama, build_tokenizer(list("甲乙丙丁戊己庚辛"))


def test_continuation_log_probs_equal_step_by_step_scores(random_model_and_tokenizer):
    model, tok = random_model_and_tokenizer
    prompts, conts, ended = ["甲", "乙丙丁", "戊"], ["乙丙", "戊", "己庚辛甲乙"], [True, False, True]
    scores = M.continuation_log_probs(model, tok, prompts, conts, ended, batch_size=2)
    for score, prompt, cont, end in zip(scores, prompts, conts, ended):
        ids = tok(prompt)["input_ids"]
        targets = tok(cont, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if end else [])
        expected = 0.0
        for target in targets:  # one full forward per step, no padding, no batching
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            expected += torch.log_softmax(logits.double(), -1)[target].item()
            ids = ids + [target]
        assert score.num_tokens == len(targets)
        assert score.log_prob == pytest.approx(expected, abs=1e-4)


def test_perplexity_is_token_weighted():
    scores = [M.ContinuationScore(-3.0, 1), M.ContinuationScore(-1.0, 3)]
    assert M.perplexity(scores) == pytest.approx(math.exp(1.0))


# ---- truth -----------------------------------------------------------------------------------------------------

def test_true_log_prob_matches_the_language(lang):
    for text in lang.sample(30, seed=5):
        assert M.true_log_prob(lang, "", text) == pytest.approx(lang.log_prob(text), abs=1e-9)
        cut = len(text) // 2
        prompt_lp = M.true_log_prob(lang, "", text[:cut], ended=False)
        assert prompt_lp + M.true_log_prob(lang, text[:cut], text[cut:]) == pytest.approx(lang.log_prob(text))
    assert M.true_log_prob(lang, "床前明月光，疑是地上", "霜。") == 0.0


def test_invalid_continuations_get_minus_infinity(lang):
    assert M.true_log_prob(lang, "小明坐", "在公园跑步。") == -math.inf
    assert M.true_log_prob(lang, "小明", "在公园跑步", ended=False) > -math.inf  # a viable prefix
    assert M.true_log_prob(lang, "小明", "在公园跑步", ended=True) == -math.inf  # the sentence needs its 。
    assert M.true_log_prob(lang, "xyz", "。") == -math.inf
    assert not M.is_valid_continuation(lang, "小明坐", "在公园跑步。")
    assert M.is_valid_continuation(lang, "小明坐", "地铁去北京。")


def test_support_errors_against_hand_counts():
    kept = torch.tensor([True, True, False, False, True])
    model_probs = torch.tensor([0.4, 0.3, 0.1, 0.1, 0.1])
    true_probs = torch.tensor([0.5, 0.0, 0.3, 0.2, 0.0])
    errors = M.support_errors(kept, model_probs, true_probs)
    assert errors == M.SupportErrors(kept=3, possible=3, dropped_possible=2, dropped_true_mass=0.5,
                                     admitted_impossible=2, admitted_mass=0.5)


# ---- bad input -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: M.distinct_n("abc"), TypeError, "texts must be a list of str, got str"),
    (lambda: M.distinct_n([]), ValueError, "texts must hold at least 1 text"),
    (lambda: M.distinct_n(["a", 3]), TypeError, r"texts\[1\] must be a str, got int"),
    (lambda: M.distinct_n(["a"], n=0), ValueError, "n must be an int >= 1, got 0"),
    (lambda: M.self_bleu(["a"]), ValueError, "texts must hold at least 2 text"),
    (lambda: M.repetition_rate(["a"], min_repeats=1), ValueError, "min_repeats must be an int >= 2, got 1"),
    (lambda: M.longest_loop(5), TypeError, "text must be a str, got int"),
    (lambda: M.perplexity([]), ValueError, "scores must be a non-empty list"),
    (lambda: M.perplexity([M.ContinuationScore(0.0, 0)]), ValueError, "at least one token"),
    (lambda: M.perplexity([1.0]), TypeError, r"scores\[0\] must be a ContinuationScore, got float"),
    (lambda: M.true_log_prob("lang", "", ""), TypeError, "lang must be a ToyLanguage or a DocumentLanguage, got str"),
    (lambda: M.support_errors(torch.ones(3), torch.ones(3), torch.ones(3)), TypeError, "kept must be a bool tensor"),
    (lambda: M.support_errors(torch.zeros(3, dtype=torch.bool), torch.ones(3), torch.ones(3)), ValueError,
     "kept must keep at least one token"),
    (lambda: M.support_errors(torch.ones(3, dtype=torch.bool), torch.ones(2), torch.ones(3)), ValueError,
     "must have one shape"),
])
def test_bad_input_names_the_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_continuation_log_probs_checks_pairs(random_model_and_tokenizer):
    model, tok = random_model_and_tokenizer
    with pytest.raises(ValueError, match="prompts and continuations must pair up, got 2 and 1"):
        M.continuation_log_probs(model, tok, ["甲", "乙"], ["丙"])
    with pytest.raises(ValueError, match="ended must hold one bool per prompt"):
        M.continuation_log_probs(model, tok, ["甲"], ["丙"], ended=[1])
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        M.continuation_log_probs(model, tok, ["甲"], ["丙"], batch_size=0)


def test_true_log_prob_checks_types(lang):
    with pytest.raises(TypeError, match="continuation must be a str, got list"):
        M.true_log_prob(lang, "", ["a"])
    with pytest.raises(TypeError, match="ended must be a bool, got int"):
        M.true_log_prob(lang, "", "a", ended=1)


def test_truncation_errors_row_by_row_equal_support_errors():
    gen = torch.Generator().manual_seed(0)
    model_probs = torch.randn(6, 12, generator=gen).softmax(-1)  # [6, 12]
    true_probs = torch.where(torch.rand(6, 12, generator=gen) < 0.5, torch.rand(6, 12, generator=gen), 0.0)
    true_probs[:, 0] = 0.3  # every row has a possible token
    true_probs = true_probs / true_probs.sum(-1, keepdim=True)
    kept = model_probs >= model_probs.topk(4, dim=-1).values[:, -1:]  # top-4 per row
    rows = M.truncation_errors(kept, model_probs, true_probs)
    for i in range(6):
        single = M.support_errors(kept[i], model_probs[i], true_probs[i])
        assert single.kept == int(rows["kept"][i]) == 4
        assert single.dropped_possible == int(rows["dropped_possible"][i])
        assert single.admitted_impossible == int(rows["admitted_impossible"][i])
        assert single.dropped_true_mass == pytest.approx(float(rows["dropped_true_mass"][i]), abs=1e-6)
        assert single.admitted_mass == pytest.approx(float(rows["admitted_mass"][i]), abs=1e-6)
        expected_admitted = model_probs[i][kept[i] & (true_probs[i] == 0)].sum() / model_probs[i][kept[i]].sum()
        assert single.admitted_mass == pytest.approx(float(expected_admitted), abs=1e-6)
    with pytest.raises(ValueError, match=r"kept must be a 2-D tensor \[N, V\]"):
        M.truncation_errors(kept[0], model_probs, true_probs)
    with pytest.raises(ValueError, match="kept must keep at least one token in every row"):
        M.truncation_errors(torch.zeros_like(kept), model_probs, true_probs)


def test_text_stats_of_the_true_language(tiny, lang):
    model, tok = tiny
    texts = lang.sample(40, seed=9)
    stats = M.text_stats(model, tok, lang, [t[:2] for t in texts], [t[2:] for t in texts])
    assert stats.validity == 1.0 and stats.repetition_rate == 0.0 and stats.num_texts == 40
    expected = sum(lang.log_prob(t) - M.true_log_prob(lang, "", t[:2], ended=False) for t in texts)
    assert stats.true_log_prob_per_token == pytest.approx(expected / sum(len(t) - 1 for t in texts))
    assert 1.0 < stats.model_perplexity < 3.0  # tiny-zh is close to the truth (entropy rate ~0.79 nats)
    unfinished = M.text_stats(model, tok, lang, ["小明"], ["在公园"], ended=[False])
    assert unfinished.validity == 0.0 and unfinished.true_log_prob_per_token is None and unfinished.self_bleu is None


def test_ending_loop_follows_holtzman():
    """A loop is the end of the text: the most repeated tail phrase, at least 3 characters, at least twice."""
    assert M.ending_loop("这是小明。小明在公园。小明在公园。小明在公园。") == ("小明在公园。", 3)
    assert M.ending_loop("小明在公园。小明在公园。今天") is None  # the loop must reach the end
    assert M.ending_loop("哈哈") is None  # a 1-character phrase needs more than 50 repeats
    assert M.ending_loop("哈" * 51) == ("哈", 51)
    assert M.loop_rate(["ab" * 2, "abcabc", "abcd"]) == pytest.approx(1 / 3)
    with pytest.raises(TypeError, match="text must be a str"):
        M.ending_loop(None)
    with pytest.raises(ValueError, match="max_phrase must be an int >= 1, got 0"):
        M.ending_loop("abc", max_phrase=0)


def test_zipf_coefficient():
    assert M.zipf_coefficient(["a" * 12 + "b" * 6 + "c" * 4 + "d" * 3]) == pytest.approx(1.0, abs=1e-9)
    with pytest.raises(ValueError, match="at least 2 distinct characters"):
        M.zipf_coefficient(["aaaa"])


def test_true_log_prob_of_a_document_continuation():
    from decodelab.toy.documents import DocumentLanguage

    docs = DocumentLanguage()
    text = docs.sample(1, seed=9)[0]
    head = M.true_log_prob(docs, "", text[:30], ended=False)
    assert head + M.true_log_prob(docs, text[:30], text[30:]) == pytest.approx(docs.log_prob(text))
    assert M.true_log_prob(docs, text[:30], "霜") == -math.inf
