"""The exercise check of chapter 07b accepts a right answer and names the mistake in a wrong one."""
import pytest
import torch

from decodelab.book.checks import CheckFailed
from decodelab.book.checks.ch07b import check_speculative_step


def accepts_right(p_x, q_x, u):
    return u < p_x / q_x


def residual_right(p, q):
    r = (p - q).clamp_min(0)
    return r / r.sum()


def test_right_answer_passes(capsys):
    check_speculative_step(accepts_right, residual_right)
    assert "通过" in capsys.readouterr().out


@pytest.mark.parametrize("accepts, residual, hint", [
    (accepts_right, lambda p, q: p - q, "里面有负数"),
    (accepts_right, lambda p, q: (p - q).clamp_min(0), "归一化"),
    (accepts_right, lambda p, q: p, "直接返回了 p"),
    (accepts_right, lambda p, q: residual_right(q, p), "方向反了"),
    (accepts_right, lambda p, q: torch.ones(3), "形状"),
    (lambda p_x, q_x, u: u < q_x / p_x, residual_right, "比值写反了"),
    (lambda p_x, q_x, u: True, residual_right, "总是接受"),
    (lambda p_x, q_x, u: u < 0.5 * p_x / q_x, residual_right, "应为 min(1, p(x)/q(x))"),
    (lambda p_x, q_x, u: "yes", residual_right, "应返回 True 或 False"),
])
def test_mistakes_are_named(accepts, residual, hint):
    with pytest.raises(CheckFailed) as error:
        check_speculative_step(accepts, residual)
    assert hint in str(error.value)
