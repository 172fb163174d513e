"""Bad arguments to the block pool, block tables and the contiguous cache: refused before anything changes."""
import re

import numpy as np
import pytest
import torch

from decodelab.kv.blocks import BlockPool, BlockTable
from decodelab.kv.contiguous_cache import ContiguousKVCache


@pytest.mark.parametrize("token_ids", [["a"], [1, -1], [1, 2.0], [True], "ab", None])
def test_append_checks_every_id_before_taking_a_block(token_ids):
    pool, table = BlockPool(num_blocks=4, block_size=2), BlockTable(block_size=2)
    table.append(pool, [7])
    free, used = pool.num_free_blocks, pool.ref_counts
    with pytest.raises(ValueError, match=re.escape("token_ids must be a list of token ids (ints >= 0), got ")):
        table.append(pool, [8, 9] + token_ids if isinstance(token_ids, list) else token_ids)
    assert (pool.num_free_blocks, pool.ref_counts, table.num_tokens, table.block_ids) == (free, used, 1, [0])


def test_numpy_and_torch_ids_are_the_same_tokens():
    pool, table = BlockPool(num_blocks=4, block_size=2), BlockTable(block_size=2)
    slots, _ = table.append(pool, np.array([5, 6, 7]))
    table.append(pool, [torch.tensor(8)])
    assert slots == [0, 1, 2] and table.token_ids(pool) == [5, 6, 7, 8]
    assert all(type(t) is int for t in table.token_ids(pool))
    pool.release(np.int64(table.block_ids[0]))  # a numpy block id is the same block


def test_a_table_and_a_pool_of_different_block_sizes_are_refused():
    pool, table = BlockPool(num_blocks=4, block_size=4), BlockTable(block_size=2)
    message = "the table's block_size (2) must equal the pool's (4)"
    for call in (lambda: table.append(pool, [1, 2, 3]), lambda: table.match_prefix(pool, [1, 2, 3]),
                 lambda: table.can_append(pool, 1), lambda: table.reserve(pool, 2)):
        with pytest.raises(ValueError, match=re.escape(message)):
            call()
    assert pool.num_free_blocks == 4


def test_table_counts_are_ints():
    pool, table = BlockPool(num_blocks=4, block_size=2), BlockTable(block_size=2)
    with pytest.raises(ValueError, match="position must be an int >= 0, got 1.5"):
        table.slot(1.5)
    with pytest.raises(ValueError, match="num_slots must be an int >= 0, got -1"):
        table.reserve(pool, -1)
    with pytest.raises(ValueError, match="enable_prefix_caching must be a bool, got 'yes'"):
        BlockPool(num_blocks=4, block_size=2, enable_prefix_caching="yes")


def small_cache(**kwargs):
    return ContiguousKVCache(num_layers=1, batch_size=1, max_len=4, num_kv_heads=2, head_dim=4, **kwargs)


@pytest.mark.parametrize("start", [1.5, -1, 5, None, True])
def test_update_start_must_be_an_int_within_the_cache(start):
    cache, k = small_cache(), torch.zeros(1, 0, 2, 4)
    with pytest.raises(ValueError, match=re.escape(f"start must be an int in [0, max_len=4], got {start!r}")):
        cache.update(0, k, k, start)


def test_update_takes_numpy_positions():
    cache, k = small_cache(), torch.ones(1, 2, 2, 4)
    keys, _ = cache.update(np.int64(0), k, k, np.int64(1))
    assert keys.shape == (1, 3, 2, 4) and cache.length == 3


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, "float32"])
def test_the_cache_dtype_must_be_floating(dtype):
    with pytest.raises(ValueError, match=re.escape(f"dtype must be a floating torch.dtype (K and V are real numbers; "
                                                   f"an integer cache would truncate them), got {dtype!r}")):
        small_cache(dtype=dtype)


def test_k_and_v_must_have_the_cache_dtype():
    cache = small_cache(dtype=torch.float16)
    k = torch.full((1, 1, 2, 4), 0.3)
    with pytest.raises(ValueError, match=re.escape("k and v must have the cache's dtype torch.float16 (cast them "
                                                   "first, or build the cache with their dtype), got torch.float32 "
                                                   "and torch.float32")):
        cache.update(0, k, k, 0)
    assert not cache.data.any() and cache.length == 0


def test_cache_sizes_may_be_numpy_ints():
    cache = ContiguousKVCache(np.int64(1), 1, np.int32(4), 2, torch.tensor(4))
    assert cache.data.shape == (1, 2, 1, 4, 2, 4) and type(cache.max_len) is int
