"""The live widgets of chapters 03 and 04 (strategy playground, autoregressive stepper) without a display."""
import math

import pytest
import torch

from decodelab.measure import scoring as metrics
from decodelab.decoding.beam import beam_search
from decodelab.decoding.generate import generate
from decodelab.sampling.sampler import SamplingParams, make_generator
from decodelab.toy.sentences import ToyLanguage
from decodelab.book.widgets.kernel_note import KernelNote
from decodelab.book.widgets.playground import PlaygroundSettings, StrategyPlayground, render_html, run_playground
from decodelab.book.widgets.stepper import AutoregressiveStepper, render_step_html, step_view


@pytest.fixture(scope="module")
def lang():
    return ToyLanguage()


# ---- playground ------------------------------------------------------------------------------------------------

def test_greedy_and_beam_match_the_library(tiny, lang):
    model, tok = tiny
    greedy = run_playground(model, tok, lang, PlaygroundSettings(prompt="今天，", strategy="greedy"))
    expected = generate(model, tok, ["今天，"], SamplingParams(temperature=0.0, max_tokens=40))[0]
    assert greedy.continuations == (expected.text,)
    beam = run_playground(model, tok, lang, PlaygroundSettings(prompt="今天，", strategy="beam search", num_beams=3))
    ids = beam_search(model, tok("今天，")["input_ids"], num_beams=3, max_tokens=40, eos_token_id=tok.eos_token_id)
    assert beam.continuations == (tok.decode(ids.token_ids, skip_special_tokens=True),)


def test_sampling_is_seeded_and_scored_against_the_truth(tiny, lang):
    model, tok = tiny
    settings = PlaygroundSettings(prompt="小明", top_p=0.9, num_samples=6, seed=3)
    first, again = run_playground(model, tok, lang, settings), run_playground(model, tok, lang, settings)
    assert first.continuations == again.continuations and len(first.continuations) == 6
    other = run_playground(model, tok, lang, PlaygroundSettings(prompt="小明", top_p=0.9, num_samples=6, seed=4))
    assert other.continuations != first.continuations
    for text, ended, true in zip(first.continuations, first.ended, first.true_log_probs):
        expected = metrics.true_log_prob(lang, "小明", text) if ended else -math.inf
        assert true == pytest.approx(expected)
    assert first.stats == metrics.text_stats(model, tok, lang, ["小明"] * 6, list(first.continuations),
                                             list(first.ended))


def test_render_html_marks_valid_and_invalid_texts(tiny, lang):
    model, tok = tiny
    result = run_playground(model, tok, lang, PlaygroundSettings(prompt="小明坐", strategy="greedy"))
    page = render_html(result)
    assert result.continuations[0] in page and "✓" in page and "font-size:14px" in page
    assert "font-size:20px" in render_html(result, lecture=True)
    broken = run_playground(model, tok, lang, PlaygroundSettings(prompt="坐小明", strategy="greedy"))  # not a prefix
    assert broken.stats.validity == 0.0 and "✗" in render_html(broken)


def test_playground_widget_reruns_on_change_and_has_a_stable_repr(tiny, lang):
    model, tok = tiny
    widget = StrategyPlayground(model, tok, lang, PlaygroundSettings(strategy="greedy", prompt="小明"))
    first = widget.view.value
    assert widget.result.continuations[0] in first
    widget._controls["prompt"].value = "因为"
    assert widget.settings.prompt == "因为" and widget.view.value != first
    widget._controls["prompt"].value = "xyz"
    assert "not in the model&#x27;s vocabulary" in widget.view.value
    assert repr(widget).startswith("StrategyPlayground(prompt='xyz', strategy='greedy'") and "0x" not in repr(widget)
    plain = widget._repr_mimebundle_()["text/plain"]  # ipywidgets shortens it, but it stays our repr
    assert repr(widget).startswith(plain.rstrip("…")) and "0x" not in plain


@pytest.mark.parametrize(("fields", "message"), [
    ({"strategy": "nucleus"}, "strategy must be one of"),
    ({"num_samples": 0}, "num_samples must be an int >= 1, got 0"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\], got 1.5"),
    ({"seed": -1}, "seed must be an int >= 0, got -1"),
])
def test_playground_settings_check_their_values(fields, message):
    with pytest.raises(ValueError, match=message):
        PlaygroundSettings(**fields)


def test_run_playground_checks_its_input(tiny, lang):
    model, tok = tiny
    with pytest.raises(TypeError, match="settings must be a PlaygroundSettings, got dict"):
        run_playground(model, tok, lang, {"prompt": "小明"})
    with pytest.raises(ValueError, match="prompt holds 'x', which is not in the model's vocabulary"):
        run_playground(model, tok, lang, PlaygroundSettings(prompt="小x"))


# ---- stepper ---------------------------------------------------------------------------------------------------

def test_step_view_shows_the_model_the_params_and_the_truth(tiny, lang):
    model, tok = tiny
    view = step_view(model, tok, lang, "小明坐", SamplingParams(top_k=3), make_generator(0), top_n=6)
    assert len(view.candidates) == 6
    probs = [c.model_prob for c in view.candidates]
    assert probs == sorted(probs, reverse=True)
    assert sum(c.sampled_prob > 0 for c in view.candidates) == 3  # top-k = 3 leaves three
    truth = lang.next_token_probs("小明坐")
    for c in view.candidates:
        assert c.true_prob == pytest.approx(truth.get(c.token, 0.0), abs=1e-6)
    assert view.chosen in [c.token for c in view.candidates[:3]]
    assert view.true_entropy == pytest.approx(lang.entropy("小明坐"), abs=1e-5)


def test_greedy_step_takes_the_argmax(tiny, lang):
    model, tok = tiny
    view = step_view(model, tok, lang, "今天，", SamplingParams(temperature=0.0), None)
    assert view.chosen == view.candidates[0].token
    with torch.no_grad():
        logits = model(input_ids=tok("今天，", return_tensors="pt")["input_ids"]).logits[0, -1]
    assert view.chosen == tok.convert_ids_to_tokens(int(logits.argmax()))


def test_stepper_is_repeatable_and_stops_at_the_end(tiny, lang):
    model, tok = tiny
    stepper = AutoregressiveStepper(model, tok, lang, prompt="小明", seed=5, initial_steps=3)
    first = [s.chosen for s in stepper.steps]
    assert len(first) == 3 and "小明" in stepper.view.value
    stepper.reset()
    assert stepper.steps == []
    for _ in range(3):
        stepper.step()
    assert [s.chosen for s in stepper.steps] == first
    while stepper.step() is not None:
        pass
    assert stepper.steps[-1].chosen == "</s>"
    continuation = "".join(s.chosen for s in stepper.steps[:-1])
    model_lp = sum(math.log(s.chosen_model_prob) for s in stepper.steps)
    assert f"{model_lp:.3f}" in stepper.view.value
    true_lp = metrics.true_log_prob(lang, "小明", continuation)  # the product formula, under the truth
    assert (f"{true_lp:.3f}" if true_lp > -math.inf else "已离开语言") in stepper.view.value
    assert repr(stepper) == ("AutoregressiveStepper(prompt='小明', steps=%d, temperature=1.0, top_k=0, top_p=1.0, "
                             "seed=5, lecture=False)" % len(stepper.steps))


def _touchable(widget) -> list:
    """Every control inside `widget` that a reader could operate (whatever has a `disabled` trait)."""
    found = [widget] if widget.has_trait("disabled") else []
    for child in getattr(widget, "children", ()):
        found += _touchable(child)
    return found


@pytest.mark.parametrize("kind", ["playground", "stepper"])
def test_widget_says_it_needs_a_kernel_until_one_answers(tiny, lang, kind):
    """Built (and saved) with its note shown and every control disabled; a ping from a view, which only a live
    kernel receives, enables the controls and tells the view to hide the note."""
    model, tok = tiny
    if kind == "playground":
        widget = StrategyPlayground(model, tok, lang, PlaygroundSettings(strategy="greedy"))
    else:
        widget = AutoregressiveStepper(model, tok, lang, initial_steps=2)
    note = widget.children[0]
    assert isinstance(note, KernelNote) and note.text.startswith("需要运行中的 Python 内核")
    controls = _touchable(widget)
    assert len(controls) >= 7 and set(map(id, controls)) == set(map(id, note.controls))
    assert all(control.disabled for control in controls)
    assert "0x" not in repr(note)

    sent = []
    note.send = sent.append
    note._handle_custom_msg({"type": "something else"}, [])
    assert sent == [] and all(control.disabled for control in controls)
    note._handle_custom_msg({"type": "ping"}, [])
    assert sent == [{"type": "live"}] and not any(control.disabled for control in controls)
    assert note.text.startswith("需要")  # a message, not the synced state: a notebook saved later still says it


def test_kernel_note_needs_a_text():
    with pytest.raises(ValueError, match="text must be a non-empty str, got ''"):
        KernelNote("", [])


def test_stepper_html_grows_for_lectures(tiny, lang):
    model, tok = tiny
    steps = [step_view(model, tok, lang, "小明", SamplingParams(temperature=0.0), None)]
    assert "font-size:20px" in render_step_html("小明", steps, lecture=True)
    assert "font-size:14px" in render_step_html("小明", steps)


def test_stepper_checks_its_input(tiny, lang):
    model, tok = tiny
    with pytest.raises(ValueError, match="initial_steps must be an int >= 0, got -1"):
        AutoregressiveStepper(model, tok, lang, initial_steps=-1)
    with pytest.raises(ValueError, match="top_p must be in"):
        AutoregressiveStepper(model, tok, lang, top_p=0.0)
    with pytest.raises(ValueError, match="top_n must be an int >= 1, got 0"):
        step_view(model, tok, lang, "小明", SamplingParams(), None, top_n=0)


def test_constructor_values_outside_a_slider_are_errors(tiny):
    """A widget built with a value outside its slider's range says so instead of running at the clamped value."""
    from decodelab.book.widgets.playground import PlaygroundSettings, StrategyPlayground
    from decodelab.book.widgets.stepper import AutoregressiveStepper

    model, tok = tiny
    lang = ToyLanguage()
    with pytest.raises(ValueError, match=r"temperature must be in \[0.0, 3.0\] \(the slider's range\), got 5"):
        AutoregressiveStepper(model, tok, lang, temperature=5)
    with pytest.raises(ValueError, match=r"num_samples must be in \[1, 32\] \(the slider's range\), got 40"):
        StrategyPlayground(model, tok, lang, PlaygroundSettings(num_samples=40))
    assert AutoregressiveStepper(model, tok, lang, temperature=3.0, initial_steps=0) is not None
