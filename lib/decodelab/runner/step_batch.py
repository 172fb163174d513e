"""Where one engine step's tokens go: `StepBatch`, the flat index tensors a forward over the paged KV cache reads
(token ids, positions, slots, the padded per-sequence queries, block tables, context lengths, last-token rows).
`StepBatch.build` takes any mix of prefill and decode sequences; `StepBatch.decode` a decode step's, one token each;
`DecodeBuffers` the same as `decode`, written in place into a runner's own buffers (`PagedLlama.decode_batch`). The
three are compared, with a persistent batch, in benchmarks/step_batch.py.

Read by `decodelab.runner.model.PagedLlama.forward`; the layout is chapter 07's (slots, block tables).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from decodelab.runner.inference import inference


@dataclass(frozen=True)
class StepBatch:
    """Where this step's T flat tokens of B sequences go. Build it with `StepBatch.build`."""
    input_ids: torch.Tensor        # [T] long
    positions: torch.Tensor        # [T] long, position of each token in its sequence
    slot_mapping: torch.Tensor     # [T] long, slot = block_id × block_size + offset
    query_index: torch.Tensor      # [B, Q] long, flat index of each sequence's q-th new token (0 for padding)
    query_valid: torch.Tensor      # [B, Q] bool, False for padding
    query_positions: torch.Tensor  # [B, Q] long
    block_tables: torch.Tensor     # [B, max_blocks] long, padded with 0
    context_lens: torch.Tensor     # [B] long
    last_index: torch.Tensor       # [B] long, flat index of each sequence's last token (its logits are sampled)
    valid_rows: torch.Tensor       # [T] long, row of each token in the padded [B * Q] layout (query_valid's True
                                   # rows, in token order): a long index, where the boolean mask would make the
                                   # GPU report its count to the host (a synchronisation) in every layer

    @staticmethod
    def build(sequences: Sequence[tuple[Sequence[int], int, Sequence[int], Sequence[int]]],
              device: torch.device | str = "cpu") -> StepBatch:
        """sequences: one (new_token_ids, start_position, slots_of_new_tokens, block_ids) per sequence.

        Every index goes into one flat list in one pass, which becomes one tensor through numpy (one copy to
        `device`; `torch.tensor` of a list costs tens of nanoseconds per element); the fields are views of it."""
        if not sequences:
            raise ValueError("sequences must name at least one, got an empty list")
        num_seqs = len(sequences)
        num_queries = max(len(tokens) for tokens, *_ in sequences)
        max_blocks = max(len(blocks) for *_, blocks in sequences)
        input_ids, positions, slots, context_lens, last, lengths = [], [], [], [], [], []
        query_index, query_positions, tables, valid_rows = [], [], [], []
        padding = [0] * max(num_queries, max_blocks)
        for tokens, start, token_slots, blocks in sequences:
            count = len(tokens)
            if not count or len(token_slots) != count:
                raise ValueError(f"each sequence needs >= 1 token and one slot per token, got {count} tokens "
                                 f"and {len(token_slots)} slots")
            first, end = len(input_ids), start + count
            input_ids += tokens
            positions += range(start, end)
            slots += token_slots
            query_index += range(first, first + count)
            row = len(context_lens) * num_queries                                  # this sequence's first padded row
            valid_rows += range(row, row + count)
            query_positions += range(start, end)
            if count < num_queries:
                query_index += padding[:num_queries - count]
                query_positions += padding[:num_queries - count]
            tables += blocks
            tables += padding[:max_blocks - len(blocks)]
            context_lens.append(end)
            last.append(first + count - 1)
            lengths.append(count)
        num_tokens = len(input_ids)
        flat = torch.from_numpy(np.array(input_ids + positions + slots + query_index + query_positions + tables
                                         + context_lens + last + lengths + valid_rows, dtype=np.int64)).to(device)
        (input_ids, positions, slots, query_index, query_positions, tables, context_lens, last,
         lengths, valid_rows) = flat.split([num_tokens] * 3 + [num_seqs * num_queries] * 2 + [num_seqs * max_blocks]
                                           + [num_seqs] * 3 + [num_tokens])
        query_valid = torch.arange(num_queries, device=device) < lengths[:, None]           # [B, Q]
        return StepBatch(input_ids, positions, slots, query_index.view(num_seqs, num_queries), query_valid,
                         query_positions.view(num_seqs, num_queries), tables.view(num_seqs, max_blocks),
                         context_lens, last, valid_rows)

    @staticmethod
    def decode(token_ids: Sequence[int], positions: Sequence[int], slots: Sequence[int],
               block_tables: Sequence[Sequence[int]] | np.ndarray, device: torch.device | str = "cpu") -> StepBatch:
        """A decode step's batch, equal to `build` of `(([token_ids[b]], positions[b], [slots[b]], block_tables[b])
        for b ...)`: one new token per sequence. `block_tables` is one list of block ids per sequence, or the tables
        already padded with 0 as an int64 array `[B, max_blocks]` (what the persistent batch measured in
        benchmarks/step_batch.py keeps from step to step). The inputs go through one host array, made from one list;
        the fields that are the same for every decode step of B sequences (sequence b's only query is flat token b,
        its last) are shared tensors, made once per (B, device), to be read, never written."""
        num_seqs = len(token_ids)
        if isinstance(block_tables, np.ndarray):
            _check_decode(token_ids, positions, slots, block_tables)
            if block_tables.ndim != 2 or block_tables.dtype != np.int64:
                raise ValueError(f"block_tables as an array must be int64 [B, max_blocks], got {block_tables.dtype} "
                                 f"{block_tables.shape}")
            max_blocks = block_tables.shape[1]
            host = np.concatenate([np.array(_decode_head(token_ids, positions, slots), dtype=np.int64),
                                   block_tables.ravel()])
        else:
            flat, max_blocks = _decode_host(token_ids, positions, slots, block_tables)
            host = np.array(flat, dtype=np.int64)
        device = torch.device(device)
        flat = torch.from_numpy(host)
        if device.type != "cpu":
            flat = flat.to(device)
        input_ids, positions_t, slots_t, context_lens, tables_t = flat.split([num_seqs] * 4 + [num_seqs * max_blocks])
        rows, query_index, query_valid = _decode_rows(num_seqs, device)
        return StepBatch(input_ids, positions_t, slots_t, query_index, query_valid, positions_t.view(num_seqs, 1),
                         tables_t.view(num_seqs, max_blocks), context_lens, rows, rows)


def _check_decode(token_ids: Sequence[int], positions: Sequence[int], slots: Sequence[int],
                  block_tables: Sequence) -> None:
    """ValueError unless there is one token, position, slot and block table per sequence (at least one), every
    position >= 0."""
    num_seqs = len(token_ids)
    if not num_seqs or not (len(positions) == len(slots) == len(block_tables) == num_seqs):
        raise ValueError(f"decode needs one token, position, slot and block table per sequence (at least one), "
                         f"got {num_seqs}, {len(positions)}, {len(slots)} and {len(block_tables)}")
    if min(positions) < 0:
        raise ValueError(f"positions must be >= 0, got {list(positions)!r:.200}")


def _decode_head(token_ids: Sequence[int], positions: Sequence[int], slots: Sequence[int]) -> list[int]:
    """Tokens, positions, slots and context lengths (position + 1) of a decode batch, as one flat list."""
    return [*token_ids, *positions, *slots, *(p + 1 for p in positions)]


def _decode_host(token_ids: Sequence[int], positions: Sequence[int], slots: Sequence[int],
                 block_tables: Sequence[Sequence[int]]) -> tuple[list[int], int]:
    """A decode batch's inputs as one flat list, checked (`_check_decode`): tokens, positions, slots, context lengths
    (position + 1), then each block table padded with 0 to the longest; and that length, max_blocks."""
    _check_decode(token_ids, positions, slots, block_tables)
    flat = _decode_head(token_ids, positions, slots)
    max_blocks = max(map(len, block_tables))
    for table in block_tables:         # the padded tables go into the same list: one array for all
        flat += table
        if len(table) < max_blocks:
            flat += [0] * (max_blocks - len(table))
    return flat, max_blocks


class DecodeBuffers:
    """A decode step's inputs at fixed addresses, owned by a runner (`PagedLlama.decode_batch`): one int64 host
    buffer, and one on the device when that is not the CPU, written in place at every step; for each shape (B
    sequences, tables of max_blocks blocks) the tensors over it and the `StepBatch` holding them are made once. A
    step then makes no tensor: it writes one flat list into the host buffer (and copies it to the device in one
    call), where `StepBatch.decode` makes an array, a tensor and its views each time (each tensor call costs
    microseconds, more with the forward's data in the caches). Inputs that stay at one address are also what a
    captured CUDA graph replays from (vLLM keeps its step's inputs in persistent buffers for both reasons).

    The batch `batch(...)` returns is the buffers': the next call writes over it, so it is valid until then (the
    runner reads it in the same step). `StepBatch.decode` gives batches that share nothing. A step of a shape not
    seen before makes its views (about what `StepBatch.decode` costs); with `kv_layout="slab"`, whose tables grow by
    a block id every token, that is every step. The buffers and their views are inference tensors, made and copied
    into under `torch.inference_mode()`, whether or not the caller is in it.

        buffers = DecodeBuffers("cpu")
        batch = buffers.batch([11, 12], [40, 3], [70, 115], [[4, 2, 7], [9]])   # == StepBatch.decode(same)
    """

    def __init__(self, device: torch.device | str = "cpu", max_shapes: int = 256) -> None:
        self.device = torch.device(device)
        self.max_shapes = max_shapes
        # empty until the first shape, which makes them (in inference mode) at its size
        self._host = torch.zeros(0, dtype=torch.int64)
        self._device = None if self.device.type == "cpu" else torch.zeros(0, dtype=torch.int64, device=self.device)
        # (B, max_blocks) -> (the host buffer's first n entries as numpy, the host part as a tensor, the device part
        # or None, the StepBatch over it)
        self._shapes: dict[tuple[int, int], tuple[np.ndarray, torch.Tensor, torch.Tensor | None, StepBatch]] = {}

    @inference                  # the buffers are inference tensors, written only inside the mode
    def batch(self, token_ids: Sequence[int], positions: Sequence[int], slots: Sequence[int],
              block_tables: Sequence[Sequence[int]]) -> StepBatch:
        """The `StepBatch` of a decode step, equal to `StepBatch.decode` of the same lists, in the buffers."""
        flat, max_blocks = _decode_host(token_ids, positions, slots, block_tables)
        entry = self._shapes.get((len(token_ids), max_blocks))
        if entry is None:
            entry = self._shape(len(token_ids), max_blocks)
        host, host_tensor, on_device, batch = entry
        host[:] = flat                                  # numpy converts the list in place: no array, no tensor
        if on_device is not None:
            on_device.copy_(host_tensor)
        return batch

    def _shape(self, num_seqs: int, max_blocks: int) -> tuple:
        """The views and the StepBatch for one shape, made on its first step (the buffers grow, to twice the size,
        when it does not fit)."""
        size = num_seqs * (4 + max_blocks)
        if size > self._host.numel():
            capacity = max(size, 2 * self._host.numel())
            self._host = torch.zeros(capacity, dtype=torch.int64)
            if self._device is not None:
                self._device = torch.zeros(capacity, dtype=torch.int64, device=self.device)
            self._shapes.clear()             # batches made before keep the old buffers, which nothing writes again
        if len(self._shapes) >= self.max_shapes:
            self._shapes.clear()
        host_tensor = self._host[:size]
        flat = host_tensor if self._device is None else self._device[:size]
        input_ids, positions, slots, context_lens, tables = flat.split([num_seqs] * 4 + [num_seqs * max_blocks])
        rows, query_index, query_valid = _decode_rows(num_seqs, self.device)
        batch = StepBatch(input_ids, positions, slots, query_index, query_valid, positions.view(num_seqs, 1),
                          tables.view(num_seqs, max_blocks), context_lens, rows, rows)
        entry = (host_tensor.numpy(), host_tensor, None if self._device is None else flat, batch)
        self._shapes[(num_seqs, max_blocks)] = entry
        return entry


@functools.lru_cache(maxsize=64)
def _decode_rows(num_seqs: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What every decode batch of `num_seqs` sequences shares: `arange(B)` (flat token b is sequence b's query, its
    last token and its padded row), the same as the `[B, 1]` query index, and an all-True `[B, 1]` query mask."""
    rows = torch.arange(num_seqs, device=device)
    return rows, rows.view(num_seqs, 1), torch.ones(num_seqs, 1, dtype=torch.bool, device=device)
