"""The one-token decode path of `BlockTable` (`can_append(pool, 1)`, `append_token(pool, token, copies)`) against
the general path: the same slots, copies, block contents, hashes and free queue, and a failure that leaves everything
as it was; and the layouts' `decode_step_fits`, the scheduler's test for a decode step that need ask no table.

The general path is reached with numpy token ids (converted, counted against the free blocks, then appended), the
fast path with one Python int; both tables run the same random script of appends, forks and releases (fixed seed)."""
from __future__ import annotations

import random

import numpy as np
import pytest

from decodelab.kv.blocks import BlockPool, BlockTable
from decodelab.kv.layout import PagedLayout, SlabLayout
from decodelab.kv.slab import FirstFitSlab, Reservation


def pool_state(pool: BlockPool) -> tuple:
    return pool.ref_counts, pool.free_block_ids, pool.cached_block_ids, [list(b) for b in pool.block_tokens], \
        pool.filled_slots()


def table_state(table: BlockTable) -> tuple:
    return list(table.block_ids), table.num_tokens, list(table._hashes)


@pytest.mark.parametrize("seed", range(5))
def test_one_token_appends_match_the_general_path(seed):
    rng = random.Random(seed)
    pools = [BlockPool(24, 4), BlockPool(24, 4)]
    tables = [[BlockTable(4)], [BlockTable(4)]]
    seen = {"full": 0, "copy": 0}
    for _ in range(400):
        op = rng.random()
        index = rng.randrange(len(tables[0]))
        if op < 0.1 and len(tables[0]) < 6:                      # fork a sibling (shares blocks: copy on write)
            for pool, group in zip(pools, tables):
                group.append(group[index].fork(pool))
        elif op < 0.15 and len(tables[0]) > 1:                   # a sequence ends
            for pool, group in zip(pools, tables):
                group.pop(index).release(pool)
        else:
            token = rng.randrange(3, 50)
            fits = [group[index].can_append(pool, 1) for pool, group in zip(pools, tables)]
            assert fits[0] == fits[1] == (tables[0][index].blocks_needed(pools[0], 1) <= pools[0].num_free_blocks)
            if not fits[0]:
                seen["full"] += 1
                before = pool_state(pools[0]), table_state(tables[0][index])
                with pytest.raises(RuntimeError, match="need 1 blocks, 0 free"):
                    tables[0][index].append_token(pools[0], token, [])
                assert (pool_state(pools[0]), table_state(tables[0][index])) == before, "a failed append changed state"
                for pool, group in zip(pools, tables):               # make room: the last sequence ends
                    if len(group) > 1:
                        group.pop().release(pool)
                continue
            copies = []
            fast = [tables[0][index].append_token(pools[0], token, copies)], copies  # fast path: one Python int
            general = tables[1][index].append(pools[1], np.array([token], dtype=np.int64))  # converted, counted
            assert fast == general
            seen["copy"] += bool(fast[1])
        assert pool_state(pools[0]) == pool_state(pools[1])
        assert [table_state(t) for t in tables[0]] == [table_state(t) for t in tables[1]]
    assert seen["full"] and seen["copy"], f"the script must reach a full pool and a copy on write: {seen}"


def test_the_fast_path_still_checks_its_pool_and_its_token():
    table, pool = BlockTable(4), BlockPool(8, 4)
    table.append(pool, [5])
    with pytest.raises(ValueError, match=r"the table's block_size \(4\) must equal the pool's \(8\)"):
        table.append(BlockPool(8, 8), [6])                  # another pool: checked again, refused
    with pytest.raises(TypeError, match="pool must be a BlockPool, got list"):
        table.can_append([], 1)
    with pytest.raises(TypeError, match="pool must be a BlockPool, got list"):
        table.append_token([], 6, [])
    for bad in ([-1], [True], ["7"], [2.5]):
        with pytest.raises(ValueError, match="token_ids must be a list of token ids"):
            table.append(pool, bad)
        with pytest.raises(ValueError, match=r"token_id must be a token id \(an int >= 0\), got "):
            table.append_token(pool, bad[0], [])
    assert table.num_tokens == 1 and pool.num_used_blocks == 1, "a refused token took a slot or a block"


def test_a_slab_reservation_takes_one_token_like_append():
    slab, table = FirstFitSlab(16), Reservation(4)
    table.append(slab, [1, 2])
    copies = []
    assert table.append_token(slab, 3, copies) == table.start + 2 and copies == [] and table.num_tokens == 3
    for bad in (-1, True, "7", 2.5):
        with pytest.raises(ValueError, match=r"token_id must be a token id \(an int >= 0\), got "):
            table.append_token(slab, bad, copies)
    assert table.num_tokens == 3 and slab.filled_slots() == 3


def test_decode_step_fits_when_every_sequence_surely_finds_a_block():
    layout = PagedLayout(num_blocks=4, block_size=2, max_model_len=64)
    assert layout.decode_step_fits(4) and layout.decode_step_fits(0) and not layout.decode_step_fits(5)
    BlockTable(2).append(layout.pool, [1, 2, 3])              # takes 2 of the 4 blocks
    assert layout.decode_step_fits(2) and not layout.decode_step_fits(3)
    assert layout.decode_step_fits(np.int64(2)), "a numpy count is a count"
    slab = SlabLayout(num_slots=8, max_model_len=64)
    assert not slab.decode_step_fits(1), "an extent's room is its own: each table is asked"
    for layout in (layout, slab):
        for bad in (-1, 2.5, True, "3"):
            with pytest.raises(ValueError, match="num_seqs"):
                layout.decode_step_fits(bad)
