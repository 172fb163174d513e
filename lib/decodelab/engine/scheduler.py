"""Which sequences run in the next step, and where their new tokens' K/V go.

The policy is nano-vllm's and vLLM's: a step is either a prefill (waiting sequences whose prompt, or whole
text after a preemption, fits in the free blocks and the token budget) or, when nothing waiting fits, a decode
step of every running sequence. When a decode step runs out of blocks, the newest running sequence is
preempted: its blocks are freed and it goes back to the front of the waiting queue, to be recomputed later.

With a `lookahead` rule (speculative decoding, `decodelab.engine.speculation`), a decode step also holds that many
empty slots past each sequence's token for the draft's proposals; `update_from_output` then appends several tokens
per sequence, up to the first that finishes it, and gives back the blocks only rejected drafts reached.

The scheduler reads K/V through `decodelab.kv.protocols`: the layout's `admit` says whether a waiting sequence fits
(touching nothing when it does not), its `decode_step_fits` whether the free blocks surely hold a decode token for
every running sequence (then the step is one pass, nobody asked), and otherwise each table's `can_append` whether
its token does. So the same policy runs
over a paged `BlockPool` + `BlockTable` and over the slab baseline, `FirstFitSlab` + `Reservation`
(`decodelab.kv.layout`), where admission means finding one free extent for the whole reservation.

Taught in: chapters/07-paged-attention.ipynb
"""
from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

import torch

from decodelab.decoding.detokenize import IncrementalDetokenizer
from decodelab.decoding.request import TokenLogprob
from decodelab.engine.sequence import SequenceState, Status
from decodelab.kv.protocols import KVLayout, KVTable
from decodelab.sampling.counter_rng import CounterRNG
from decodelab.sampling.params import SamplingParams


class StepKind(StrEnum):
    """What a step runs; a str enum, so `plan.kind == "prefill"` holds as it did when kinds were strings."""
    PREFILL = "prefill"
    DECODE = "decode"
    IDLE = "idle"


@dataclass(slots=True)
class ScheduledSeq:
    """One sequence's part of a step: the tokens it feeds the model and the KV slots they are written to. Made by
    the scheduler and only read after (slots and no freezing: one is built per sequence per step, and a frozen
    dataclass costs three times as much to build)."""
    seq: SequenceState
    token_ids: list[int]                      # new tokens (the whole uncached prompt for a prefill, else one)
    start: int                                # position of the first of them
    slots: list[int]                          # KV slot of each new token
    num_cached: int = 0                       # prompt tokens the prefix cache already held (prefill only)
    num_lookahead: int = 0                    # empty slots held after them for a speculative step's drafts


@dataclass(slots=True)
class Schedule:
    """The plan of one step, decided before the model runs and read by everything after it (only read: like
    `ScheduledSeq`, `Schedule`, `Drawn` and `StepUpdate` are not frozen, since one of each is built every step and a
    frozen dataclass costs four times as much to build).

    `scheduled` has one entry per model row; `samples` one (row, sequence) per token to draw: each scheduled
    sequence, and after a
    prefill the request's other n - 1 samples (`forks`), which share their prompt's blocks and draw from its row.
    """
    kind: StepKind
    scheduled: list[ScheduledSeq]
    copies: list[tuple[int, int]]              # (src, dst) blocks to copy before the forward (copy-on-write)
    preempted: list[SequenceState]
    forks: list[SequenceState] = field(default_factory=list)
    samples: list[tuple[int, SequenceState]] = field(default_factory=list)

    @property
    def seqs(self) -> list[SequenceState]:
        return [sched.seq for sched in self.scheduled]


@dataclass(slots=True)
class Drawn:
    """What the sampler (or a speculative round's verify) drew for a plan, one list per `plan.samples` entry: the
    tokens in order (one, or a round's kept drafts and the target's token) and each one's logprob (None when the
    request did not ask)."""
    tokens: list[list[int]]
    logprobs: list[list[TokenLogprob | None]]
    prompt_logprobs: dict[int, list[TokenLogprob | None]] | None = None   # seq_id -> per prompt token, from this
                                                                          # prefill (None: no request asked)


@dataclass(slots=True)
class StepUpdate:
    """What `update_from_output` wrote, per `plan.samples` entry: the tokens appended (a finish drops the rest),
    their logprobs, the finish reason (or None); and the requests whose every sample has now finished, each as its
    samples by index. Those requests have left the scheduler."""
    tokens: list[list[int]]
    logprobs: list[list[TokenLogprob | None]]
    reasons: list[str | None]
    finished: list[list[SequenceState]]


FinishRule = Callable[[SequenceState, int], "str | None"]
LookaheadRule = Callable[[SequenceState], int]


def no_lookahead(seq: SequenceState) -> int:
    """Without speculation a decode step holds no draft slots."""
    return 0


class Scheduler:
    """Waiting queue, running list, the requests in flight and the K/V layout they share; the only writer of request
    state. Each step is `schedule()` (the plan: who runs, where their K/V go, which blocks to copy, who was
    preempted, which samples fork) and, once the tokens are drawn, `update_from_output(plan, drawn)` (append them
    with their logprobs and grammar steps, finish sequences by `finish_rule`, free their blocks, complete requests).
    `lookahead(seq)` is how many draft slots a decode step holds for `seq` (speculative decoding; its tables must be
    `decodelab.kv.protocols.LookaheadTable`s).

    Example:
        scheduler = Scheduler(PagedLayout(num_blocks=64, block_size=16, max_model_len=256), max_num_seqs=8,
                              max_num_batched_tokens=2048, finish_rule=lambda seq, token: "stop" if token == 2 else None)
        scheduler.add(scheduler.new_sequence(0, prompt_ids, params, BlockTable(16), None))
        plan = scheduler.schedule()            # plan.kind == "prefill"
    Taught in: chapters/07-paged-attention.ipynb
    """

    def __init__(self, layout: KVLayout, max_num_seqs: int, max_num_batched_tokens: int,
                 finish_rule: FinishRule, lookahead: LookaheadRule = no_lookahead) -> None:
        self.layout = layout
        self.pool = layout.pool
        self.lookahead = lookahead
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.finish_rule = finish_rule
        self.waiting: deque[SequenceState] = deque()
        self.running: list[SequenceState] = []      # oldest first
        self.requests: dict[int, list[SequenceState]] = {}   # request id -> its samples so far, while unfinished
        self.num_preemptions = 0
        self.num_cached_tokens = 0
        self._seq_ids = itertools.count()

    def new_sequence(self, request_id: int, prompt_ids: list[int], params: SamplingParams, table: KVTable,
                     generator: torch.Generator | CounterRNG | None,
                     detokenizer: IncrementalDetokenizer | None = None,
                     quiet: tuple[frozenset[int], int] | None = None) -> SequenceState:
        """Sample 0 of a request (it forks the other n - 1 after its prefill). `detokenizer`: the output's text for
        the finish rule's stop strings (the forks get their own). `quiet`: what the finish rule guarantees (the
        tokens that may end the sequence, the length that ends it; `SequenceState.quiet`), so that the common step
        need not call it; None (the default) asks the rule at every token."""
        if quiet is not None and not (type(quiet) is tuple and len(quiet) == 2 and type(quiet[0]) is frozenset
                                      and type(quiet[1]) is int and quiet[1] >= 0):
            raise ValueError(f"quiet must be None or (frozenset of token ids, length >= 0), as "
                             f"decodelab.decoding.request.quiet_finish makes it, got {quiet!r:.100}")
        return SequenceState(next(self._seq_ids), request_id, 0, list(prompt_ids), len(prompt_ids), params, table,
                             generator, params.n - 1, detokenizer=detokenizer, quiet=quiet)

    def add(self, seq: SequenceState) -> None:
        """Queue a request's first sample; the request is in flight until all its samples finish or it is aborted."""
        if seq.request_id in self.requests:
            raise ValueError(f"request {seq.request_id} is already in flight")
        self.requests[seq.request_id] = [seq]
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- before the model runs -----------------------------------------------------------------------------
    def schedule(self) -> Schedule:
        prefill = self._schedule_prefill() if self.waiting else None
        if prefill:
            forks, samples = [], []
            for row, sched in enumerate(prefill):              # each prompt's samples draw from its row
                children = self._fork(sched.seq)
                forks += children
                samples += [(row, seq) for seq in (sched.seq, *children)]
            return Schedule(StepKind.PREFILL, prefill, [], [], forks, samples)
        if not self.running:
            return Schedule(StepKind.IDLE, [], [], [])
        return self._schedule_decode()

    def _schedule_prefill(self) -> list[ScheduledSeq]:
        """Admit waiting sequences in order while they fit. The layout's `admit` is asked first and takes nothing,
        so the one that does not fit leaves the free queue and the prefix cache as they were (vLLM's rule)."""
        scheduled: list[ScheduledSeq] = []
        num_tokens, width = 0, len(self.running)           # tokens admitted so far; sequences once they fork
        while self.waiting:
            seq = self.waiting[0]
            if width + seq.width > self.max_num_seqs:
                break
            fresh = seq.wants_prompt_logprobs          # the whole prompt runs: its logits are the prompt's logprobs
            cached = self.layout.admit(seq.table, seq.token_ids, use_prefix_cache=not fresh)
            if cached is None or (scheduled and num_tokens + len(seq.token_ids) - cached > self.max_num_batched_tokens):
                break
            if not fresh:
                seq.table.match_prefix(self.pool, seq.token_ids)
            new_tokens = seq.token_ids[cached:]
            slots, _ = seq.table.append(self.pool, new_tokens)
            self.num_cached_tokens += cached
            num_tokens += len(new_tokens)
            seq.status = Status.RUNNING
            width += seq.width
            scheduled.append(ScheduledSeq(self.waiting.popleft(), list(new_tokens), cached, slots, cached))
        self.running += [sched.seq for sched in scheduled]
        return scheduled

    def _fork(self, parent: SequenceState) -> list[SequenceState]:
        """Start the request's other samples on the parent's blocks (shared, copied on write)."""
        children = [parent.spawn(next(self._seq_ids), i, parent.table.fork(self.pool))
                    for i in range(1, parent.num_forks + 1)]
        parent.num_forks = 0
        self.running += children
        self.requests[parent.request_id] += children
        return children

    def _schedule_decode(self) -> Schedule:
        """Every running sequence feeds its last token, oldest first. When the layout says the free blocks cover
        them all (and no drafts need slots), nobody is preempted and no table need be asked: one pass, the running
        list unchanged. Otherwise each is asked in turn, and one that does not fit preempts the newest."""
        running = self.running
        if self.lookahead is no_lookahead and self.layout.decode_step_fits(len(running)):
            pool, copies = self.pool, []
            scheduled = []
            for seq in running:
                token_ids = seq.token_ids
                last = token_ids[-1]
                scheduled.append(ScheduledSeq(seq, [last], len(token_ids) - 1,
                                              [seq.table.append_token(pool, last, copies)]))
            return Schedule(StepKind.DECODE, scheduled, copies, [], [], list(enumerate(running)))
        queue = deque(running)
        scheduled: list[ScheduledSeq] = []
        preempted: list[SequenceState] = []
        copies: list[tuple[int, int]] = []
        pool, lookahead = self.pool, (None if self.lookahead is no_lookahead else self.lookahead)
        while queue:
            seq = queue.popleft()
            extra = lookahead(seq) if lookahead is not None else 0
            table = seq.table
            while not table.can_append(pool, 1 + extra):
                victim = queue.pop() if queue else seq      # the newest running sequence
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            else:
                last = seq.token_ids[-1]
                slot = table.append_token(pool, last, copies)
                if extra:
                    table.reserve(pool, extra)
                scheduled.append(ScheduledSeq(seq, [last], len(seq.token_ids) - 1, [slot], 0, extra))
        self.running = [sched.seq for sched in scheduled]
        samples = [(row, sched.seq) for row, sched in enumerate(scheduled)]
        return Schedule(StepKind.DECODE, scheduled, copies, preempted, [], samples)

    def _preempt(self, seq: SequenceState) -> None:
        seq.table.release(self.pool)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)           # the newest is preempted first, so older ones end up in front
        self.num_preemptions += 1

    # -- after the tokens are drawn ------------------------------------------------------------------------
    def update_from_output(self, plan: Schedule, drawn: Drawn) -> StepUpdate:
        """The one write of request state after the forward (nano-vllm's `postprocess`). For each sample of the
        plan, in order: append its drawn tokens (and push them to its detokenizer), stopping at the first that
        `finish_rule` ends it with (the tokens after it are dropped), with their logprobs; advance its grammar over every appended token but a finishing
        one. A finished sequence frees its blocks at once; one that goes on records a speculative round's kept
        drafts in its table (their K/V are written) and gives back the draft slots past them (the rollback).
        Requests whose every sample has finished leave the scheduler, in the order their first sample ended here."""
        if len(drawn.tokens) != len(plan.samples) or len(drawn.logprobs) != len(plan.samples):
            raise ValueError(f"update_from_output needs one token list and one logprob list per sample of the plan "
                             f"({len(plan.samples)}), got {len(drawn.tokens)} and {len(drawn.logprobs)}")
        if drawn.prompt_logprobs:
            for seq in plan.seqs:
                if seq.seq_id in drawn.prompt_logprobs:
                    seq.prompt_logprobs = list(drawn.prompt_logprobs[seq.seq_id])
        finish_rule, scheduled = self.finish_rule, plan.scheduled
        drafts_held = self.lookahead is not no_lookahead    # only then may a row hold draft slots
        appended, logprobs = drawn.tokens, drawn.logprobs   # what was drawn, copied only if a finish cuts a round
        reasons: list[str | None] = [None] * len(plan.samples)
        ended: dict[int, None] = {}                         # request ids with a sample that ended, in order
        for i, ((row, seq), tokens) in enumerate(zip(plan.samples, drawn.tokens)):
            if len(tokens) == 1 and not (drafts_held and scheduled[row].num_lookahead):   # the common step
                token = tokens[0]
                token_ids = seq.token_ids
                token_ids.append(token)
                if seq.detokenizer is not None:
                    seq.detokenizer.push(token)
                quiet = seq.quiet
                if quiet is not None and token not in quiet[0] and len(token_ids) < quiet[1]:
                    reason = None                           # what the rule would say, without the call
                else:
                    reason = finish_rule(seq, token)
                logprob = logprobs[i][0]
                if logprob is not None:
                    seq.logprobs.append(logprob)
                if reason is None:
                    if seq.grammar_state is not None:
                        seq.grammar_state.advance(token)
                    continue
            else:
                reason, kept = self._append_round(seq, tokens, logprobs[i], scheduled[row].num_lookahead)
                if kept < len(tokens):                      # a finish drops the drafts after it
                    if appended is drawn.tokens:
                        appended, logprobs = list(appended), list(logprobs)
                    appended[i], logprobs[i] = tokens[:kept], logprobs[i][:kept]
                if reason is None:
                    continue
            reasons[i] = reason
            self._finish(seq, reason)
            ended[seq.request_id] = None
        finished = [done for done in map(self._complete, ended) if done is not None] if ended else []
        return StepUpdate(appended, logprobs, reasons, finished)

    def _append_round(self, seq: SequenceState, tokens: list[int], token_logprobs: list[TokenLogprob | None],
                      num_lookahead: int) -> tuple[str | None, int]:
        """Append several tokens (a speculative round's kept drafts and the target's token) up to the first that
        finishes `seq`, with their logprobs and grammar steps; if it goes on, record them in its table and give back
        the draft slots past them. Returns the finish reason (or None) and how many tokens were kept."""
        reason, kept = None, 0
        detokenizer = seq.detokenizer
        for token in tokens:
            seq.token_ids.append(token)
            kept += 1
            if detokenizer is not None:
                detokenizer.push(token)
            reason = self.finish_rule(seq, token)
            if reason is not None:
                break
        token_logprobs = token_logprobs[:kept]
        if token_logprobs.count(None) != len(token_logprobs):
            seq.logprobs += [lp for lp in token_logprobs if lp is not None]
        if seq.grammar_state is not None:
            for token in tokens[:kept - 1] if reason is not None else tokens:
                seq.grammar_state.advance(token)
        if reason is None and num_lookahead:
            seq.table.append(self.pool, seq.token_ids[seq.table.num_tokens:-1])
            seq.table.trim(self.pool)
        return reason, kept

    def _finish(self, seq: SequenceState, reason: str) -> None:
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        seq.table.release(self.pool)
        self.running.remove(seq)

    def _complete(self, request_id: int) -> list[SequenceState] | None:
        """The request's samples by index if all n have finished (it leaves `requests`), else None."""
        seqs = self.requests[request_id]
        if len(seqs) < seqs[0].params.n or any(s.status is not Status.FINISHED for s in seqs):
            return None
        del self.requests[request_id]
        return sorted(seqs, key=lambda s: s.sample_index)

    def abort(self, request_id: int) -> None:
        """Drop every sample of the request wherever it is (waiting or running) and free its blocks; they end with
        reason "abort". KeyError if the request is not in flight."""
        for seq in self.requests.pop(request_id):
            if seq in self.running:
                self.running.remove(seq)
            elif seq in self.waiting:
                self.waiting.remove(seq)
            seq.table.release(self.pool)
            seq.status = Status.FINISHED
            seq.finish_reason = "abort"
