"""Chapter 01's softmax explorer in Python: the state is the stable softmax and log-softmax of the shifted logits,
the shift changes no probability, and bad input gets a message naming the argument and what is allowed."""
import re

import numpy as np
import pytest
import torch

from decodelab.book.widgets.softmax_explorer import SoftmaxExplorer, softmax_state
from decodelab.sampling import probs


def test_state_is_the_stable_softmax_and_log_softmax():
    logits = [7.2, 7.1, 3.0, -2.5, -9.9]
    state = softmax_state(logits, shift=-4.0)
    reference = torch.tensor(logits, dtype=torch.float64) - 4.0
    np.testing.assert_allclose(state.probs, probs.softmax(reference).numpy(), rtol=1e-12)
    np.testing.assert_allclose(state.log_probs, probs.log_softmax(reference).numpy(), rtol=1e-12)
    assert state.log_sum_exp == pytest.approx(float(torch.logsumexp(reference, 0)))
    np.testing.assert_allclose(state.logits, np.array(logits) - 4.0)


@pytest.mark.parametrize("shift", [-5.0, 0.3, 5.0])
def test_shift_moves_the_logits_not_the_probabilities(shift):
    base, moved = softmax_state([2.0, 0.5, -1.0]), softmax_state([2.0, 0.5, -1.0], shift)
    np.testing.assert_allclose(moved.probs, base.probs, rtol=1e-12)
    np.testing.assert_allclose(moved.log_probs, base.log_probs, atol=1e-12)
    assert moved.log_sum_exp == pytest.approx(base.log_sum_exp + shift)


def test_large_logits_do_not_overflow():
    state = softmax_state([1000.0, 999.0])
    assert np.all(np.isfinite(state.log_probs)) and state.probs.sum() == pytest.approx(1.0)


def test_widget_stores_logits_on_the_slider_grid_and_takes_numpy_and_torch_numbers():
    widget = SoftmaxExplorer(["a", "b"], np.array([1.04, -2.96]), shift=torch.tensor(0.5), lecture=True)
    assert widget.logits == [1.0, -3.0] and widget.shift == 0.5 and widget.lecture is True
    np.testing.assert_allclose(widget.state().probs, softmax_state([1.0, -3.0]).probs)
    assert repr(widget) == "SoftmaxExplorer(tokens=['a', 'b'], shift=0.5, lecture=True)"


@pytest.mark.parametrize("tokens, logits, kwargs, error, message", [
    (None, [1.0, 2.0], {}, TypeError, "tokens must be a list of non-empty str, got None"),
    ("ab", [1.0, 2.0], {}, TypeError, "tokens must be a list of non-empty str, got 'ab'"),
    (["a", ""], [1.0, 2.0], {}, TypeError, "tokens must be a list of non-empty str"),
    (["a"], [1.0], {}, ValueError, "tokens must hold 2 to 12 tokens (one slider each), got 1"),
    (["a", "b"], [1.0], {}, ValueError, "tokens and logits must have the same length, got 2 tokens and 1 logits"),
    (["a", "b"], "xy", {}, ValueError, "logits must be a non-empty 1-D sequence of numbers [V], got 'xy'"),
    (["a", "b"], [1.0, float("nan")], {}, ValueError, "logits must be finite"),
    (["a", "b"], [1.0, 11.0], {}, ValueError, "each logit must be in [-10.0, 10.0] (the slider's range), got 11.0"),
    (["a", "b"], [1.0, 2.0], {"shift": 6.0}, ValueError, "shift must be in [-5.0, 5.0] (the slider's range), got 6.0"),
    (["a", "b"], [1.0, 2.0], {"shift": True}, ValueError, "shift must be a finite number, got True"),
    (["a", "b"], [1.0, 2.0], {"shift": "1"}, ValueError, "shift must be a finite number, got '1'"),
])
def test_bad_input_names_the_argument(tokens, logits, kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        SoftmaxExplorer(tokens, logits, **kwargs)


def test_state_refuses_an_empty_or_2d_row():
    for bad in ([], [[1.0, 2.0]]):
        with pytest.raises(ValueError, match=re.escape("logits must be a non-empty 1-D sequence of numbers [V]")):
            softmax_state(bad)
