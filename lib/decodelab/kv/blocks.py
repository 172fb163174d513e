"""The paged KV cache's bookkeeping: a pool of fixed-size blocks and one block table per sequence.

The K/V numbers themselves live in one tensor `[num_layers, 2, num_blocks, block_size, kv_heads, head_dim]`
(see `decodelab.runner.model`); this module decides which block and slot each token's K/V goes to:
slot = block_id × block_size + offset. It also records, per block, the token ids whose K/V the block holds, so
the chapter can draw the pool and the tests can check that a forked sibling never sees another's writes.

- Reference counts let several sequences share a block (n > 1 samples share their prompt).
- Freed blocks join the tail of an LRU free queue; allocation takes the head (least recently used).
- Prefix caching: a full block gets a hash chained from the first block (hash of the parent's hash and the
  block's tokens); a freed block keeps its hash until it is evicted, so a later prompt with the same prefix
  reuses it. A hit is capped so the last prompt token is recomputed (its logits are needed).
- Copy-on-write: writing into a block another sequence also holds first copies it to a fresh block.
- Lookahead (speculative decoding): a table may hold empty blocks past its tokens (`reserve`) for a step's drafts;
  only the drafts the target keeps are `append`ed (so no rejected token is ever hashed) and `trim` gives back the
  blocks no kept token reached.

Taught in: chapters/07-paged-attention.ipynb
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from decodelab.validation import as_int_list, as_scalar, check_int


def _token_ids(token_ids) -> list[int]:
    """`token_ids` as a list of ints >= 0 (numpy and torch integers too); anything else is a ValueError."""
    if type(token_ids) is list and all(type(t) is int and t >= 0 for t in token_ids):
        return token_ids                       # the engine's own lists: nothing to convert
    ids = as_int_list(token_ids)
    if ids is None or any(t < 0 for t in ids):
        raise ValueError(f"token_ids must be a list of token ids (ints >= 0), got {token_ids!r:.100}")
    return [int(t) for t in ids]               # plain ints, as `BlockTable.append_token` takes them


def block_hash(parent_hash: int | None, token_ids: Sequence[int]) -> int:
    """Hash of a full block, chained from its parent's hash so equal blocks after different prefixes differ."""
    return hash((parent_hash, tuple(token_ids)))


class BlockPool:
    """`num_blocks` blocks of `block_size` slots (for every layer), with ref counts, an LRU free queue and a
    prefix cache.

    Example:
        pool = BlockPool(num_blocks=8, block_size=4)
        b = pool.allocate()          # pool.ref_counts[b] == 1
        pool.release(b)              # back on the free queue, at its tail
    Taught in: chapters/07-paged-attention.ipynb
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.num_blocks = check_int(num_blocks, "num_blocks")
        self.block_size = check_int(block_size, "block_size")
        if not isinstance(as_scalar(enable_prefix_caching), bool):
            raise ValueError(f"enable_prefix_caching must be a bool, got {enable_prefix_caching!r}")
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self._ref_counts = [0] * num_blocks
        self.block_tokens: list[list[int]] = [[] for _ in range(num_blocks)]  # token ids whose K/V each block holds
        self._block_hashes: list[int | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))  # head = evict first
        self._cached: dict[int, int] = {}  # block hash -> block id
        self._filled = 0                    # tokens in blocks whose ref count is > 0, kept as blocks change

    # -- state the chapter draws ---------------------------------------------------------------------------
    @property
    def ref_counts(self) -> list[int]:
        return list(self._ref_counts)

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    @property
    def free_block_ids(self) -> list[int]:
        """Free blocks in eviction order: the first one is handed out next."""
        return list(self._free)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def cached_block_ids(self) -> list[int]:
        """Blocks that a prefix-cache lookup can hit (in use or free but not yet evicted)."""
        return sorted(self._cached.values())

    def filled_slots(self) -> int:
        """Slots holding a live token's K/V, counted once per used block however many sequences share it.

        A running count (O(1)): the engine reads it every step.
        """
        return self._filled

    # -- allocation ----------------------------------------------------------------------------------------
    def _check_id(self, block_id: int) -> int:
        checked = as_scalar(block_id)
        if isinstance(checked, bool) or not isinstance(checked, int) or not 0 <= checked < self.num_blocks:
            raise ValueError(f"block_id must be an int in [0, {self.num_blocks}), got {block_id!r}")
        return checked

    def allocate(self) -> int:
        """Take the least recently used free block, evicting its prefix-cache entry; its ref count becomes 1."""
        if not self._free:
            raise RuntimeError(f"no free block: all {self.num_blocks} blocks are in use")
        block_id, _ = self._free.popitem(last=False)
        old_hash = self._block_hashes[block_id]
        if old_hash is not None:
            del self._cached[old_hash]
            self._block_hashes[block_id] = None
        self.block_tokens[block_id] = []
        self._ref_counts[block_id] = 1
        return block_id

    def share(self, block_id: int) -> None:
        """One more holder of `block_id` (a fork or a prefix-cache hit); a free cached block leaves the queue."""
        block_id = self._check_id(block_id)
        if self._ref_counts[block_id] == 0:
            if self._block_hashes[block_id] is None:
                raise ValueError(f"block {block_id} is free and not cached: allocate() it instead of sharing it")
            del self._free[block_id]
            self._filled += len(self.block_tokens[block_id])
        self._ref_counts[block_id] += 1

    def release(self, block_id: int) -> None:
        """One holder fewer; at zero the block joins the tail of the free queue (keeping its cached hash)."""
        block_id = self._check_id(block_id)
        if self._ref_counts[block_id] == 0:
            raise ValueError(f"block {block_id} is already free; release it once per holder")
        self._ref_counts[block_id] -= 1
        if self._ref_counts[block_id] == 0:
            self._free[block_id] = None
            self._filled -= len(self.block_tokens[block_id])

    # -- contents ------------------------------------------------------------------------------------------
    def write(self, block_id: int, token_id: int) -> None:
        """Record that the next free slot of `block_id` (held, not full, not shared) now holds `token_id`'s K/V."""
        block_id = self._check_id(block_id)
        tokens = self.block_tokens[block_id]
        if self._ref_counts[block_id] != 1 or len(tokens) >= self.block_size:
            raise ValueError(f"block {block_id} cannot take a token: ref count {self._ref_counts[block_id]}, "
                             f"{len(tokens)} of {self.block_size} slots filled (needs ref count 1 and a free slot)")
        tokens.append(int(token_id))
        self._filled += 1

    def copy_on_write(self, block_id: int) -> int:
        """A fresh block with `block_id`'s tokens for one of its holders, who lets go of the shared one."""
        block_id = self._check_id(block_id)
        if self._ref_counts[block_id] == 0:
            raise ValueError(f"block {block_id} is free; only a held block can be copied")
        fresh = self.allocate()
        self.block_tokens[fresh] = list(self.block_tokens[block_id])
        self._filled += len(self.block_tokens[fresh])
        self.release(block_id)
        return fresh

    # -- prefix cache --------------------------------------------------------------------------------------
    def lookup(self, hash_value: int, token_ids: Sequence[int]) -> int | None:
        """The cached block holding exactly `token_ids` under `hash_value`, or None."""
        if not self.enable_prefix_caching:
            return None
        block_id = self._cached.get(hash_value)
        if block_id is None or self.block_tokens[block_id] != list(token_ids):  # guards against hash collisions
            return None
        return block_id

    def register(self, block_id: int, hash_value: int) -> None:
        """Make a full block findable by `lookup`; a hash already cached keeps its first block."""
        block_id = self._check_id(block_id)
        if len(self.block_tokens[block_id]) != self.block_size:
            raise ValueError(f"only full blocks are cached; block {block_id} holds "
                             f"{len(self.block_tokens[block_id])} of {self.block_size} tokens")
        self._cache(block_id, hash_value)

    def _cache(self, block_id: int, hash_value: int) -> None:
        """`register` of a block id `BlockTable` knows to be valid and full (it just wrote the block's last slot)."""
        if self.enable_prefix_caching and hash_value not in self._cached and self._block_hashes[block_id] is None:
            self._cached[hash_value] = block_id
            self._block_hashes[block_id] = hash_value


class BlockTable:
    """The blocks one sequence's tokens live in, in order; token i sits in slot
    `block_ids[i // block_size] * block_size + i % block_size`.

    Example:
        table = BlockTable(block_size=4)
        slots, copies = table.append(pool, [5, 6, 7, 8, 9])   # 2 blocks; slots of the 5 tokens
    Taught in: chapters/07-paged-attention.ipynb
    """
    __slots__ = ("block_size", "block_ids", "num_tokens", "_hashes", "_checked_pool")   # read on every decode step

    def __init__(self, block_size: int) -> None:
        self.block_size = check_int(block_size, "block_size")
        self.block_ids: list[int] = []
        self.num_tokens = 0                 # tokens whose K/V slots are written
        self._hashes: list[int] = []        # chained hash of each full block
        self._checked_pool: BlockPool | None = None   # the last pool `_check_pool` accepted (checked once)

    def _check_pool(self, pool: BlockPool) -> None:
        """A table and its pool must agree on the block size: a slot is block_id × block_size + offset in both.
        The pool that passed is remembered, so a decode step's calls cost one identity test."""
        if pool is self._checked_pool:
            return
        if not isinstance(pool, BlockPool):
            raise TypeError(f"pool must be a BlockPool, got {type(pool).__name__}")
        if pool.block_size != self.block_size:
            raise ValueError(f"the table's block_size ({self.block_size}) must equal the pool's "
                             f"({pool.block_size}): a slot is block_id × block_size + offset in both")
        self._checked_pool = pool

    @property
    def num_slots(self) -> int:
        """Slots the table holds: whole blocks, the last one possibly part empty."""
        return len(self.block_ids) * self.block_size

    def slot(self, position: int) -> int:
        """Flat slot index of token `position` in the pool: block_id × block_size + offset."""
        position = check_int(position, "position", low=0)
        if not 0 <= position < len(self.block_ids) * self.block_size:
            raise ValueError(f"position must be in [0, {len(self.block_ids) * self.block_size}), got {position}")
        return self.block_ids[position // self.block_size] * self.block_size + position % self.block_size

    def blocks_needed(self, pool: BlockPool, num_new_tokens: int) -> int:
        """Fresh blocks `append` of `num_new_tokens` tokens would take (new blocks plus a copy-on-write)."""
        self._check_pool(pool)
        if type(num_new_tokens) is not int or num_new_tokens < 0:
            num_new_tokens = check_int(num_new_tokens, "num_new_tokens", low=0)
        return self._blocks_needed(pool, num_new_tokens)

    def _blocks_needed(self, pool: BlockPool, num_new_tokens: int) -> int:
        free_slots = len(self.block_ids) * self.block_size - self.num_tokens   # in the last block and reserved ones
        new_blocks = -(-max(0, num_new_tokens - free_slots) // self.block_size)
        copy = (free_slots > 0 and num_new_tokens > 0
                and pool._ref_counts[self.block_ids[self.num_tokens // self.block_size]] > 1)
        return new_blocks + int(copy)

    def can_append(self, pool: BlockPool, num_new_tokens: int) -> bool:
        """Whether `append` of that many tokens would find enough free blocks (the scheduler's admission test)."""
        if num_new_tokens == 1 and pool is self._checked_pool and type(num_new_tokens) is int:   # a decode step
            index = self.num_tokens // self.block_size
            if index == len(self.block_ids) or pool._ref_counts[self.block_ids[index]] > 1:
                return len(pool._free) > 0                  # a fresh block, or a copy of a shared one
            return True
        return self.blocks_needed(pool, num_new_tokens) <= len(pool._free)

    def match_prefix(self, pool: BlockPool, token_ids: Sequence[int]) -> int:
        """Share the cached blocks that hold a prefix of `token_ids`; return how many tokens they cover.

        Only full blocks count, and the hit stops before the last token so its logits get computed.
        """
        self._check_pool(pool)
        if self.block_ids:
            raise ValueError("match_prefix must be called on an empty table")
        token_ids = _token_ids(token_ids)
        parent = None
        for start in range(0, len(token_ids) - 1 - self.block_size + 1, self.block_size):
            chunk = token_ids[start:start + self.block_size]
            hash_value = block_hash(parent, chunk)
            block_id = pool.lookup(hash_value, chunk)
            if block_id is None:
                break
            pool.share(block_id)
            self.block_ids.append(block_id)
            self._hashes.append(hash_value)
            parent = hash_value
        self.num_tokens = len(self.block_ids) * self.block_size
        return self.num_tokens

    def append(self, pool: BlockPool, token_ids: Sequence[int]) -> tuple[list[int], list[tuple[int, int]]]:
        """Give `token_ids` the next slots, allocating blocks as needed; return (slots, copies).

        `copies` lists (src, dst) block pairs whose K/V the caller must copy before writing: the last block was
        shared with a forked sibling, so this sequence writes into its own copy (copy-on-write).
        """
        self._check_pool(pool)
        token_ids = _token_ids(token_ids)  # every id checked before a block is taken
        needed = self._blocks_needed(pool, len(token_ids))
        if needed > len(pool._free):
            raise RuntimeError(f"need {needed} blocks, {pool.num_free_blocks} free")
        copies: list[tuple[int, int]] = []
        return [self.append_token(pool, token, copies) for token in token_ids], copies

    def append_token(self, pool: BlockPool, token_id: int, copies: list[tuple[int, int]]) -> int:
        """Give one token id the next slot and return it: `append(pool, [token_id])` for a decode step, which makes
        no list. A copy-on-write of the last block is added to `copies` as (src, dst). It takes a block only once it
        knows one is free, so a failure leaves the table and the pool as they were.

            copies = []
            slot = table.append_token(pool, 42, copies)   # == table.append(pool, [42]) = ([slot], copies)
        """
        if pool is not self._checked_pool:
            self._check_pool(pool)
        if type(token_id) is not int or token_id < 0:
            raise ValueError(f"token_id must be a token id (an int >= 0), got {token_id!r:.100}")
        size, block_ids, num_tokens = self.block_size, self.block_ids, self.num_tokens
        index = num_tokens // size
        offset = num_tokens - index * size
        if index == len(block_ids):
            if not pool._free:
                raise RuntimeError("need 1 blocks, 0 free")
            block_id = pool.allocate()
            block_ids.append(block_id)
        else:
            block_id = block_ids[index]
            if pool._ref_counts[block_id] > 1:                   # shared with a forked sibling: copy on write
                if not pool._free:
                    raise RuntimeError("need 1 blocks, 0 free")
                shared, block_id = block_id, pool.copy_on_write(block_id)
                block_ids[index] = block_id
                copies.append((shared, block_id))
        tokens = pool.block_tokens[block_id]       # held by this table alone, with a free slot
        tokens.append(token_id)
        pool._filled += 1
        self.num_tokens = num_tokens + 1
        if offset == size - 1:                     # the block just filled: hash it once, now
            hash_value = block_hash(self._hashes[-1] if self._hashes else None, tokens)
            self._hashes.append(hash_value)
            pool._cache(block_id, hash_value)
        return block_id * size + offset

    def reserve(self, pool: BlockPool, num_slots: int) -> None:
        """Hold blocks for `num_slots` more slots past the written tokens, without writing any: a speculative step's
        drafts get their K/V slots there (`slot` reaches them), and `append` later fills them with the kept ones.
        Call it after `append` of the step's own token, so the slots lie in blocks this table alone holds."""
        self._check_pool(pool)
        num_slots = check_int(num_slots, "num_slots", low=0)
        needed = -(-(self.num_tokens + num_slots) // self.block_size) - len(self.block_ids)
        if needed > pool.num_free_blocks:
            raise RuntimeError(f"need {needed} blocks, {pool.num_free_blocks} free")
        self.block_ids += [pool.allocate() for _ in range(needed)]

    def trim(self, pool: BlockPool) -> None:
        """Give back the blocks past the last written token (rolled-back drafts' slots), last block first."""
        self._check_pool(pool)
        keep = -(-self.num_tokens // self.block_size)
        for block_id in reversed(self.block_ids[keep:]):
            pool.release(block_id)
        del self.block_ids[keep:]

    def fork(self, pool: BlockPool) -> BlockTable:
        """A sibling table sharing every block (ref counts + 1); later writes copy on write."""
        self._check_pool(pool)
        child = BlockTable(self.block_size)
        for block_id in self.block_ids:
            pool.share(block_id)
        child.block_ids = list(self.block_ids)
        child.num_tokens = self.num_tokens
        child._hashes = list(self._hashes)
        return child

    def release(self, pool: BlockPool) -> None:
        """Give every block back, last block first, so the tail of a sequence is evicted before its prefix."""
        self._check_pool(pool)
        for block_id in reversed(self.block_ids):
            pool.release(block_id)
        self.block_ids = []
        self._hashes = []
        self.num_tokens = 0

    def token_ids(self, pool: BlockPool) -> list[int]:
        """The tokens this table's slots hold, read back from the pool's blocks."""
        self._check_pool(pool)
        return [t for b in self.block_ids for t in pool.block_tokens[b]][: self.num_tokens]
