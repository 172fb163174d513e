"""Best-of-n and pass@k: the estimator against brute force and by simulation, the verifiers on hand-made samples, the
task's answer extraction, a run through the engine, and every bad input refused with its name."""
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from decodelab.measure.best_of_n import (Samples, bootstrap_mean, draw, is_right, majority_answer, mean_pass_at_k,
                                 pass_at_k, pick)
from decodelab.toy.questions import PERSONS, answer_of, is_correct, question, questions, truth_accuracy
from decodelab.engine.engine import Engine
from decodelab.models.load import load_model
from decodelab.validation import ParamError


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_equals_brute_force_over_all_k_subsets(n):
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(outcomes, k))
            expected = sum(any(s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_closed_form_and_edges():
    assert pass_at_k(16, 4, 4) == pytest.approx(1 - math.comb(12, 4) / math.comb(16, 4), abs=1e-15)
    assert pass_at_k(10, 0, 3) == 0.0 and pass_at_k(10, 8, 3) == 1.0 and pass_at_k(5, 2, 1) == pytest.approx(0.4)


def test_pass_at_k_stays_finite_where_factorials_overflow():
    n, c, k = 2000, 30, 100  # C(2000, 100) ~ 1e185, its factorials far past a float
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)  # Python ints: exact
    assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-9)


def test_pass_at_k_is_unbiased_by_simulation():
    """Mean of the estimator over many draws of n samples ~ the true 1 - (1 - p)^k; the plug-in 1 - (1 - c/n)^k is
    biased low, by more than the simulation's noise."""
    rng = np.random.default_rng(0)
    p, n, k, trials = 0.1, 10, 5, 40_000
    cs = rng.binomial(n, p, size=trials)
    table = {c: pass_at_k(n, c, k) for c in range(n + 1)}
    estimate = np.mean([table[c] for c in cs])
    truth = 1 - (1 - p) ** k
    plug_in = np.mean(1 - (1 - cs / n) ** k)
    assert abs(estimate - truth) < 0.005
    assert truth - plug_in > 0.03


@pytest.mark.parametrize("args, name", [((0, 0, 1), "n"), ((5, 6, 1), "c"), ((5, -1, 1), "c"), ((5, 2, 0), "k"),
                                        ((5, 2, 6), "k"), ((5.0, 2, 1), "n"), ((5, 2, True), "k")])
def test_pass_at_k_refuses_bad_input(args, name):
    with pytest.raises(ParamError) as error:
        pass_at_k(*args)
    assert error.value.param == name and name in str(error.value)


def test_answer_extraction():
    assert answer_of("小红在公园跑步。老王喜欢吃饺子。") == "小红"
    assert answer_of("李老师买了三本书。") == "李老师"  # not 老师 (no such person) nor anything later
    assert answer_of("祝妈妈生日快乐！爸爸在家睡觉。") == "爸爸"  # 妈妈 after 祝 is the addressee
    assert answer_of("小猫在树上睡觉。") is None
    assert is_correct("这是小李的书。", "小李") and not is_correct("小猫在树上睡觉。", "小李")


def test_questions_cover_every_person():
    asked = questions(2)
    assert len(asked) == 2 * len(PERSONS) and asked[0] == question(PERSONS[0], "北京")
    assert asked[0].prompt == "这是小明在北京的一天。" and asked[0].answer == "小明"


def test_truth_accuracy_is_between_chance_and_certainty():
    right, total = truth_accuracy(300, 40, seed=0)
    assert total == 300 and 0.5 < right / total < 0.75


@pytest.mark.parametrize("call, name", [
    (lambda: question("小王", "北京"), "person"), (lambda: question("小明", "东京"), "city"),
    (lambda: questions(0), "num_cities"), (lambda: questions(21), "num_cities"),
    (lambda: answer_of(None), "text"), (lambda: is_correct("小明。", "小王"), "answer"),
    (lambda: truth_accuracy(0, 40), "count"),
])
def test_task_refuses_bad_input(call, name):
    with pytest.raises(ParamError) as error:
        call()
    assert error.value.param == name


def hand_made() -> Samples:
    q = question("老王", "北京")
    texts = ("小红在家。", "老王在家。", "小红喜欢吃饺子。", "老王在公园。", "老王坐火车去上海。")
    return Samples(q, texts, (-0.5, -0.9, -0.2, -1.0, -0.8), (5, 5, 8, 6, 9))


def test_verifiers_on_hand_made_samples():
    s = hand_made()
    assert s.correct == (False, True, False, True, True)
    assert [pick(s, m, "exact") for m in (1, 2, 5)] == [0, 1, 1]
    assert [pick(s, m, "likelihood") for m in (1, 2, 5)] == [0, 0, 2]  # the model prefers the wrong 小红 samples
    assert [pick(s, m, "majority") for m in (1, 2, 3, 4, 5)] == [0, 0, 0, 0, 1]  # 2-1 小红, 2-2 tie -> first, 3-2 老王
    assert [is_right(s, 5, v) for v in ("exact", "likelihood", "majority")] == [True, False, True]


def test_majority_answer_ignores_no_answer_and_breaks_ties_by_first():
    assert majority_answer([None, None, "小明"]) == "小明"
    assert majority_answer(["小红", "小明", "小明", "小红"]) == "小红"
    assert majority_answer([None]) is None and majority_answer([]) is None


@pytest.mark.parametrize("call, name", [
    (lambda s: pick(s, 0, "exact"), "m"), (lambda s: pick(s, 6, "exact"), "m"),
    (lambda s: pick(s, 2, "oracle"), "verifier"), (lambda s: pick("text", 1, "exact"), "samples"),
    (lambda s: majority_answer("小明"), "answers"), (lambda s: mean_pass_at_k([], 1), "all_samples"),
    (lambda s: mean_pass_at_k([s], 6), "k"), (lambda s: bootstrap_mean([]), "values"),
    (lambda s: bootstrap_mean([1.0, float("nan")]), "values"), (lambda s: bootstrap_mean([1.0], draws=0), "draws"),
])
def test_verifiers_refuse_bad_input(call, name):
    with pytest.raises(ParamError) as error:
        call(hand_made())
    assert error.value.param == name


def test_bootstrap_mean_brackets_the_mean():
    mean, low, high = bootstrap_mean([0.0, 1.0] * 50, seed=0)
    assert mean == 0.5 and low < 0.5 < high and high - low < 0.25


@pytest.fixture(scope="module")
def engine():
    torch.set_num_threads(1)
    model, tokenizer = load_model("tiny-zh-doc", device="cpu")
    return Engine(model, tokenizer, block_size=4, max_num_seqs=16)


def test_draw_through_the_engine_shares_the_prompt_and_repeats_with_its_seed(engine):
    asked = questions(1)[:3]
    first = draw(engine, asked, n=4, temperature=1.0, seed=5, max_tokens=12)
    assert [s.question for s in first.samples] == asked
    for s in first.samples:
        assert len(s.texts) == 4 and all(0 < t <= 12 for t in s.num_tokens)
        assert all(lp < 0 for lp in s.mean_logprobs)
    # 3 prompts of 12 tokens = 3 full blocks each, held once and listed by 4 samples while they decode
    assert first.sharing.listed > first.sharing.distinct
    assert first.sharing.peak_listed - first.sharing.peak_distinct >= 3 * 3 * 3
    assert first.prefill_tokens + first.cached_prompt_tokens == 3 * 12  # 这是小 opens every prompt: one cached block
    assert first.decode_tokens == sum(sum(s.num_tokens) for s in first.samples) - 3 * 4
    same = draw(engine, asked, n=4, temperature=1.0, seed=5, max_tokens=12)
    assert [s.texts for s in same.samples] == [s.texts for s in first.samples]
    assert not engine.has_unfinished() and engine.pool.num_used_blocks == 0


@pytest.mark.parametrize("kwargs, name", [({"n": 0}, "n"), ({"temperature": -1.0}, "temperature"),
                                          ({"seed": -1}, "seed"), ({"max_tokens": 0}, "max_tokens"),
                                          ({"questions": []}, "questions"), ({"questions": ["这是"]}, "questions")])
def test_draw_refuses_bad_input(engine, kwargs, name):
    args = {"questions": questions(1)[:1], "n": 2, "temperature": 1.0, **kwargs}
    with pytest.raises(ParamError) as error:
        draw(engine, **args)
    assert error.value.param == name
    assert not engine.has_unfinished()


def test_draw_refuses_what_is_not_an_engine():
    with pytest.raises(ParamError) as error:
        draw("engine", questions(1)[:1], n=2, temperature=1.0)
    assert error.value.param == "engine"


@pytest.mark.slow
def test_benchmark_quick_run_writes_its_json(tmp_path):
    """benchmarks/best_of_n.py --quick runs end to end (about 20 s) and writes every figure the chapter reads."""
    out = tmp_path / "best_of_n.json"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "best_of_n.py"), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["quick"] and result["questions"] == 20
    assert [block["temperature"] for block in result["temperatures"]] == [0.7, 1.0, 1.5]
    for block in result["temperatures"]:
        assert [row["n"] for row in block["rows"]] == [1, 2, 4, 8, 16]
        for row in block["rows"]:
            assert all(row[key]["low"] <= row[key]["value"] <= row[key]["high"]
                       for key in ("exact", "likelihood", "majority", "pass_at_k"))
        assert block["sharing"]["saved_share"] > 0
    assert "| n | exact (oracle) |" in done.stdout
