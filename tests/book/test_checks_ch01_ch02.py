"""The exercise checks of chapters 01 and 02 accept a right answer and name the mistake in a wrong one."""
import re

import pytest
import torch

from decodelab.sampling import probs
from decodelab.book.checks import CheckFailed
from decodelab.book.checks.ch01 import check_log_softmax, check_stable_softmax
from decodelab.book.checks.ch02 import check_entropy, check_temperature_softmax


# ---- chapter 01: stable softmax -------------------------------------------------------------------------------

def softmax_right(x):
    shifted = x - x.max(dim=-1, keepdim=True).values
    return shifted.exp() / shifted.exp().sum(dim=-1, keepdim=True)


def softmax_naive(x):
    return x.exp() / x.exp().sum(dim=-1, keepdim=True)


def softmax_global_max(x):
    shifted = x - x.max()
    return shifted.exp() / shifted.exp().sum(dim=-1, keepdim=True)


def softmax_wrong_dim(x):
    shifted = x - x.max(dim=0, keepdim=True).values
    return shifted.exp() / shifted.exp().sum(dim=0, keepdim=True)


def softmax_no_keepdim(x):
    shifted = x - x.max(dim=-1).values
    return shifted.exp() / shifted.exp().sum(dim=-1)


def softmax_in_place(x):
    x -= x.max(dim=-1, keepdim=True).values
    return x.exp() / x.exp().sum(dim=-1, keepdim=True)


def softmax_todo(x):
    raise NotImplementedError


@pytest.mark.parametrize("fn", [softmax_right])
def test_stable_softmax_accepts_right_answers(fn, capsys):
    check_stable_softmax(fn)
    assert "通过" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (softmax_naive, "exp(1000) 在 float32 里溢出成 inf"),
        (softmax_global_max, "你减去的是整个张量的最大值"),
        (softmax_wrong_dim, "你在 dim=0（batch 维）上归一化了"),
        (softmax_no_keepdim, "keepdim=True"),
        (softmax_in_place, "被原地修改了"),
        (lambda x: torch.log_softmax(x, dim=-1), "你返回的是 log 概率"),
        (softmax_todo, "函数还没有实现"),
    ],
)
def test_stable_softmax_names_the_mistake(fn, hint, capsys):
    with pytest.raises(CheckFailed, match=hint.replace("(", r"\(").replace(")", r"\)")):
        check_stable_softmax(fn)
    assert "通过" not in capsys.readouterr().out


def test_check_failed_is_an_assertion_error():
    assert issubclass(CheckFailed, AssertionError)
    with pytest.raises(CheckFailed, match="要检查的应是你写的函数（可调用的对象），你给的是 int"):
        check_stable_softmax(3)


# ---- chapter 01: log-softmax ----------------------------------------------------------------------------------

def log_softmax_right(x):
    m = x.max(dim=-1, keepdim=True).values
    return x - m - (x - m).exp().sum(dim=-1, keepdim=True).log()


def log_softmax_of_softmax(x):
    return torch.softmax(x, dim=-1).log()


def log_softmax_naive(x):
    return x - x.exp().sum(dim=-1, keepdim=True).log()


def log_softmax_forgot_max(x):
    m = x.max(dim=-1, keepdim=True).values
    return x - (x - m).exp().sum(dim=-1, keepdim=True).log()


@pytest.mark.parametrize("fn", [log_softmax_right])
def test_log_softmax_accepts_right_answers(fn, capsys):
    check_log_softmax(fn)
    assert "通过" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (log_softmax_of_softmax, "log(0) = -inf"),
        (log_softmax_naive, "exp(1000) 溢出"),
        (log_softmax_forgot_max, "要把它加回来"),
        (lambda x: torch.softmax(x, dim=-1), "你返回的是概率"),
        (lambda x: x - x.logsumexp(dim=0, keepdim=True), "你在 dim=0（batch 维）上做了 logsumexp"),
    ],
)
def test_log_softmax_names_the_mistake(fn, hint):
    with pytest.raises(CheckFailed, match=hint.replace("(", r"\(").replace(")", r"\)")):
        check_log_softmax(fn)


# ---- chapter 02: temperature ----------------------------------------------------------------------------------

def temperature_right(logits, temperature):
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return torch.softmax(logits / temperature, dim=-1)


def temperature_by_power(logits, temperature):
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    p = torch.softmax(logits, dim=-1) ** (1 / temperature)
    return p / p.sum(dim=-1, keepdim=True)


def temperature_multiplied(logits, temperature):
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return torch.softmax(logits * temperature, dim=-1)


def temperature_after_softmax(logits, temperature):
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return torch.softmax(logits, dim=-1) / temperature


def temperature_naive_exp(logits, temperature):
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    e = (logits / temperature).exp()
    return e / e.sum(dim=-1, keepdim=True)


def temperature_unchecked(logits, temperature):
    return torch.softmax(logits / temperature, dim=-1)


@pytest.mark.parametrize("fn", [temperature_right, temperature_by_power])
def test_temperature_accepts_right_answers(fn, capsys):
    check_temperature_softmax(fn)
    assert "通过" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (temperature_multiplied, "你把 logits 乘以了 T"),
        (temperature_after_softmax, "你把概率除以了 T"),
        (temperature_naive_exp, "exp 溢出"),
        (temperature_unchecked, "temperature = 0.0 时应该抛出 ValueError"),
        (lambda logits, t: torch.softmax(logits, dim=-1), "temperature 没有起作用"),
        (lambda logits, t: torch.softmax(logits / t, dim=0), "你在 dim=0（batch 维）上做了 softmax"),
    ],
)
def test_temperature_names_the_mistake(fn, hint):
    with pytest.raises(CheckFailed, match=hint.replace("(", r"\(").replace(")", r"\)")):
        check_temperature_softmax(fn)


# ---- chapter 02: entropy --------------------------------------------------------------------------------------

def entropy_right(p):
    return -torch.xlogy(p, p).sum(dim=-1)


def entropy_with_where(p):
    return -torch.where(p > 0, p * p.log(), torch.zeros_like(p)).sum(dim=-1)


@pytest.mark.parametrize("fn", [entropy_right, entropy_with_where])
def test_entropy_accepts_right_answers(fn, capsys):
    check_entropy(fn)
    assert "通过" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (lambda p: -(p * p.log()).sum(dim=-1), "0 · log 0 在 PyTorch 里是 0 · \\(-inf\\) = nan"),
        (lambda p: -torch.special.xlogy(p, p).sum(dim=-1) / torch.log(torch.tensor(2.0)), "以 2 为底（bits）"),
        (lambda p: torch.xlogy(p, p).sum(dim=-1), "前面有一个负号"),
        (lambda p: -torch.xlogy(p, p).sum(), "你把所有元素加在一起了"),
        (lambda p: -torch.xlogy(p, p).sum(dim=0), "你沿 dim=0 求和了"),
    ],
)
def test_entropy_names_the_mistake(fn, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_entropy(fn)


# ---- decodelab.sampling.probs, the teaching helpers the chapters read -----------------------------------------------------

def test_probs_helpers_match_torch_and_stay_finite():
    x = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 5  # [3, 50]
    torch.testing.assert_close(probs.softmax(x), torch.softmax(x, dim=-1))
    torch.testing.assert_close(probs.log_softmax(x), torch.log_softmax(x, dim=-1))
    big = torch.tensor([1000.0, 999.0, -200.0])
    assert torch.isfinite(probs.softmax(big)).all() and torch.isfinite(probs.log_softmax(big)).all()
    p = torch.softmax(x, dim=-1)
    torch.testing.assert_close(probs.entropy(p), -(p * p.log()).sum(dim=-1))
    q = torch.softmax(x.flip(0), dim=-1)
    torch.testing.assert_close(probs.kl_divergence(p, q), (p * (p.log() - q.log())).sum(dim=-1))
    assert torch.all(probs.kl_divergence(p, p).abs() < 1e-6)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: probs.softmax([1.0, 2.0]), TypeError, "logits must be a torch.Tensor, got list"),
        (lambda: probs.softmax(torch.tensor([1, 2])), TypeError, "logits must be a floating-point tensor"),
        (lambda: probs.log_softmax(torch.tensor(1.0)), ValueError, "logits must have shape \\[..., V\\]"),
        (lambda: probs.entropy(torch.tensor([0.5, 0.6])), ValueError, "probs must sum to 1 over the last dim"),
        (lambda: probs.entropy(torch.tensor([1.5, -0.5])), ValueError, "probs must hold finite probabilities >= 0"),
        (lambda: probs.kl_divergence(torch.tensor([0.5, 0.5]), torch.tensor([1.0])), ValueError,
         "p and q must have the same shape"),
    ],
)
def test_probs_helpers_check_their_input(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_dense_probs_lays_a_mapping_out_over_the_vocabulary():
    from decodelab.models.tokenizer import build_tokenizer

    tokenizer = build_tokenizer(["你", "好", "们"])
    dense = probs.dense_probs({"好": 0.75, "</s>": 0.25}, tokenizer)  # [V] with V = 4 specials + 3 characters
    assert dense.shape == (7,)
    assert dense[tokenizer.convert_tokens_to_ids("好")] == 0.75 and dense[tokenizer.eos_token_id] == 0.25
    assert dense.sum() == 1.0
    with pytest.raises(ValueError, match="token_probs holds '猫', which is not in the tokenizer's vocabulary"):
        probs.dense_probs({"猫": 1.0}, tokenizer)
    with pytest.raises(TypeError, match="token_probs must be a mapping"):
        probs.dense_probs([("好", 1.0)], tokenizer)


def test_a_function_that_never_returns_gets_the_loop_hint_within_the_budget():
    """A check must not hang on a student's endless loop: a function blocked forever (on an Event nobody sets) is
    stopped after the check's budget, whatever the machine's speed, and gets the loop hint."""
    import threading

    from decodelab.book import checks
    from decodelab.book.checks import call_student

    never = threading.Event()

    def stuck(x):
        never.wait()
        return x

    assert checks.TIME_LIMIT_S <= 5  # a few seconds on the small probes; only the model probe of ch04 gets more
    with pytest.raises(CheckFailed, match="秒还没有返回.*是不是有一个永远不会结束的循环"):
        call_student(stuck, torch.zeros(3), what="[0, 0, 0]", time_limit=0.3)
    assert call_student(lambda x: x + 1, torch.zeros(2), what="[0, 0]").tolist() == [1.0, 1.0]


def test_every_check_runs_the_student_under_the_short_budget(monkeypatch):
    """The checks of chapters 01 and 02 use the default budget: a stuck function is stopped by it."""
    import threading

    from decodelab.book import checks

    never = threading.Event()
    monkeypatch.setitem(checks.call_student.__kwdefaults__, "time_limit", 0.3)
    for check in (check_stable_softmax, check_log_softmax, check_entropy):
        with pytest.raises(CheckFailed, match="0.3 秒还没有返回"):
            check(lambda x: never.wait())
    with pytest.raises(CheckFailed, match="0.3 秒还没有返回"):
        check_temperature_softmax(lambda x, t: never.wait())


# ---- shortcuts: the forbidden functions fail with a hint that names them ----------------------------------------

import torch.nn.functional as F  # noqa: E402
from torch.nn.functional import softmax as bound_softmax  # noqa: E402  (bound before the check: caught too)


@pytest.mark.parametrize(("fn", "name"), [
    (lambda x: torch.softmax(x, dim=-1), "`torch.softmax`"),
    (lambda x: F.softmax(x, dim=-1), "`F.softmax`"),
    (lambda x: x.softmax(dim=-1), "`x.softmax`"),
    (lambda x: bound_softmax(x, dim=-1), "`F.softmax`"),
    (lambda x: torch.nn.Softmax(dim=-1)(x), "`F.softmax`"),
    (lambda x: torch.special.softmax(x, dim=-1), "`torch.special.softmax`"),
    (probs.softmax, "库里现成的 `decodelab.sampling.probs.softmax`"),
    (lambda x: probs.softmax(x), "库里现成的 `decodelab.sampling.probs.softmax`"),
])
def test_stable_softmax_refuses_every_spelling_of_softmax(fn, name, capsys):
    with pytest.raises(CheckFailed, match=re.escape(name)):
        check_stable_softmax(fn)
    assert "通过" not in capsys.readouterr().out
    assert torch.softmax(torch.zeros(2), dim=-1).tolist() == [0.5, 0.5]  # restored after the check
    assert torch.zeros(2).softmax(-1).tolist() == [0.5, 0.5] and probs.softmax(torch.zeros(2)).tolist() == [0.5, 0.5]


def test_a_swallowed_forbidden_call_still_fails():
    def sneaky(x):
        try:
            return torch.softmax(x, dim=-1)
        except Exception:  # noqa: BLE001 - the student hides the refusal
            shifted = x - x.max(dim=-1, keepdim=True).values
            return shifted.exp() / shifted.exp().sum(dim=-1, keepdim=True)

    with pytest.raises(CheckFailed, match="`torch.softmax`"):
        check_stable_softmax(sneaky)


@pytest.mark.parametrize(("fn", "name"), [
    (lambda x: torch.log_softmax(x, dim=-1), "`torch.log_softmax`"),
    (lambda x: F.log_softmax(x, dim=-1), "`F.log_softmax`"),
    (lambda x: x.log_softmax(dim=-1), "`x.log_softmax`"),
    (probs.log_softmax, "`decodelab.sampling.probs.log_softmax`"),
])
def test_log_softmax_refuses_every_spelling_of_log_softmax(fn, name):
    with pytest.raises(CheckFailed, match=re.escape(name)):
        check_log_softmax(fn)


def test_entropy_refuses_the_library_entropy():
    with pytest.raises(CheckFailed, match=re.escape("库里现成的 `decodelab.sampling.probs.entropy`")):
        check_entropy(probs.entropy)
    with pytest.raises(CheckFailed, match=re.escape("torch.distributions.Categorical.entropy")):
        check_entropy(lambda p: torch.distributions.Categorical(probs=p).entropy())


def test_temperature_softmax_refuses_the_library_sampler():
    from decodelab.sampling import SamplingParams
    from decodelab.sampling.sampler import process_logits

    def library(x, t):
        if t <= 0:
            raise ValueError("temperature must be > 0")
        return process_logits(x, SamplingParams(temperature=t)).softmax(-1)

    with pytest.raises(CheckFailed, match=re.escape("`decodelab.sampling.sampler.process_logits`")):
        check_temperature_softmax(library)


# ---- the hint alone: IPython shows a failed check as its Chinese lines, with no traceback --------------------------

def test_a_failed_check_renders_as_the_hint_alone():
    with pytest.raises(CheckFailed) as error:
        check_stable_softmax(softmax_naive)
    lines = error.value._render_traceback_()
    assert lines[0].endswith("检查没有通过\x1b[0m") and lines[1:] == str(error.value).splitlines()
    assert not any("Traceback" in line or "checks/" in line or ".py" in line for line in lines)
    assert error.value.__suppress_context__  # raised `from None`: no chained traceback either


def test_ipython_shows_only_the_hint_and_a_name_error_gets_a_chinese_hint():
    IPython = pytest.importorskip("IPython")
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_cell("import decodelab.book.checks")
    from decodelab.book import checks
    checks._register_name_error_hint()
    shown = []
    original = shell._showtraceback
    shell._showtraceback = lambda etype, value, stb: shown.append(stb)
    try:
        result = shell.run_cell("from decodelab.book.checks.ch01 import check_stable_softmax\n"
                                "check_stable_softmax(lambda x: x.exp() / x.exp().sum(-1, keepdim=True))")
        assert isinstance(result.error_in_exec, CheckFailed)
        assert shown[-1][0].endswith("检查没有通过\x1b[0m") and "exp(1000)" in "".join(shown[-1])
        assert not any("File " in line or "ch01.py" in line for line in shown[-1])
        result = shell.run_cell("check_stable_softmax(function_not_defined_yet)")
        assert isinstance(result.error_in_exec, NameError)
        assert "名字 `function_not_defined_yet` 还没有定义：先运行上面定义（或导入）它的单元" in shown[-1][1]
    finally:
        shell._showtraceback = original
