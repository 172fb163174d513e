"""The autoregressive stepper: one click, one token; the distribution it was drawn from is shown next to the truth.

`step_view` computes one step (the model's next-token distribution after the text so far, what the sampling
parameters leave of it, the true distribution, and the token drawn with the request's own generator);
`render_step_html` draws it; `AutoregressiveStepper` is a thin ipywidgets layer with "下一个 token" and "重来" buttons.
It takes `initial_steps` steps when it is built, so the static HTML book shows a few steps already, under a
`KernelNote` that says the buttons need a running kernel (they stay disabled until one answers).

Taught in: chapters/04-autoregressive.ipynb
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass

import ipywidgets as widgets
import torch

from decodelab.models.tokenizer import encode_prompt
from decodelab.sampling.probs import dense_probs
from decodelab.sampling.sampler import SamplingParams, make_generator, process_logits, sample
from decodelab.toy.sentences import ToyLanguage
from decodelab.validation import check_int, check_model
from decodelab.book.widgets.kernel_note import KernelNote
from decodelab.book.widgets.sliders import slider

NEEDS_KERNEL = ("需要运行中的 Python 内核：在 JupyterLab 里打开本章（make lecture）并运行，才能操作；"
                "下面是默认设置走了 {steps} 步的结果。")


@dataclass(frozen=True)
class Candidate:
    """One row of the shown distribution."""

    token: str
    model_prob: float    # softmax of the raw logits
    sampled_prob: float  # after temperature / top-k / top-p: what the draw uses
    true_prob: float     # under the toy language (0 where the prefix has already left it)


@dataclass(frozen=True)
class StepView:
    """One step of the loop: the text before it, the top candidates, the chosen token and running log-probs."""

    text: str                     # prompt + generated text before this step
    candidates: tuple[Candidate, ...]
    chosen: str                   # the token drawn at this step ("</s>" ends)
    chosen_model_prob: float
    chosen_true_prob: float
    model_entropy: float          # nats, of the raw model distribution
    true_entropy: float | None    # nats; None once the text has left the language


@torch.no_grad()
def step_view(model, tokenizer, lang: ToyLanguage, text: str, params: SamplingParams,
              generator: torch.Generator | None, top_n: int = 8) -> StepView:
    """Run the model on `<s> text`, draw the next token with `params` and `generator`, and describe the step."""
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
    check_int(top_n, "top_n")
    ids = torch.tensor([encode_prompt(tokenizer, text)])  # [1, T]; a character outside the vocabulary is an error
    logits = model(input_ids=ids).logits[:, -1, :].float()  # [1, V]
    model_probs = logits.softmax(-1)[0]  # [V]
    sampled_probs = process_logits(logits, params).softmax(-1)[0]  # [V]
    viable = lang.prefix_is_viable(text) if all(ch in set(lang.alphabet) for ch in text) else False
    true_probs = dense_probs(lang.next_token_probs(text), tokenizer) if viable else torch.zeros_like(model_probs)
    token_id = int(sample(logits, params, [generator])[0])
    names = tokenizer.convert_ids_to_tokens(list(range(len(model_probs))))
    top = model_probs.topk(min(top_n, model_probs.numel())).indices.tolist()
    if token_id not in top:
        top[-1] = token_id  # the drawn token is always shown
    candidates = tuple(Candidate(names[i], float(model_probs[i]), float(sampled_probs[i]), float(true_probs[i]))
                       for i in top)
    positive = model_probs[model_probs > 0]
    true_entropy = None
    if viable:
        t = true_probs[true_probs > 0]
        true_entropy = max(0.0, float(-(t * t.log()).sum()))  # no "-0.000" for a certain step
    return StepView(text, candidates, names[token_id], float(model_probs[token_id]), float(true_probs[token_id]),
                    float(-(positive * positive.log()).sum()), true_entropy)


def render_step_html(prompt: str, steps: list[StepView], lecture: bool = False) -> str:
    """The text so far (generated tokens highlighted), the running log-probabilities, and the last step's table."""
    size, bar = ("20px", 220) if lecture else ("14px", 140)
    pieces = [f"<b>{html.escape(prompt)}</b>"]
    for s in steps:
        token = "␃" if s.chosen == "</s>" else html.escape(s.chosen)
        pieces.append(f"<span style='background:#dbeafe;padding:0 2px'>{token}</span>")
    model_lp = sum(math.log(s.chosen_model_prob) for s in steps)
    true_lp = sum(math.log(s.chosen_true_prob) if s.chosen_true_prob > 0 else -math.inf for s in steps)
    parts = [f"<div style='font-size:{size};line-height:1.6'>",
             f"<p style='font-size:1.3em'>{''.join(pieces)}</p>",
             f"<p>{len(steps)} 步 · log P<sub>模型</sub> = Σ log p = {model_lp:.3f} · "
             f"log P<sub>真</sub> = {'−∞（已离开语言）' if true_lp == -math.inf else f'{true_lp:.3f}'}</p>"]
    if steps:
        last = steps[-1]
        true_h = "—" if last.true_entropy is None else f"{last.true_entropy:.3f}"
        parts.append(f"<p>最后一步：在「{html.escape(last.text)}」之后，模型熵 {last.model_entropy:.3f} nats，真实熵 {true_h} nats</p>")
        parts.append("<table><tr><th>token</th><th>模型 p</th><th></th><th>参数处理后</th><th>真 p</th></tr>")
        for c in last.candidates:
            chosen = c.token == last.chosen
            name = "␃ (EOS)" if c.token == "</s>" else html.escape(c.token)
            color = "#2563eb" if c.true_prob > 0 else "#dc2626"
            row_style = " style='background:#fef3c7;font-weight:bold'" if chosen else ""
            parts.append(f"<tr{row_style}><td>{name}{' ←' if chosen else ''}</td><td>{c.model_prob:.3f}</td>"
                         f"<td><div style='width:{bar * c.model_prob:.0f}px;height:0.8em;background:{color}'></div></td>"
                         f"<td>{c.sampled_prob:.3f}</td><td>{c.true_prob:.3f}</td></tr>")
        parts.append("</table><p style='font-size:0.85em'>蓝条：真分布里可能的 token；红条：不可能的 token。</p>")
    parts.append("</div>")
    return "".join(parts)


class AutoregressiveStepper(widgets.VBox):
    """Step through generation one token per click; the seed makes every run repeatable.

    >>> from decodelab.book.widgets.stepper import AutoregressiveStepper
    >>> from decodelab.toy import ToyLanguage
    >>> AutoregressiveStepper(model, tokenizer, ToyLanguage(), prompt="小明", initial_steps=3)
    AutoregressiveStepper(prompt='小明', steps=3, temperature=1.0, top_k=0, top_p=1.0, seed=0, lecture=False)

    Taught in: chapters/04-autoregressive.ipynb
    """

    def __init__(self, model, tokenizer, lang: ToyLanguage, prompt: str = "小明", temperature: float = 1.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int = 0, initial_steps: int = 0, max_steps: int = 40,
                 lecture: bool = False) -> None:
        check_model(model, "AutoregressiveStepper(model, tokenizer, lang)")
        if not isinstance(lang, ToyLanguage):
            raise TypeError(f"lang must be a ToyLanguage, got {type(lang).__name__}")
        SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)  # checks the values
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
        encode_prompt(tokenizer, prompt)  # refuses characters the vocabulary lacks, naming them
        initial_steps = check_int(initial_steps, "initial_steps", low=0)
        max_steps = check_int(max_steps, "max_steps")
        self._model, self._tokenizer, self._lang = model, tokenizer, lang
        self.lecture, self.max_steps = bool(lecture), max_steps
        style, width = {"description_width": "100px"}, {"width": "380px" if lecture else "300px"}
        self._prompt = widgets.Text(value=prompt, description="提示", layout=width, style=style)
        self._temperature = slider(widgets.FloatSlider, "temperature", temperature, 0.0, 3.0, step=0.05,
                                                description="T (0=greedy)", layout=width, style=style)
        self._top_k = slider(widgets.IntSlider, "top_k", top_k, 0, 50, description="top-k", layout=width, style=style)
        self._top_p = slider(widgets.FloatSlider, "top_p", top_p, 0.05, 1.0, step=0.05, description="top-p",
                                          layout=width, style=style)
        self._seed = widgets.IntText(value=seed, description="seed", layout=width, style=style)
        self._next = widgets.Button(description="下一个 token")
        self._reset = widgets.Button(description="重来")
        self.view = widgets.HTML()
        self._next.on_click(lambda _: self.step())
        self._reset.on_click(lambda _: self.reset())
        self.reset()
        for _ in range(initial_steps):
            self.step()
        inputs = [self._prompt, self._temperature, self._top_k, self._top_p, self._seed, self._next, self._reset]
        self.note = KernelNote(NEEDS_KERNEL.format(steps=initial_steps), inputs)
        controls = widgets.VBox([*inputs[:5], widgets.HBox(inputs[5:])], layout={"flex": "0 0 auto"})  # as the playground's
        super().__init__([self.note, widgets.HBox([controls, self.view])])

    def params(self) -> SamplingParams:
        temperature = self._temperature.value
        return SamplingParams(temperature=0.0 if temperature < 0.05 else temperature, top_k=self._top_k.value,
                              top_p=self._top_p.value, seed=self._seed.value)

    def reset(self) -> None:
        """Back to the prompt, with a fresh generator from the seed."""
        self.steps: list[StepView] = []
        self._generator = make_generator(self.params().seed)
        self._draw()

    def step(self) -> StepView | None:
        """Draw one token; nothing happens once the text has ended or `max_steps` are taken."""
        if self.steps and self.steps[-1].chosen == "</s>" or len(self.steps) >= self.max_steps:
            return None
        text = self._prompt.value + "".join(s.chosen for s in self.steps)
        try:
            view = step_view(self._model, self._tokenizer, self._lang, text, self.params(), self._generator)
        except ValueError as error:
            self.view.value = f"<p style='color:#b00'>{html.escape(str(error))}</p>"
            return None
        self.steps.append(view)
        self._draw()
        return view

    def _draw(self) -> None:
        self.view.value = render_step_html(self._prompt.value, self.steps, self.lecture)

    def __repr__(self) -> str:
        p = self.params()
        return (f"AutoregressiveStepper(prompt={self._prompt.value!r}, steps={len(self.steps)}, "
                f"temperature={self._temperature.value}, top_k={p.top_k}, top_p={p.top_p}, seed={p.seed}, "
                f"lecture={self.lecture})")
