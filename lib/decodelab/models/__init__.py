"""The course's models: `load_model` (shipped tiny-zh / tiny-zh-doc, a hub id, a path), the character tokenizer,
and `python -m decodelab.models.train`, which trains the shipped models on the toy language (assets/ holds them)."""
from decodelab.models.load import load_model
from decodelab.models.tokenizer import build_tokenizer, encode_prompt

__all__ = ["build_tokenizer", "encode_prompt", "load_model"]
