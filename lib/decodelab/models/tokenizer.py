"""A character-level transformers fast tokenizer for the toy language.

Vocabulary: `<pad>`=0, `<s>`=1, `</s>`=2, `<unk>`=3, then the alphabet in sorted order. Encoding prepends `<s>`
and adds no `</s>`; decoding joins characters without spaces, so `decode(encode(text))` gives the text back.

Taught in: chapters/01-logits-to-probs.ipynb
"""
from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, processors
from transformers import PreTrainedTokenizerFast

from decodelab.validation import ParamError

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")


def build_tokenizer(alphabet: list[str], model_max_length: int = 256) -> PreTrainedTokenizerFast:
    """A fast tokenizer with one token per character of `alphabet` (sorted, single characters, no duplicates).

    >>> tok = build_tokenizer(["好", "你"])
    >>> tok("你好")["input_ids"]
    [1, 4, 5]
    """
    if not isinstance(alphabet, (list, tuple)) or not alphabet:
        raise ValueError(f"alphabet must be a non-empty list of characters, got {alphabet!r}")
    bad = [c for c in alphabet if not isinstance(c, str) or len(c) != 1 or c.isspace()]
    if bad:
        raise ValueError(f"alphabet must hold single non-space characters, got {bad[:5]!r}")
    if len(set(alphabet)) != len(alphabet):
        raise ValueError("alphabet must not contain duplicates")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    # BPE without merges splits the input into single characters; unknown characters become <unk>.
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", vocab["<s>"])])
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
        clean_up_tokenization_spaces=False, model_max_length=model_max_length, padding_side="left")


def encode_prompt(tokenizer, prompt: str, name: str = "prompt") -> list[int]:
    """Token ids of `prompt`; characters the vocabulary lacks are an error (ParamError naming `name`), not a
    silent `<unk>`. Used by `generate`, `beam_search` and the engine for every string prompt.

    >>> encode_prompt(build_tokenizer(["好", "你"]), "你好")
    [1, 4, 5]
    """
    ids = list(tokenizer(prompt)["input_ids"])
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is not None and unk in ids and tokenizer.unk_token not in prompt:
        unknown = sorted({ch for ch in prompt if tokenizer.convert_tokens_to_ids(ch) == unk})
        raise ParamError(name, f"{name} has characters outside the tokenizer's vocabulary: {unknown!r}; they would "
                               f"be read as {tokenizer.unk_token!r} (the toy language's alphabet is "
                               f"ToyLanguage().alphabet)")
    return ids
