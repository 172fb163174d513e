"""A forced token and the errors after it: the sentence-by-sentence verdicts, the forced characters, the pooled rate."""
import pytest
import torch

from decodelab.measure.forced_token import (DOCUMENT_SEED, Judged, continue_and_judge, error_rate, forced_inputs,
                                    forced_position, judge_after_forced)
from decodelab.models.load import load_model
from decodelab.toy.sentences import ToyLanguage
from decodelab.toy.documents import DocumentLanguage

LANG = ToyLanguage()
EOS = ToyLanguage.EOS


def test_the_forced_sentence_is_skipped_then_each_sentence_is_judged():
    judged = judge_after_forced(LANG, list("和小猫。小明在河边跳舞。小明在在"))
    assert judged.statuses == ("skip",) * 3 + ("ok",) * 11 + ("error",)
    assert judged.closed_at == 3
    assert judged.sentences == (True, False)


def test_a_forced_sentence_end_starts_judging_at_once():
    judged = judge_after_forced(LANG, list("。小明在河边跳舞。"))
    assert judged.closed_at == 0
    assert set(judged.statuses) == {"ok"} and judged.sentences == (True,)


def test_a_question_in_quotes_ends_at_the_closing_quote():
    judged = judge_after_forced(LANG, list("吗？”小明在河边跳舞。"))
    assert judged.closed_at == 2  # "？" is followed by "”": the run of sentence ends closes at the quote
    assert judged.statuses[:2] == ("skip",) * 2 and judged.sentences == (True,)


def test_judging_restarts_after_an_error_at_the_next_sentence_end():
    judged = judge_after_forced(LANG, list("。小明在在跳舞。小明在河边跳舞。"))
    assert judged.statuses[:4] == ("ok", "ok", "ok", "error")
    assert judged.statuses[4:7] == ("skip",) * 3
    assert judged.sentences == (False, True)


@pytest.mark.parametrize(("tail", "expected"), [
    (["。", "小", "明", EOS], ("ok", "ok", "error")),  # an end of text inside a sentence
    (["。", "<unk>"], ("error",)),  # a token outside the language
    (["和", "小", EOS], ("skip", "skip")),  # the end of text while skipping is not judged
    (["。", "小", "。", "小"], ("ok", "error", "ok")),  # an impossible sentence end still ends the sentence
])
def test_ends_of_text_and_unknown_tokens(tail, expected):
    assert judge_after_forced(LANG, tail).statuses == expected


def test_judge_rejects_what_it_cannot_judge():
    with pytest.raises(TypeError, match="lang must be a ToyLanguage"):
        judge_after_forced(DocumentLanguage(), ["。"])
    with pytest.raises(ValueError, match="tail must hold at least the forced token"):
        judge_after_forced(LANG, [])


def test_error_rate_pools_judged_tokens_and_ignores_skips():
    judged = [Judged(("x",) * 4, ("skip", "ok", "error", "ok"), 1, ()), Judged(("x",) * 3, ("ok", "ok", "ok"), 0, ())]
    assert error_rate(judged) == pytest.approx(1 / 6)
    assert error_rate(judged, first=3, last=3) == pytest.approx(1 / 2)
    assert error_rate([Judged(("x",), ("skip",), None, ())]) != error_rate([])  # both nan: nothing judged


def test_forced_position_is_inside_a_sentence_where_the_truth_branches():
    docs = DocumentLanguage()
    document = docs.sample(1, seed=3)[0]
    k = forced_position(docs, document, 40)
    assert k >= 40 and document[k - 1] not in "。！？”"
    assert sum(ch != docs.EOS for ch in docs.next_token_probs(document[:k])) >= 2


@pytest.fixture(scope="module")
def doc_model():
    return load_model("tiny-zh-doc", device="cpu")


def test_forced_characters_are_wrong_and_valid_as_named(doc_model):
    docs = DocumentLanguage()
    inputs = forced_inputs(*doc_model, docs, n=6, seed=DOCUMENT_SEED)
    assert len(inputs.prefixes) == 6
    for document, prefix, original, wrong, substitute in zip(inputs.documents, inputs.prefixes, inputs.originals,
                                                             inputs.wrong, inputs.substitutes):
        allowed = docs.next_token_probs(prefix)
        assert document.startswith(prefix + original)
        assert wrong in docs.alphabet and wrong not in allowed
        assert substitute in allowed and substitute != original
    with pytest.raises(ValueError, match="n must be a positive int"):
        forced_inputs(*doc_model, docs, n=0, seed=0)


def test_continue_and_judge_matches_the_three_conditions(doc_model):
    torch.manual_seed(0)
    inputs = forced_inputs(*doc_model, DocumentLanguage(), n=4, seed=DOCUMENT_SEED)
    clean = continue_and_judge(*doc_model, LANG, inputs.prefixes, None, 1.0, max_tokens=12, seed=0)
    wrong = continue_and_judge(*doc_model, LANG, inputs.prefixes, inputs.wrong, 1.0, max_tokens=12, seed=0)
    assert [j.tail[0] for j in wrong] == list(inputs.wrong)
    for j in clean + wrong:  # the token at the forced position, then 12 more unless the model ended the text
        assert len(j.statuses) == len(j.tail) - 1 <= 12
        assert len(j.statuses) == 12 or j.tail[-1] == EOS
