"""Documents in the toy language: paragraphs of many sentences tied together by a protagonist, still exact.

A document opens with "这是{P}在{CITY}的一天。", which names its protagonist P. Every later sentence is drawn from the
sentence grammar of `ToyLanguage`, except that each {PERSON} slot names P with probability `PROTAGONIST_WEIGHT` (and
otherwise any person by the usual Zipf weights, P included), so who the paragraph is about carries across sentence
boundaries. Sentences follow one another until the document holds `MIN_CHARS` characters; from then on, each sentence
end closes the document with probability `STOP_PROB`.

Everything stays exact: the sentence grammar is prefix-free and unambiguous and the protagonist is named by the first
sentence, so every document has one derivation. `next_token_probs` runs the forward algorithm over (protagonist,
automaton position); the entropy rate comes from a renewal recursion over document lengths, not from sampling.

Taught in: chapters/03-strategies.ipynb (long continuations, loops), chapters/00-intro.md (the course's languages)
"""
from __future__ import annotations

import bisect
import itertools
import math
import random

from decodelab.toy.sentences import AlphabetChecks, ToyLanguage
from decodelab.toy.automaton import (Edge, compile_automaton, cumulative_probs, length_distribution, path_entropy,
                                         random_path)
from decodelab.toy.templates import _CLASSES, _TEMPLATE_ALPHA, _TEMPLATES

_INTRO = "这是{PROTAGONIST}在{CITY}的一天。"
_BOUNDARY = -2  # pseudo-position: between two sentences of the body
_State = tuple[int, int, int]  # (protagonist index, 0 = intro / 1 = body, automaton position or _BOUNDARY)


class DocumentLanguage(AlphabetChecks):
    """The ground-truth language of documents: exact next-character probabilities, log-probabilities, entropy rate.

    Texts are plain strings without BOS/EOS; the end of a document is the key `DocumentLanguage.EOS`.

    >>> docs = DocumentLanguage()
    >>> docs.EOS in docs.next_token_probs("这是小明在北京的一天。")  # 11 characters: too short to end
    False
    >>> text = docs.sample(1, seed=0)[0]
    >>> len(text) >= docs.MIN_CHARS and docs.is_valid(text)
    True

    Taught in: chapters/03-strategies.ipynb
    """

    EOS = ToyLanguage.EOS
    MIN_CHARS = 150
    STOP_PROB = 0.5
    PROTAGONIST_WEIGHT = 0.6

    def __init__(self) -> None:
        words, alpha = _CLASSES["PERSON"]
        self.protagonists: list[str] = words.split()
        zipf = [1.0 / (r + 1) ** alpha for r in range(len(self.protagonists))]
        self._person_prior = [w / sum(zipf) for w in zipf]
        self._intro: list[list[list[Edge]]] = []
        self._body: list[list[list[Edge]]] = []
        for name in self.protagonists:
            bound = {w: (1.0 - self.PROTAGONIST_WEIGHT) * z + (self.PROTAGONIST_WEIGHT if w == name else 0.0)
                     for w, z in zip(self.protagonists, self._person_prior)}
            self._intro.append(compile_automaton({**_CLASSES, "PROTAGONIST": {name: 1.0}}, (_INTRO,), 0.0))
            self._body.append(compile_automaton({**_CLASSES, "PERSON": bound}, _TEMPLATES, _TEMPLATE_ALPHA))
        self._cum = {id(a): cumulative_probs(a) for a in self._intro + self._body}
        self.alphabet: list[str] = ToyLanguage().alphabet
        self._alphabet_set = frozenset(self.alphabet)
        self._start: dict[_State, float] = {(i, 0, 0): p for i, p in enumerate(self._person_prior)}
        self._forward_cache: dict[str, tuple[dict[_State, float], float]] = {"": (self._start, 0.0)}
        self._moments_cache: tuple[float, float] | None = None

    # ---- forward algorithm -------------------------------------------------------------------------------
    def _edges(self, state: _State) -> list[Edge]:
        who, stage, pos = state
        automaton = self._intro[who] if stage == 0 else self._body[who]
        return automaton[0 if pos == _BOUNDARY else pos]

    def _continue_prob(self, state: _State, length: int) -> float:
        """Probability that the document goes on with another character from `state` after `length` characters."""
        if state[2] != _BOUNDARY or length < self.MIN_CHARS:
            return 1.0
        return 1.0 - self.STOP_PROB

    def _step(self, state: _State, edge: Edge) -> _State:
        """The state after `edge`; a completed sentence (its only way on is the end) becomes a body boundary."""
        automaton = self._intro[state[0]] if state[1] == 0 else self._body[state[0]]
        nxt = automaton[edge.target]
        if len(nxt) == 1 and nxt[0].char is None:
            return (state[0], 1, _BOUNDARY)
        return (state[0], state[1], edge.target)

    def _forward(self, prefix: str) -> tuple[dict[_State, float], float]:
        """Normalised weights of the states consistent with `prefix`, and log P(prefix) (-inf if impossible)."""
        known = len(prefix)
        while prefix[:known] not in self._forward_cache:
            known -= 1
        state, logp = self._forward_cache[prefix[:known]]
        if len(self._forward_cache) > 200_000:
            self._forward_cache = {"": (self._start, 0.0)}
        for i in range(known, len(prefix)):
            new: dict[_State, float] = {}
            for s, w in state.items():
                go_on = w * self._continue_prob(s, i)
                for e in self._edges(s):
                    if e.char == prefix[i]:
                        t = self._step(s, e)
                        new[t] = new.get(t, 0.0) + go_on * e.prob
            total = sum(new.values())
            state, logp = ({s: w / total for s, w in new.items()}, logp + math.log(total)) if total > 0 \
                else ({}, -math.inf)
            self._forward_cache[prefix[:i + 1]] = (state, logp)
        return state, logp

    def next_token_probs(self, prefix: str) -> dict[str, float]:
        """Exact P(next char | prefix) over the alphabet and `EOS`, most probable first; only nonzero entries.

        Raises ValueError if the prefix has an unknown character or cannot start any document of the language.
        """
        self.check_text(prefix, "prefix")
        state, _ = self._forward(prefix)
        if not state:
            raise ValueError(f"prefix {prefix!r} cannot start any document of the toy language "
                             "(check with prefix_is_viable)")
        probs: dict[str, float] = {}
        for s, w in state.items():
            go_on = self._continue_prob(s, len(prefix))
            if go_on < 1.0:
                probs[self.EOS] = probs.get(self.EOS, 0.0) + w * (1.0 - go_on)
            for e in self._edges(s):
                probs[e.char] = probs.get(e.char, 0.0) + w * go_on * e.prob
        return dict(sorted(probs.items(), key=lambda kv: -kv[1]))

    def entropy(self, prefix: str) -> float:
        """Entropy in nats of the next-character distribution after `prefix` (EOS included)."""
        return 0.0 - sum(p * math.log(p) for p in self.next_token_probs(prefix).values())

    def prefix_is_viable(self, prefix: str) -> bool:
        """True when some document of the language starts with `prefix`."""
        self.check_text(prefix, "prefix")
        return bool(self._forward(prefix)[0])

    def log_prob(self, text: str) -> float:
        """Natural log of P(text), the end of the document included; -inf for texts the language cannot produce."""
        self.check_text(text, "text")
        state, logp = self._forward(text)
        p_end = sum(w * (1.0 - self._continue_prob(s, len(text))) for s, w in state.items())
        return logp + math.log(p_end) if p_end > 0 else -math.inf

    def is_valid(self, text: str) -> bool:
        """True when the language produces `text` as a whole document."""
        return self.log_prob(text) > -math.inf

    def protagonist(self, text: str) -> str | None:
        """The protagonist a document (or a prefix of one) names in its first sentence; None before it is known."""
        self.check_text(text, "text")
        who = {s[0] for s in self._forward(text)[0]}
        return self.protagonists[who.pop()] if len(who) == 1 else None

    def split_sentences(self, text: str) -> list[str]:
        """The sentences of a document or of a viable prefix of one (the last may be unfinished).

        >>> DocumentLanguage().split_sentences("这是小明在北京的一天。小明喜欢吃米")
        ['这是小明在北京的一天。', '小明喜欢吃米']
        """
        self.check_text(text, "text")
        if not self.prefix_is_viable(text):
            raise ValueError(f"text {text[:40]!r}... is not a prefix of any document; check with prefix_is_viable")
        sentences, start = [], 0
        for end in range(1, len(text) + 1):
            if all(s[2] == _BOUNDARY for s in self._forward(text[:end])[0]):
                sentences.append(text[start:end])
                start = end
        return sentences + ([text[start:]] if start < len(text) else [])

    def sample_sentences(self, protagonist: str, n: int, seed: int = 0) -> list[str]:
        """`n` body sentences of a document about `protagonist`, drawn independently with a fixed `seed`."""
        if protagonist not in self.protagonists:
            raise ValueError(f"protagonist must be one of {self.protagonists}, got {protagonist!r}")
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"n must be a non-negative int, got {n!r}")
        rng = random.Random(seed)
        body = self._body[self.protagonists.index(protagonist)]
        return ["".join(self._walk(body, rng)) for _ in range(n)]

    # ---- sampling ----------------------------------------------------------------------------------------
    def sample(self, n: int, seed: int = 0) -> list[str]:
        """`n` documents drawn independently from the language with a fixed `seed`."""
        self.check_sample_args(n, seed)
        rng = random.Random(seed)
        cum_prior = list(itertools.accumulate(self._person_prior))
        docs = []
        for _ in range(n):
            who = min(bisect.bisect_right(cum_prior, rng.random() * cum_prior[-1]), len(cum_prior) - 1)
            chars = self._walk(self._intro[who], rng)
            while len(chars) < self.MIN_CHARS or rng.random() >= self.STOP_PROB:
                chars += self._walk(self._body[who], rng)
            docs.append("".join(chars))
        return docs

    def _walk(self, automaton: list[list[Edge]], rng: random.Random) -> list[str]:
        """The characters of one random path from the start to the end of `automaton`."""
        return random_path(automaton, self._cum[id(automaton)], rng)

    # ---- exact statistics --------------------------------------------------------------------------------
    def _moments(self) -> tuple[float, float]:
        """(H(document) in nats, E[len(document)]) by a renewal recursion over lengths (mass below 1e-16 dropped)."""
        if self._moments_cache is None:
            self._moments_cache = self._renewal()
        return self._moments_cache

    def _renewal(self) -> tuple[float, float]:
        stop_entropy = -self.STOP_PROB * math.log(self.STOP_PROB) - (1 - self.STOP_PROB) * math.log(1 - self.STOP_PROB)
        entropy = -sum(p * math.log(p) for p in self._person_prior)
        mean_length = 0.0
        for who, prior in enumerate(self._person_prior):
            intro_h, intro_len = path_entropy(self._intro[who]), length_distribution(self._intro[who])
            body_h, body_len = path_entropy(self._body[who]), length_distribution(self._body[who])
            boundary = dict(intro_len)  # probability of a sentence boundary after exactly L characters
            sentences = decisions = length = 0.0
            total = min(boundary)
            while boundary:
                mass = boundary.pop(total, 0.0)
                if mass == 0.0:
                    total += 1
                    continue
                go_on = mass
                if total >= self.MIN_CHARS:
                    decisions += mass
                    length += mass * self.STOP_PROB * total
                    go_on = mass * (1.0 - self.STOP_PROB)
                sentences += go_on
                if go_on > 1e-16:  # the mass still going on halves at every boundary past MIN_CHARS
                    for ell, p in body_len.items():
                        boundary[total + ell] = boundary.get(total + ell, 0.0) + go_on * p
                total += 1
            entropy += prior * (intro_h + sentences * body_h + decisions * stop_entropy)
            mean_length += prior * length
        return entropy, mean_length

    def document_entropy(self) -> float:
        """Exact entropy in nats of a whole document (one derivation per document, so = path entropy)."""
        return self._moments()[0]

    def expected_length(self) -> float:
        """Expected number of characters per document (the end symbol not counted)."""
        return self._moments()[1]

    def entropy_rate(self) -> float:
        """Nats per predicted token on `<s> document </s>`: H(document) / E[len(document) + 1]."""
        entropy, length = self._moments()
        return entropy / (length + 1.0)

