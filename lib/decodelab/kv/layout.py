"""The engine's two K/V layouts as one strategy (`decodelab.kv.protocols.KVLayout`): the pool, a table per request,
the check that a request can ever fit, and the admission test of a waiting sequence.

- `PagedLayout`: a `BlockPool` of `num_blocks` blocks of `block_size` slots; a request takes blocks as it grows,
  shares cached prompt blocks (prefix caching) and forks them for n > 1.
- `SlabLayout`: the baseline PagedAttention replaced, a `FirstFitSlab` of the same number of slots; a request
  reserves one extent at admission, prompt + max_tokens (`reserve="max_tokens"`) or the model's whole context
  (`reserve="max_model_len"`), and shares nothing.

Admission follows vLLM: the waiting queue's head is admitted only if its new tokens fit; the test counts the cached
prompt blocks it would take off the free queue, and takes none of them when the answer is no, so a request that
has to wait does not reorder the LRU free queue.

    layout = make_layout("paged", num_blocks=64, block_size=16, max_model_len=256)
    table = layout.new_table(num_prompt_tokens=20, max_tokens=30)
    layout.admit(table, prompt_ids)          # cached prompt tokens (0 on a cold cache), or None: wait

Taught in: chapters/07-paged-attention.ipynb
"""
from __future__ import annotations

from collections.abc import Sequence

from decodelab.kv.blocks import BlockPool, BlockTable, block_hash
from decodelab.kv.slab import FirstFitSlab, Reservation
from decodelab.validation import ParamError, check_int

KV_LAYOUTS = ("paged", "slab")
RESERVATIONS = ("max_tokens", "max_model_len")


class PagedLayout:
    """Blocks of `block_size` slots in a `BlockPool`, with prefix caching and copy-on-write forks.
    Taught in: chapters/07-paged-attention.ipynb"""
    name = "paged"

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int,
                 enable_prefix_caching: bool = True) -> None:
        self.pool = BlockPool(num_blocks, block_size, enable_prefix_caching)
        self.block_size = block_size
        self.max_model_len = max_model_len

    def new_table(self, num_prompt_tokens: int, max_tokens: int) -> BlockTable:
        return BlockTable(self.block_size)

    def check_fits(self, num_prompt_tokens: int, max_tokens: int, n: int, name: str) -> None:
        slots = min(num_prompt_tokens + max_tokens - 1, self.max_model_len)
        blocks = -(-slots // self.block_size)
        if blocks > self.pool.num_blocks:
            raise ParamError("max_tokens", f"{name} needs up to {blocks} blocks ({slots} tokens), more than the whole "
                                           f"pool of {self.pool.num_blocks}; lower max_tokens or give the engine "
                                           f"more blocks")

    def decode_step_fits(self, num_seqs: int) -> bool:
        """Whether the free blocks cover one more token for each of `num_seqs` sequences: a token needs at most one
        fresh block (a new block, or a copy of a shared one), so then no sequence need be asked or preempted."""
        if type(num_seqs) is not int or num_seqs < 0:
            num_seqs = check_int(num_seqs, "num_seqs", low=0)
        return num_seqs <= self.pool.num_free_blocks

    def admit(self, table: BlockTable, token_ids: Sequence[int], use_prefix_cache: bool = True) -> int | None:
        """The prefix `table.match_prefix` would share, found by the same hash walk but read only: the cached tokens
        if the rest of the prompt fits in the free blocks left once the free cached blocks it hits are taken.
        `use_prefix_cache=False` (a request that asked for its prompt's logprobs) looks nothing up: 0 if the whole
        prompt fits."""
        pool, size = self.pool, self.block_size
        parent, cached, free_hits = None, 0, 0
        for start in range(0, (len(token_ids) - 1 - size + 1) if use_prefix_cache else 0, size):
            chunk = token_ids[start:start + size]
            hash_value = block_hash(parent, chunk)
            block_id = pool.lookup(hash_value, chunk)
            if block_id is None:
                break
            free_hits += pool.ref_count(block_id) == 0
            parent = hash_value
            cached += size
        new_blocks = -(-(len(token_ids) - cached) // size)     # the hit ends on a block boundary: no copy-on-write
        return cached if new_blocks <= pool.num_free_blocks - free_hits else None


class SlabLayout:
    """One `FirstFitSlab` of `num_slots` one-slot blocks; a request reserves its extent at admission, first fit.
    Taught in: chapters/07-paged-attention.ipynb"""
    name = "slab"
    block_size = 1

    def __init__(self, num_slots: int, max_model_len: int, reserve: str = "max_tokens") -> None:
        self.pool = FirstFitSlab(num_slots)
        self.max_model_len = max_model_len
        self.reserve = reserve

    def reservation_size(self, num_prompt_tokens: int, max_tokens: int) -> int:
        if self.reserve == "max_model_len":
            return self.max_model_len
        return min(num_prompt_tokens + max_tokens, self.max_model_len)

    def new_table(self, num_prompt_tokens: int, max_tokens: int) -> Reservation:
        return Reservation(self.reservation_size(num_prompt_tokens, max_tokens))

    def check_fits(self, num_prompt_tokens: int, max_tokens: int, n: int, name: str) -> None:
        if n > 1:
            raise ParamError("n", f"n for {name} is {n}; a slab reservation cannot share a prompt, "
                                  f"use kv_layout='paged' for n > 1")
        size = self.reservation_size(num_prompt_tokens, max_tokens)
        if size > self.pool.num_slots:
            raise ParamError("max_tokens", f"{name} reserves {size} slots, more than the whole slab of "
                                           f"{self.pool.num_slots}; lower max_tokens or give the engine more memory")

    def decode_step_fits(self, num_seqs: int) -> bool:
        """Always False: whether an extent has room is its own, so each table is asked."""
        check_int(num_seqs, "num_seqs", low=0)
        return False

    def admit(self, table: Reservation, token_ids: Sequence[int], use_prefix_cache: bool = True) -> int | None:
        """0 (an extent shares nothing, so `use_prefix_cache` changes nothing) if a free extent holds the whole
        reservation, else None."""
        return 0 if table.can_append(self.pool, len(token_ids)) else None


def make_layout(kv_layout: str, num_blocks: int, block_size: int, max_model_len: int,
                enable_prefix_caching: bool = True, reserve: str = "max_tokens") -> PagedLayout | SlabLayout:
    """The layout named `kv_layout`; a slab one gets the same memory as `num_blocks` blocks, as one slab."""
    if kv_layout not in KV_LAYOUTS or reserve not in RESERVATIONS:
        raise ValueError(f"kv_layout must be one of {KV_LAYOUTS} and reserve one of {RESERVATIONS}, "
                         f"got {kv_layout!r} and {reserve!r}")
    if kv_layout == "paged":
        return PagedLayout(num_blocks, block_size, max_model_len, enable_prefix_caching)
    return SlabLayout(num_blocks * block_size, max_model_len, reserve)
