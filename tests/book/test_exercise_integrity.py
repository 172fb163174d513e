"""The exercise notebooks and their checks keep the course honest (issues 28 and 29): a starter stores each check's
"not done yet" hint alone (no traceback, no machine path), every check cell imports its own check, the chapter link
resolves from the repository root, the investigative exercises store a prediction cell and their solutions a model
answer, and no failure message of a check interpolates the reference."""
from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path

import pytest
import torch

from decodelab.book.checks import CheckFailed

ROOT = Path(__file__).resolve().parents[2]
STARTERS = sorted((ROOT / "exercises").glob("*.ipynb"))
SOLUTIONS = sorted((ROOT / "exercises" / "solutions").glob("*.ipynb"))
CHECKS = sorted((ROOT / "lib" / "decodelab" / "book" / "checks").glob("*.py"))
INVESTIGATIVE = {"01-logits-to-probs", "02-temperature", "03-strategies", "04-autoregressive", "05-exposure-bias",
                 "06-prefill-decode-kv-cache",
                 "07-paged-attention", "07b-speculative-decoding", "07c-serving",
                 "07d-constrained-decoding", "07e-best-of-n"}  # the exercises that ask for a prediction before measuring


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _source(cell: dict) -> str:
    return "".join(cell["source"])


def test_there_are_eleven_starters_each_with_its_solution():
    assert len(STARTERS) == 11
    assert [p.name for p in STARTERS] == [p.name for p in SOLUTIONS]


@pytest.mark.parametrize("path", STARTERS, ids=lambda p: p.stem)
def test_a_starter_stores_each_check_hint_alone(path):
    checks = [c for c in _cells(path) if c["cell_type"] == "code" and re.search(r"^check_\w+\(", _source(c), re.M)]
    assert checks
    for cell in checks:
        assert "raises-exception" in cell["metadata"].get("tags", []), _source(cell)
        errors = [o for o in cell["outputs"] if o["output_type"] == "error"]
        assert len(errors) == 1 and errors[0]["ename"] == "CheckFailed", _source(cell)
        traceback = errors[0]["traceback"]
        assert traceback[0] == "\x1b[0;31m检查没有通过\x1b[0m" and traceback[1:] == errors[0]["evalue"].splitlines()
        assert not any(re.search(r"/work|/root|/home|site-packages|\.py\b|File \"", line) for line in traceback)


@pytest.mark.parametrize("path", STARTERS + SOLUTIONS, ids=lambda p: str(p.relative_to(ROOT / "exercises")))
def test_every_check_cell_imports_its_own_check(path):
    for cell in _cells(path):
        source = _source(cell)
        if cell["cell_type"] != "code":
            continue
        for name in re.findall(r"^(check_\w+)\(", source, re.M):
            assert re.search(rf"^from decodelab\.book\.checks\.ch\w+ import .*\b{name}\b", source, re.M), source


@pytest.mark.parametrize("path", STARTERS, ids=lambda p: p.stem)
def test_the_chapter_link_resolves_from_the_repository_root(path):
    first = _source(_cells(path)[0])
    links = re.findall(r"对应章节：\[[^\]]+\]\(([^)]+)\)", first)
    assert links == [f"../chapters/{path.name}"]  # `make lab` must serve the repository root for it to open
    assert (path.parent / links[0]).resolve() == ROOT / "chapters" / path.name and (ROOT / "chapters" / path.name).exists()


def _predictions(path: Path) -> list[str]:
    return [_source(c) for c in _cells(path) if c["cell_type"] == "code" and _source(c).startswith("PREDICTION =")]


def test_the_investigative_exercises_store_a_prediction_cell():
    found = {p.stem for p in STARTERS if _predictions(p)}
    assert found == INVESTIGATIVE
    for path in STARTERS:
        for prediction in _predictions(path):
            assert prediction.startswith("PREDICTION = None")  # the student writes it before measuring
    headings = [p.stem for p in STARTERS for c in _cells(p) if _source(c).startswith("### 写下你的预测")]
    assert sorted(headings) == sorted(INVESTIGATIVE)


@pytest.mark.parametrize("stem", sorted(INVESTIGATIVE))
def test_a_solution_has_a_model_prediction_a_pass_beside_it_and_a_model_answer(stem):
    cells = _cells(ROOT / "exercises" / "solutions" / f"{stem}.ipynb")
    assert any(_source(c).startswith("PREDICTION = ") and "None" not in _source(c).splitlines()[0] for c in cells)
    replies = ["".join(o.get("text", "")) for c in cells if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert any(r.startswith("通过 ✔") and "你预测" in r and "量到" in r for r in replies)
    assert any(c["cell_type"] == "markdown" and "参考答案" in _source(c) and "好的回答会提到" in _source(c)
               for c in cells)


# ---- no failure message interpolates the reference ---------------------------------------------------------------

REFERENCE_NAMES = {"expected", "reference", "ref", "right", "right_ttft", "right_tpot", "tolerance", "low", "high",
                   "exact", "greedy", "clean_ref", "wrong_ref"}


def _interpolated_names(node: ast.AST) -> set[str]:
    names = set()
    for part in ast.walk(node):
        if isinstance(part, ast.FormattedValue):
            names |= {n.id for n in ast.walk(part.value) if isinstance(n, ast.Name)}
    return names


@pytest.mark.parametrize("path", CHECKS, ids=lambda p: p.stem)
def test_no_failure_message_interpolates_the_reference(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "fail":
            leaked = _interpolated_names(node) & REFERENCE_NAMES
            assert not leaked, f"{path.name}:{node.lineno} fail() shows {sorted(leaked)}"


def _numbers(message: str) -> list[float]:
    return [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?", message)]


def test_no_number_of_a_measurement_failure_passes_when_resubmitted():
    """Each measurement check takes raw material: resubmitting any number read from a failure is refused."""
    from decodelab.book.checks.ch03 import check_loop_rate
    from decodelab.book.checks.ch04 import check_later_error_rate
    from decodelab.book.checks.ch05 import check_hazard_gap

    with pytest.raises(CheckFailed) as first:
        check_loop_rate(2, ["小明喜欢吃米饭。" * 3] * 30)  # loops everywhere, too short: a failure with numbers
    for number in _numbers(str(first.value)) + [0.17]:
        with pytest.raises(CheckFailed, match="不是一个数"):
            check_loop_rate(2, number)
        with pytest.raises(CheckFailed, match="不是一个数"):
            check_later_error_rate(1.5, number, number)
        with pytest.raises(CheckFailed, match="不是一个数"):
            check_hazard_gap(1.3, number, number)


# ---- exercise 1.3 (predict, then measure): where float32's exp overflows ----------------------------------------

from decodelab.book.checks.ch01 import check_overflow_point  # noqa: E402


def _exp(zs, dtype=torch.float32):
    return [torch.exp(torch.tensor(float(z), dtype=dtype)) for z in zs]


def test_overflow_point_sets_the_prediction_beside_the_measurement(capsys):
    zs = list(range(80, 100))
    check_overflow_point(1000, zs, _exp(zs))
    out = capsys.readouterr().out
    assert out.startswith("通过 ✔ 你预测 1000，量到 89（差 -911）") and "ln(3.4 × 10^38) ≈ 88.7" in out


@pytest.mark.parametrize(("args", "hint"), [
    ((None, [1, 2], [1.0, 2.0]), "先写下你的预测"),
    ((100, None, None), "还没有量"),
    ((100, list(range(80, 100)), _exp(range(80, 100), torch.float64)), "你是不是用了 float64"),
    ((100, list(range(80, 89)), _exp(range(80, 89))), "没有一个让 exp 溢出"),
    ((100, [80, 100], _exp([80, 100])), "逐个整数地试"),
    ((100, [88, 89], [1.0, math.inf]), "不是 float32 的 exp(z)"),
    ((100, [88, 89, 90], _exp([88, 89])), "一一对应"),
    (("a lot", [88, 89], _exp([88, 89])), "应是一个数"),
])
def test_overflow_point_needs_the_measurement(args, hint, capsys):
    with pytest.raises(CheckFailed, match=re.escape(hint)):
        check_overflow_point(*args)
    assert "89" not in capsys.readouterr().out


# ---- exercise 7b.2 (predict, then measure): the acceptance rate of a draft ---------------------------------------

from decodelab.book.checks.ch07b import ACCEPT_P, ACCEPT_Q, check_acceptance_rate  # noqa: E402


def _simulate(n=4000, seed=0, draw_from=ACCEPT_Q, rule=lambda p, q, u: u < p / q):
    generator = torch.Generator().manual_seed(seed)
    xs = torch.multinomial(draw_from, n, replacement=True, generator=generator)
    us = torch.rand(n, generator=generator, dtype=torch.float64)
    return [(int(x), float(u), bool(rule(float(ACCEPT_P[x]), float(ACCEPT_Q[x]), float(u)))) for x, u in zip(xs, us)]


@pytest.mark.parametrize("seed", [0, 1])
def test_acceptance_rate_is_recomputed_and_set_beside_the_prediction(seed, capsys):
    records = _simulate(seed=seed)
    check_acceptance_rate(0.5, records)
    out = capsys.readouterr().out
    measured = sum(a for _, _, a in records) / len(records)
    assert f"你预测 0.500，量到 {measured:.3f}" in out and "1 − TV(p, q) = Σ min(p, q) = 0.600" in out


@pytest.mark.parametrize(("args", "hint"), [
    ((None, _simulate()), "先写下你的预测"),
    ((0.5, None), "还没有量"),
    ((0.5, 0.6), "三元组"),
    ((0.5, _simulate(n=500)), "至少 2000 次"),
    ((0.5, _simulate(draw_from=ACCEPT_P)), "你的 x 是按目标分布 p 抽的"),
    ((0.5, _simulate(rule=lambda p, q, u: u < q / p)), "接受当且仅当 u < p(x)/q(x)"),
    ((0.5, [(x, u / 2, a) for x, u, a in _simulate()]), "u 应是 [0, 1) 上的均匀随机数"),
    ((1.5, _simulate()), "不在可能的范围"),
])
def test_acceptance_rate_needs_honest_records(args, hint, capsys):
    with pytest.raises(CheckFailed, match=re.escape(hint)):
        check_acceptance_rate(*args)
    assert "0.600" not in capsys.readouterr().out


# ---- exercise 7e.2 (predict, then measure): how pass@n grows with n ----------------------------------------------

from decodelab.book.checks.ch07e import check_pass_at_n_growth  # noqa: E402


def _trials(n=2000, seed=0, p=0.2):
    return (torch.rand(n, 10, generator=torch.Generator().manual_seed(seed)) < p).tolist()


def test_pass_at_n_growth_is_recomputed_from_the_trials(capsys):
    trials = _trials()
    check_pass_at_n_growth(0.3, trials)
    out = capsys.readouterr().out
    measured = sum(any(row) for row in trials) / len(trials)
    assert f"你预测 0.300，量到 {measured:.3f}" in out and "1 − (1 − p)^n = 0.893" in out and "n=1: 0.2" in out


@pytest.mark.parametrize(("args", "hint"), [
    ((None, _trials()), "先写下你的预测"),
    ((0.5, None), "还没有量"),
    ((0.5, _trials(n=100)), "至少 1000 道"),
    ((0.5, [row[:5] for row in _trials()]), "正好 10 个样本"),
    ((0.5, _trials(p=0.5)), "对不上"),
    ((0.5, [[v] * 10 for v in (torch.rand(2000, generator=torch.Generator().manual_seed(0)) < 0.2).tolist()]),
     "同一道题的样本全都一样"),
    ((0.5, 0.893), "一道题的 10 个判定"),
])
def test_pass_at_n_growth_needs_honest_trials(args, hint, capsys):
    with pytest.raises(CheckFailed, match=re.escape(hint)):
        check_pass_at_n_growth(*args)
    assert "0.893" not in capsys.readouterr().out


# ---- exercise 7.4 (predict, then measure): sequences that fit with and without paging ------------------------------

from decodelab.book.checks.ch07 import POOL_BLOCKS, SEQUENCE_LENGTHS, check_paged_fit  # noqa: E402


def _blocks(round_up=True):
    return [-(-n // 16) if round_up else n // 16 for n in SEQUENCE_LENGTHS]


def _fit(blocks):
    used = admitted = 0
    for b in blocks:
        if used + b > POOL_BLOCKS:
            break
        used, admitted = used + b, admitted + 1
    return admitted


def test_paged_fit_sets_the_count_beside_the_prediction_and_the_contiguous_count(capsys):
    check_paged_fit(12, _blocks(), _fit(_blocks()))
    out = capsys.readouterr().out
    assert f"分页时放得下 {_fit(_blocks())} 条：你预测 12" in out and "只放得下 4 条" in out


@pytest.mark.parametrize(("args", "hint"), [
    ((None, _blocks(), 7), "先写下你的预测"),
    ((5, None, None), "还没有量"),
    ((5, _blocks(round_up=False), _fit(_blocks(round_up=False))), "要向上取整"),
    ((5, _blocks()[:10], 7), "应有 40 项"),
    ((5, _blocks(), _fit(_blocks()) + 1), "放得下的不是"),
    ((5, _blocks(), 4.0), "应是一个整数"),
])
def test_paged_fit_needs_the_students_counts(args, hint, capsys):
    with pytest.raises(CheckFailed, match=re.escape(hint)):
        check_paged_fit(*args)
    assert "通过" not in capsys.readouterr().out


# ---- exercise 2.3 (predict, then measure): entropy growth from T = 1 to T = 2 on tiny-zh's contexts -------------

from decodelab.book.checks.ch02 import ENTROPY_PROMPTS, check_entropy_growth  # noqa: E402


@pytest.fixture(scope="module")
def last_logits():
    from decodelab.models import load_model

    model, tokenizer = load_model("tiny-zh", device="cpu")
    with torch.no_grad():
        return torch.stack([model(input_ids=torch.tensor([tokenizer(p)["input_ids"]])).logits[0, -1]
                            for p in ENTROPY_PROMPTS])


def test_entropy_growth_is_recomputed_and_set_beside_the_prediction(last_logits, capsys):
    check_entropy_growth(3.0, torch.softmax(last_logits, -1), torch.softmax(last_logits / 2, -1))
    out = capsys.readouterr().out
    h = [float((-torch.xlogy(p, p).sum(-1)).mean()) for p in (torch.softmax(last_logits, -1),
                                                             torch.softmax(last_logits / 2, -1))]
    assert f"你预测 +3.00，量到 {h[1] - h[0]:+.2f}" in out


@pytest.mark.parametrize(("make", "hint"), [
    (lambda x: (None, None), "还没有量"),
    (lambda x: (torch.softmax(x, -1), torch.softmax(x * 2, -1)), "你把 logits 乘以了 T"),
    (lambda x: (torch.softmax(x, -1), torch.softmax(x, -1)), "temperature 没有起作用"),
    (lambda x: (torch.softmax(x, -1), torch.softmax(x, -1) / 2), "加起来不是 1"),
    (lambda x: (torch.softmax(x[:2], -1), torch.softmax(x[:2] / 2, -1)), "应是形状 [4, V]"),
    (lambda x: (torch.softmax(x.flip(0), -1), torch.softmax(x.flip(0) / 2, -1)), "提示是不是 ENTROPY_PROMPTS"),
])
def test_entropy_growth_needs_the_models_distributions(last_logits, make, hint, capsys):
    with pytest.raises(CheckFailed, match=re.escape(hint)):
        check_entropy_growth(1.0, *make(last_logits))
    assert "通过" not in capsys.readouterr().out


@pytest.mark.parametrize("path", STARTERS + SOLUTIONS, ids=lambda p: str(p.relative_to(ROOT / "exercises")))
def test_no_stored_output_names_a_machine_path(path):
    for cell in _cells(path):
        for output in cell.get("outputs", []):
            text = json.dumps(output, ensure_ascii=False)
            assert not re.search(r"/work/|/root/|/home/|site-packages", text), text[:300]


# ---- exercise 7d.1 with a prediction: the masked q of a two-step tree beside p(x | valid) ----------------------

def test_mask_step_sets_the_prediction_beside_q_and_the_conditional(capsys):
    from decodelab.book.checks.ch07d import check_mask_step

    def mask(probs, allowed):
        if not allowed.any():
            raise ValueError("nothing allowed")
        kept = probs * allowed
        return kept / kept.sum()

    check_mask_step(mask, prediction=0.007)
    out = capsys.readouterr().out
    assert "你预测 0.007，量到 0.857" in out and "条件分布给它 0.007" in out
    with pytest.raises(CheckFailed, match="先写下你的预测"):
        check_mask_step(mask, prediction=None)
    check_mask_step(mask)  # the chapter's call, without a prediction, still passes
    assert "你预测" not in capsys.readouterr().out


# ---- exercise 7c.1 with a prediction: normalized latency against TPOT for a queued request ----------------------

def test_latency_metrics_sets_the_prediction_beside_the_ratio(capsys):
    from decodelab.book.checks.ch07c import check_latency_metrics

    def latency(sent, times):
        return times[0] - sent, (None if len(times) == 1 else (times[-1] - times[0]) / (len(times) - 1))

    check_latency_metrics(latency, prediction=5)
    assert "你预测 5.0，量到 21.7" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="先写下你的预测"):
        check_latency_metrics(latency, prediction=None)


# ---- exercise 6.2 with a prediction: how many 128K-token sequences fit next to the weights ----------------------

def test_max_sequences_sets_the_prediction_beside_the_students_count(capsys):
    from decodelab.book.checks.ch06 import check_max_sequences

    check_max_sequences(lambda gpu, weights, per_token, seq_len: max(0, (gpu - weights) // (per_token * seq_len)),
                        prediction=10)
    assert "你预测 10，量到 3" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="先写下你的预测"):
        check_max_sequences(lambda *args: 0, prediction=None)
