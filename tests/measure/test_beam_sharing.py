"""decodelab.measure.beam_sharing: a beam search's family tree replayed through the block pool."""
import pytest

from decodelab.decoding.beam import beam_search
from decodelab.measure.beam_sharing import beam_blocks


def test_counts_by_hand():
    # prompt of 3 tokens in blocks of 2, two beams. Step 1: both continue beam 0, so the prompt's half-full last block
    # is copied for one of them (3 blocks held, 2 + 2 alone). Step 2: each continues its own beam and opens a block.
    steps = [((0, 7), (0, 8)), ((0, 9), (1, 10))]
    assert beam_blocks(3, steps, num_beams=2, block_size=2) == [(3, 4), (5, 6)]


def test_one_beam_shares_nothing_and_a_single_lineage_shares_everything_but_the_last_block():
    steps = [((0, t),) for t in range(10)]
    held = beam_blocks(5, steps, num_beams=1, block_size=4)
    assert all(shared == alone for shared, alone in held)
    # four beams that all continue beam 0: after 8 steps (16 tokens, 4 blocks a beam) they share the two prompt
    # blocks and the full third block, and each holds its own last block: 2 + 1 + 4 = 7 against 4 x 4
    steps = [tuple((0, t) for _ in range(4)) for t in range(8)]
    assert beam_blocks(8, steps, num_beams=4, block_size=4)[-1] == (7, 16)


def test_a_real_search_shares_its_prompt_and_never_holds_more_than_alone(tiny):
    model, tokenizer = tiny
    prompt = tokenizer("小明今天在学校里").input_ids
    result = beam_search(model, prompt, num_beams=4, max_tokens=24, eos_token_id=tokenizer.eos_token_id)
    assert len(result.steps) >= 1 and all(len(step) == 4 for step in result.steps)
    held = beam_blocks(len(prompt), result.steps, num_beams=4, block_size=4)
    assert all(shared <= alone for shared, alone in held)
    assert sum(s for s, _ in held) < sum(a for _, a in held)


@pytest.mark.parametrize("args, pattern", [
    ((0, [], 2, 4), "prompt_len"),
    ((3, [((0, 1),)], 2, 4), r"steps\[0\] must hold 2"),
    ((3, [((0, 1), (2, 1))], 2, 4), r"parents in \[0, 2\)"),
    ((3, [], 2, 0), "block_size"),
])
def test_bad_input_is_named(args, pattern):
    with pytest.raises(ValueError, match=pattern):
        beam_blocks(*args)
