"""What the scheduler needs from where K/V live: an allocator, one table per sequence, and the layout that makes them.

Two layouts implement these (`decodelab.kv.layout`): the paged one (`BlockPool` + `BlockTable`, blocks of
`block_size` slots) and the slab baseline (`FirstFitSlab` + `Reservation`, one extent of slots per request, seen
as blocks of one slot). The scheduler and the model's forward read only what is named here, so they serve both.

    table.match_prefix(pool, token_ids)     # share cached blocks (paged) or nothing (slab): tokens covered
    table.can_append(pool, 1)               # would one more token find a slot? (the decode step's test)
    slots, copies = table.append(pool, ids) # the new tokens' slots, and (src, dst) blocks to copy before writing
    slot = table.append_token(pool, id, copies)   # one token, a decode step's: its slot
    layout.decode_step_fits(num_seqs)       # sure that num_seqs tables can each take a token? (else ask each)

Used by: decodelab.engine.scheduler and decodelab.kv.layout (chapter 07 teaches the two layouts, not these types).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class KVAllocator(Protocol):
    """The slots of one K/V tensor, handed out in blocks (a slab's blocks are one slot each)."""
    block_size: int

    @property
    def num_blocks(self) -> int: ...

    @property
    def num_free_blocks(self) -> int: ...

    @property
    def num_used_blocks(self) -> int: ...

    def filled_slots(self) -> int:
        """Slots holding a live token's K/V."""
        ...


class KVTable(Protocol):
    """One sequence's slots: token i's K/V sit in block `block_ids[i // block_size]`, offset `i % block_size`."""
    block_size: int
    block_ids: list[int]
    num_tokens: int                          # tokens whose K/V slots are written

    @property
    def num_slots(self) -> int: ...

    def match_prefix(self, pool: KVAllocator, token_ids: Sequence[int]) -> int:
        """Take the cached blocks holding a prefix of `token_ids` (an empty table only); tokens they cover."""
        ...

    def can_append(self, pool: KVAllocator, num_new_tokens: int) -> bool: ...

    def append(self, pool: KVAllocator, token_ids: Sequence[int]) -> tuple[list[int], list[tuple[int, int]]]:
        """Slots for `token_ids` (written from now on), and the (src, dst) block copies to make before the forward."""
        ...

    def append_token(self, pool: KVAllocator, token_id: int, copies: list[tuple[int, int]]) -> int:
        """`append(pool, [token_id])` for a decode step: the token's slot, with a block copy added to `copies`."""
        ...

    def fork(self, pool: KVAllocator) -> KVTable:
        """A sibling's table sharing every block (n > 1 samples of one prompt)."""
        ...

    def release(self, pool: KVAllocator) -> None:
        """Give every slot back (a finish, an abort or a preemption)."""
        ...


class LookaheadTable(KVTable, Protocol):
    """A table that can hold empty slots past its tokens for a speculative step's drafts (the paged `BlockTable`)."""

    def slot(self, position: int) -> int: ...

    def reserve(self, pool: KVAllocator, num_slots: int) -> None: ...

    def trim(self, pool: KVAllocator) -> None: ...


class KVLayout(Protocol):
    """How an engine's K/V are laid out: the allocator (`pool`), the slots per block the forward addresses
    (`block_size`), a fresh table per request, the check that a request can ever fit, and the admission test of the
    waiting queue's head, which touches nothing when the answer is no."""
    name: str
    pool: KVAllocator
    block_size: int

    def new_table(self, num_prompt_tokens: int, max_tokens: int) -> KVTable: ...

    def check_fits(self, num_prompt_tokens: int, max_tokens: int, n: int, name: str) -> None:
        """ParamError (naming `n` or `max_tokens`) for a request this layout could never hold, even with the pool
        empty."""
        ...

    def decode_step_fits(self, num_seqs: int) -> bool:
        """True when `num_seqs` tables can surely each take one more token now (a decode step with no preemption, and
        no table to ask); False when each must be asked (`KVTable.can_append`)."""
        ...

    def admit(self, table: KVTable, token_ids: Sequence[int], use_prefix_cache: bool = True) -> int | None:
        """Prompt tokens a prefill of `token_ids` on the empty `table` would find cached, if its new tokens fit in the
        free slots now; None if they do not. Takes nothing: the free queue and the cache stay as they are. With
        `use_prefix_cache=False` nothing is looked up (0 cached tokens)."""
        ...
