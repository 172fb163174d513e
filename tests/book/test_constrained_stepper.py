"""The constrained-decoding stepper's frames (decodelab.book.widgets.constrained_stepper): each frame is one step of
constrained_generate with the same seed (token, running log q and log p, kept mass), its allowed tokens are the
grammar state's mask, q is p renormalised over them, and the widget refuses what it does not offer."""
from __future__ import annotations

import json
import math

import pytest

from decodelab.decoding.constrained import constrained_generate
from decodelab.grammar.backends import LLGuidanceGrammar, ToyLanguageGrammar
from decodelab.sampling.sampler import SamplingParams
from decodelab.book.widgets.constrained_stepper import ConstrainedStepper, constrained_frames

pytestmark = pytest.mark.usefixtures("one_thread")

FORM = "(小明|小红)(喜欢吃北京烤鸭|坐(飞机|火车)去北京)。"
CITY = "[^。！？]{0,15}北京[^。！？]{0,15}[。！？]"
# (grammar, params): the chapter's three cases, one cut by max_tokens, one with top-k (the sampler truncates after
# the mask, so q is not p / m there).
CASES = {
    "form": ("form", SamplingParams(seed=5, max_tokens=40)),
    "city": ("city", SamplingParams(seed=0, max_tokens=40)),
    "toy-hot": ("toy", SamplingParams(temperature=2.0, seed=1, max_tokens=40)),
    "city-cut": ("city", SamplingParams(seed=2, max_tokens=9)),
    "toy-top-k": ("toy", SamplingParams(temperature=1.5, seed=3, top_k=5, max_tokens=40)),
}


@pytest.fixture(scope="module")
def grammars(tiny):
    tokenizer = tiny[1]
    return {"form": LLGuidanceGrammar.regex(FORM, tokenizer), "city": LLGuidanceGrammar.regex(CITY, tokenizer),
            "toy": ToyLanguageGrammar(tokenizer)}


@pytest.fixture(scope="module")
def recorded(tiny, grammars):
    """Each case's frames and the completion constrained_generate draws with the same seed."""
    model, tokenizer = tiny
    out = {}
    for name, (grammar, params) in CASES.items():
        completion = constrained_generate(model, tokenizer, "", params, grammars[grammar])[0]
        out[name] = (constrained_frames(model, tokenizer, "", params, grammars[grammar], name), completion)
    return out


@pytest.mark.parametrize("name", CASES)
def test_frames_follow_constrained_generate(recorded, tiny, name):
    run, completion = recorded[name]
    tokenizer = tiny[1]
    steps = run["steps"]
    assert [frame["id"] for frame in steps] == completion.token_ids
    assert [frame["token"] for frame in steps] == [tokenizer.decode([t]) for t in completion.token_ids]
    assert [frame["step"] for frame in steps] == list(range(1, len(steps) + 1))
    assert run["text"] == steps[-1]["text"] == completion.text and run["finish_reason"] == completion.finish_reason
    assert (run["log_q"], run["log_p"]) == (round(completion.log_q, 3), round(completion.log_p, 3))
    # the last running sums are recomputed with a teacher-forced forward: equal up to float noise and rounding
    assert steps[-1]["log_q"] == pytest.approx(completion.log_q, abs=2e-3)
    assert steps[-1]["log_p"] == pytest.approx(completion.log_p, abs=2e-3)
    assert [frame["allowed"] for frame in steps] == list(completion.allowed)
    # 3 significant digits: a relative error up to 0.5 in the third digit, 5e-3 for a mantissa of 1.00
    assert [frame["kept"] for frame in steps] == pytest.approx(list(completion.kept_mass), rel=5e-3)
    assert all(frame["eos"] == (frame["id"] == tokenizer.eos_token_id) for frame in steps)
    if completion.finish_reason == "length":
        assert len(steps) == CASES[name][1].max_tokens and not steps[-1]["eos"]


@pytest.mark.parametrize("name", CASES)
def test_each_frame_allows_what_the_grammar_state_allows(recorded, grammars, name):
    run, _ = recorded[name]
    grammar = grammars[CASES[name][0]]
    state = grammar.start()
    for frame in run["steps"]:
        mask = state.mask()
        assert frame["allowed"] == int(mask.sum()) and frame["eos_allowed"] == bool(mask[grammar.eos_token_id])
        assert [row["allowed"] for row in frame["rows"]] == [bool(mask[row["id"]]) for row in frame["rows"]]
        shown_allowed = sum(row["allowed"] for row in frame["rows"])
        assert shown_allowed + frame["rest_allowed"] == frame["allowed"]
        assert len(frame["rows"]) + frame["rest_allowed"] + frame["rest_forbidden"] == run["vocab_size"]
        state.advance(frame["id"])


@pytest.mark.parametrize("name", CASES)
def test_q_is_p_renormalised_over_the_allowed_tokens(recorded, name):
    run, _ = recorded[name]
    truncated = CASES[name][1].top_k > 0
    for frame in run["steps"]:
        rows = frame["rows"]
        # every stored probability has 3 significant digits: sums are exact to about 1e-3 per term
        assert sum(row["q"] for row in rows if row["allowed"]) + frame["rest_allowed_q"] == pytest.approx(1, abs=1e-2)
        assert all(row["q"] == 0 for row in rows if not row["allowed"])
        assert sum(row["p"] for row in rows) + frame["rest_allowed_p"] + frame["rest_forbidden_p"] == pytest.approx(
            1, abs=1e-2)
        assert frame["kept"] + frame["removed"] == pytest.approx(1, abs=1e-3)
        assert [row["rank"] for row in rows] == sorted(row["rank"] for row in rows)
        assert [row["rank"] for row in rows][:10] == list(range(1, 11))
        drawn = [row for row in rows if row["drawn"]]
        assert len(drawn) == 1 and drawn[0]["id"] == frame["id"] and drawn[0]["allowed"]
        assert (drawn[0]["p"], drawn[0]["q"]) == (frame["p"], frame["q"])
        if not truncated and frame["kept"] > 0:
            for row in rows:
                if row["allowed"] and row["p"] > 1e-6:
                    assert row["q"] == pytest.approx(row["p"] / frame["kept"], rel=1e-2)
        assert ("1 / m" in frame["summary"]) <= (not truncated)


def test_a_forced_token_the_model_barely_wants_is_shown_below_the_top(recorded):
    """After 小明喜欢吃 the grammar allows only 北: the model's top 10 are all forbidden, 北 is listed after them
    with its own rank, and q = 1."""
    steps = recorded["form"][0]["steps"]
    assert "".join(frame["token"] for frame in steps[:6]) == "小明喜欢吃北"
    frame = steps[5]
    assert frame["allowed"] == 1 and frame["kept"] < 1e-3 and frame["q"] == 1.0
    assert not any(row["allowed"] for row in frame["rows"][:10])
    assert frame["rows"][-1]["token"] == "北" and frame["rows"][-1]["rank"] > 10
    assert "被硬拉了回来" in frame["summary"]


def test_log_z_is_kept_for_the_finished_text(tiny, grammars):
    model, tokenizer = tiny
    run = constrained_frames(model, tokenizer, "", CASES["form"][1], grammars["form"], "form", log_z=-8.5553,
                             log_z_source="exact")
    assert (run["log_z"], run["log_z_source"]) == (-8.555, "exact")
    assert run["steps"][-1]["eos"] and run["steps"][-1]["log_q"] > run["steps"][-1]["log_p"] - run["log_z"]


@pytest.fixture(scope="module")
def runs(recorded):
    return [recorded[name][0] for name in ("form", "city", "toy-hot")]


def test_stepper_shows_the_chosen_case_and_has_a_stable_repr(runs):
    widget = ConstrainedStepper(runs, case="city", index=3, title="t")
    assert repr(widget) == "ConstrainedStepper(cases=['form', 'city', 'toy-hot'], case='city', index=3, lecture=False)"
    assert widget.run() is widget.runs[1] and widget.frame()["step"] == 4
    default = ConstrainedStepper(runs)
    assert (default.case, default.index, default.lecture) == ("form", 0, False)
    assert "0x" not in repr(default)
    assert ConstrainedStepper(runs, lecture=True).lecture is True


def test_the_stored_state_is_small(runs):
    widget = ConstrainedStepper(runs)
    size = len(json.dumps(widget.runs)) + len(widget._esm)
    assert size < 200_000, size


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"case": "json"}, r"case must be one of \['form', 'city', 'toy-hot'\], got 'json'"),
    ({"index": 99}, r"index must be an int in \[0, 11\) \(the steps of case 'form'\), got 99"),
    ({"index": -1}, r"index must be an int in \[0, 11\) .*got -1"),
    ({"index": True}, r"index must be an int in \[0, 11\) .*got True"),
    ({"case": "city", "index": 24}, r"index must be an int in \[0, 24\) \(the steps of case 'city'\), got 24"),
])
def test_stepper_refuses_what_it_does_not_offer(runs, kwargs, message):
    with pytest.raises(ValueError, match=message):
        ConstrainedStepper(runs, **kwargs)


def test_stepper_refuses_runs_it_cannot_show(runs):
    with pytest.raises(ValueError, match="at least one run"):
        ConstrainedStepper([])
    with pytest.raises(ValueError, match=r"runs\[0\] lacks \['params', 'prompt', 'steps'\]"):
        ConstrainedStepper([{"case": "x"}])
    with pytest.raises(ValueError, match="distinct case names, got \\['form', 'city', 'toy-hot', 'form'\\]"):
        ConstrainedStepper(runs + runs[:1])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"name": ""}, "name must be a non-empty str, got ''"),
    ({"params": SamplingParams(seed=0, n=2)}, "params must be a SamplingParams with n = 1"),
    ({"log_z": 0.5}, "log_z must be None or a finite log-probability <= 0, got 0.5"),
    ({"log_z": -math.inf}, "log_z must be None or a finite log-probability <= 0, got -inf"),
    ({"top": 0}, "top must be an int >= 1, got 0"),
])
def test_frames_refuse_bad_arguments(tiny, grammars, kwargs, message):
    model, tokenizer = tiny
    arguments = {"params": SamplingParams(seed=0, max_tokens=4), "name": "x"} | kwargs
    with pytest.raises(ValueError, match=message):
        constrained_frames(model, tokenizer, "", arguments.pop("params"), grammars["toy"], arguments.pop("name"),
                           **arguments)
