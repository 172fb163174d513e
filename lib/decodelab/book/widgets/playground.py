"""The strategy playground: prompt, strategy, parameters and seed → samples and their statistics.

`run_playground` does the work (generate with `decodelab.decoding.generate` or `decodelab.decoding.beam`, score with
`decodelab.measure.scoring`), `render_html` turns a result into an HTML table, and `StrategyPlayground` is a thin ipywidgets
layer that re-runs on every change. Its first result is rendered when it is built, so the static HTML book shows it,
under a `KernelNote` that says the controls need a running kernel (they stay disabled until one answers).

Taught in: chapters/03-strategies.ipynb
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass, replace

import ipywidgets as widgets

from decodelab.measure import scoring as metrics
from decodelab.decoding.beam import beam_search
from decodelab.decoding.generate import generate
from decodelab.sampling.sampler import SamplingParams, sample_seed
from decodelab.toy.sentences import ToyLanguage
from decodelab.validation import check_int, check_model
from decodelab.book.widgets.kernel_note import KernelNote
from decodelab.book.widgets.sliders import slider

STRATEGIES = ("greedy", "beam search", "sampling")
NEEDS_KERNEL = ("需要运行中的 Python 内核：在 JupyterLab 里打开本章（make lecture）并运行，才能操作；"
                "下面是默认设置的结果。")


@dataclass(frozen=True)
class PlaygroundSettings:
    """One run of the playground. `sampling` uses temperature, top-k, top-p, min-p and typical-p; `beam search` uses
    `num_beams`; greedy and beam search give one text, sampling gives `num_samples` texts (seeds `seed`, `seed+1`, ...)."""

    prompt: str = "小明"
    strategy: str = "sampling"
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    typical_p: float = 1.0
    num_beams: int = 4
    num_samples: int = 8
    seed: int = 0
    max_tokens: int = 40

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str):
            raise TypeError(f"prompt must be a str, got {type(self.prompt).__name__}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        for name, low in (("num_beams", 1), ("num_samples", 1), ("max_tokens", 1), ("seed", 0)):
            object.__setattr__(self, name, check_int(getattr(self, name), name, low))
        self.sampling_params()  # checks temperature, top_k, top_p, min_p and typical_p

    def sampling_params(self, seed: int | None = None) -> SamplingParams:
        temperature = 0.0 if self.strategy == "greedy" else self.temperature
        return SamplingParams(temperature=temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                              typical_p=self.typical_p, seed=seed, max_tokens=self.max_tokens)


@dataclass(frozen=True)
class PlaygroundResult:
    """The texts one setting produced (continuations of the prompt) and their statistics."""

    settings: PlaygroundSettings
    continuations: tuple[str, ...]
    ended: tuple[bool, ...]  # stopped on </s> (else ran into max_tokens)
    true_log_probs: tuple[float, ...]  # log P(continuation | prompt) under the language; -inf: not a sentence
    stats: metrics.TextStats


def run_playground(model, tokenizer, lang: ToyLanguage, settings: PlaygroundSettings) -> PlaygroundResult:
    """Generate with `settings` from the model and score the texts against the model and the true language.

    Raises ValueError if the prompt holds a character outside the model's vocabulary.
    """
    if not isinstance(settings, PlaygroundSettings):
        raise TypeError(f"settings must be a PlaygroundSettings, got {type(settings).__name__}")
    vocab = tokenizer.get_vocab()
    unknown = [ch for ch in settings.prompt if ch not in vocab]
    if unknown:
        raise ValueError(f"prompt holds {unknown[0]!r}, which is not in the model's vocabulary (the toy language's "
                         "characters, see ToyLanguage().alphabet)")
    prompt_ids = tokenizer(settings.prompt)["input_ids"]
    if settings.strategy == "beam search":
        result = beam_search(model, prompt_ids, num_beams=settings.num_beams, max_tokens=settings.max_tokens,
                             eos_token_id=tokenizer.eos_token_id)
        texts = [tokenizer.decode(result.token_ids, skip_special_tokens=True)]
        ended = [bool(result.token_ids) and result.token_ids[-1] == tokenizer.eos_token_id]
    else:
        count = 1 if settings.strategy == "greedy" else settings.num_samples
        params = [settings.sampling_params(seed=sample_seed(settings.seed, i)) for i in range(count)]
        completions = generate(model, tokenizer, [prompt_ids] * count, params)
        texts = [c.text for c in completions]
        ended = [c.finish_reason == "stop" for c in completions]
    prompts = [settings.prompt] * len(texts)
    true = tuple(metrics.true_log_prob(lang, settings.prompt, t, e) if e else -math.inf for t, e in zip(texts, ended))
    stats = metrics.text_stats(model, tokenizer, lang, prompts, texts, ended)
    return PlaygroundResult(settings, tuple(texts), tuple(ended), true, stats)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def render_html(result: PlaygroundResult, lecture: bool = False) -> str:
    """The samples (valid ones marked ✓) and a line of statistics, as an HTML fragment."""
    size = "20px" if lecture else "14px"
    prompt = html.escape(result.settings.prompt)
    rows = []
    for i, (text, ended, true) in enumerate(zip(result.continuations, result.ended, result.true_log_probs)):
        mark = "✓" if true > -math.inf else "✗"
        end = "" if ended else " …（未结束）"
        true_text = "−∞" if true == -math.inf else f"{true:.2f}"
        rows.append(f"<tr><td>{i + 1}</td><td><b>{prompt}</b>{html.escape(text)}{end}</td>"
                    f"<td style='text-align:center'>{mark}</td><td style='text-align:right'>{true_text}</td></tr>")
    s = result.stats
    summary = (f"合法率 {s.validity:.0%} · distinct-2 {s.distinct_2:.3f} · self-BLEU {_fmt(s.self_bleu)} · "
               f"重复（循环）{s.repetition_rate:.0%} · 模型 perplexity {s.model_perplexity:.3f} · "
               f"真 log P / token {_fmt(s.true_log_prob_per_token)}")
    return (f"<div style='font-size:{size};line-height:1.5'>"
            f"<table><tr><th>#</th><th>文本（粗体是提示）</th><th>合法</th><th>真 log P(续写)</th></tr>"
            f"{''.join(rows)}</table><p>{summary}</p></div>")


class StrategyPlayground(widgets.VBox):
    """Controls for `PlaygroundSettings` over an HTML view of `run_playground`'s result; every change re-runs.

    >>> from decodelab.book.widgets.playground import PlaygroundSettings, StrategyPlayground
    >>> from decodelab.toy import ToyLanguage
    >>> StrategyPlayground(model, tokenizer, ToyLanguage(), PlaygroundSettings(strategy="greedy"))
    StrategyPlayground(prompt='小明', strategy='greedy', temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, num_beams=4, num_samples=8, seed=0, lecture=False)

    Taught in: chapters/03-strategies.ipynb
    """

    def __init__(self, model, tokenizer, lang: ToyLanguage, settings: PlaygroundSettings = PlaygroundSettings(),
                 lecture: bool = False) -> None:
        check_model(model, "StrategyPlayground(model, tokenizer, lang)")
        if not isinstance(lang, ToyLanguage):
            raise TypeError(f"lang must be a ToyLanguage, got {type(lang).__name__}")
        if not isinstance(settings, PlaygroundSettings):
            raise TypeError(f"settings must be a PlaygroundSettings, got {type(settings).__name__}")
        self._model, self._tokenizer, self._lang, self.lecture = model, tokenizer, lang, bool(lecture)
        self.settings = settings
        width = {"width": "420px" if lecture else "320px"}
        style = {"description_width": "110px"}
        self._controls = {
            "prompt": widgets.Text(value=settings.prompt, description="提示", continuous_update=False,
                                   layout=width, style=style),
            "strategy": widgets.Dropdown(options=STRATEGIES, value=settings.strategy, description="策略",
                                         layout=width, style=style),
            "temperature": slider(widgets.FloatSlider, "temperature", settings.temperature, 0.1, 3.0, step=0.05,
                                               description="temperature", continuous_update=False, layout=width, style=style),
            "top_k": slider(widgets.IntSlider, "top_k", settings.top_k, 0, 50, description="top-k (0=关)",
                                       continuous_update=False, layout=width, style=style),
            "top_p": slider(widgets.FloatSlider, "top_p", settings.top_p, 0.05, 1.0, step=0.05, description="top-p",
                                         continuous_update=False, layout=width, style=style),
            "min_p": slider(widgets.FloatSlider, "min_p", settings.min_p, 0.0, 0.5, step=0.01, description="min-p",
                                         continuous_update=False, layout=width, style=style),
            "typical_p": slider(widgets.FloatSlider, "typical_p", settings.typical_p, 0.05, 1.0, step=0.05,
                                             description="typical-p", continuous_update=False, layout=width, style=style),
            "num_beams": slider(widgets.IntSlider, "num_beams", settings.num_beams, 1, 16, description="beam 数",
                                           continuous_update=False, layout=width, style=style),
            "num_samples": slider(widgets.IntSlider, "num_samples", settings.num_samples, 1, 32, description="样本数",
                                             continuous_update=False, layout=width, style=style),
            "seed": widgets.IntText(value=settings.seed, description="seed", layout=width, style=style),
        }
        self.view = widgets.HTML()
        for control in self._controls.values():
            control.observe(self._on_change, names="value")
        self._refresh()
        self.note = KernelNote(NEEDS_KERNEL, list(self._controls.values()))
        # the result takes the width that is left; the controls keep theirs (squeezed, JupyterLab cut their readouts)
        controls = widgets.VBox(list(self._controls.values()), layout={"flex": "0 0 auto"})
        super().__init__([self.note, widgets.HBox([controls, self.view])])

    def _on_change(self, _change=None) -> None:
        values = {name: control.value for name, control in self._controls.items()}
        try:
            self.settings = replace(self.settings, **values)
        except (TypeError, ValueError) as error:
            self.view.value = f"<p style='color:#b00'>{html.escape(str(error))}</p>"
            return
        self._refresh()

    def _refresh(self) -> None:
        try:
            self.result = run_playground(self._model, self._tokenizer, self._lang, self.settings)
        except ValueError as error:
            self.view.value = f"<p style='color:#b00'>{html.escape(str(error))}</p>"
            return
        self.view.value = render_html(self.result, lecture=self.lecture)

    def __repr__(self) -> str:
        s = self.settings
        return (f"StrategyPlayground(prompt={s.prompt!r}, strategy={s.strategy!r}, temperature={s.temperature}, "
                f"top_k={s.top_k}, top_p={s.top_p}, min_p={s.min_p}, typical_p={s.typical_p}, "
                f"num_beams={s.num_beams}, num_samples={s.num_samples}, seed={s.seed}, lecture={self.lecture})")
