"""A request's state inside the engine: one `SequenceState` per sample, in a module of its own (nano-vllm's
`engine/sequence.py`).

The scheduler is its only writer: `Scheduler.schedule` moves it between the waiting queue and the running list and
gives it slots; `Scheduler.update_from_output` appends its tokens, logprobs, grammar steps and text (a request with
stop strings holds an `IncrementalDetokenizer`, so the finish rule never decodes the whole output) and finishes it.
Everything else (the sampler, the speculator, observers) reads it.

    seq.token_ids[:seq.num_prompt_tokens]    # the prompt
    seq.output_token_ids                     # what this sample generated so far
    seq.status, seq.finish_reason            # Status.WAITING / RUNNING / FINISHED, and why it finished

Taught in: chapters/07-paged-attention.ipynb
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import torch

from decodelab.decoding.detokenize import IncrementalDetokenizer, sample_detokenizer
from decodelab.kv.protocols import KVTable
from decodelab.sampling.params import SamplingParams
from decodelab.sampling.counter_rng import CounterRNG
from decodelab.sampling.sampler import make_generator, sample_seed


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False, slots=True, weakref_slot=True)
class SequenceState:
    """One stream of tokens: a request's prompt plus one sample's output. Slotted, since the scheduler reads every
    running one on every step (the weak-reference slot serves the speculator's per-sequence draft lengths)."""
    seq_id: int
    request_id: int
    sample_index: int                         # i of n; a seeded request's sample i uses sample_seed(seed, i)
    token_ids: list[int]                      # prompt + generated so far
    num_prompt_tokens: int
    params: SamplingParams
    table: KVTable
    generator: torch.Generator | CounterRNG | None = None
    num_forks: int = 0                        # siblings to fork off once the prompt is prefilled (n - 1)
    status: Status = Status.WAITING
    finish_reason: str | None = None
    logprobs: list = field(default_factory=list)   # decoding.request.TokenLogprob per output token, when asked for
    grammar_state: object | None = None       # where params.grammar stands after the output (None without one)
    detokenizer: IncrementalDetokenizer | None = None   # the output's text as it grows, with stop strings only
    prompt_logprobs: list | None = None       # per prompt token (None first), once computed, when asked for
    # (the tokens that may end it, the length that ends it) when its finish rule is that simple (no stop strings):
    # below that length any other token leaves it running, so the scheduler need not ask the rule; None: always ask
    quiet: tuple[frozenset[int], int] | None = None

    def __post_init__(self) -> None:
        if self.grammar_state is None and self.params.grammar is not None:
            self.grammar_state = self.params.grammar.start()

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Whether its next prefill must compute the prompt's log-probabilities (asked for, not yet computed; a
        request's sample 0 holds them for all n): that prefill runs the whole prompt, with no prefix-cache hit (vLLM's
        rule)."""
        return self.params.prompt_logprobs is not None and self.prompt_logprobs is None and self.sample_index == 0

    @property
    def width(self) -> int:
        """Sequences it will occupy once running (itself and the siblings it forks)."""
        return 1 + self.num_forks

    def spawn(self, seq_id: int, index: int, table: KVTable) -> SequenceState:
        """Sample `index` of the same request, on `table` (a fork of this sequence's), with its own seed stream.
        Forks happen at the prompt's prefill, before any output, so the sibling starts with none."""
        device = self.generator.device if self.generator is not None else "cpu"
        rng = "counter" if isinstance(self.generator, CounterRNG) else "torch"   # an unseeded counter stream: a new seed
        detokenizer = (None if self.detokenizer is None
                       else sample_detokenizer(self.detokenizer.tokenizer, self.params))
        return SequenceState(seq_id, self.request_id, index, list(self.token_ids), self.num_prompt_tokens,
                             self.params, table, make_generator(sample_seed(self.params.seed, index), device, rng),
                             status=Status.RUNNING, detokenizer=detokenizer, quiet=self.quiet)
