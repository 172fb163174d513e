"""Text out of token ids as a sample grows: the incremental text equals decoding the whole output, on the course's
character tokenizer and on a byte-level BPE whose tokens split Chinese characters; stop strings cut where a whole
decode would; a stream's pieces are never taken back; and the work per token does not grow with the output."""
import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from decodelab.decoding.detokenize import REPLACEMENT_CHAR, IncrementalDetokenizer, truncate_at_stop
from decodelab.toy import DocumentLanguage

N_TOKENS = 2000


class CountingTokenizer:
    """Wraps a tokenizer and counts the token ids it is asked to decode."""

    def __init__(self, tokenizer):
        self.tokenizer, self.decoded_ids = tokenizer, 0

    def decode(self, ids, skip_special_tokens=True):
        self.decoded_ids += len(ids)
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


@pytest.fixture(scope="module")
def documents() -> str:
    return "".join(DocumentLanguage().sample(30, seed=0))


@pytest.fixture(scope="module")
def byte_bpe(documents):
    """A byte-level BPE trained here on toy documents (no download): with 300 tokens, most Chinese characters
    (3 UTF-8 bytes) are split across tokens."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator([documents], trainers.BpeTrainer(vocab_size=300, special_tokens=["</s>"],
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="</s>")


def incremental(tokenizer, ids, stop=()):
    """Push ids until the sample ends; the pieces a stream would send, and the detokenizer."""
    detok = IncrementalDetokenizer(tokenizer, stop)
    pieces = []
    for token in ids:
        pieces.append(detok.push(token))
        if detok.stopped:
            break
    pieces.append(detok.finish())
    return pieces, detok


def test_truncate_at_stop_cuts_before_the_earliest_stop():
    assert truncate_at_stop("小明喜欢苹果。小红", ("小红", "。")) == ("小明喜欢苹果", True)
    assert truncate_at_stop("小明", ("。",)) == ("小明", False)
    assert truncate_at_stop("小明", ()) == ("小明", False)


def test_character_tokenizer_2000_tokens_equal_the_whole_decode(tiny, documents):
    _, tokenizer = tiny
    ids = tokenizer.encode(documents, add_special_tokens=False)[:N_TOKENS]
    assert len(ids) == N_TOKENS
    pieces, detok = incremental(tokenizer, ids)
    whole = tokenizer.decode(ids, skip_special_tokens=True)
    assert detok.text == whole == "".join(pieces) and not detok.stopped


def test_byte_level_bpe_2000_tokens_equal_the_whole_decode_without_half_characters(byte_bpe, documents):
    ids = byte_bpe.encode(documents)[:N_TOKENS]
    assert len(ids) == N_TOKENS
    assert sum(REPLACEMENT_CHAR in byte_bpe.decode([t]) for t in ids) > 100     # tokens that are half a character
    pieces, detok = incremental(byte_bpe, ids)
    whole = byte_bpe.decode(ids)
    assert detok.text == whole == "".join(pieces)
    assert not any(REPLACEMENT_CHAR in piece for piece in pieces[:-1])          # only whole characters are sent


def test_work_per_token_stays_flat_over_2000_tokens(byte_bpe, documents):
    """Whole-output decoding would pass about n^2 / 2 = 2,000,000 ids to decode; the windows pass a few per token."""
    ids = byte_bpe.encode(documents)[:N_TOKENS]
    counting = CountingTokenizer(byte_bpe)
    incremental(counting, ids)
    assert counting.decoded_ids < 10 * N_TOKENS


@pytest.mark.parametrize("seed", range(6))
def test_stop_strings_cut_where_the_whole_decode_does(byte_bpe, documents, seed):
    ids = byte_bpe.encode(documents)[:N_TOKENS]
    whole = byte_bpe.decode(ids)
    rng = random.Random(seed)
    start = rng.randrange(50, len(whole) - 10)
    stop = (whole[start:start + rng.randint(1, 4)], "不会出现的停止串")
    pieces, detok = incremental(byte_bpe, ids, stop)
    expected = truncate_at_stop(whole, stop)[0]
    assert detok.stopped and detok.text == expected == "".join(pieces)
    # it stopped at the first token whose text completes the stop string, not later
    end = len(detok.token_ids)
    assert truncate_at_stop(byte_bpe.decode(ids[:end]), stop)[1]
    assert not truncate_at_stop(byte_bpe.decode(ids[:end - 1]), stop)[1]


def test_a_stream_holds_back_what_a_stop_string_may_take_back(tiny):
    _, tokenizer = tiny
    ids = tokenizer.encode("小明喜欢苹果。小红", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, stop=("苹果。",))
    pieces = [detok.push(t) for t in ids[:7]]
    assert pieces == ["", "", "小", "明", "喜", "欢", ""]    # "苹" and "苹果" could still become "苹果。"
    assert detok.stopped and detok.text == "小明喜欢" and detok.finish() == ""


def test_bad_arguments_are_named(tiny):
    _, tokenizer = tiny
    with pytest.raises(TypeError, match="tokenizer must have a decode method .* got NoneType"):
        IncrementalDetokenizer(None)
    with pytest.raises(ValueError, match="stop must be a sequence of non-empty strings, got '。'"):
        IncrementalDetokenizer(tokenizer, stop="。")
    with pytest.raises(ValueError, match="non-empty strings"):
        IncrementalDetokenizer(tokenizer, stop=("",))
    detok = IncrementalDetokenizer(tokenizer, stop=("明",))
    for token in tokenizer.encode("小明", add_special_tokens=False):
        detok.push(token)
    with pytest.raises(RuntimeError, match="already ended at a stop string"):
        detok.push(5)
