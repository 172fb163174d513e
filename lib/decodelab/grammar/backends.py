"""Grammars as token masks: after the tokens generated so far, which tokens keep the text completable.

A `Grammar` turns the token ids generated so far into a boolean mask over the vocabulary, `[V]`: True for every token
after which the text can still be completed to a whole string of the grammar, and True for EOS exactly where the text
may end. Other special tokens (`<pad>`, `<s>`, `<unk>`) are never allowed. `grammar.start()` gives a `GrammarState`
that a generation loop advances one token at a time, so a step costs one mask, not a replay of the prefix.

- `ToyLanguageGrammar`: the toy language's own automaton. `ToyLanguage.next_token_probs(prefix)` lists exactly the
  characters (and the end) that have nonzero probability after a viable prefix, and the course's tokenizer has one
  token per character, so those keys are the mask.
- `LLGuidanceGrammar`: a regex, a JSON schema or a Lark grammar compiled by llguidance (pinned in requirements.txt).
  We chose llguidance over xgrammar because its wheel has no dependencies (xgrammar 0.2.9 requires torch, triton,
  transformers and apache-tvm-ffi, which could move the course's exact torch pin), it computes each mask on the fly
  from a token trie with an Earley parser (no per-grammar precompilation over the vocabulary), and serving systems use
  it: vLLM's `guidance` structured-output backend, SGLang's `--grammar-backend llguidance`, llama.cpp. Its
  `llguidance.hf.from_tokenizer` reads byte-level and byte-fallback tokenizers, not the course's character tokenizer
  (whose decoder is `Fuse`), so the vocabulary is handed over as a list of token texts (`TokenizerWrapper`), which is
  exact when every token is whole text; a tokenizer whose tokens are pieces of UTF-8 is refused with a pointer to
  `from_tokenizer`. JSON is out of reach for the course's models: their vocabulary has no ASCII braces or quotes, so
  a JSON grammar allows no first token (`constrained_generate` then raises).

    >>> from decodelab.grammar import LLGuidanceGrammar
    >>> grammar = LLGuidanceGrammar.regex("小明(喜欢吃北京烤鸭|坐飞机去北京)。", tokenizer)
    >>> allowed = grammar.mask(tokenizer("小明", add_special_tokens=False)["input_ids"]).nonzero()
    >>> allowed
    tensor([[107],
            [120]])
    >>> tokenizer.convert_ids_to_tokens(allowed.flatten().tolist())
    ['喜', '坐']

Taught in: chapters/07d-constrained-decoding.ipynb
"""
from __future__ import annotations

import json

import numpy as np
import torch

from decodelab.toy.sentences import ToyLanguage
from decodelab.toy.documents import DocumentLanguage
from decodelab.grammar.base import Grammar, GrammarState
from decodelab.validation import ParamError, as_scalar


def _check_tokenizer(tokenizer) -> tuple[int, int]:
    """(vocabulary size, EOS id) of a transformers tokenizer, or a ParamError naming `tokenizer`."""
    if not callable(getattr(tokenizer, "convert_ids_to_tokens", None)) or not hasattr(tokenizer, "eos_token_id"):
        raise ParamError("tokenizer", f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}")
    if tokenizer.eos_token_id is None:
        raise ParamError("tokenizer", "tokenizer must have an EOS token (eos_token_id is None)")
    return len(tokenizer), int(tokenizer.eos_token_id)


def _vocab_size(vocab_size, tokenizer_size: int) -> int:
    """The mask's length: the tokenizer's size, or the model's when its embedding is padded beyond it."""
    if vocab_size is None:
        return tokenizer_size
    value = as_scalar(vocab_size)
    if isinstance(value, bool) or not isinstance(value, int) or value < tokenizer_size:
        raise ParamError("vocab_size", f"vocab_size must be None or an int >= the tokenizer's {tokenizer_size} "
                                       f"tokens, got {vocab_size!r}")
    return value


class _ToyState(GrammarState):
    def __init__(self, grammar: ToyLanguageGrammar) -> None:
        self.grammar, self.text, self.ended = grammar, grammar.prefix, False

    def mask(self) -> torch.Tensor:
        out = torch.zeros(self.grammar.vocab_size, dtype=torch.bool)  # [V]
        if not self.ended:
            ids = self.grammar.token_of
            out[[ids[key] for key in self.grammar.language.next_token_probs(self.text)]] = True
        return out

    def advance(self, token_id: int) -> None:
        if self.ended:
            raise ParamError("token_id", f"the text already ended; got token {token_id} after EOS")
        if token_id == self.grammar.eos_token_id:
            self.ended = True
            return
        char = self.grammar.char_of.get(token_id)
        if char is None or not self.grammar.language.prefix_is_viable(self.text + char):
            raise ParamError("token_id", f"token {token_id} cannot follow {self.text!r} in the toy language")
        self.text += char


class ToyLanguageGrammar(Grammar):
    """The toy language (a `ToyLanguage`, or a `DocumentLanguage`) as a grammar over a character tokenizer: allowed
    are the characters with nonzero probability after `prefix` + the text so far, and EOS where a sentence may end.
    `prefix` is text the prompt already holds (default "": the generated text is the whole sentence).

    >>> from decodelab.grammar import ToyLanguageGrammar
    >>> allowed = ToyLanguageGrammar(tokenizer, prefix="床前明月光，疑是地上").mask([]).nonzero()
    >>> tokenizer.decode(allowed.flatten().tolist())   # only 霜
    '霜'
    """

    def __init__(self, tokenizer, language: ToyLanguage | DocumentLanguage | None = None, prefix: str = "",
                 vocab_size: int | None = None) -> None:
        size, self.eos_token_id = _check_tokenizer(tokenizer)
        self.vocab_size = _vocab_size(vocab_size, size)
        self.language = ToyLanguage() if language is None else language
        if not isinstance(self.language, (ToyLanguage, DocumentLanguage)):
            raise ParamError("language", f"language must be a ToyLanguage or a DocumentLanguage, got "
                                         f"{type(self.language).__name__}")
        if not isinstance(prefix, str) or not self.language.in_alphabet(prefix) \
                or not self.language.prefix_is_viable(prefix):
            raise ParamError("prefix", f"prefix must be text that starts a sentence of the toy language, got {prefix!r}")
        self.prefix = prefix
        self.token_of: dict[str, int] = {self.language.EOS: self.eos_token_id}
        for char in self.language.alphabet:
            token = tokenizer.convert_tokens_to_ids(char)
            if token is None or token == tokenizer.unk_token_id or token >= self.vocab_size:
                raise ParamError("tokenizer", f"tokenizer has no token for {char!r}; the toy language's grammar needs "
                                              "one token per character (decodelab.models.tokenizer.build_tokenizer)")
            self.token_of[char] = token
        self.char_of = {token: char for char, token in self.token_of.items() if char != self.language.EOS}

    def start(self) -> GrammarState:
        return _ToyState(self)


def _llguidance():
    """llguidance, imported when a grammar first needs it, so that the rest of decodelab (the sampler, the engine)
    imports without it: the GPU image has torch, transformers and triton but not llguidance."""
    try:
        import llguidance
    except ImportError as error:
        raise ImportError("LLGuidanceGrammar needs llguidance (pinned in requirements.txt): "
                          "pip install -r requirements.txt") from error
    return llguidance


class _TokenTexts:
    """The vocabulary as llguidance's `TokenizerWrapper` reads it: the bytes of every token, the special ids, and
    an encoder from text to ids."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id
        self.bos_token_id = tokenizer.bos_token_id
        self.special_token_ids = sorted(set(tokenizer.all_special_ids))
        special = set(self.special_token_ids)
        self.tokens = []
        for token in range(len(tokenizer)):
            text = tokenizer.convert_ids_to_tokens(token) if token in special else tokenizer.decode([token])
            if token not in special and (not text or "\ufffd" in text):
                raise ParamError("tokenizer", f"token {token} is not whole text ({text!r}); for a byte-level "
                                              "tokenizer build the vocabulary with llguidance.hf.from_tokenizer")
            self.tokens.append(text.encode("utf-8"))

    def __call__(self, text: str) -> list[int]:
        # str only: on bytes llguidance tokenizes the valid UTF-8 prefix itself and the broken tail greedily
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


class _LLGuidanceState(GrammarState):
    def __init__(self, grammar: LLGuidanceGrammar) -> None:
        self.grammar = grammar
        self.matcher = _llguidance().LLMatcher(grammar.llg_tokenizer, grammar.definition, log_level=0)

    def mask(self) -> torch.Tensor:
        if self.matcher.is_error():
            raise ParamError("grammar", f"the grammar engine stopped with an error: {self.matcher.get_error()}")
        allowed = np.frombuffer(self.matcher.compute_logit_bias(), dtype=np.uint8) > 0  # [tokenizer size]
        out = torch.zeros(self.grammar.vocab_size, dtype=torch.bool)  # [V]
        out[: allowed.shape[0]] = torch.from_numpy(allowed.copy())
        out &= self.grammar.text_or_eos
        # a matcher that finds no token stops and offers EOS: that would end an incomplete text silently
        out[self.grammar.eos_token_id] = bool(out[self.grammar.eos_token_id]) and self.matcher.is_accepting()
        return out

    def advance(self, token_id: int) -> None:
        if not self.matcher.consume_token(int(token_id)):
            raise ParamError("token_id", f"token {token_id} is not allowed by the grammar here: "
                                         f"{self.matcher.get_error()}")


def _lark(grammar: str) -> str:
    """llguidance's definition of a Lark grammar, with forcing off. Forcing fast-forwards the bytes a grammar forces,
    assuming the vocabulary can spell any byte; the course's cannot spell half a character, and with forcing on, the
    mask after 小明 in 小明(喜欢…|坐…) held no token at all (喜 and 坐 share their first UTF-8 byte)."""
    return _llguidance().LLMatcher.grammar_from_lark('%llguidance { "no_forcing": true }\n' + grammar)


class LLGuidanceGrammar(Grammar):
    """A grammar compiled by llguidance against a tokenizer's vocabulary; build it with `LLGuidanceGrammar.regex`,
    `.json_schema` or `.lark`. The text must match the whole grammar (a regex is anchored at both ends).

    >>> from decodelab.grammar import LLGuidanceGrammar
    >>> grammar = LLGuidanceGrammar.regex("[^。！？]*北京[^。！？]*[。！？]", tokenizer)   # a sentence that names 北京
    >>> full_stop = tokenizer.convert_tokens_to_ids("。")
    >>> ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]
    >>> bool(grammar.mask(ids("小明去北京"))[full_stop]), bool(grammar.mask(ids("小明去成都"))[full_stop])
    (True, False)
    """

    def __init__(self, definition: str, tokenizer, vocab_size: int | None = None, source: str = "grammar") -> None:
        size, self.eos_token_id = _check_tokenizer(tokenizer)
        self.vocab_size = _vocab_size(vocab_size, size)
        llguidance = _llguidance()
        self.llg_tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_TokenTexts(tokenizer)))
        error = llguidance.LLMatcher.validate_grammar(definition, self.llg_tokenizer)
        if error:
            raise ParamError(source, f"{source} does not compile: {error.strip()}")
        self.definition = definition
        # llguidance may allow a special token such as <unk> where no text token fits; only text and EOS count here
        self.text_or_eos = torch.zeros(self.vocab_size, dtype=torch.bool)  # [V]
        self.text_or_eos[:size] = True
        self.text_or_eos[sorted(set(tokenizer.all_special_ids))] = False
        self.text_or_eos[self.eos_token_id] = True

    @classmethod
    def regex(cls, pattern: str, tokenizer, vocab_size: int | None = None) -> LLGuidanceGrammar:
        """Texts that match `pattern` as a whole (Rust regex syntax, https://docs.rs/regex)."""
        if not isinstance(pattern, str) or not pattern:
            raise ParamError("pattern", f"pattern must be a non-empty str, got {pattern!r}")
        return cls(_lark("start: /" + pattern.replace("/", "\\/") + "/"), tokenizer, vocab_size, "pattern")

    @classmethod
    def json_schema(cls, schema: dict | str, tokenizer, vocab_size: int | None = None) -> LLGuidanceGrammar:
        """JSON texts valid under `schema` (a dict or its JSON string)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as error:
                raise ParamError("schema", f"schema is not valid JSON: {error}") from error
        if not isinstance(schema, dict):
            raise ParamError("schema", f"schema must be a JSON object (a dict), got {type(schema).__name__}")
        return cls(_lark("start: %json " + json.dumps(schema, ensure_ascii=False)), tokenizer, vocab_size, "schema")

    @classmethod
    def lark(cls, grammar: str, tokenizer, vocab_size: int | None = None) -> LLGuidanceGrammar:
        """Texts of a Lark context-free grammar (llguidance's dialect; `start` is the start rule)."""
        if not isinstance(grammar, str) or not grammar.strip():
            raise ParamError("grammar", f"grammar must be a non-empty Lark grammar str, got {grammar!r}")
        return cls(_lark(grammar), tokenizer, vocab_size, "grammar")

    def start(self) -> GrammarState:
        return _LLGuidanceState(self)
