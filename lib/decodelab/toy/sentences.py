"""A ground-truth toy language of short Chinese sentences whose next-character distribution is known exactly.

A weighted grammar (templates made of literal text and word classes, every word with a weight) is compiled
into a probabilistic automaton over characters (the grammar: `decodelab.toy.templates`; the compiler:
`decodelab.toy.automaton`). Each word class becomes a trie; an automaton position is
(template, element, trie node). `next_token_probs` runs the forward algorithm over the set of positions that
are consistent with the prefix, so templates that share a beginning are marginalised exactly.

The grammar is unambiguous (every sentence has exactly one derivation; `is_unambiguous()` checks it), so
the entropy of a sentence equals the entropy of its derivation path, which the automaton gives in closed form.

Taught in: chapters/01-logits-to-probs.ipynb (the truth behind every figure), chapters/03-strategies.ipynb.
"""
from __future__ import annotations

import math
import random

from decodelab.toy.automaton import (Edge, compile_automaton, cumulative_probs, expected_visits, path_entropy,
                                         random_path)
from decodelab.toy.templates import _CLASSES, _TEMPLATE_ALPHA, _TEMPLATES


class AlphabetChecks:
    """Input checks shared by the toy languages; a language sets `alphabet` and `_alphabet_set`."""

    alphabet: list[str]
    _alphabet_set: frozenset[str]

    def in_alphabet(self, text: str) -> bool:
        """True when every character of `text` is in the alphabet (the language may still not produce it)."""
        return isinstance(text, str) and all(ch in self._alphabet_set for ch in text)

    def check_text(self, text: str, name: str) -> None:
        """Raise TypeError / ValueError naming `name` unless `text` is a str over the alphabet."""
        if not isinstance(text, str):
            raise TypeError(f"{name} must be a str, got {type(text).__name__}")
        for ch in text:
            if ch not in self._alphabet_set:
                raise ValueError(f"{name} contains {ch!r}, which is not in the alphabet of the toy language "
                                 f"({len(self.alphabet)} characters, see {type(self).__name__}().alphabet)")

    @staticmethod
    def check_sample_args(n: int, seed: int) -> None:
        """`sample(n, seed)`: n a non-negative int, seed an int."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"n must be a non-negative int, got {n!r}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed must be an int, got {seed!r}")


class ToyLanguage(AlphabetChecks):
    """The ground-truth language: exact next-character probabilities, log-probabilities and entropy rate.

    Texts are plain strings without BOS/EOS; the end of text is the key `ToyLanguage.EOS` in `next_token_probs`.

    >>> lang = ToyLanguage()
    >>> probs = lang.next_token_probs("床前明月光，疑是地上")
    >>> round(probs["霜"], 6)
    1.0

    Taught in: chapters/01-logits-to-probs.ipynb
    """

    EOS = "</s>"

    def __init__(self) -> None:
        self._edges: list[list[Edge]] = compile_automaton(_CLASSES, _TEMPLATES, _TEMPLATE_ALPHA)
        self._char_probs: list[dict[str, float]] = []
        for edges in self._edges:
            probs: dict[str, float] = {}
            for e in edges:
                key = self.EOS if e.char is None else e.char
                probs[key] = probs.get(key, 0.0) + e.prob
            self._char_probs.append(probs)
        self._cum = cumulative_probs(self._edges)
        self.alphabet: list[str] = sorted({c for probs in self._char_probs for c in probs if c != self.EOS})
        self._alphabet_set = frozenset(self.alphabet)
        self._visits = expected_visits(self._edges)
        self._forward_cache: dict[str, tuple[dict[int, float], float]] = {"": ({0: 1.0}, 0.0)}

    # ---- forward algorithm -------------------------------------------------------------------------------
    def _forward(self, prefix: str) -> tuple[dict[int, float], float]:
        """Normalised weights of the positions consistent with `prefix`, and log P(prefix) (-inf if impossible)."""
        known = len(prefix)
        while prefix[:known] not in self._forward_cache:
            known -= 1
        state, logp = self._forward_cache[prefix[:known]]
        if len(self._forward_cache) > 500_000:
            self._forward_cache = {"": ({0: 1.0}, 0.0)}
        for i in range(known, len(prefix)):
            new: dict[int, float] = {}
            for pos, w in state.items():
                for e in self._edges[pos]:
                    if e.char == prefix[i]:
                        new[e.target] = new.get(e.target, 0.0) + w * e.prob
            total = sum(new.values())
            state, logp = ({p: w / total for p, w in new.items()}, logp + math.log(total)) if total > 0 \
                else ({}, -math.inf)
            self._forward_cache[prefix[:i + 1]] = (state, logp)
        return state, logp

    def next_token_probs(self, prefix: str) -> dict[str, float]:
        """Exact P(next char | prefix) over the alphabet and `EOS`, most probable first; only nonzero entries.

        Raises ValueError if the prefix has an unknown character or cannot start any sentence of the language.
        """
        self.check_text(prefix, "prefix")
        state, _ = self._forward(prefix)
        if not state:
            raise ValueError(f"prefix {prefix!r} cannot start any sentence of the toy language "
                             "(check with prefix_is_viable)")
        probs: dict[str, float] = {}
        for pos, w in state.items():
            for ch, p in self._char_probs[pos].items():
                probs[ch] = probs.get(ch, 0.0) + w * p
        return dict(sorted(probs.items(), key=lambda kv: -kv[1]))

    def entropy(self, prefix: str) -> float:
        """Entropy in nats of the next-character distribution after `prefix` (EOS included)."""
        return 0.0 - sum(p * math.log(p) for p in self.next_token_probs(prefix).values())

    def prefix_is_viable(self, prefix: str) -> bool:
        """True when some sentence of the language starts with `prefix`."""
        self.check_text(prefix, "prefix")
        return bool(self._forward(prefix)[0])

    def log_prob(self, text: str) -> float:
        """Natural log of P(text), the end of text included; -inf for texts the language cannot produce."""
        self.check_text(text, "text")
        state, logp = self._forward(text)
        p_end = sum(w * self._char_probs[pos].get(self.EOS, 0.0) for pos, w in state.items())
        return logp + math.log(p_end) if p_end > 0 else -math.inf

    def is_valid(self, text: str) -> bool:
        """True when the language produces `text` as a whole sentence."""
        return self.log_prob(text) > -math.inf

    def most_probable_continuations(self, prefix: str, k: int = 2) -> list[tuple[str, float]]:
        """The `k` most probable ways to finish a sentence that starts with `prefix`: (continuation, log P(continuation
        + end | prefix)), most probable first; fewer when the language has fewer. Exact: a k-best Viterbi pass over
        the automaton, which is acyclic, from the positions the forward algorithm leaves after `prefix` (the grammar
        is unambiguous, so each path is a different sentence). k = 2 tells whether the most probable one is unique.

        >>> [(text, round(logp, 6)) for text, logp in ToyLanguage().most_probable_continuations("床前明月光，疑是地上")]
        [('霜。', 0.0)]

        Taught in: chapters/03-strategies.ipynb (is beam search's output the truth's most probable continuation?)
        """
        self.check_text(prefix, "prefix")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        state, _ = self._forward(prefix)
        if not state:
            raise ValueError(f"prefix {prefix!r} cannot start any sentence of the toy language "
                             "(check with prefix_is_viable)")
        best: dict[int, list[tuple[float, str]]] = {}

        def suffixes(pos: int) -> list[tuple[float, str]]:
            """The k best (log P, text) from automaton position `pos` to the end of the sentence."""
            if pos not in best:
                found = []
                for edge in self._edges[pos]:
                    step = math.log(edge.prob)
                    if edge.char is None:
                        found.append((step, ""))
                    else:
                        found += [(step + logp, edge.char + rest) for logp, rest in suffixes(edge.target)]
                best[pos] = sorted(found, key=lambda item: -item[0])[:k]
            return best[pos]

        found = [(math.log(weight) + logp, rest) for pos, weight in state.items() for logp, rest in suffixes(pos)]
        return [(rest, logp) for logp, rest in sorted(found, key=lambda item: -item[0])[:k]]

    # ---- sampling ----------------------------------------------------------------------------------------
    def sample(self, n: int, seed: int = 0) -> list[str]:
        """`n` sentences drawn independently from the language with a fixed `seed`."""
        self.check_sample_args(n, seed)
        rng = random.Random(seed)
        return ["".join(random_path(self._edges, self._cum, rng)) for _ in range(n)]

    # ---- exact statistics --------------------------------------------------------------------------------
    def expected_length(self) -> float:
        """Expected number of characters per sentence (the end symbol not counted)."""
        return sum(v * (1.0 - cp.get(self.EOS, 0.0)) for v, cp in zip(self._visits, self._char_probs))

    def sentence_entropy(self) -> float:
        """Exact entropy in nats of a whole sentence, H(X) = E[-log P(X)] (unambiguous grammar: = path entropy)."""
        return path_entropy(self._edges, self._visits)

    def entropy_rate(self) -> float:
        """Nats per character: H(X) / E[len(X) + 1], the sentence entropy over the expected length with the end.

        This is the cross-entropy per predicted token that a perfect model reaches on `<s> text </s>`,
        averaged over tokens of a large corpus (every character and the end symbol are predicted once).
        """
        return self.sentence_entropy() / (self.expected_length() + 1.0)

    def expected_char_counts(self) -> dict[str, float]:
        """Expected number of occurrences of each character per sentence."""
        counts = dict.fromkeys(self.alphabet, 0.0)
        for v, cp in zip(self._visits, self._char_probs):
            for ch, p in cp.items():
                if ch != self.EOS:
                    counts[ch] += v * p
        return counts

    def is_unambiguous(self) -> bool:
        """True when no sentence has two derivations (product-automaton check over pairs of positions)."""
        def step(pair: tuple[int, int]) -> dict[tuple[int, int], None]:
            out: dict[tuple[int, int], None] = {}
            for a in self._edges[pair[0]]:
                for b in self._edges[pair[1]]:
                    if a.char == b.char and a.char is not None:
                        out[(a.target, b.target)] = None
            return out

        seen, stack, successors = {(0, 0)}, [(0, 0)], {}
        while stack:
            pair = stack.pop()
            successors[pair] = step(pair)
            for nxt in successors[pair]:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        # two different start edges reaching the same char are already distinct pairs, so (0, 0) covers them
        can_end = {p for p in seen if self.EOS in self._char_probs[p[0]] and self.EOS in self._char_probs[p[1]]}
        changed = True
        while changed:
            changed = False
            for pair in seen:
                if pair not in can_end and any(n in can_end for n in successors[pair]):
                    can_end.add(pair)
                    changed = True
        split = any(a != b for a, b in can_end)
        ends_twice = any(sum(1 for e in self._edges[p] if e.char is None) > 1 for p in range(len(self._edges)))
        return not split and not ends_twice

    # ---- example contexts for the chapters ---------------------------------------------------------------
    def flat_context(self) -> str:
        """A prefix where dozens of words fit next: after "在" comes one of 30 equally likely places."""
        return "小明在"

    def peaked_context(self) -> str:
        """A prefix inside a fixed phrase: the next character is certain."""
        return "床前明月光，疑是地上"

    def example_contexts(self) -> list[tuple[str, float]]:
        """A few prefixes from flat to peaked, each with its exact next-character entropy in nats."""
        prefixes = ["", "小明在", "你知道", "小明坐", "小明喜欢吃", "今天，小明在图书", "床前明月光，疑是地上"]
        return [(p, self.entropy(p)) for p in prefixes]
