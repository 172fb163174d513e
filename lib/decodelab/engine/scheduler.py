"""Which sequences run in the next step, and where their new tokens' K/V go.

The policy is nano-vllm's and vLLM's: a step is either a prefill (waiting sequences whose prompt, or whole
text after a preemption, fits in the free blocks and the token budget) or, when nothing waiting fits, a decode
step of every running sequence. When a decode step runs out of blocks, the newest running sequence is
preempted: its blocks are freed and it goes back to the front of the waiting queue, to be recomputed later.

With a `lookahead` rule (speculative decoding, `decodelab.engine.speculation`), a decode step also holds that many
empty slots past each sequence's token for the draft's proposals; `postprocess` then appends several tokens per
sequence, up to the first that finishes it, and gives back the blocks only rejected drafts reached.

The scheduler asks each sequence's table whether its tokens fit (`can_append`), so the same policy runs over a
paged `BlockPool` + `BlockTable` and over the contiguous baseline, `FirstFitSlab` + `Reservation`
(`decodelab.kv.slab`), where admission means finding one free run for the whole reservation.

Taught in: chapters/07-paged-attention.ipynb
"""
from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import torch

from decodelab.kv.blocks import BlockPool, BlockTable
from decodelab.sampling.params import SamplingParams
from decodelab.sampling.sampler import make_generator, sample_seed


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
    logprobs: list = field(default_factory=list)   # engine.TokenLogprob per output token, when asked for
    grammar_state: object | None = None       # where params.grammar stands after the output (made on first use)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def width(self) -> int:
        """Sequences it will occupy once running (itself and the siblings it forks)."""
        return 1 + self.num_forks

    def spawn(self, seq_id: int, index: int, table: BlockTable) -> SequenceState:
        """Sample `index` of the same request, on `table` (a fork of this sequence's), with its own seed stream."""
        device = self.generator.device if self.generator is not None else "cpu"
        return SequenceState(seq_id, self.request_id, index, list(self.token_ids), self.num_prompt_tokens,
                             self.params, table, make_generator(sample_seed(self.params.seed, index), device),
                             status=Status.RUNNING)


@dataclass(frozen=True)
class ScheduledRun:
    """One sequence's part of a step: the tokens it feeds the model and the KV slots they are written to."""
    seq: SequenceState
    token_ids: list[int]                      # new tokens (the whole uncached prompt for a prefill, else one)
    start: int                                # position of the first of them
    slots: list[int]                          # KV slot of each new token
    num_cached: int = 0                       # prompt tokens the prefix cache already held (prefill only)
    num_lookahead: int = 0                    # empty slots held after them for a speculative step's drafts


@dataclass(frozen=True)
class Schedule:
    """The plan of one step, decided before the model runs and read by everything after it.

    `runs` has one entry per model row; `samples` one (row, sequence) per token to draw: each run, and after a
    prefill the request's other n - 1 samples (`forks`), which share their prompt's blocks and draw from its row.
    """
    kind: str                                  # "prefill" | "decode" | "idle"
    runs: list[ScheduledRun]
    copies: list[tuple[int, int]]              # (src, dst) blocks to copy before the forward (copy-on-write)
    preempted: list[SequenceState]
    forks: list[SequenceState] = field(default_factory=list)
    samples: list[tuple[int, SequenceState]] = field(default_factory=list)

    @property
    def seqs(self) -> list[SequenceState]:
        return [run.seq for run in self.runs]


FinishRule = Callable[[SequenceState, int], "str | None"]
LookaheadRule = Callable[[SequenceState], int]


class Scheduler:
    """Waiting queue, running list and the block pool they share. Each step is `schedule()` (the plan: who runs,
    where their K/V go, which blocks to copy, who was preempted, which samples fork) and, once the tokens are drawn,
    `postprocess(plan, tokens)` (append them, finish sequences by `finish_rule`, free their blocks).
    `lookahead(seq)`, when given, is how many draft slots a decode step holds for `seq` (speculative decoding).

    Example:
        scheduler = Scheduler(BlockPool(64, 16), max_num_seqs=8, max_num_batched_tokens=2048,
                              finish_rule=lambda seq, token: "stop" if token == 2 else None)
        scheduler.add(scheduler.new_sequence(0, prompt_ids, params, BlockTable(16), None))
        plan = scheduler.schedule()            # plan.kind == "prefill"
    Taught in: chapters/07-paged-attention.ipynb
    """

    def __init__(self, pool: BlockPool, max_num_seqs: int, max_num_batched_tokens: int,
                 finish_rule: FinishRule, lookahead: LookaheadRule | None = None) -> None:
        self.pool = pool
        self.lookahead = lookahead
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.finish_rule = finish_rule
        self.waiting: deque[SequenceState] = deque()
        self.running: list[SequenceState] = []      # oldest first
        self.num_preemptions = 0
        self.num_cached_tokens = 0
        self._seq_ids = itertools.count()

    def new_sequence(self, request_id: int, prompt_ids: list[int], params: SamplingParams, table: BlockTable,
                     generator: torch.Generator | None) -> SequenceState:
        """Sample 0 of a request (it forks the other n - 1 after its prefill)."""
        return SequenceState(next(self._seq_ids), request_id, 0, list(prompt_ids), len(prompt_ids), params, table,
                             generator, params.n - 1)

    def add(self, seq: SequenceState) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- before the model runs -----------------------------------------------------------------------------
    def schedule(self) -> Schedule:
        prefill = self._schedule_prefill()
        if prefill:
            forks, samples = [], []
            for row, run in enumerate(prefill):              # each prompt's samples draw from its row
                children = self._fork(run.seq)
                forks += children
                samples += [(row, seq) for seq in (run.seq, *children)]
            return Schedule("prefill", prefill, [], [], forks, samples)
        if not self.running:
            return Schedule("idle", [], [], [])
        return self._schedule_decode()

    def _schedule_prefill(self) -> list[ScheduledRun]:
        scheduled: list[ScheduledRun] = []
        num_tokens = 0
        while self.waiting:
            seq = self.waiting[0]
            if len(self.running) + sum(r.seq.width for r in scheduled) + seq.width > self.max_num_seqs:
                break
            cached = seq.table.match_prefix(self.pool, seq.token_ids)
            new_tokens = seq.token_ids[cached:]
            too_many = scheduled and num_tokens + len(new_tokens) > self.max_num_batched_tokens
            if too_many or not seq.table.can_append(self.pool, len(new_tokens)):
                seq.table.release(self.pool)
                break
            slots, _ = seq.table.append(self.pool, new_tokens)
            self.num_cached_tokens += cached
            num_tokens += len(new_tokens)
            seq.status = Status.RUNNING
            scheduled.append(ScheduledRun(self.waiting.popleft(), list(new_tokens), cached, slots, cached))
        self.running += [run.seq for run in scheduled]
        return scheduled

    def _fork(self, parent: SequenceState) -> list[SequenceState]:
        """Start the request's other samples on the parent's blocks (shared, copied on write)."""
        children = [parent.spawn(next(self._seq_ids), i, parent.table.fork(self.pool))
                    for i in range(1, parent.num_forks + 1)]
        parent.num_forks = 0
        self.running += children
        return children

    def _schedule_decode(self) -> Schedule:
        queue = deque(self.running)
        scheduled: list[ScheduledRun] = []
        preempted: list[SequenceState] = []
        copies: list[tuple[int, int]] = []
        while queue:
            seq = queue.popleft()
            extra = self.lookahead(seq) if self.lookahead is not None else 0
            while not seq.table.can_append(self.pool, 1 + extra):
                victim = queue.pop() if queue else seq      # the newest running sequence
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            else:
                start = len(seq.token_ids) - 1
                slots, seq_copies = seq.table.append(self.pool, seq.token_ids[-1:])
                if extra:
                    seq.table.reserve(self.pool, extra)
                copies += seq_copies
                scheduled.append(ScheduledRun(seq, seq.token_ids[-1:], start, slots, num_lookahead=extra))
        self.running = [run.seq for run in scheduled]
        samples = [(row, run.seq) for row, run in enumerate(scheduled)]
        return Schedule("decode", scheduled, copies, preempted, [], samples)

    def _preempt(self, seq: SequenceState) -> None:
        seq.table.release(self.pool)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)           # the newest is preempted first, so older ones end up in front
        self.num_preemptions += 1

    # -- after the tokens are drawn ------------------------------------------------------------------------
    def postprocess(self, plan: Schedule, tokens: list[list[int]]) -> tuple[list[list[int]], list[str | None]]:
        """Append each sample's drawn tokens (one list per `plan.samples`: one token, or a speculative step's kept
        drafts and the target's token) to its sequence in order, stopping at the first that `finish_rule` ends it
        with: the sequence is finished and its blocks freed at once, the tokens after it dropped. A sequence that
        goes on records the kept drafts in its table (their K/V are written) and gives back its draft slots past
        them (the rollback). Returns the tokens appended and the finish reason (or None) of each sample."""
        if len(tokens) != len(plan.samples):
            raise ValueError(f"postprocess needs one token list per sample of the plan ({len(plan.samples)}), "
                             f"got {len(tokens)}")
        appended, reasons = [], []
        for (row, seq), drawn in zip(plan.samples, tokens):
            reason, kept = None, []
            for token in drawn:
                seq.token_ids.append(token)
                kept.append(token)
                reason = self.finish_rule(seq, token)
                if reason is not None:
                    break
            if reason is not None:
                self._finish(seq, reason)
            elif plan.runs[row].num_lookahead:
                seq.table.append(self.pool, seq.token_ids[seq.table.num_tokens:-1])
                seq.table.trim(self.pool)
            appended.append(kept)
            reasons.append(reason)
        return appended, reasons

    def _finish(self, seq: SequenceState, reason: str) -> None:
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        seq.table.release(self.pool)
        self.running.remove(seq)

    def abort(self, seq: SequenceState) -> None:
        """Drop `seq` wherever it is (waiting or running) and free its blocks; it ends with reason "abort"."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.table.release(self.pool)
        seq.status = Status.FINISHED
        seq.finish_reason = "abort"
