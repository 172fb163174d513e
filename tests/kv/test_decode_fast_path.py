"""The one-token decode path of `BlockTable` (`can_append(pool, 1)`, `append(pool, [token])`) against the general
path: the same slots, copies, block contents, hashes and free queue, and a failure that leaves everything as it was.

The general path is reached with numpy token ids (converted, then appended in the loop), the fast path with a list
of one Python int; both tables run the same random script of appends, forks and releases (fixed seed)."""
from __future__ import annotations

import random

import numpy as np
import pytest

from decodelab.kv.blocks import BlockPool, BlockTable


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
                    tables[0][index].append(pools[0], [token])
                assert (pool_state(pools[0]), table_state(tables[0][index])) == before, "a failed append changed state"
                for pool, group in zip(pools, tables):               # make room: the last sequence ends
                    if len(group) > 1:
                        group.pop().release(pool)
                continue
            fast = tables[0][index].append(pools[0], [token])                       # fast path: one Python int
            general = tables[1][index].append(pools[1], np.array([token], dtype=np.int64))  # converted, looped
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
    for bad in ([-1], [True], ["7"], [2.5]):
        with pytest.raises(ValueError, match="token_ids must be a list of token ids"):
            table.append(pool, bad)
    assert table.num_tokens == 1 and pool.num_used_blocks == 1, "a refused token took a slot or a block"
