"""`SamplingParams`: how one request chooses its tokens, every field checked when it is made.

A module of its own below `decodelab.sampling.sampler` and `decodelab.sampling.penalties`, which both read it (so neither imports the
other), and below the engine and the server, which add what the sampler ignores (`n`, `max_tokens`, `stop`,
`logprobs`). `from decodelab.sampling.sampler import SamplingParams` is the usual import.

    >>> SamplingParams(temperature=0.7, top_p=0.9).greedy
    False

Taught in: chapters/03-strategies.ipynb
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

from decodelab.grammar.base import is_grammar
from decodelab.validation import ParamError, as_scalar, check_int

MIN_TEMPERATURE = 1e-6  # below this (and above 0) dividing can overflow float32
MAX_ABS_PENALTY = 2.0  # frequency / presence penalties, as OpenAI and vLLM allow
MAX_LOGPROBS = 20  # alternatives per token an engine reports, vLLM's default cap
MAX_ABS_LOGIT_BIAS = 100.0  # OpenAI's range for logit_bias values


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_int(value) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How one request chooses its tokens. `temperature=0` means greedy; `top_k=0`, `top_p=1`, `min_p=0`,
    `typical_p=1` and penalties of 1 / 0 switch those off. `no_repeat_ngram_size=n > 0` bans (logit -inf) every token
    that would repeat an n-gram of the tokens seen so far, as transformers' `no_repeat_ngram_size`; 0 is off.
    `logit_bias` (token id -> a number in [-100, 100], a dict or pairs, kept as sorted pairs) is added to those
    logits before anything else, as OpenAI's and vLLM's `logit_bias`: -100 in effect bans a token, +100 forces it.
    `n`, `stop` (strings that end the text, left out of it), `logprobs` (report each token's log-probability under
    the model and that many top alternatives; None is off) and `max_tokens` are for engines: sample() draws one token
    per row and ignores them.

    vLLM's request constraints: `min_tokens` (EOS and the stop tokens are masked, and stop strings not matched, until
    the output holds that many tokens), `allowed_token_ids` (every other token masked; None is off), `bad_word_ids`
    (token sequences that are never completed: the last token of each is masked when the output ends with the rest;
    an engine fills them in from `bad_words`, the strings, with its tokenizer), `include_stop_str_in_output` (the
    stop string stays in the text) and `prompt_logprobs` (the prompt's log-probabilities and that many top
    alternatives per prompt token; an engine computes them in the prefill). The masks are applied by `sample` and
    `process_logits` (decodelab.sampling.constraints); min_tokens needs the tokens that end a sample, passed as
    `eos_token_ids`.

    Taught in: chapters/03-strategies.ipynb
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    typical_p: float = 1.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    no_repeat_ngram_size: int = 0
    seed: int | None = None
    n: int = 1
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    grammar: object | None = None             # a decodelab.grammar.base Grammar: every step masked by it
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs, sorted by id
    min_tokens: int = 0
    bad_words: tuple[str, ...] = ()                 # strings; an engine turns them into bad_word_ids
    bad_word_ids: tuple[tuple[int, ...], ...] = ()  # token sequences never completed
    allowed_token_ids: tuple[int, ...] | None = None
    include_stop_str_in_output: bool = False
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        checks = [
            ("temperature", lambda v: v == 0 or MIN_TEMPERATURE <= v < math.inf,
             f"0 (greedy) or a finite number >= {MIN_TEMPERATURE}"),
            ("top_p", lambda v: 0 < v <= 1, "in (0, 1]"),
            ("min_p", lambda v: 0 <= v <= 1, "in [0, 1]"),
            ("typical_p", lambda v: 0 < v <= 1, "in (0, 1]"),
            ("repetition_penalty", lambda v: 0 < v < math.inf, "a finite number > 0"),
            ("frequency_penalty", lambda v: -MAX_ABS_PENALTY <= v <= MAX_ABS_PENALTY, "in [-2, 2]"),
            ("presence_penalty", lambda v: -MAX_ABS_PENALTY <= v <= MAX_ABS_PENALTY, "in [-2, 2]"),
        ]
        for name, ok, allowed in checks:
            value = as_scalar(getattr(self, name))  # torch / numpy scalars are numbers too
            if not _is_number(value):
                raise ParamError(name, f"{name} must be {allowed}, got {type(value).__name__} {value!r}")
            if math.isnan(value) or not ok(value):
                raise ParamError(name, f"{name} must be {allowed}, got {value!r}")
            object.__setattr__(self, name, float(value))
        for name, low in (("top_k", 0), ("no_repeat_ngram_size", 0), ("n", 1), ("max_tokens", 1)):
            object.__setattr__(self, name, check_int(getattr(self, name), name, low))
        seed = as_scalar(self.seed)
        if seed is not None and not (is_int(seed) and 0 <= seed < 2**63):
            raise ParamError("seed", f"seed must be None or an int in [0, 2**63), got {self.seed!r}")
        object.__setattr__(self, "seed", seed)
        stop = self.stop_token_ids
        if isinstance(stop, (tuple, list)):
            stop = tuple(as_scalar(t) for t in stop)
        if not isinstance(stop, tuple) or not all(is_int(t) and t >= 0 for t in stop):
            raise ParamError("stop_token_ids", f"stop_token_ids must be a tuple of ints >= 0, got {self.stop_token_ids!r}")
        object.__setattr__(self, "stop_token_ids", stop)
        if not isinstance(self.ignore_eos, bool):
            raise ParamError("ignore_eos", f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        stop = tuple(self.stop) if isinstance(self.stop, list) else self.stop
        if not isinstance(stop, tuple) or not all(isinstance(s, str) and s for s in stop):
            raise ParamError("stop", f"stop must be a tuple of non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", stop)
        if self.grammar is not None and not is_grammar(self.grammar):
            raise ParamError("grammar", f"grammar must be None or a decodelab grammar (vocab_size, eos_token_id, "
                                        f"start()), got {type(self.grammar).__name__}")
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
        if self.logprobs is not None:
            object.__setattr__(self, "logprobs", check_int(self.logprobs, "logprobs", low=0))
            if self.logprobs > MAX_LOGPROBS:
                raise ParamError("logprobs", f"logprobs must be None or an int in [0, {MAX_LOGPROBS}], "
                                             f"got {self.logprobs}")
        self._check_constraints()

    def _check_constraints(self) -> None:
        """vLLM's rules for min_tokens, bad_words, allowed_token_ids, include_stop_str_in_output, prompt_logprobs."""
        object.__setattr__(self, "min_tokens", check_int(self.min_tokens, "min_tokens", low=0))
        if self.min_tokens > self.max_tokens:
            raise ParamError("min_tokens", f"min_tokens must be <= max_tokens={self.max_tokens}, got {self.min_tokens}")
        words = tuple(self.bad_words) if isinstance(self.bad_words, list) else self.bad_words
        if not isinstance(words, tuple) or not all(isinstance(w, str) and w for w in words):
            raise ParamError("bad_words", f"bad_words must be a tuple of non-empty strings, got {self.bad_words!r:.100}")
        object.__setattr__(self, "bad_words", words)
        sequences = self.bad_word_ids
        if isinstance(sequences, (tuple, list)):
            sequences = tuple(_token_ids(s, "bad_word_ids") for s in sequences)
        if not isinstance(sequences, tuple) or not all(s for s in sequences):
            raise ParamError("bad_word_ids", f"bad_word_ids must be a tuple of non-empty token-id tuples, got "
                                             f"{self.bad_word_ids!r:.100}")
        object.__setattr__(self, "bad_word_ids", sequences)
        if self.allowed_token_ids is not None:
            allowed = _token_ids(self.allowed_token_ids, "allowed_token_ids")
            if not allowed:
                raise ParamError("allowed_token_ids", f"allowed_token_ids must be None or a non-empty tuple of token "
                                                      f"ids >= 0, got {self.allowed_token_ids!r:.100}")
            object.__setattr__(self, "allowed_token_ids", tuple(sorted(set(allowed))))
            banned = {s[0] for s in self.bad_word_ids if len(s) == 1}
            if banned.issuperset(self.allowed_token_ids):
                raise ParamError("allowed_token_ids", f"allowed_token_ids {list(self.allowed_token_ids)} are all banned "
                                                      f"by bad_word_ids; no token could be drawn")
        if not isinstance(self.include_stop_str_in_output, bool):
            raise ParamError("include_stop_str_in_output", f"include_stop_str_in_output must be a bool, got "
                                                           f"{self.include_stop_str_in_output!r}")
        if self.prompt_logprobs is not None:
            object.__setattr__(self, "prompt_logprobs", check_int(self.prompt_logprobs, "prompt_logprobs", low=0))
            if self.prompt_logprobs > MAX_LOGPROBS:
                raise ParamError("prompt_logprobs", f"prompt_logprobs must be None or an int in [0, {MAX_LOGPROBS}], "
                                                    f"got {self.prompt_logprobs}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_constraints(self) -> bool:
        """Whether min_tokens, allowed_token_ids or bad_word_ids mask tokens (decodelab.sampling.constraints)."""
        return self.min_tokens > 0 or self.allowed_token_ids is not None or bool(self.bad_word_ids)

    @property
    def needs_output_tokens(self) -> bool:
        """Whether `sample` must be passed the tokens seen so far: for a penalty, the n-gram ban, min_tokens (the
        output's length) or a bad word of more than one token (the output's last tokens)."""
        return self.has_penalties or self.min_tokens > 0 or any(len(s) > 1 for s in self.bad_word_ids)

    @property
    def has_penalties(self) -> bool:
        """Whether any penalty or the n-gram ban is on, so the tokens seen so far must be passed as `output_tokens`."""
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
                or self.no_repeat_ngram_size > 0)


def _token_ids(value, field: str) -> tuple[int, ...]:
    """`value` (a tuple or list of ints >= 0; numpy and 0-d torch integers too) as a tuple of ints; ParamError
    naming `field` otherwise."""
    ids = tuple(as_scalar(t) for t in value) if isinstance(value, (tuple, list)) else None
    if ids is None or not all(is_int(t) and t >= 0 for t in ids):
        raise ParamError(field, f"{field} must hold tuples or lists of token ids (ints >= 0), got {value!r:.100}")
    return ids


def _logit_bias(value) -> tuple[tuple[int, float], ...]:
    """`logit_bias` as sorted (token id, bias) pairs; a dict or pairs with ids >= 0 and biases in [-100, 100]."""
    pairs = value.items() if isinstance(value, dict) else value
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, (tuple, list, type({}.items()))):
        raise ParamError("logit_bias", f"logit_bias must be a dict or pairs of token id -> bias, got {value!r:.100}")
    out = {}
    for pair in pairs:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ParamError("logit_bias", f"logit_bias must be a dict or pairs of token id -> bias, got {value!r:.100}")
        token, bias = as_scalar(pair[0]), as_scalar(pair[1])
        if not (is_int(token) and token >= 0):
            raise ParamError("logit_bias", f"logit_bias keys must be token ids (ints >= 0), got {pair[0]!r}")
        if not _is_number(bias) or math.isnan(bias) or abs(bias) > MAX_ABS_LOGIT_BIAS:
            raise ParamError("logit_bias", f"logit_bias values must be numbers in [-100, 100], got {pair[1]!r} "
                                           f"for token {token}")
        if token in out:
            raise ParamError("logit_bias", f"logit_bias names token {token} twice")
        out[token] = float(bias)
    return tuple(sorted(out.items()))


_BATCH_ROWS: dict[int, tuple] = {}   # id(params) -> batch_row(params), dropped when that params object is freed


def batch_row(params: SamplingParams) -> tuple[bool, int, int, bool, bool, bool, bool, bool, bool, bool, bool, bool]:
    """What `SamplingBatch` reads of one row, computed once per params object (an engine rebuilds its batch whenever a
    sequence joins or leaves, from the same params): (argmax, top_k with 0 for an argmax row, no_repeat_ngram_size,
    has_penalties, has_constraints, needs_output_tokens, bad words still strings, plain: a random row with no top-k,
    top-p, min-p or typical, tempered: a random row with a temperature other than 1, has a grammar, asks for logprobs,
    has a logit_bias). Kept beside the object, keyed by its id and dropped when it is freed, not in its __dict__, so
    `SamplingParams(**params.__dict__)` still copies one."""
    row = _BATCH_ROWS.get(id(params))
    if row is None:
        argmax = params.greedy or params.top_k == 1
        plain = (not argmax and params.top_k == 0 and params.top_p == 1.0 and params.min_p == 0.0
                 and params.typical_p == 1.0)
        row = (argmax, 0 if argmax else params.top_k, params.no_repeat_ngram_size, params.has_penalties,
               params.has_constraints, params.needs_output_tokens, bool(params.bad_words), plain,
               not argmax and params.temperature != 1.0, params.grammar is not None, params.logprobs is not None,
               bool(params.logit_bias))
        _BATCH_ROWS[id(params)] = row
        weakref.finalize(params, _BATCH_ROWS.pop, id(params), None)
    return row
