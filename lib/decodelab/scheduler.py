"""Which sequences run in the next step, and where their new tokens' K/V go.

The policy is nano-vllm's and vLLM's: a step is either a prefill (waiting sequences whose prompt, or whole
text after a preemption, fits in the free blocks and the token budget) or, when nothing waiting fits, a decode
step of every running sequence. When a decode step runs out of blocks, the newest running sequence is
preempted: its blocks are freed and it goes back to the front of the waiting queue, to be recomputed later.

The scheduler asks each sequence's table whether its tokens fit (`can_append`), so the same policy runs over a
paged `BlockPool` + `BlockTable` and over the contiguous baseline, `FirstFitSlab` + `Reservation`
(`decodelab.contiguous`), where admission means finding one free run for the whole reservation.

Taught in: chapters/07-paged-attention.ipynb
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

import torch

from decodelab.paged import BlockPool, BlockTable
from decodelab.sampling import SamplingParams


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class SequenceState:
    """One stream of tokens: a request's prompt plus one sample's output."""
    seq_id: int
    request_id: int
    sample_index: int                         # i of n; a seeded request's sample i uses sample_seed(seed, i)
    token_ids: list[int]                      # prompt + generated so far
    num_prompt_tokens: int
    params: SamplingParams
    table: BlockTable
    generator: torch.Generator | None = None
    num_forks: int = 0                        # siblings to fork off once the prompt is prefilled (n - 1)
    status: Status = Status.WAITING
    finish_reason: str | None = None
    new_slots: list[int] = field(default_factory=list)   # slots of this step's new tokens
    num_cached_tokens: int = 0                # tokens of this step's prefill served by the prefix cache
    logprobs: list = field(default_factory=list)   # engine.TokenLogprob per output token, when asked for

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def width(self) -> int:
        """Sequences it will occupy once running (itself and the siblings it forks)."""
        return 1 + self.num_forks


@dataclass(frozen=True)
class Schedule:
    """The plan of one step: prefill or decode, the sequences in it, KV block copies, who was preempted."""
    kind: str                                  # "prefill" | "decode" | "idle"
    seqs: list[SequenceState]
    copies: list[tuple[int, int]]              # (src, dst) blocks to copy before the step (copy-on-write)
    preempted: list[SequenceState]


class Scheduler:
    """Waiting queue, running list and the block pool they share.

    Example:
        scheduler = Scheduler(BlockPool(64, 16), max_num_seqs=8, max_num_batched_tokens=2048)
        scheduler.add(seq); plan = scheduler.schedule()   # plan.kind == "prefill"
    Taught in: chapters/07-paged-attention.ipynb
    """

    def __init__(self, pool: BlockPool, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.pool = pool
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[SequenceState] = deque()
        self.running: list[SequenceState] = []      # oldest first
        self.num_preemptions = 0
        self.num_cached_tokens = 0

    def add(self, seq: SequenceState) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> Schedule:
        prefill = self._schedule_prefill()
        if prefill:
            return Schedule("prefill", prefill, [], [])
        if not self.running:
            return Schedule("idle", [], [], [])
        return self._schedule_decode()

    def _schedule_prefill(self) -> list[SequenceState]:
        scheduled: list[SequenceState] = []
        num_tokens = 0
        while self.waiting:
            seq = self.waiting[0]
            if len(self.running) + sum(s.width for s in scheduled) + seq.width > self.max_num_seqs:
                break
            cached = seq.table.match_prefix(self.pool, seq.token_ids)
            new_tokens = seq.token_ids[cached:]
            too_many = scheduled and num_tokens + len(new_tokens) > self.max_num_batched_tokens
            if too_many or not seq.table.can_append(self.pool, len(new_tokens)):
                seq.table.release(self.pool)
                break
            seq.new_slots, _ = seq.table.append(self.pool, new_tokens)
            seq.num_cached_tokens = cached
            self.num_cached_tokens += cached
            num_tokens += len(new_tokens)
            seq.status = Status.RUNNING
            scheduled.append(self.waiting.popleft())
        self.running += scheduled
        return scheduled

    def _schedule_decode(self) -> Schedule:
        queue = deque(self.running)
        scheduled: list[SequenceState] = []
        preempted: list[SequenceState] = []
        copies: list[tuple[int, int]] = []
        while queue:
            seq = queue.popleft()
            while not seq.table.can_append(self.pool, 1):
                victim = queue.pop() if queue else seq      # the newest running sequence
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            else:
                seq.new_slots, seq_copies = seq.table.append(self.pool, seq.token_ids[-1:])
                seq.num_cached_tokens = 0
                copies += seq_copies
                scheduled.append(seq)
        self.running = scheduled
        return Schedule("decode", scheduled, copies, preempted)

    def _preempt(self, seq: SequenceState) -> None:
        seq.table.release(self.pool)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)           # the newest is preempted first, so older ones end up in front
        self.num_preemptions += 1

    def fork(self, parent: SequenceState, child: SequenceState) -> None:
        """Start `child` running on `parent`'s blocks (shared, copied on write)."""
        child.table = parent.table.fork(self.pool)
        child.status = Status.RUNNING
        self.running.append(child)

    def abort(self, seq: SequenceState) -> None:
        """Drop `seq` wherever it is (waiting or running) and free its blocks; it ends with reason "abort"."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.table.release(self.pool)
        seq.status = Status.FINISHED
        seq.finish_reason = "abort"

    def finish(self, seq: SequenceState, reason: str) -> None:
        """Free a finished sequence's blocks at once, so the next step can use them."""
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        seq.table.release(self.pool)
        self.running.remove(seq)
