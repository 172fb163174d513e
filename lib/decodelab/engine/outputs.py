"""What the engine tells its observers (the chapter's stepper, the server, metrics, benchmarks): one `StepOutput`
per step with a `TokenEvent` per new token, `EngineStats` over the run, `SequenceView` per unfinished sequence.

These are values: built after a step from the state the scheduler wrote, never written back.

    out = engine.step()
    out.kind == "decode"                       # a StepKind, a str enum: compares equal to its name
    [(e.request_id, e.sample_index, e.token_id) for e in out.events]
    [c.text for c in out.finished]             # the requests this step completed (they leave the engine)

Taught in: chapters/07-paged-attention.ipynb
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from decodelab.decoding.request import Completion, TokenLogprob
from decodelab.engine.scheduler import Schedule, StepKind
from decodelab.engine.speculation import SpeculativeStats

__all__ = ["EngineStats", "SequenceView", "StepKind", "StepOutput", "TokenEvent"]


class TokenEvent(NamedTuple):
    """One token a step produced for one sample of a request, for streaming: what a server sends as it happens.
    A named tuple, not a frozen dataclass: a step makes one per token, and a named tuple costs a third as much to
    build (immutable all the same; read its fields by name)."""
    request_id: int
    sample_index: int
    token_id: int
    logprob: TokenLogprob | None           # when the request asked for logprobs
    finish_reason: str | None              # set when this token ended the sample


@dataclass(frozen=True)
class EngineStats:
    num_blocks: int
    free_blocks: int
    preemptions: int
    prefix_cache_hit_tokens: int           # prompt tokens whose K/V came from the prefix cache
    prefill_tokens: int                    # tokens run through prefill (computed, not cached)
    decode_tokens: int
    kv_utilization: float                  # live tokens / allocated slots, mean over non-idle steps
    steps: int
    speculative: SpeculativeStats | None = None   # drafts, acceptance, tokens per target forward (with speculation)


@dataclass(frozen=True, kw_only=True)
class StepOutput:
    """What one `Engine.step()` did: the public observation API (the chapter's stepper, the server, metrics).
    `plan` is the scheduler's decision for the step (`decodelab.engine.scheduler.Schedule`: the scheduled sequences with their slots and
    prefix-cache hits, block copies, preemptions, forks). Built by keyword, or `StepOutput.idle(...)`."""
    kind: StepKind                         # "prefill" | "decode" | "idle"
    new_tokens: dict[int, int]             # seq_id -> last token appended this step (a speculative step may append
                                           # several: `events` has them all)
    preempted: tuple[int, ...]             # seq_ids sent back to the waiting queue
    finished: tuple[Completion, ...]       # requests completed this step
    block_tables: dict[int, list[int]]     # seq_id -> block ids, for every running sequence after the step
    live_tokens: int                       # slots holding a token's K/V (shared blocks counted once)
    allocated_slots: int                   # used blocks × block_size
    num_running: int                       # sequences holding blocks while the step ran
    num_waiting: int
    events: tuple[TokenEvent, ...] = ()    # the new tokens by request and sample, in batch order
    plan: Schedule | None = None
    drafts: dict[int, tuple[int, ...]] = field(default_factory=dict)   # seq_id -> drafts proposed (speculative step)
    accepted: dict[int, int] = field(default_factory=dict)             # seq_id -> how many of them the target kept

    @classmethod
    def idle(cls, num_waiting: int, plan: Schedule) -> StepOutput:
        """A step with nothing to run (no sequence running, none of the waiting fits)."""
        return cls(kind=StepKind.IDLE, new_tokens={}, preempted=(), finished=(), block_tables={}, live_tokens=0,
                   allocated_slots=0, num_running=0, num_waiting=num_waiting, plan=plan)


@dataclass(frozen=True)
class SequenceView:
    """An unfinished sequence as observers (the chapter's stepper, scripts, metrics) see it, without the engine's
    internals: `Engine.sequences()` lists them."""
    seq_id: int
    request_id: int
    sample_index: int
    status: str                            # "running" (holds blocks) or "waiting" (queued for a prefill)
    block_ids: tuple[int, ...]             # its block table (an extent's slots when kv_layout="slab")
    num_tokens: int                        # tokens whose K/V its blocks hold
    num_slots: int                         # slots its table holds (blocks × block_size, or the reservation)
    num_prompt_tokens: int
    num_output_tokens: int
    max_tokens: int
