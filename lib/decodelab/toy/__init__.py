"""The known-truth world: a toy language whose next-character distribution is known exactly.

templates (word classes and sentence templates) -> automaton (compiled, probabilistic) -> sentences (ToyLanguage)
-> documents (DocumentLanguage, sentences tied by a protagonist) -> questions (tasks with a right answer).
"""
from decodelab.toy.documents import DocumentLanguage
from decodelab.toy.questions import Question
from decodelab.toy.sentences import ToyLanguage

__all__ = ["DocumentLanguage", "Question", "ToyLanguage"]
