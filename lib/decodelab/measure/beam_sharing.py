"""The KV blocks a beam search holds in a paged cache, replayed from its family tree (`BeamResult.steps`).

A beam search keeps `num_beams` hypotheses that constantly fork and die: at every step each new beam continues some
beam of the step before. A contiguous cache (transformers' `reorder_cache`) keeps one full copy of every beam's K/V.
A paged cache lets the beams share their common ancestors' blocks: a new beam forks its parent's block table
(reference counts + 1), the parents are released, and only a last block still shared by siblings is copied when a
beam writes its token (copy-on-write). This module replays a search's tree through a real `BlockPool` and counts the
blocks held at each forward, against the blocks the same beams would hold without sharing.

    >>> from decodelab.decoding import beam_search
    >>> from decodelab.measure.beam_sharing import beam_blocks
    >>> prompt_ids = tokenizer("小明")["input_ids"]
    >>> result = beam_search(model, prompt_ids, num_beams=4, max_tokens=64, eos_token_id=2)
    >>> held = beam_blocks(len(prompt_ids), result.steps, num_beams=4, block_size=4)
    >>> held[:3]                                 # per forward: (blocks with sharing, blocks each beam on its own)
    [(4, 4), (7, 8), (7, 8)]
    >>> round(1 - sum(s for s, _ in held) / sum(u for _, u in held), 3)   # the share of KV memory sharing saves
    0.208

Taught in: chapters/07-paged-attention.ipynb
"""
from __future__ import annotations

from collections.abc import Sequence

from decodelab.kv.blocks import BlockPool, BlockTable
from decodelab.validation import check_int


def beam_blocks(prompt_len: int, steps: Sequence[Sequence[tuple[int, int]]], num_beams: int,
                block_size: int) -> list[tuple[int, int]]:
    """Per forward of the search: (blocks held with sharing, blocks the same beams hold each on its own).

    The prompt is written once and shared by every beam (one prefill); step t's beams each add one token to a fork
    of their parent's table. `steps[t]` holds one `(parent, token)` per running beam, parents in
    `range(num_beams)`.
    """
    check_int(prompt_len, "prompt_len")
    check_int(num_beams, "num_beams")
    check_int(block_size, "block_size")
    for t, step in enumerate(steps):
        if len(step) != num_beams or not all(isinstance(p, int) and 0 <= p < num_beams for p, _ in step):
            raise ValueError(f"steps[{t}] must hold {num_beams} (parent, token) pairs with parents in "
                             f"[0, {num_beams}), got {list(step)!r:.200}")
    most = num_beams * -(-(prompt_len + len(steps)) // block_size) + num_beams  # every beam alone, plus copies
    pool = BlockPool(most, block_size, enable_prefix_caching=False)
    prompt = BlockTable(block_size)
    prompt.append(pool, [0] * prompt_len)  # the token values do not matter to the count
    beams = [prompt.fork(pool) for _ in range(num_beams)]
    prompt.release(pool)
    held = []
    for step in steps:
        children = [beams[parent].fork(pool) for parent, _ in step]
        for table in beams:  # parents go first, so a block only one child still needs is not copied
            table.release(pool)
        for table, (_, token) in zip(children, step):
            table.append(pool, [token])
        beams = children
        alone = sum(-(-table.num_tokens // block_size) for table in beams)
        held.append((pool.num_used_blocks, alone))
    return held
