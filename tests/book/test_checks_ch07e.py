"""The exercise check of chapter 07e accepts the unbiased pass@k estimator and names the usual mistakes."""
import math

import numpy as np
import pytest

from decodelab.book.checks import CheckFailed
from decodelab.book.checks.ch07e import check_pass_at_k


def right(n, c, k):
    if k > n:
        raise ValueError(f"k must be at most n ({n}), got {k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def test_right_answer_passes(capsys):
    check_pass_at_k(right)
    out = capsys.readouterr().out
    assert "通过" in out and "1 − (1 − p)^k = 0.4095" in out and "期望 = 0.4095（无偏）" in out


def test_math_comb_passes_too():
    def with_comb(n, c, k):
        if k > n:
            raise ValueError("k > n")
        return 1.0 - math.comb(n - c, k) / math.comb(n, k)
    check_pass_at_k(with_comb)


def not_implemented(n, c, k):
    raise NotImplementedError


def float_factorials(n, c, k):
    if k > n:
        raise ValueError("k > n")
    if n - c < k:
        return 1.0
    comb = lambda a, b: float(math.factorial(a)) / (float(math.factorial(b)) * float(math.factorial(a - b)))
    return 1.0 - comb(n - c, k) / comb(n, k)


def numpy_gamma(n, c, k):
    if k > n:
        raise ValueError("k > n")
    if n - c < k:
        return 1.0
    gamma = lambda x: np.float64(math.gamma(x)) if x < 171 else np.float64(np.inf)  # as a float64 library would
    comb = lambda a, b: gamma(a + 1) / (gamma(b + 1) * gamma(a - b + 1))
    with np.errstate(invalid="ignore"):
        return float(1.0 - comb(n - c, k) / comb(n, k))


def no_edge(n, c, k):
    if k > n:
        raise ValueError("k > n")
    comb = lambda a, b: math.factorial(a) // (math.factorial(b) * math.factorial(a - b))
    return 1.0 - comb(n - c, k) / comb(n, k)


@pytest.mark.parametrize("estimator, hint", [
    (not_implemented, "还没有实现"),
    (lambda n, c, k: 1.0 - (1.0 - c / n) ** k if k <= n else right(n, c, k), "plug-in"),
    (lambda n, c, k: c / n, "不对"),
    (lambda n, c, k: 1.0 - right(n, c, k), "1 − 正确答案"),
    (float_factorials, "OverflowError"),
    (numpy_gamma, "溢出"),
    (no_edge, "错的样本凑不满 k 个"),
    (lambda n, c, k: right(n, c, min(k, n)), "应抛出 ValueError"),
    (lambda n, c, k: right(n, c, k) if k <= n else [][0], "出了别的错"),
    (lambda n, c, k: str(right(n, c, k)), "应返回一个数"),
])
def test_mistakes_are_named(estimator, hint):
    with pytest.raises(CheckFailed) as error:
        check_pass_at_k(estimator)
    assert hint in str(error.value)
