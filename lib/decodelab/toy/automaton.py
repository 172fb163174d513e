"""Compiling a weighted grammar into a probabilistic automaton over characters, the machinery under `ToyLanguage`.

Each word class becomes a weighted trie; literal text in a template becomes a one-word class. An automaton position is
(template, element, trie node), and its outgoing edges emit one character (or the end of text) with the probability
the grammar gives it. Word ends are followed into the next element at compile time, so every edge emits a character.
The automaton is acyclic: a sentence visits each position at most once.

Taught in: chapters/00-intro.md (the truth behind every figure)
"""
from __future__ import annotations

import bisect
import itertools
import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Edge:
    """One outgoing choice of an automaton position: emit `char` (None = end of text) and move to `target`."""

    char: str | None
    target: int
    prob: float


class _Trie:
    """A weighted word trie; node n has `mass[n]` (words below it) and `end[n]` (the word ending at it)."""

    def __init__(self, words: list[tuple[str, float]]):
        self.children: list[dict[str, int]] = [{}]
        self.mass: list[float] = [0.0]
        self.end: list[float] = [0.0]
        for word, weight in words:
            node = 0
            self.mass[0] += weight
            for ch in word:
                if ch not in self.children[node]:
                    self.children[node][ch] = len(self.mass)
                    self.children.append({})
                    self.mass.append(0.0)
                    self.end.append(0.0)
                node = self.children[node][ch]
                self.mass[node] += weight
            self.end[node] += weight


def _parse_template(template: str) -> list[str]:
    """Split "{A}在{B}" into element names; literal text becomes a one-word class named by its text."""
    elements, literal, i = [], "", 0
    while i < len(template):
        if template[i] == "{":
            close = template.index("}", i)
            if literal:
                elements.append("=" + literal)
                literal = ""
            elements.append(template[i + 1:close])
            i = close + 1
        else:
            literal += template[i]
            i += 1
    if literal:
        elements.append("=" + literal)
    return elements


def compile_automaton(classes: dict[str, tuple[str, float] | dict[str, float]], templates: tuple[str, ...],
                      template_alpha: float) -> list[list[Edge]]:
    """The outgoing edges of every position reachable from the start; position 0 is the start, before any template.

    `classes` maps a name to (space-separated words in rank order, Zipf exponent), where the word of rank r weighs
    1 / (r + 1) ** alpha, or to a dict {word: weight} of explicit weights (the document language binds a slot this
    way). The template of rank r weighs 1 / (r + 1) ** template_alpha. An edge with `target` -1 ends the text.

    >>> edges = compile_automaton({"X": ("甲 乙", 0.0)}, ("{X}。",), 0.5)
    >>> [(e.char, e.prob) for e in edges[0]]
    [('甲', 0.5), ('乙', 0.5)]
    """
    tries = {}
    for name, spec in classes.items():
        if isinstance(spec, dict):
            tries[name] = _Trie([(w, weight) for w, weight in spec.items() if weight > 0])
        else:
            words, alpha = spec
            tries[name] = _Trie([(w, 1.0 / (r + 1) ** alpha) for r, w in enumerate(words.split())])
    template_weights = [1.0 / (r + 1) ** template_alpha for r in range(len(templates))]
    total = sum(template_weights)
    elements = [[tries.get(e) or _Trie([(e[1:], 1.0)]) for e in _parse_template(t)] for t in templates]
    # position id <-> (template, element, trie node); id 0 is the start, before any template is chosen
    keys: list[tuple[int, int, int]] = [(-1, -1, -1)]
    ids: dict[tuple[int, int, int], int] = {}

    def position(t: int, e: int, node: int) -> int:
        key = (t, e, node)
        if key not in ids:
            ids[key] = len(keys)
            keys.append(key)
        return ids[key]

    def closure(t: int, e: int, node: int, weight: float) -> list[Edge]:
        """Outgoing edges of trie `node` of element `e` of template `t`, following word ends to later elements."""
        trie = elements[t][e]
        edges = [Edge(ch, position(t, e, child), weight * trie.mass[child] / trie.mass[node])
                 for ch, child in trie.children[node].items()]
        if trie.end[node] > 0:
            w_end = weight * trie.end[node] / trie.mass[node]
            if e + 1 == len(elements[t]):
                edges.append(Edge(None, -1, w_end))
            else:
                edges += closure(t, e + 1, 0, w_end)
        return edges

    start_edges: list[Edge] = []
    for t, weight in enumerate(template_weights):
        start_edges += closure(t, 0, 0, weight / total)
    automaton = [start_edges]
    done = 1
    while done < len(keys):  # compile every position reachable from the start
        automaton.append(closure(*keys[done], 1.0))
        done += 1
    return automaton


def expected_visits(automaton: list[list[Edge]]) -> list[float]:
    """Expected number of visits of each position per sentence (the automaton is acyclic)."""
    indegree = [0] * len(automaton)
    for edges in automaton:
        for e in edges:
            if e.target >= 0:
                indegree[e.target] += 1
    visits = [0.0] * len(automaton)
    visits[0] = 1.0
    ready = [0]
    while ready:
        pos = ready.pop()
        for e in automaton[pos]:
            if e.target >= 0:
                visits[e.target] += visits[pos] * e.prob
                indegree[e.target] -= 1
                if indegree[e.target] == 0:
                    ready.append(e.target)
    return visits


def path_entropy(automaton: list[list[Edge]], visits: list[float] | None = None) -> float:
    """Entropy in nats of one path through an acyclic automaton: the expected visits times each position's choice
    entropy (`visits` from `expected_visits`, computed when not given)."""
    visits = expected_visits(automaton) if visits is None else visits
    return -sum(v * sum(e.prob * math.log(e.prob) for e in edges if e.prob > 0) for v, edges in zip(visits, automaton))


def length_distribution(automaton: list[list[Edge]]) -> dict[int, float]:
    """P(a path emits exactly L characters), by dynamic programming over (position, length) in visiting order."""
    indegree = [0] * len(automaton)
    for edges in automaton:
        for e in edges:
            if e.target >= 0:
                indegree[e.target] += 1
    at: list[dict[int, float]] = [{} for _ in automaton]
    at[0] = {0: 1.0}
    done: dict[int, float] = {}
    ready = [0]
    while ready:
        pos = ready.pop()
        for e in automaton[pos]:
            step = 0 if e.char is None else 1
            dest = done if e.target < 0 else at[e.target]
            for length, p in at[pos].items():
                dest[length + step] = dest.get(length + step, 0.0) + p * e.prob
            if e.target >= 0:
                indegree[e.target] -= 1
                if indegree[e.target] == 0:
                    ready.append(e.target)
    return done


def cumulative_probs(automaton: list[list[Edge]]) -> list[list[float]]:
    """Each position's running sums of its edge probabilities, what `random_path` draws against."""
    return [list(itertools.accumulate(e.prob for e in edges)) for edges in automaton]


def random_path(automaton: list[list[Edge]], cumulative: list[list[float]], rng: random.Random) -> list[str]:
    """The characters of one random path from the start to the end (`cumulative` from `cumulative_probs`)."""
    pos, chars = 0, []
    while pos >= 0:
        cum = cumulative[pos]
        edge = automaton[pos][min(bisect.bisect_right(cum, rng.random() * cum[-1]), len(cum) - 1)]
        if edge.char is not None:
            chars.append(edge.char)
        pos = edge.target
    return chars
