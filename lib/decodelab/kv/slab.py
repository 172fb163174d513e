"""Slab KV reservation, the baseline PagedAttention replaced: one slab of slots, first-fit placement.

Before paging, serving systems gave each request one extent of consecutive KV slots sized for the longest it could
become, reserved when the request is admitted and freed when it finishes. Requests of different sizes come and go,
so the free slots break into gaps between reservations: a request can wait while enough slots are free in total,
because no single gap holds it (external fragmentation). Slots reserved but never written by the time the request
ends are wasted too (over-reservation).

- `FirstFitSlab` is the allocator: a slab of `num_slots` token slots, free extents kept sorted by start; `allocate`
  takes the first extent that is long enough, `free` merges the extent back with its free neighbours.
- `Reservation` is one sequence's extent of slots. It has the methods the scheduler calls on a `BlockTable`
  (`decodelab.kv.protocols.KVTable`: `can_append`, `append`, `release`, `match_prefix`), with blocks of one slot, so
  the same scheduler and the same model forward serve both layouts: token i of a sequence lives in slot start + i.
  The slab counts the slots each extent has written (`write`), so `filled_slots()` needs no help from outside.

    slab = FirstFitSlab(num_slots=10)
    a, b = slab.allocate(4), slab.allocate(4)   # 0, 4
    slab.free(a)                                # free extents [(0, 4), (8, 2)]: 6 free, none holds 5
    slab.find(5) is None                        # True: external fragmentation

Taught in: chapters/07-paged-attention.ipynb
"""
from __future__ import annotations

import bisect
from collections.abc import Sequence

from decodelab.validation import check_int


class FirstFitSlab:
    """`num_slots` KV slots handed out as extents of consecutive slots, first fit.

    Exposes the counters the engine reads from a `BlockPool` (`num_blocks`, `num_used_blocks`, `num_free_blocks`,
    `filled_slots()`), counted in slots: a slab layout is a pool of one-slot blocks.
    Taught in: chapters/07-paged-attention.ipynb
    """

    block_size = 1

    def __init__(self, num_slots: int) -> None:
        self.num_slots = check_int(num_slots, "num_slots")
        self._free: list[tuple[int, int]] = [(0, num_slots)]   # (start, length), sorted by start, never adjacent
        self._held: dict[int, int] = {}                        # start -> length of each reservation
        self._written: dict[int, int] = {}                     # start -> slots of that reservation written
        self._filled = 0                                       # sum of _written, kept by write() and free()

    # -- the counters BlockPool also has -------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.num_slots

    @property
    def num_used_blocks(self) -> int:
        """Slots inside reservations, written or not."""
        return self.num_slots - self.num_free_blocks

    @property
    def num_free_blocks(self) -> int:
        return sum(length for _, length in self._free)

    def filled_slots(self) -> int:
        """Slots holding a token's K/V."""
        return self._filled

    # -- allocation ----------------------------------------------------------------------------------------
    @property
    def free_extents(self) -> list[tuple[int, int]]:
        """Free extents as (start, length), by start."""
        return list(self._free)

    @property
    def reservations(self) -> dict[int, int]:
        """Held extents as start -> length."""
        return dict(self._held)

    def largest_free_extent(self) -> int:
        return max((length for _, length in self._free), default=0)

    def external_fragmentation(self, size: int) -> int:
        """Free slots in gaps too short for an extent of `size`: free, yet useless to a request that needs `size`."""
        check_int(size, "size")
        return sum(length for _, length in self._free if length < size)

    def find(self, size: int) -> int | None:
        """Start of the first free extent that holds `size` slots, or None."""
        check_int(size, "size")
        return next((start for start, length in self._free if length >= size), None)

    def allocate(self, size: int) -> int:
        """Reserve `size` contiguous slots at the first free extent long enough; return its start."""
        start = self.find(size)
        if start is None:
            raise RuntimeError(f"no free extent of {size} slots: {self.num_free_blocks} of {self.num_slots} slots are "
                               f"free, the longest extent holds {self.largest_free_extent()}")
        index = next(i for i, (s, _) in enumerate(self._free) if s == start)
        length = self._free[index][1]
        if length == size:
            del self._free[index]
        else:
            self._free[index] = (start + size, length - size)
        self._held[start] = size
        self._written[start] = 0
        return start

    def write(self, start: int, num_slots: int) -> None:
        """Record that `num_slots` more slots of the extent at `start` now hold a token's K/V."""
        if start not in self._held:
            raise ValueError(f"start must be the start of a held extent {sorted(self._held)}, got {start!r}")
        if self._written[start] + num_slots > self._held[start]:
            raise ValueError(f"the extent at {start} holds {self._held[start]} slots; {self._written[start]} are "
                             f"written, {num_slots} more do not fit")
        self._written[start] += num_slots
        self._filled += num_slots

    def free(self, start: int) -> None:
        """Give back the extent that starts at `start`, merging it with free neighbours."""
        if isinstance(start, bool) or not isinstance(start, int) or start not in self._held:
            raise ValueError(f"start must be the start of a held extent {sorted(self._held)}, got {start!r}")
        size = self._held.pop(start)
        self._filled -= self._written.pop(start)
        index = bisect.bisect_left(self._free, (start, 0))
        if index < len(self._free) and self._free[index][0] == start + size:    # merge with the extent after
            size += self._free.pop(index)[1]
        if index > 0 and sum(self._free[index - 1]) == start:                  # merge with the extent before
            start, size = self._free[index - 1][0], self._free[index - 1][1] + size
            index -= 1
            del self._free[index]
        self._free.insert(index, (start, size))


class Reservation:
    """One sequence's extent of `size` consecutive slots in a `FirstFitSlab`, taken at its first `append`.

    The table interface of `decodelab.kv.blocks.BlockTable`, with one-slot blocks: `block_ids` lists the slots the
    sequence has written, so `decodelab.runner.model.PagedLlama` reads them like any block table.

    Example:
        slab = FirstFitSlab(64)
        table = Reservation(size=20)                  # prompt + max_tokens
        slots, copies = table.append(slab, [5, 6, 7]) # slots [0, 1, 2], no copies
    Taught in: chapters/07-paged-attention.ipynb
    """

    block_size = 1

    def __init__(self, size: int) -> None:
        self.size = check_int(size, "size")
        self.start: int | None = None      # None until admitted
        self.num_tokens = 0

    @property
    def block_ids(self) -> list[int]:
        return [] if self.start is None else list(range(self.start, self.start + self.num_tokens))

    @property
    def num_slots(self) -> int:
        """Slots the table holds: the whole reservation once admitted, none before."""
        return 0 if self.start is None else self.size

    def match_prefix(self, pool: FirstFitSlab, token_ids: Sequence[int]) -> int:
        """An extent shares nothing: no prefix is ever reused."""
        if self.start is not None:
            raise ValueError("match_prefix must be called on a table that holds no slots")
        return 0

    def can_append(self, pool: FirstFitSlab, num_new_tokens: int) -> bool:
        """Whether `append` of that many tokens would succeed: the extent exists (or a free extent of `size` does)
        and has room."""
        if self.num_tokens + num_new_tokens > self.size:
            return False
        return self.start is not None or pool.find(self.size) is not None

    def append(self, pool: FirstFitSlab, token_ids: Sequence[int]) -> tuple[list[int], list[tuple[int, int]]]:
        """Reserve the extent on the first call; give `token_ids` the next slots. Returns (slots, copies = [])."""
        if self.num_tokens + len(token_ids) > self.size:
            raise RuntimeError(f"the reservation holds {self.size} slots; {self.num_tokens} are written, "
                               f"{len(token_ids)} more do not fit")
        if self.start is None:
            self.start = pool.allocate(self.size)
        slots = list(range(self.start + self.num_tokens, self.start + self.num_tokens + len(token_ids)))
        self.num_tokens += len(token_ids)
        pool.write(self.start, len(token_ids))
        return slots, []

    def append_token(self, pool: FirstFitSlab, token_id: int, copies: list[tuple[int, int]]) -> int:
        """`append(pool, [token_id])`'s one slot, for a decode step (an extent copies nothing: `copies` stays)."""
        if type(token_id) is not int or token_id < 0:
            raise ValueError(f"token_id must be a token id (an int >= 0), got {token_id!r:.100}")
        return self.append(pool, [token_id])[0][0]

    def fork(self, pool: FirstFitSlab) -> Reservation:
        raise ValueError("a slab reservation cannot share its prompt with a sibling; use the paged layout for n > 1")

    def release(self, pool: FirstFitSlab) -> None:
        """Free the whole extent (admission reserved it, finishing or preemption gives it back)."""
        if self.start is not None:
            pool.free(self.start)
        self.start = None
        self.num_tokens = 0
