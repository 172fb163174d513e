"""The speculative-decoding stepper's frames (decodelab.book.widgets.speculative_stepper): each frame is one Round of
speculative_generate with the same seed (proposals, decisions, the target's token, the text), its p and q are the
ones the rule judged, and the widget refuses what it does not offer."""
from __future__ import annotations

import pytest

from decodelab.models.load import load_model
from decodelab.sampling.sampler import SamplingParams
from decodelab.decoding.speculative import ModelDraft, NgramDraft, speculative_generate
from decodelab.book.widgets.speculative_stepper import SpeculativeStepper, speculative_frames, speculative_runs

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = "这是小明在北京的一天。"


@pytest.fixture(scope="module")
def models():
    target, tokenizer = load_model("tiny-zh-doc", device="cpu")
    return target, tokenizer, load_model("tiny-zh-doc-small", device="cpu")[0]


def make_draft(kind: str, small):
    return ModelDraft(small) if kind == "model" else NgramDraft()


@pytest.mark.parametrize(("kind", "gamma", "params"), [
    ("model", 3, SamplingParams(seed=0, max_tokens=30)),
    ("model", 5, SamplingParams(seed=3, max_tokens=30, top_k=20)),
    ("ngram", 4, SamplingParams(seed=1, max_tokens=30)),
])
def test_frames_follow_the_rounds_of_speculative_generate(models, kind, gamma, params):
    target, tokenizer, small = models
    result = speculative_generate(target, tokenizer, PROMPT, params, make_draft(kind, small), gamma)
    run = speculative_frames(target, tokenizer, PROMPT, params, make_draft(kind, small), gamma, kind)
    assert (run["draft"], run["gamma"], run["point_mass"]) == (kind, gamma, kind == "ngram")
    assert run["prompt"] == PROMPT and run["text"] == result.text
    assert len(run["rounds"]) == len(result.rounds)
    piece = lambda token: tokenizer.decode([token])  # noqa: E731
    for frame, record in zip(run["rounds"], result.rounds):
        assert [d["token"] for d in frame["drafts"]] == [piece(t) for t in record.drafted]
        statuses = [d["status"] for d in frame["drafts"]]
        assert statuses == (["accepted"] * record.accepted + ["rejected"] * (record.accepted < len(record.drafted))
                            + ["unjudged"] * max(0, len(record.drafted) - record.accepted - 1))
        assert frame["accepted"] == record.accepted and frame["target"]["token"] == piece(record.token)
        expected_kind = ("residual" if record.accepted < len(record.drafted) else "bonus" if record.drafted
                         else "plain")
        assert frame["target"]["kind"] == expected_kind
        for draft in frame["drafts"]:
            # the stored values have 3 significant digits each
            assert draft["accept_prob"] == pytest.approx(min(1.0, draft["p"] / draft["q"]), rel=1e-2)
            if draft["status"] == "rejected":
                assert draft["q"] > draft["p"]  # min(1, p / q) = 1 never rejects
        if kind == "ngram":  # a point mass: the rule's acceptance probability is p(x) itself
            judged = [d["p"] for d in frame["drafts"] if d["status"] != "unjudged"]
            assert judged == pytest.approx(list(record.acceptance_probs), abs=1e-3)
            assert all(d["q"] == 1.0 for d in frame["drafts"])
    assert "".join(frame["new_text"] for frame in run["rounds"]) == result.text
    last = run["rounds"][-1]
    assert last["tokens"] == len(result.token_ids) and last["forwards"] == result.target_forwards
    assert (last["accepted_total"], last["judged_total"]) == (result.accepted, result.judged)
    assert sum(frame["emitted"] for frame in run["rounds"]) == len(result.token_ids)


def test_greedy_frames_put_the_point_masses_where_the_rule_looked(models):
    """At temperature 0 p and q are point masses on each model's argmax: a kept draft has p = q = 1, a rejected one
    p = 0 (the target's argmax is elsewhere) and q = 1, and the target's own token has probability 1."""
    target, tokenizer, small = models
    run = speculative_frames(target, tokenizer, "从前有一座山，", SamplingParams(temperature=0.0, max_tokens=60),
                             ModelDraft(small), 4, "tiny-zh-doc-small")
    seen = set()
    for frame in run["rounds"]:
        for draft in frame["drafts"]:
            seen.add(draft["status"])
            if draft["status"] == "accepted":
                assert (draft["q"], draft["p"], draft["accept_prob"]) == (1.0, 1.0, 1.0)
            elif draft["status"] == "rejected":
                assert (draft["q"], draft["p"], draft["accept_prob"]) == (1.0, 0.0, 0.0)
        assert frame["target"]["prob"] == 1.0
    assert {"accepted", "rejected"} <= seen


def test_a_round_cut_short_by_max_tokens_says_so(models):
    target, tokenizer, small = models
    run = speculative_frames(target, tokenizer, PROMPT, SamplingParams(seed=0, max_tokens=7), ModelDraft(small), 4,
                             "tiny-zh-doc-small")
    last = run["rounds"][-1]
    assert last["tokens"] == 7 and last["emitted"] < last["accepted"] + 1
    assert "max_tokens = 7" in last["summary"] and all("max_tokens" not in f["summary"] for f in run["rounds"][:-1])


@pytest.fixture(scope="module")
def runs(models):
    target, tokenizer, small = models
    return speculative_runs(target, tokenizer, PROMPT, SamplingParams(seed=0, max_tokens=12),
                            {"tiny-zh-doc-small": lambda: ModelDraft(small), "n-gram": NgramDraft}, (2, 4))


def test_stepper_shows_the_chosen_run_and_has_a_stable_repr(runs):
    assert [(run["draft"], run["gamma"]) for run in runs] == [
        ("tiny-zh-doc-small", 2), ("tiny-zh-doc-small", 4), ("n-gram", 2), ("n-gram", 4)]
    widget = SpeculativeStepper(runs, draft="n-gram", gamma=4, index=1, title="t")
    assert repr(widget) == ("SpeculativeStepper(drafts=['tiny-zh-doc-small', 'n-gram'], gammas=[2, 4], "
                            "draft='n-gram', gamma=4, index=1)")
    assert widget.run() is widget.runs[3] and widget.frame()["round"] == 2
    default = SpeculativeStepper(runs)
    assert (default.draft, default.gamma, default.index, default.lecture) == ("tiny-zh-doc-small", 2, 0, False)
    assert "0x" not in repr(default)
    assert SpeculativeStepper(runs, lecture=True).lecture is True


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"draft": "eagle"}, r"draft must be one of \['tiny-zh-doc-small', 'n-gram'\], got 'eagle'"),
    ({"gamma": 3}, r"gamma must be one of \[2, 4\], got 3"),
    ({"gamma": True}, r"gamma must be one of \[2, 4\], got True"),
    ({"index": 99}, r"index must be an int in \[0, \d+\) .*got 99"),
    ({"index": -1}, r"index must be an int in \[0, \d+\) .*got -1"),
])
def test_stepper_refuses_what_it_does_not_offer(runs, kwargs, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeStepper(runs, **kwargs)


def test_stepper_refuses_runs_that_do_not_cover_every_choice(runs):
    with pytest.raises(ValueError, match="at least one run"):
        SpeculativeStepper([])
    with pytest.raises(ValueError, match="must come from speculative_runs"):
        SpeculativeStepper([{"draft": "x"}])
    with pytest.raises(ValueError, match=r"each \(draft, gamma\)"):
        SpeculativeStepper(runs[:3])  # n-gram with gamma 4 missing
    with pytest.raises(ValueError, match=r"each \(draft, gamma\)"):
        SpeculativeStepper(runs + runs[:1])


def test_frames_refuse_a_draft_without_q_or_a_name(models):
    target, tokenizer, small = models
    params = SamplingParams(seed=0, max_tokens=4)
    with pytest.raises(TypeError, match="ModelDraft or an NgramDraft"):
        speculative_frames(target, tokenizer, PROMPT, params, object(), 2, "x")
    with pytest.raises(ValueError, match="draft_name"):
        speculative_frames(target, tokenizer, PROMPT, params, NgramDraft(), 2, "")
    with pytest.raises(ValueError, match="gammas"):
        speculative_runs(target, tokenizer, PROMPT, params, {"n-gram": NgramDraft}, ())
