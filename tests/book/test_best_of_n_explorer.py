"""The best-of-n explorer's data (decodelab.book.widgets.best_of_n_explorer): its samples are best_of_n.draw's for the same
seed, each verifier's pick is best_of_n.pick for every n, pass@k is pass_at_k(n, c, k), and the widget refuses what
it does not offer."""
from __future__ import annotations

import json

import pytest

from decodelab.measure.best_of_n import VERIFIERS, draw, pass_at_k, pick
from decodelab.toy.questions import answer_of
from decodelab.engine.engine import Engine
from decodelab.models.load import load_model
from decodelab.book.widgets.best_of_n_explorer import BestOfNExplorer, best_of_n_frames

from best_of_n_cases import QUESTIONS, TEMPERATURES

pytestmark = pytest.mark.usefixtures("one_thread")



@pytest.fixture(scope="module")
def model():
    return load_model("tiny-zh-doc", device="cpu")


@pytest.fixture(scope="module")
def runs(model):
    return best_of_n_frames(Engine(*model, block_size=4), QUESTIONS, TEMPERATURES)


@pytest.fixture(scope="module")
def drawn(model):
    """best_of_n.draw on its own engine, the same questions, seed and length: the samples the runs must hold."""
    engine = Engine(*model, block_size=4)
    return {t: draw(engine, QUESTIONS, 16, t, seed=0, max_tokens=40).samples for t in TEMPERATURES}


def test_runs_hold_the_samples_draw_gives_for_the_same_seed(runs, drawn):
    assert [(run["question"], run["temperature"]) for run in runs] == [
        (q.prompt, t) for q in QUESTIONS for t in TEMPERATURES]
    for run in runs:
        i = [q.prompt for q in QUESTIONS].index(run["question"])
        expected = drawn[run["temperature"]][i]
        assert (run["answer"], run["seed"], run["max_tokens"]) == (QUESTIONS[i].answer, i, 40)
        assert [s["text"] for s in run["samples"]] == list(expected.texts)
        assert [s["answer"] for s in run["samples"]] == list(expected.answers)
        assert [s["correct"] for s in run["samples"]] == list(expected.correct)
        assert [s["num_tokens"] for s in run["samples"]] == list(expected.num_tokens)
        assert [s["mean_logprob"] for s in run["samples"]] == pytest.approx(list(expected.mean_logprobs), abs=6e-4)
    json.dumps(runs)  # stored in the widget state


def test_every_frame_is_what_pick_and_pass_at_k_give_for_the_first_n(runs, drawn):
    for run in runs:
        i = [q.prompt for q in QUESTIONS].index(run["question"])
        full = drawn[run["temperature"]][i]  # picks from the unrounded log-probabilities
        assert [frame["n"] for frame in run["frames"]] == list(range(1, 17))
        for frame in run["frames"]:
            n = frame["n"]
            assert frame["picks"] == {v: pick(full, n, v) for v in VERIFIERS}
            c = sum(full.correct[:n])
            assert frame["num_right"] == c and frame["tokens"] == sum(full.num_tokens[:n])
            assert frame["pass_at_k"] == pytest.approx([pass_at_k(n, c, k) for k in range(1, n + 1)], abs=5e-5)
            assert frame["pass_at_k"][0] == pytest.approx(c / n, abs=5e-5)  # pass@1 is the fraction right


def test_the_verifiers_disagree_somewhere_among_the_offered_questions(runs):
    """The explorer is worth opening: some frame has a wrong likelihood pick next to a right majority, and some
    frame has a wrong majority next to a right oracle."""
    def right(run, frame, verifier):
        return run["samples"][frame["picks"][verifier]]["correct"]

    frames = [(run, frame) for run in runs for frame in run["frames"]]
    assert any(right(r, f, "majority") and not right(r, f, "likelihood") for r, f in frames)
    assert any(right(r, f, "exact") and not right(r, f, "majority") for r, f in frames)


def test_answer_at_marks_the_name_answer_of_found(runs):
    for run in runs:
        for sample in run["samples"]:
            at, answer, text = sample["answer_at"], sample["answer"], sample["text"]
            if answer is None:
                assert at == -1
            else:
                assert text[at:at + len(answer)] == answer and answer_of(text[:at + len(answer)]) == answer
                assert answer_of(text[:at]) is None


def test_explorer_shows_the_chosen_run_and_has_a_stable_repr(runs):
    from ipywidgets.embed import dependency_state, embed_data

    widget = BestOfNExplorer(runs, question="这是老王在成都的一天。", temperature=1.0, n=4, title="t")
    assert repr(widget) == ("BestOfNExplorer(questions=6, temperatures=[0.7, 1.0, 1.5], "
                            "question='这是老王在成都的一天。', temperature=1.0, n=4)")
    assert widget.run() is widget.runs[4 * 3 + 1] and widget.frame()["n"] == 4
    default = BestOfNExplorer(runs)
    assert (default.question, default.temperature, default.n, default.lecture) == (QUESTIONS[0].prompt, 0.7, 4, False)
    assert "0x" not in repr(default)
    assert BestOfNExplorer(runs, temperature=1, lecture=True).lecture is True
    state = embed_data(views=[widget], state=dependency_state(widget, drop_defaults=False))["manager_state"]
    assert len(json.dumps(state)) < 200_000  # every combination is in the page; keep the page light


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"question": "这是小红在北京的一天。"}, r"question must be one of \['这是小明在北京的一天。', .*got '这是小红在北京的一天。'"),
    ({"temperature": 0.5}, r"temperature must be one of \[0.7, 1.0, 1.5\], got 0.5"),
    ({"temperature": True}, r"temperature must be one of \[0.7, 1.0, 1.5\], got True"),
    ({"n": 0}, r"n must be an int in \[1, 16\] .*got 0"),
    ({"n": 17}, r"n must be an int in \[1, 16\] .*got 17"),
    ({"n": 2.0}, r"n must be an int in \[1, 16\] .*got 2.0"),
    ({"n": True}, r"n must be an int in \[1, 16\] .*got True"),
])
def test_explorer_refuses_what_it_does_not_offer(runs, kwargs, message):
    with pytest.raises(ValueError, match=message):
        BestOfNExplorer(runs, **kwargs)


def test_explorer_refuses_runs_that_do_not_cover_every_choice(runs):
    with pytest.raises(ValueError, match="at least one run"):
        BestOfNExplorer([])
    with pytest.raises(ValueError, match="must come from best_of_n_frames"):
        BestOfNExplorer([{"question": "x"}])
    with pytest.raises(ValueError, match=r"each \(question, temperature\)"):
        BestOfNExplorer(runs[:-1])  # 妈妈 at 1.5 missing
    with pytest.raises(ValueError, match=r"each \(question, temperature\)"):
        BestOfNExplorer(runs + runs[:1])
    with pytest.raises(ValueError, match="same number of samples"):
        BestOfNExplorer([runs[0], {**runs[1], "samples": runs[1]["samples"][:8]}, runs[2]])


def test_frames_refuse_bad_temperatures_and_n(model):
    engine = Engine(*model, block_size=4)
    with pytest.raises(ValueError, match="temperatures must be a non-empty list"):
        best_of_n_frames(engine, QUESTIONS[:1], ())
    with pytest.raises(ValueError, match=r"temperatures must be distinct, got \[1.0, 1.0\]"):
        best_of_n_frames(engine, QUESTIONS[:1], (1.0, 1.0))
    with pytest.raises(ValueError, match="n must be an int >= 1, got 0"):
        best_of_n_frames(engine, QUESTIONS[:1], (1.0,), n=0)
