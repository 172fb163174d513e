"""The exposure-bias drift explorer: how the model does on the true prefix (teacher forcing) against its own
prefix (free running), and what happens after a wrong character is forced into the prefix.

Every measurement is against the toy language's truth (`decodelab.toy.sentences.ToyLanguage`):
- `position_errors` scores the model's next-character distribution at every position of a set of texts: the
  probability mass it puts on characters the language forbids there, and KL(truth || model);
- `inject_and_continue` replaces one character of a true sentence by one the language forbids (or, as the
  baseline, by a different character it allows), lets the model continue, and asks whether the continuation still
  fits the sentence as it was meant (recovered);
- `sample_with_verifier` samples in chunks of `horizon` characters, checks each chunk with a verifier and resamples a
  chunk that fails: the oracle (the grammar's viability test, so filtering with the truth itself) or the model's own
  likelihood (every token of the chunk had probability >= `min_prob` under the model at temperature 1).

`DriftExplorer` draws stored results; its ESM (`drift.js` after the shared prelude) only reads them, so it
works in the static book.

Taught in: chapters/05-exposure-bias.ipynb
"""
from __future__ import annotations

import math
import pathlib
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import anywidget
import torch
import traitlets

from decodelab.toy.sentences import ToyLanguage
from decodelab.validation import as_int_list, check_index, check_int, check_records
from decodelab.book.widgets.esm import ESM_PRELUDE

_HERE = pathlib.Path(__file__).parent


def _check_texts(texts: Sequence[str], lang: ToyLanguage) -> None:
    if isinstance(texts, str) or not texts:
        raise ValueError(f"texts must be a non-empty list of strings, got {texts!r}")
    for text in texts:
        lang.check_text(text, "each text")


@torch.inference_mode()
def model_log_probs(model, tokenizer, text: str, temperature: float = 1.0) -> torch.Tensor:
    """Log-probabilities (at `temperature`) of the next token after each prefix `text[:t]`, t = 0..len(text):
    `[len(text) + 1, V]`."""
    ids = torch.tensor([tokenizer(text)["input_ids"]], device=next(model.parameters()).device)  # [1, T + 1]
    return torch.log_softmax(model(input_ids=ids).logits[0].float() / temperature, dim=-1).cpu()  # [T + 1, V]


@dataclass(frozen=True)
class PositionErrors:
    """Per-position scores of one set of texts; lists are indexed by position t (the character being predicted)."""

    viable: list[float]          # fraction of texts whose prefix text[:t] is still a possible sentence start
    invalid_mass: list[float]    # mean model mass on forbidden next characters, over texts with a viable prefix
    kl: list[float]              # mean KL(truth || model) in nats, over the same texts
    counts: list[int]            # texts long enough to reach position t


def position_errors(model, tokenizer, lang: ToyLanguage, texts: Sequence[str], max_position: int = 30,
                    temperature: float = 1.0) -> PositionErrors:
    """Score the model's next-character distribution (at `temperature`, what sampling draws from) at positions
    0..max_position of each text against the truth.

    The end of text counts as a character (`ToyLanguage.EOS` ↔ the tokenizer's eos token).
    """
    _check_texts(texts, lang)
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not temperature > 0:
        raise ValueError(f"temperature must be a number > 0, got {temperature!r}")
    check_int(max_position, "max_position", low=0)
    eos_id = tokenizer.eos_token_id
    char_ids = {ch: tokenizer.convert_tokens_to_ids(ch) for ch in lang.alphabet}
    sums = {name: [0.0] * (max_position + 1) for name in ("viable", "invalid", "kl")}
    counts, scored = [0] * (max_position + 1), [0] * (max_position + 1)
    for text in texts:
        log_probs = model_log_probs(model, tokenizer, text, temperature)  # [T + 1, V]
        for t in range(min(len(text), max_position) + 1):
            counts[t] += 1
            prefix = text[:t]
            if not lang.prefix_is_viable(prefix):
                continue
            sums["viable"][t] += 1
            scored[t] += 1
            truth = lang.next_token_probs(prefix)
            ids = torch.tensor([eos_id if ch == lang.EOS else char_ids[ch] for ch in truth])
            true_p = torch.tensor(list(truth.values()), dtype=torch.float64)
            model_lp = log_probs[t, ids].double()
            sums["invalid"][t] += float(1.0 - model_lp.exp().sum())
            sums["kl"][t] += float((true_p * (true_p.log() - model_lp)).sum())
    return PositionErrors(
        viable=[v / c if c else math.nan for v, c in zip(sums["viable"], counts)],
        invalid_mass=[v / s if s else math.nan for v, s in zip(sums["invalid"], scored)],
        kl=[v / s if s else math.nan for v, s in zip(sums["kl"], scored)],
        counts=counts,
    )


_PUNCTUATION = "，。！？“”：；"


def forbidden_char(lang: ToyLanguage, prefix: str, rng: random.Random) -> str:
    """A character that no sentence of the language has after `prefix` (drawn with `rng`)."""
    allowed = lang.next_token_probs(prefix)
    candidates = [ch for ch in lang.alphabet if ch not in allowed and ch not in _PUNCTUATION]
    return rng.choice(candidates)


def valid_substitute(lang: ToyLanguage, prefix: str, original: str, rng: random.Random) -> str | None:
    """A character other than `original` that the language allows after `prefix` (drawn with `rng`); None if the
    language allows no other (non-punctuation) character there."""
    candidates = [ch for ch in lang.next_token_probs(prefix) if ch not in (original, lang.EOS, *_PUNCTUATION)]
    return rng.choice(sorted(candidates)) if candidates else None


@dataclass(frozen=True)
class Injection:
    """One injected error: the sentence, where, what was forced in, the model's continuation and the verdicts."""

    text: str
    position: int
    wrong: str
    continuation: str
    recovered: bool      # text[:position + 1] + continuation is a sentence: the model carried on as meant
    valid_anyway: bool   # the output as written (with the wrong character) is a sentence (never, by construction)


def inject_and_continue(lang: ToyLanguage, texts: Sequence[str], positions: Sequence[int],
                        continue_fn: Callable[[list[str]], list[str]], seed: int = 0,
                        substitute: str = "forbidden") -> list[Injection]:
    """For each text and position k < len(text), force a character at k and let `continue_fn` (prefixes ->
    continuations) finish the text; judge the continuation against the text as it was meant. `substitute` is
    "forbidden" (a character the language forbids there) or "valid" (a different one it allows: the baseline, since
    a valid change also leads the continuation away from the meant sentence; cases with none are left out)."""
    _check_texts(texts, lang)
    if substitute not in ("forbidden", "valid"):
        raise ValueError(f"substitute must be 'forbidden' or 'valid', got {substitute!r}")
    checked = as_int_list(positions)
    if not checked or min(checked) < 0:
        raise ValueError(f"positions must be a non-empty list of ints >= 0, got {positions!r}")
    positions = checked
    rng = random.Random(seed)
    cases = [(text, k, forbidden_char(lang, text[:k], rng) if substitute == "forbidden"
              else valid_substitute(lang, text[:k], text[k], rng))
             for text in texts for k in positions if k < len(text) - 1]
    cases = [case for case in cases if case[2] is not None]
    if not cases:
        raise ValueError(f"no text is longer than the positions {list(positions)}")
    continuations = list(continue_fn([text[:k] + wrong for text, k, wrong in cases]))
    if len(continuations) != len(cases) or not all(isinstance(c, str) for c in continuations):
        raise ValueError(f"continue_fn must return one string per prefix: {len(cases)} expected, got "
                         f"{len(continuations)} ({[type(c).__name__ for c in continuations][:5]})")
    return [Injection(text, k, wrong, cont, lang.is_valid(text[:k + 1] + cont) if _known(lang, cont) else False,
                      lang.is_valid(text[:k] + wrong + cont) if _known(lang, cont) else False)
            for (text, k, wrong), cont in zip(cases, continuations)]


def _known(lang: ToyLanguage, text: str) -> bool:
    return lang.in_alphabet(text)


@dataclass(frozen=True)
class VerifiedSample:
    text: str
    valid: bool
    model_calls: int     # forward passes, resampled chunks included
    resamples: int       # chunks thrown away by the verifier


@torch.inference_mode()
def sample_with_verifier(model, tokenizer, lang: ToyLanguage, horizon: int | None, temperature: float, seed: int,
                         max_chars: int = 60, max_resamples: int = 20, min_prob: float | None = None) -> VerifiedSample:
    """Sample one text at `temperature`, `horizon` characters at a time; after each chunk the verifier accepts it
    or the chunk is drawn again, up to `max_resamples` times in all. `horizon=None` is plain sampling with no
    verifier. The verifier is the oracle (`lang.prefix_is_viable`, and `lang.is_valid` at the end) when `min_prob`
    is None, else the model's own likelihood: every token of the chunk had probability >= `min_prob` under the
    model at temperature 1. `valid` is always judged by the grammar.

    Taught in: chapters/05-exposure-bias.ipynb
    """
    if horizon is not None and (isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1):
        raise ValueError(f"horizon must be None or an int >= 1, got {horizon!r}")
    if not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature must be a number > 0, got {temperature!r}")
    if min_prob is not None and (isinstance(min_prob, bool) or not isinstance(min_prob, (int, float))
                                 or not 0 < min_prob < 1):
        raise ValueError(f"min_prob must be None (the oracle verifier) or a number in (0, 1), got {min_prob!r}")
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    text, calls, resamples, done = "", 0, 0, False
    while not done and len(text) < max_chars:
        chunk, ended, likely = "", False, True
        for _ in range(horizon or max_chars):
            ids = torch.tensor([tokenizer(text + chunk)["input_ids"]], device=device)   # [1, T]
            logits = model(input_ids=ids).logits[0, -1].float().cpu()    # [V]
            calls += 1
            token = int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator))
            likely = likely and (min_prob is None or float(torch.softmax(logits, -1)[token]) >= min_prob)
            if token == tokenizer.eos_token_id:
                ended = True
                break
            piece = tokenizer.convert_ids_to_tokens(token)
            chunk += piece if piece and lang.in_alphabet(piece) else "\ufffd"
            if len(text + chunk) >= max_chars:
                break
        candidate = text + chunk
        if min_prob is None:
            ok = _known(lang, candidate) and (lang.is_valid(candidate) if ended else lang.prefix_is_viable(candidate))
        else:
            ok = likely
        if horizon is None or ok or resamples >= max_resamples:
            text, done = candidate, ended or horizon is None
        else:
            resamples += 1
    return VerifiedSample(text, _known(lang, text) and lang.is_valid(text), calls, resamples)


# A blank line between the shared prelude and this widget's own view (drift.js).
_ESM = ESM_PRELUDE + "\n" + (_HERE / "drift.js").read_text(encoding="utf-8")


def _finite(values: Sequence[float]) -> list[float | None]:
    return [None if v is None or not math.isfinite(v) else round(float(v), 6) for v in values]


class DriftExplorer(anywidget.AnyWidget):
    """A temperature slider over stored results, free running drawn against teacher forcing.

    Each run is one temperature: `teacher_forcing` and `free_running` are `PositionErrors` (as dicts) of true
    sentences and of the model's own samples, scored at that temperature; `valid` is the fraction of samples that
    are sentences and `nll` their mean true −log P per character.

    Taught in: chapters/05-exposure-bias.ipynb
    """

    _esm = _ESM

    runs = traitlets.List(traitlets.Dict()).tag(sync=True)
    run_index = traitlets.Int(0).tag(sync=True)
    lecture = traitlets.Bool(False).tag(sync=True)

    def __init__(self, runs: Sequence[Mapping], *, run_index: int = 0, lecture: bool = False) -> None:
        runs = check_records(runs, "runs", "position_errors (as dicts)")
        if not runs:
            raise ValueError("runs must hold at least one free-running result, got none")
        for run in runs:
            missing = {"temperature", "teacher_forcing", "free_running", "valid", "nll"} - set(run)
            if missing or not all(isinstance(run[k], Mapping) for k in ("teacher_forcing", "free_running")):
                raise ValueError("each run needs temperature, teacher_forcing and free_running (PositionErrors as "
                                 f"dicts, see asdict), valid and nll; got {sorted(run)}")
        run_index = check_index(run_index, "run_index", len(runs))
        super().__init__(
            runs=[{"temperature": float(r["temperature"]), "valid": round(float(r["valid"]), 6),
                   "nll": round(float(r["nll"]), 6),
                   "teacher_forcing": {k: _finite(r["teacher_forcing"][k]) for k in ("viable", "invalid_mass")},
                   "viable": _finite(r["free_running"]["viable"]),
                   "invalid_mass": _finite(r["free_running"]["invalid_mass"])} for r in runs],
            run_index=run_index, lecture=bool(lecture))

    def __repr__(self) -> str:
        temperatures = [r["temperature"] for r in self.runs]
        return f"DriftExplorer(temperatures={temperatures}, run_index={self.run_index}, lecture={self.lecture})"
