"""Grammars as the sampler sees them: a `Grammar` starts a `GrammarState` per sequence, whose `mask()` says which
tokens keep the text completable (base), and the back ends: the toy language's automaton and llguidance (backends).
"""
from decodelab.grammar.backends import LLGuidanceGrammar, ToyLanguageGrammar
from decodelab.grammar.base import Grammar, GrammarState, mask_logits

__all__ = ["Grammar", "GrammarState", "LLGuidanceGrammar", "ToyLanguageGrammar", "mask_logits"]
