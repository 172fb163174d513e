"""The distribution explorer's computation and widget, without a display."""
import math

import numpy as np
import pytest

from decodelab.book.widgets.explorer import (
    DistributionExplorer,
    ExplorerContext,
    ExplorerParams,
    explorer_state,
    make_context,
)

RNG = np.random.default_rng(0)
LOGITS = RNG.normal(0.0, 2.0, size=40)


def test_temperature_one_is_plain_softmax():
    state = explorer_state([math.log(0.5), math.log(0.3), math.log(0.2)])
    np.testing.assert_allclose(state.probs, [0.5, 0.3, 0.2])
    np.testing.assert_allclose(state.final_probs, [0.5, 0.3, 0.2])
    assert state.kept_count == 3 and state.kept_mass == pytest.approx(1.0)
    assert state.entropy == pytest.approx(-(0.5 * math.log(0.5) + 0.3 * math.log(0.3) + 0.2 * math.log(0.2)))


@pytest.mark.parametrize("temperature", [0.1, 0.5, 1.0, 2.0, 3.0])
def test_temperature_keeps_the_ranking(temperature):
    state = explorer_state(LOGITS, ExplorerParams(temperature=temperature))
    assert state.probs.sum() == pytest.approx(1.0)
    assert np.array_equal(np.argsort(-state.probs, kind="stable"), np.argsort(-LOGITS, kind="stable"))


def test_lower_temperature_lowers_entropy():
    entropies = [explorer_state(LOGITS, ExplorerParams(temperature=t)).entropy for t in (0.3, 0.7, 1.0, 1.5, 3.0)]
    assert entropies == sorted(entropies)
    assert entropies[-1] < math.log(LOGITS.size)


def test_top_k_keeps_ties_with_the_kth_logit():
    state = explorer_state([3.0, 2.0, 2.0, 1.0], ExplorerParams(top_k=2))
    assert state.kept.tolist() == [True, True, True, False]
    assert state.final_probs.sum() == pytest.approx(1.0)
    assert state.final_probs[3] == 0.0


def test_top_p_keeps_the_token_that_crosses_p():
    logits = np.log([0.5, 0.3, 0.15, 0.05])
    assert explorer_state(logits, ExplorerParams(top_p=0.6)).kept.tolist() == [True, True, False, False]
    assert explorer_state(logits, ExplorerParams(top_p=0.79)).kept.tolist() == [True, True, False, False]
    assert explorer_state(logits, ExplorerParams(top_p=0.81)).kept.tolist() == [True, True, True, False]
    state = explorer_state(logits, ExplorerParams(top_p=0.01))
    assert state.kept.tolist() == [True, False, False, False]
    assert state.kept_mass == pytest.approx(0.5)
    np.testing.assert_allclose(state.final_probs, [1.0, 0.0, 0.0, 0.0])


def test_top_p_is_computed_after_top_k():
    logits = np.log([0.4, 0.3, 0.2, 0.1])
    # without top-k the first token holds 0.4 < 0.42, so the second one joins the nucleus;
    # after top-k=3 the first token holds 0.4/0.9 = 0.444 >= 0.42 and stands alone
    assert explorer_state(logits, ExplorerParams(top_p=0.42)).kept.tolist() == [True, True, False, False]
    assert explorer_state(logits, ExplorerParams(top_k=3, top_p=0.42)).kept.tolist() == [True, False, False, False]


def test_min_p_is_relative_to_the_top_probability():
    logits = np.log([0.5, 0.3, 0.12, 0.08])
    assert explorer_state(logits, ExplorerParams(min_p=0.2)).kept.tolist() == [True, True, True, False]
    assert explorer_state(logits, ExplorerParams(min_p=0.7)).kept.tolist() == [True, False, False, False]


def test_nucleus_adapts_to_the_shape_of_the_distribution():
    flat = np.zeros(30)
    peaked = np.array([8.0] + [0.0] * 29)
    params = ExplorerParams(top_p=0.85)
    assert explorer_state(flat, params).kept_count == 26  # 25/30 < 0.85 <= 26/30
    assert explorer_state(peaked, params).kept_count == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"temperature": 0.0}, ValueError, "temperature must be a finite number > 0, got 0.0"),
        ({"temperature": float("nan")}, ValueError, "temperature must be a finite number > 0"),
        ({"temperature": "1"}, TypeError, "temperature must be a number, got str"),
        ({"top_k": -1}, ValueError, "top_k must be >= 0 (0 = off), got -1"),
        ({"top_k": 2.5}, TypeError, "top_k must be an int"),
        ({"top_p": 1.5}, ValueError, "top_p must be in (0, 1], got 1.5"),
        ({"top_p": 0.0}, ValueError, "top_p must be in (0, 1], got 0.0"),
        ({"min_p": 1.0}, ValueError, "min_p must be in [0, 1), got 1.0"),
    ],
)
def test_params_are_checked(kwargs, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        ExplorerParams(**kwargs)


@pytest.mark.parametrize(
    ("logits", "message"),
    [([], "non-empty 1-D"), ([[1.0, 2.0]], "shape \\(1, 2\\)"), ([1.0, float("inf")], "must be finite")],
)
def test_logits_are_checked(logits, message):
    with pytest.raises(ValueError, match=message):
        explorer_state(logits)


def test_params_type_is_checked():
    with pytest.raises(TypeError, match="params must be an ExplorerParams, got dict"):
        explorer_state([1.0, 2.0], {"temperature": 1.0})


def test_make_context_rounds_and_checks():
    context = make_context("平坦", ["的", "了"], [1.234567, -0.5])
    assert context.logits == (1.2346, -0.5)
    with pytest.raises(ValueError, match="same length, got 2 tokens and 1 logits"):
        ExplorerContext("平坦", ("的", "了"), (1.0,))
    with pytest.raises(ValueError, match="label must be a non-empty str"):
        make_context("", ["的"], [1.0])
    with pytest.raises(ValueError, match="decimals must be an int >= 0, got -1"):
        make_context("平坦", ["的"], [1.0], decimals=-1)


def _widget(**kwargs):
    flat = make_context("平坦的上下文", [chr(0x4E00 + i) for i in range(40)], LOGITS * 0.3)
    peaked = make_context("尖锐的上下文", [chr(0x4E80 + i) for i in range(40)], LOGITS * 2.0)
    return DistributionExplorer([flat, peaked], **kwargs)


def test_widget_repr_is_stable_and_names_its_state():
    widget = _widget(temperature=0.7, top_p=0.9, lecture=True)
    text = repr(widget)
    assert text == (
        "DistributionExplorer(contexts=['平坦的上下文', '尖锐的上下文'], temperature=0.7, top_k=0, "
        "top_p=0.9, min_p=0.0, use_min_p=False, lecture=True)"
    )
    assert repr(_widget(temperature=0.7, top_p=0.9, lecture=True)) == text
    bundle, _ = widget._repr_mimebundle_()
    assert bundle["text/plain"] == text
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == widget.model_id


def test_widget_state_holds_the_esm_css_and_logits():
    widget = _widget()
    state = widget.get_state()
    assert "export function computeState" in state["_esm"] and "export default { render }" in state["_esm"]
    assert ".dl-explorer" in state["_css"]
    assert "import " not in state["_esm"] and "http" not in state["_esm"]  # nothing fetched: works offline
    assert [c["label"] for c in state["contexts"]] == ["平坦的上下文", "尖锐的上下文"]
    assert len(state["contexts"][0]["logits"]) == 40


def test_widget_states_follow_the_sliders_and_the_min_p_toggle():
    widget = _widget()
    widget.temperature = 0.5
    widget.top_k = 5
    widget.min_p = 0.3
    flat, peaked = widget.states()
    expected = explorer_state(widget.contexts[0]["logits"], ExplorerParams(temperature=0.5, top_k=5))
    np.testing.assert_allclose(flat.final_probs, expected.final_probs)
    assert flat.kept_count == 5
    widget.use_min_p = True
    with_min_p = widget.states()[1]
    expected = explorer_state(widget.contexts[1]["logits"], ExplorerParams(temperature=0.5, top_k=5, min_p=0.3))
    assert with_min_p.kept.tolist() == expected.kept.tolist()
    assert with_min_p.kept_count < peaked.kept_count


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"temperature": 5.0}, ValueError, "temperature must be in \\[0.05, 3.0\\] \\(the slider's range\\), got 5.0"),
        ({"top_k": 80}, ValueError, "top_k must be in \\[0, 50\\]"),
        ({"top_p": 0.01}, ValueError, "top_p must be in \\[0.05, 1\\]"),
        ({"min_p": 0.9}, ValueError, "min_p must be in \\[0, 0.5\\]"),
        ({"num_bars": 0}, ValueError, "num_bars must be an int >= 1, got 0"),
        ({"top_p": 2.0}, ValueError, "top_p must be in \\(0, 1\\], got 2.0"),
    ],
)
def test_widget_arguments_are_checked(kwargs, error, message):
    with pytest.raises(error, match=message):
        _widget(**kwargs)


def test_widget_context_count_and_type_are_checked():
    context = make_context("平坦", ["的"], [1.0])
    with pytest.raises(ValueError, match="contexts must hold 1 or 2 ExplorerContext, got 3"):
        DistributionExplorer([context] * 3)
    with pytest.raises(TypeError, match="contexts must hold ExplorerContext \\(see make_context\\), got dict"):
        DistributionExplorer([{"label": "平坦"}])


@pytest.mark.parametrize("method", ["sort", "fast"])
def test_explorer_state_matches_the_library_sampler(method):
    """What the explorer shows is exactly the distribution decodelab.sampling.sampler draws from."""
    import torch

    from decodelab.sampling.sampler import SamplingParams, process_logits

    rng = np.random.default_rng(1)
    for case in range(60):
        logits = rng.normal(0.0, rng.uniform(0.3, 4.0), size=int(rng.integers(5, 300)))
        params = ExplorerParams(
            temperature=float(rng.choice([0.05, 0.3, 0.7, 1.0, 1.6, 3.0])),
            top_k=int(rng.choice([0, 1, 3, 10, 40])),
            top_p=float(rng.choice([1.0, 0.95, 0.8, 0.5, 0.1])),
            min_p=float(rng.choice([0.0, 0.0, 0.05, 0.3])),
        )
        state = explorer_state(logits, params)
        library = process_logits(
            torch.tensor(logits, dtype=torch.float64).unsqueeze(0),  # [1, V]
            SamplingParams(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, min_p=params.min_p),
            method=method,
        )[0]
        assert np.array_equal(torch.isfinite(library).numpy(), state.kept), (case, params)
        np.testing.assert_allclose(torch.softmax(library, dim=-1).numpy(), state.final_probs, atol=1e-12)
