"""The exercise check of chapter 07d accepts a right answer and names the mistake in a wrong one."""
import pytest
import torch

from decodelab.book.checks import CheckFailed
from decodelab.book.checks.ch07d import check_mask_step


def right(probs, allowed):
    if not allowed.any():
        raise ValueError("the mask allows no token")
    kept = probs * allowed
    return kept / kept.sum()


def test_right_answer_passes(capsys):
    check_mask_step(right)
    out = capsys.readouterr().out
    assert "通过" in out and "q = 0.857" in out and "p(x | valid) = 0.007" in out


def not_implemented(probs, allowed):
    raise NotImplementedError


@pytest.mark.parametrize("step, hint", [
    (not_implemented, "还没有实现"),
    (lambda p, a: p * a, "重新归一化"),
    (lambda p, a: right(p, ~a) if (~a).any() else right(p, a), "用反了"),
    (lambda p, a: torch.softmax(p.masked_fill(~a, float("-inf")), dim=-1), "不是 logits"),
    (lambda p, a: a.double() / a.sum(), "比例"),
    (lambda p, a: (p * a) / (p * a).sum(), "应抛出 ValueError"),
    (lambda p, a: right(p, a) if a.any() else torch.zeros_like(p), "应抛出 ValueError"),
    (lambda p, a: right(p, a) if a.any() else p[10], "应抛出 ValueError，你的函数抛出了 IndexError"),
    (lambda p, a: right(p, a)[:2], "形状"),
    (lambda p, a: right(p, a).tolist(), "应返回 torch.Tensor"),
])
def test_mistakes_are_named(step, hint):
    with pytest.raises(CheckFailed) as error:
        check_mask_step(step)
    assert hint in str(error.value)
