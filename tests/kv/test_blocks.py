"""BlockPool and BlockTable: ref counts, LRU free queue, prefix caching, copy-on-write (chapter 7)."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decodelab.kv.blocks import BlockPool, BlockTable, block_hash


def check_invariants(pool: BlockPool, tables: dict, contents: dict) -> None:
    assert pool.num_free_blocks + pool.num_used_blocks == pool.num_blocks
    counts = pool.ref_counts
    assert min(counts) >= 0
    for block_id in range(pool.num_blocks):
        holders = sum(block_id in t.block_ids for t in tables.values())
        assert counts[block_id] == holders
        assert (block_id in pool.free_block_ids) == (holders == 0)
    # the running count the engine reads each step equals a recount over the used blocks
    assert pool.filled_slots() == sum(len(pool.block_tokens[b]) for b in range(pool.num_blocks) if counts[b] > 0)
    for key, table in tables.items():
        # every sequence reads back exactly what it wrote, whatever its forked siblings wrote since
        assert table.token_ids(pool) == contents[key]
        assert table.num_tokens == len(contents[key])


operation = st.tuples(st.sampled_from(["new", "append", "fork", "release"]), st.integers(0, 7),
                      st.lists(st.integers(0, 3), min_size=1, max_size=7))


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(operation, max_size=25), block_size=st.integers(1, 4), caching=st.booleans())
def test_pool_invariants_under_random_operations(ops, block_size, caching):
    pool = BlockPool(num_blocks=12, block_size=block_size, enable_prefix_caching=caching)
    tables: dict[int, BlockTable] = {}
    contents: dict[int, list[int]] = {}
    next_key = 0
    for kind, pick, tokens in ops:
        keys = sorted(tables)
        if kind == "new":
            table = BlockTable(block_size)
            hit = table.match_prefix(pool, tokens)
            assert hit % block_size == 0 and hit < len(tokens)
            if table.blocks_needed(pool, len(tokens) - hit) > pool.num_free_blocks:
                table.release(pool)
                continue
            table.append(pool, tokens[hit:])
            tables[next_key], contents[next_key] = table, list(tokens)
            next_key += 1
        elif not keys:
            continue
        elif kind == "append":
            key = keys[pick % len(keys)]
            if tables[key].blocks_needed(pool, len(tokens)) <= pool.num_free_blocks:
                tables[key].append(pool, tokens)
                contents[key] += tokens
        elif kind == "fork":
            key = keys[pick % len(keys)]
            tables[next_key], contents[next_key] = tables[key].fork(pool), list(contents[key])
            next_key += 1
        else:
            key = keys[pick % len(keys)]
            tables.pop(key).release(pool)
            contents.pop(key)
        check_invariants(pool, tables, contents)
    for table in tables.values():
        table.release(pool)
    assert pool.num_free_blocks == pool.num_blocks and max(pool.ref_counts) == 0


@settings(max_examples=40, deadline=None)
@given(order=st.permutations(list(range(6))))
def test_eviction_order_is_lru(order):
    pool = BlockPool(num_blocks=6, block_size=2)
    blocks = [pool.allocate() for _ in range(6)]
    assert sorted(blocks) == list(range(6)) and pool.num_free_blocks == 0
    for block_id in order:
        pool.release(block_id)
    assert pool.free_block_ids == list(order)
    assert [pool.allocate() for _ in range(6)] == list(order)  # least recently freed first


def test_forked_sibling_copies_on_write():
    pool = BlockPool(num_blocks=8, block_size=4)
    parent = BlockTable(4)
    parent.append(pool, [1, 2, 3, 4, 5, 6])          # one full block, one half-full block
    child = parent.fork(pool)
    assert child.block_ids == parent.block_ids and pool.ref_counts[parent.block_ids[1]] == 2
    assert parent.blocks_needed(pool, 1) == 1        # the shared last block must be copied first
    slots, copies = child.append(pool, [70])
    assert copies == [(parent.block_ids[1], child.block_ids[1])]
    assert slots == [child.block_ids[1] * 4 + 2]
    _, copies = parent.append(pool, [80])            # the parent now owns the old block alone: no copy
    assert copies == []
    assert parent.token_ids(pool) == [1, 2, 3, 4, 5, 6, 80] and child.token_ids(pool) == [1, 2, 3, 4, 5, 6, 70]
    assert parent.block_ids[0] == child.block_ids[0] and pool.ref_counts[parent.block_ids[0]] == 2


def test_prefix_cache_hits_full_blocks_and_keeps_the_last_token():
    pool = BlockPool(num_blocks=8, block_size=4)
    first = BlockTable(4)
    first.append(pool, list(range(10)))              # blocks: [0..3] [4..7] [8, 9]
    first_blocks = list(first.block_ids)
    first.release(pool)
    second = BlockTable(4)
    assert second.match_prefix(pool, list(range(9))) == 8   # both full blocks are reused
    assert second.block_ids == first_blocks[:2]
    third = BlockTable(4)
    assert third.match_prefix(pool, list(range(8))) == 4    # capped: token 7 must be recomputed
    fourth = BlockTable(4)
    assert fourth.match_prefix(pool, [0, 1, 2, 99, 4, 5, 6, 7, 8]) == 0   # chained hash: a changed first block misses all
    assert pool.ref_counts[second.block_ids[0]] == 2


def test_eviction_drops_the_cache_entry():
    pool = BlockPool(num_blocks=2, block_size=2)
    table = BlockTable(2)
    table.append(pool, [5, 6, 7])
    table.release(pool)                               # tail block (partial) is queued first, then the prefix
    assert pool.cached_block_ids == [table_block := pool.free_block_ids[1]]
    other = BlockTable(2)
    other.append(pool, [1, 2, 3])                     # takes both blocks, evicting the cached one
    assert pool.cached_block_ids == [other.block_ids[0]] and table_block in other.block_ids
    assert BlockTable(2).match_prefix(pool, [5, 6, 7]) == 0


def test_no_caching_means_no_hits():
    pool = BlockPool(num_blocks=4, block_size=2, enable_prefix_caching=False)
    table = BlockTable(2)
    table.append(pool, [1, 2, 3])
    table.release(pool)
    assert BlockTable(2).match_prefix(pool, [1, 2, 3]) == 0 and pool.cached_block_ids == []


def test_slot_mapping():
    pool = BlockPool(num_blocks=5, block_size=3)
    pool.allocate()                                   # block 0 taken, so the table starts at block 1
    table = BlockTable(3)
    slots, _ = table.append(pool, [9] * 7)
    assert table.block_ids == [1, 2, 3]
    assert slots == [3, 4, 5, 6, 7, 8, 9] == [table.slot(i) for i in range(7)]


def test_bad_input():
    with pytest.raises(ValueError, match="num_blocks must be an int >= 1, got 0"):
        BlockPool(0, 4)
    with pytest.raises(ValueError, match="block_size must be an int >= 1, got 2.5"):
        BlockTable(2.5)
    pool = BlockPool(2, 2)
    with pytest.raises(ValueError, match="block_id must be an int in"):
        pool.release(7)
    with pytest.raises(ValueError, match="already free"):
        pool.release(0)
    with pytest.raises(ValueError, match="free and not cached"):
        pool.share(1)
    with pytest.raises(ValueError, match="block 1 cannot take a token: ref count 0"):
        pool.write(1, 5)
    with pytest.raises(ValueError, match="block 1 is free; only a held block can be copied"):
        pool.copy_on_write(1)
    held = pool.allocate()
    pool.write(held, 5)
    pool.write(held, 6)
    with pytest.raises(ValueError, match=f"block {held} cannot take a token: ref count 1, 2 of 2 slots filled"):
        pool.write(held, 7)
    assert pool.block_tokens[held] == [5, 6] and pool.filled_slots() == 2   # the refused write changed nothing
    pool.release(held)
    assert pool.filled_slots() == 0
    table = BlockTable(2)
    with pytest.raises(RuntimeError, match="need 3 blocks, 2 free"):
        table.append(pool, [1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match="position must be in"):
        table.slot(0)
    assert block_hash(None, [1, 2]) != block_hash(block_hash(None, [0, 0]), [1, 2])
