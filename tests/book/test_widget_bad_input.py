"""Widget constructors and the drift helpers on bad input: a clear message naming the argument; numpy and torch
scalars taken as the numbers they hold."""
import re

import numpy as np
import pytest
import torch

from decodelab.book.widgets.best_of_n_explorer import BestOfNExplorer
from decodelab.book.widgets.constrained_stepper import ConstrainedStepper
from decodelab.book.widgets.cost import CostExplorer
from decodelab.book.widgets.drift import DriftExplorer, inject_and_continue
from decodelab.book.widgets.explorer import DistributionExplorer, ExplorerParams, make_context
from decodelab.book.widgets.kernel_note import KernelNote
from decodelab.book.widgets.paged_stepper import PagedStepper
from decodelab.book.widgets.playground import PlaygroundSettings, StrategyPlayground
from decodelab.book.widgets.sliders import slider
from decodelab.book.widgets.speculative_stepper import SpeculativeStepper
from decodelab.book.widgets.stepper import AutoregressiveStepper
from decodelab.toy.sentences import ToyLanguage

RECORDED = [(BestOfNExplorer, "runs", "best_of_n_frames"), (ConstrainedStepper, "runs", "constrained_frames"),
            (DriftExplorer, "runs", "position_errors (as dicts)"), (SpeculativeStepper, "runs", "speculative_runs"),
            (lambda frames: PagedStepper(frames, block_size=4), "frames", "record_frames")]


@pytest.mark.parametrize("widget, name, source", RECORDED)
@pytest.mark.parametrize("value", [None, "abc", -1, np.float64(0.5), [1, 2]])
def test_recorded_widgets_name_what_their_runs_must_be(widget, name, source, value):
    with pytest.raises(ValueError, match=re.escape(f"{name} must be a list of the dicts {source} returns, got ")):
        widget(value)


@pytest.mark.parametrize("widget, name, source", RECORDED)
def test_recorded_widgets_refuse_no_runs(widget, name, source):
    with pytest.raises(ValueError, match=f"{name} must hold at least one"):
        widget([])


FRAME = {"step": 0, "sequences": [], "ref_counts": [], "free": [], "fill": 0, "blocks": []}


def test_indices_and_sizes_may_be_numpy_or_torch_ints():
    widget = PagedStepper([FRAME, FRAME], block_size=np.int64(4), index=torch.tensor(1))
    assert (widget.block_size, widget.index) == (4, 1)
    with pytest.raises(ValueError, match=re.escape("index must be an int in [0, 2), got 2.0")):
        PagedStepper([FRAME, FRAME], block_size=4, index=2.0)


@pytest.mark.parametrize("value", [None, "abc", -1, []])
def test_cost_explorer_names_its_models(value):
    with pytest.raises(ValueError, match="models must be a non-empty list of ModelSpec"):
        CostExplorer(value)


@pytest.mark.parametrize("value", [None, "abc", -1])
def test_distribution_explorer_names_its_contexts(value):
    with pytest.raises(TypeError, match="contexts must be a list of 1 or 2 ExplorerContext"):
        DistributionExplorer(value)


def test_explorer_takes_numpy_scalars_as_numbers():
    context = make_context("x", ["a", "b", "c"], np.array([1.0, 2.0, 0.5]), decimals=np.int64(2))
    widget = DistributionExplorer([context], temperature=np.float32(0.5), top_k=np.int64(2), top_p=np.float32(0.5),
                                  min_p=torch.tensor(0.25), num_bars=np.int64(3))
    assert (widget.temperature, widget.top_k, widget.top_p, widget.min_p, widget.num_bars) == (0.5, 2, 0.5, 0.25, 3)
    assert ExplorerParams(top_p=np.float32(0.5)).top_p == 0.5
    with pytest.raises(ValueError, match=re.escape("top_p must be in (0, 1], got True")):
        ExplorerParams(top_p=True)
    with pytest.raises(TypeError, match="tokens must be a list of str, got None"):
        make_context("x", None, [1.0])
    with pytest.raises(ValueError, match=re.escape("logits must be a non-empty 1-D sequence of numbers [V], got 'ab'")):
        make_context("x", ["a", "b"], "ab")


def test_kernel_note_names_its_controls():
    with pytest.raises(TypeError, match="controls must be a list of ipywidgets controls, got None"):
        KernelNote("text", None)


def test_sliders_take_numpy_scalars_and_refuse_a_float_for_an_int():
    import ipywidgets as widgets

    assert slider(widgets.FloatSlider, "top_p", np.float32(0.5), 0.05, 1.0).value == 0.5
    assert slider(widgets.IntSlider, "top_k", np.int64(3), 0, 50).value == 3
    with pytest.raises(ValueError, match=re.escape("top_k must be an int in [0, 50] (the slider's range), got 2.5")):
        slider(widgets.IntSlider, "top_k", 2.5, 0, 50)
    with pytest.raises(ValueError, match=re.escape("top_p must be a number in [0.05, 1.0] (the slider's range), "
                                                   "got None")):
        slider(widgets.FloatSlider, "top_p", None, 0.05, 1.0)


def test_playground_settings_keep_numpy_counts_as_ints():
    settings = PlaygroundSettings(num_beams=np.int64(3), num_samples=np.int32(2), seed=torch.tensor(1),
                                  top_p=np.float32(0.5))
    assert (type(settings.num_beams), type(settings.num_samples), type(settings.seed)) == (int, int, int)


def test_the_stepper_refuses_characters_outside_the_vocabulary(tiny):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match=re.escape("prompt has characters outside the tokenizer's vocabulary: "
                                                   "['e', 'h', 'l', 'o']")):
        AutoregressiveStepper(model, tokenizer, ToyLanguage(), prompt="hello")
    stepper = AutoregressiveStepper(model, tokenizer, ToyLanguage(), prompt="小明", top_p=np.float32(0.5),
                                    top_k=np.int64(3), initial_steps=np.int64(1))
    stepper._prompt.value = "小明x"  # typed in the text box: refused in the view, nothing drawn
    assert stepper.step() is None and "outside the tokenizer&#x27;s vocabulary: [&#x27;x&#x27;]" in stepper.view.value


@pytest.mark.parametrize("widget", [AutoregressiveStepper, StrategyPlayground])
def test_live_widgets_name_a_missing_or_swapped_model(tiny, widget):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="^model must be a transformers causal LM, got NoneType$"):
        widget(None, tokenizer, ToyLanguage())
    with pytest.raises(ValueError, match=re.escape(f"got a tokenizer where the model goes: call {widget.__name__}(")):
        widget(tokenizer, model, ToyLanguage())


def test_inject_and_continue_needs_one_continuation_per_prefix():
    lang = ToyLanguage()
    texts = lang.sample(3, seed=1)
    with pytest.raises(ValueError, match=re.escape("continue_fn must return one string per prefix: 6 expected, got 5")):
        inject_and_continue(lang, texts, [1, 2], lambda prefixes: ["。"] * (len(prefixes) - 1))
    with pytest.raises(ValueError, match=re.escape("positions must be a non-empty list of ints >= 0, got [-1]")):
        inject_and_continue(lang, texts, [-1], lambda prefixes: ["。"] * len(prefixes))
    assert len(inject_and_continue(lang, texts, np.array([1, 2]), lambda prefixes: ["。"] * len(prefixes))) == 6
