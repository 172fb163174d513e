"""A continuous-batching engine over the paged KV cache, vLLM's design in plain PyTorch.

Requests join between steps and leave the moment they finish: a finished request is reported once, in the
`StepOutput.finished` of its last step, and the engine keeps nothing of it. Each step is a prefill or a decode of
every running sequence (see `decodelab.engine.scheduler`); blocks that run out trigger preemption by recompute; full
prompt blocks are reused through the prefix cache; n > 1 samples fork the prompt's blocks (copy-on-write).

`Engine.step` is one pipeline, top to bottom:
  plan (`Scheduler.schedule`) -> propose (the speculator; `NoSpeculation` proposes nothing) -> execute (`PagedLlama.execute`)
  -> draw (`TokenDrawer`: masks, sampling, logprobs; or the speculator's verify) -> `Scheduler.update_from_output`
  (the one write of request state) -> the `StepOutput`, built from that state without side effects.

The keywords become an `EngineConfig` (`decodelab.engine.config`), checked once. `kv_layout` picks a
`decodelab.kv.layout` strategy: "paged", or "slab", the baseline paging replaced (one slab of the same number
of slots, each request reserving one extent of prompt + max_tokens, or max_model_len, slots at admission, first fit);
scheduler and model stay the same.
`speculative=SpeculativeConfig(draft, gamma)` makes every decode step a speculative round per sequence: a draft model
(its K/V in the same block pool) or the n-gram draft proposes up to gamma tokens, the target judges them in one
forward, rejected drafts' slots are rolled back (`decodelab.engine.speculation`): a strategy of the same step.
Sampling is `decodelab.sampling.sampler.sample` with one `SamplingParams` per row, so greedy and random requests share
a batch. A seeded request keeps one generator per sample (sample i of n draws from `sample_seed(seed, i)`), so its
tokens do not depend on what else is in the batch.

    engine = Engine(hf_model, tokenizer)
    [c] = engine.generate(["从前"], SamplingParams(temperature=0, max_tokens=20))
    c.text, c.finish_reason, engine.stats.kv_utilization

    request = engine.check_request("小明", SamplingParams(max_tokens=8))   # checked once: a CheckedRequest
    engine.add_request(request)                                          # queued without a second check

Taught in: chapters/07-paged-attention.ipynb
"""
from __future__ import annotations

import dataclasses
import itertools
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from decodelab.decoding.detokenize import sample_detokenizer
from decodelab.decoding.request import (Completion, check_vocabulary_ids, eos_token_ids, finish_reason, output_text,
                                        prompt_token_ids, quiet_finish, text_decoder, with_bad_word_ids)
from decodelab.engine.config import EngineConfig, kv_memory_limit
from decodelab.engine.draw import TokenDrawer
from decodelab.engine.outputs import EngineStats, SequenceView, StepKind, StepOutput, TokenEvent
from decodelab.engine.scheduler import Drawn, Schedule, Scheduler, StepUpdate
from decodelab.engine.sequence import SequenceState
from decodelab.engine.speculation import Drafts, SpeculativeConfig, make_speculator
from decodelab.kv.contiguous_cache import kv_bytes_per_token
from decodelab.kv.layout import make_layout
from decodelab.runner.model import PagedLlama
from decodelab.sampling.counter_rng import DEFAULT_RNG
from decodelab.sampling.sampler import SamplingParams, make_generator
from decodelab.validation import ParamError, check_model

__all__ = ["CheckedRequest", "Engine", "EngineConfig", "EngineStats", "SequenceView", "StepKind", "StepOutput",
           "TokenEvent"]


_SEQ_ID, _BLOCK_IDS = operator.attrgetter("seq_id"), operator.attrgetter("table.block_ids")


@dataclass(frozen=True)
class CheckedRequest:
    """A request an engine has accepted (`Engine.check_request`): its prompt's token ids and its params.
    `Engine.add_request` (and `AsyncEngine.submit`) queue it without checking it again; only the engine that checked
    it takes it."""
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    checked_for: EngineConfig = field(repr=False, compare=False)


class Engine:
    """Serve many requests at once from a transformers Llama/Qwen2 causal LM over a paged KV cache.

    num_blocks defaults to what max_num_seqs sequences of full context need, capped at 1 GiB of K/V.
    attention: "torch" (the reference, any device) or "triton" (decode steps by the Triton kernel; CUDA).
    kv_layout: "paged" (blocks of `block_size`) or "slab" (one slab of num_blocks × block_size slots, one extent
    per request, first fit; `reserve` sizes the extent: "max_tokens" = prompt + max_tokens, "max_model_len" = the
    model's context). The slab layout shares nothing: no prefix caching, n must be 1.
    speculative: a `SpeculativeConfig` for speculative decoding (paged layout only; `decodelab.engine.speculation`).
    rng: "torch" (a torch.Generator per seeded sample, Exponential noise over the vocabulary; the book's streams) or
    "counter" (every sample a `CounterRNG`, one hashed uniform per token by the inverse CDF, drawn for the whole
    batch in one call; the same distributions, other tokens for the same seed; `decodelab.sampling.counter_rng`).
    Taught in: chapters/07-paged-attention.ipynb
    """

    def __init__(self, model, tokenizer=None, block_size: int = 16, num_blocks: int | None = None,
                 max_num_seqs: int = 32, max_num_batched_tokens: int | None = None,
                 enable_prefix_caching: bool = True, attention: str = "torch", kv_layout: str = "paged",
                 reserve: str = "max_tokens", speculative: SpeculativeConfig | None = None,
                 rng: str = DEFAULT_RNG) -> None:
        check_model(model, "Engine(model, tokenizer, ...)")         # None, or the arguments swapped
        self.runner = PagedLlama(model, attention)                 # checks `attention`
        self.speculator = make_speculator(speculative, self.runner)  # checks `speculative` against the target
        self.tokenizer = tokenizer
        self.max_model_len = self.runner.max_model_len
        self.config = EngineConfig(
            max_model_len=self.max_model_len,
            kv_bytes_per_token=kv_bytes_per_token(model.config, self.runner.dtype) + self.speculator.kv_bytes_per_token,
            kv_memory_limit=kv_memory_limit(self.runner.device), block_size=block_size, num_blocks=num_blocks,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            enable_prefix_caching=enable_prefix_caching, kv_layout=kv_layout, reserve=reserve, speculative=speculative,
            rng=rng)
        config = self.config
        self.layout = make_layout(config.kv_layout, config.num_blocks, config.block_size, self.max_model_len,
                                  config.enable_prefix_caching, config.reserve)
        self.kv_cache = self.runner.allocate_kv_cache(self.pool.num_blocks, self.block_size)  # [L, 2, blocks, block_size, KVH, D]
        self.speculator.allocate_kv_cache(self.pool.num_blocks, self.block_size)
        self.scheduler = Scheduler(self.layout, config.max_num_seqs, config.max_num_batched_tokens,
                                   self._finish_reason, self.speculator.lookahead)
        self.eos_token_ids = eos_token_ids(model, tokenizer)
        self.drawer = TokenDrawer(self.runner.device, self.eos_token_ids)   # EOS: masked until min_tokens
        self._decode = text_decoder(tokenizer)
        self._request_ids = itertools.count()
        self._steps = self._prefill_tokens = self._decode_tokens = 0
        self._utilization_sum = 0.0

    @property
    def pool(self):
        """The layout's allocator: a `BlockPool` (paged) or a `FirstFitSlab` (slab)."""
        return self.layout.pool

    @property
    def block_size(self) -> int:
        """Slots per block as the forward addresses them (1 for the slab layout)."""
        return self.layout.block_size

    # -- requests ------------------------------------------------------------------------------------------
    def _prompt_ids(self, prompt, name: str) -> list[int]:
        return prompt_token_ids(prompt, self.tokenizer, name, self.runner.vocab_size, self.max_model_len)

    def _checked(self, prompt_ids: list[int], params, name: str) -> CheckedRequest:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params for {name} must be a SamplingParams, got {type(params).__name__}")
        params = with_bad_word_ids(params, self.tokenizer, name)      # bad_words -> token ids, once
        check_vocabulary_ids(params, self.runner.vocab_size, name)   # stop_token_ids, logit_bias, allowed, bad words
        if params.grammar is not None and params.grammar.vocab_size > self.runner.vocab_size:
            raise ParamError("grammar", f"the grammar for {name} masks {params.grammar.vocab_size} tokens, more than "
                                        f"the model's vocabulary of {self.runner.vocab_size}")
        if params.stop and self.tokenizer is None:
            raise ParamError("stop", f"stop strings for {name} need text: give the engine a tokenizer, or use "
                                     f"stop_token_ids")
        self.speculator.check_params(params, name)
        if params.n > self.config.max_num_seqs:
            raise ParamError("n", f"n for {name} is {params.n}, more than max_num_seqs={self.config.max_num_seqs}")
        self.layout.check_fits(len(prompt_ids), params.max_tokens, params.n, name)
        return CheckedRequest(tuple(prompt_ids), params, self.config)

    def check_request(self, prompt, params: SamplingParams, name: str = "prompt") -> CheckedRequest:
        """The request as a `CheckedRequest` (its prompt's token ids and params) if this engine can serve it;
        otherwise ParamError (a ValueError naming the field: the prompt, `n`, `max_tokens`, `stop`, ...) or
        TypeError. Reads the engine's configuration only, so a server may call it while a step runs."""
        return self._checked(self.check_prompt(prompt, name), params, name)

    def check_prompt(self, prompt, name: str = "prompt") -> list[int]:
        """The first half of `check_request`: the prompt's token ids (a string tokenized), checked against the
        vocabulary and the context. For a caller whose params depend on the prompt (a server's default
        max_tokens is what the context leaves): `check_params(check_prompt(p), params)` checks each part once."""
        return self._prompt_ids(prompt, name)

    def check_params(self, prompt_ids: list[int], params: SamplingParams, name: str = "prompt") -> CheckedRequest:
        """The second half of `check_request`, for `prompt_ids` that `check_prompt` returned (they are not checked
        again): the params against this engine (vocabulary ids, grammar, stop strings, speculation, n, the KV it
        would need)."""
        return self._checked(prompt_ids, params, name)

    def add_request(self, prompt, params: SamplingParams | None = None) -> int:
        """Queue a request and return its id; it joins the batch at the next step. `prompt` is a string or token ids
        (checked here, with `params`), or a `CheckedRequest` from this engine's `check_request` (not checked again)."""
        if isinstance(prompt, CheckedRequest):
            if params is not None:
                raise TypeError("a CheckedRequest carries its params: pass it alone, add_request(request)")
            if prompt.checked_for is not self.config:
                raise ValueError("this CheckedRequest was checked by another engine; check it with this one")
            return self._add(prompt)
        params = SamplingParams() if params is None else params
        return self._add(self.check_request(prompt, params))

    def _add(self, request: CheckedRequest) -> int:
        request_id = next(self._request_ids)
        params = request.params
        table = self.layout.new_table(len(request.prompt_ids), params.max_tokens)
        detokenizer = sample_detokenizer(self.tokenizer, params) if params.stop else None
        seq = self.scheduler.new_sequence(request_id, list(request.prompt_ids), params, table,
                                          make_generator(params.seed, self.runner.device, self.config.rng),
                                          detokenizer, self._quiet(params, len(request.prompt_ids)))
        self.scheduler.add(seq)
        return request_id

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def sequences(self) -> list[SequenceView]:
        """Every unfinished sequence: the running ones (oldest first), then the waiting queue in order."""
        def view(seq: SequenceState) -> SequenceView:
            return SequenceView(seq.seq_id, seq.request_id, seq.sample_index, seq.status.value,
                                tuple(seq.table.block_ids), seq.table.num_tokens, seq.table.num_slots,
                                seq.num_prompt_tokens, len(seq.output_token_ids), seq.params.max_tokens)
        return [view(s) for s in (*self.scheduler.running, *self.scheduler.waiting)]

    @property
    def max_num_seqs(self) -> int:
        return self.config.max_num_seqs

    @property
    def num_waiting(self) -> int:
        """Sequences queued for a prefill (new, or preempted and to be recomputed)."""
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        """Sequences holding KV blocks."""
        return len(self.scheduler.running)

    def abort(self, request_id: int) -> None:
        """Stop a request that has not finished (all its samples) and free its blocks at once.

        Raises KeyError for an id that is unknown, aborted or already finished (reported in a StepOutput)."""
        if request_id not in self.scheduler.requests:
            raise KeyError(f"request {request_id!r} is not in flight (unknown, aborted or finished; a finished "
                           f"request is reported once, in the StepOutput.finished of its last step)")
        self.scheduler.abort(request_id)

    # -- one step ------------------------------------------------------------------------------------------
    def step(self) -> StepOutput:
        """One iteration, top to bottom: the scheduler plans it, the speculator proposes drafts (none without
        speculation), the runner runs the model, the step draws its tokens (sampling, or verifying drafts), the
        scheduler writes them back, and the output is read off the result. Everything about where K/V go is
        decided before the model runs (`plan`). The whole step runs in `torch.inference_mode()`, entered once: no
        tensor it makes leaves it (the output holds Python numbers)."""
        with torch.inference_mode():
            return self._step()

    def _step(self) -> StepOutput:
        plan = self.scheduler.schedule()              # who runs, their slots, block copies, preemptions, forks
        if plan.kind is StepKind.IDLE:
            self.drawer.forget()                      # nothing runs: let the last batch's sequences go
            return StepOutput.idle(self.num_waiting, plan)
        drafts = self.speculator.propose(plan, self.drawer)   # per scheduled sequence: drafts into the held slots
        wanted = ([i for i, sched in enumerate(plan.scheduled) if sched.seq.wants_prompt_logprobs]
                  if plan.kind is StepKind.PREFILL else [])
        if wanted:   # the same one forward also gives the prompts' logits (prompt_logprobs, echo)
            logits, prompt_logits = self.runner.execute_with_prompt_logits(plan, self.kv_cache, wanted)
        else:
            logits = self.runner.execute(plan, self.kv_cache, drafts.tokens)   # [rows, V]; the copies, then one forward
        holding = self._account(plan)                 # (live slots, allocated slots, sequences holding blocks)
        drawn = self.speculator.draw(plan, drafts, logits, self.drawer)   # per sample: tokens and logprobs
        if wanted:
            seqs = [plan.scheduled[i].seq for i in wanted]
            drawn = dataclasses.replace(drawn, prompt_logprobs={
                seq.seq_id: self.drawer.prompt_logprobs(rows, seq) for seq, rows in zip(seqs, prompt_logits)})
        update = self.scheduler.update_from_output(plan, drawn)          # the one write of request state
        self.speculator.record(drafts, update)
        if not self.scheduler.running:
            self.drawer.forget()                      # the last sequences finished: the drawer holds none of them
        return self._step_output(plan, drafts, drawn, update, *holding)

    def _account(self, plan: Schedule) -> tuple[int, int, int]:
        """Count the step's tokens; return, as the model ran, the slots holding live K/V, the slots allocated and
        the sequences holding blocks."""
        layout = self.layout
        pool = layout.pool
        live, allocated = pool.filled_slots(), pool.num_used_blocks * layout.block_size
        self._steps += 1
        self._utilization_sum += live / allocated
        if plan.kind is StepKind.PREFILL:
            self._prefill_tokens += sum(len(sched.token_ids) for sched in plan.scheduled)
        else:
            self._decode_tokens += len(plan.scheduled)            # a decode step feeds one token per sequence
        return live, allocated, len(self.scheduler.running)

    def _step_output(self, plan: Schedule, drafts: Drafts, drawn: Drawn, update: StepUpdate, live: int,
                     allocated: int, num_running: int) -> StepOutput:
        """The step's StepOutput, read from the plan, the update and the scheduler's state; writes nothing. A
        sample's finish reason belongs to the last token it appended."""
        events, new_tokens = [], {}
        for (_, seq), tokens, logprobs, reason in zip(plan.samples, update.tokens, update.logprobs, update.reasons):
            new_tokens[seq.seq_id] = tokens[-1]
            if len(tokens) == 1:                       # the common step: one token per sample
                events.append(TokenEvent(seq.request_id, seq.sample_index, tokens[0], logprobs[0], reason))
                continue
            last = len(tokens) - 1
            events += [TokenEvent(seq.request_id, seq.sample_index, token, logprob, reason if i == last else None)
                       for i, (token, logprob) in enumerate(zip(tokens, logprobs))]
        proposed, accepted = drafts.by_sequence(plan, drawn)
        running = self.scheduler.running
        return StepOutput(
            kind=plan.kind, new_tokens=new_tokens, preempted=tuple(s.seq_id for s in plan.preempted),
            finished=tuple(map(self._completion, update.finished)),
            # each running table's block ids as a new list (the tables change after the step), by C-level maps
            block_tables=dict(zip(map(_SEQ_ID, running), map(list, map(_BLOCK_IDS, running)))), live_tokens=live,
            allocated_slots=allocated, num_running=num_running, num_waiting=self.num_waiting, events=tuple(events),
            plan=plan, drafts=proposed, accepted=accepted)

    def _finish_reason(self, seq: SequenceState, token: int) -> str | None:
        """The finish rule, on `seq` with `token` just appended (and pushed to its detokenizer, which holds the
        output's text when the request has stop strings)."""
        num_tokens = len(seq.token_ids)
        return finish_reason(seq.params, token, num_tokens - seq.num_prompt_tokens, num_tokens, self.eos_token_ids,
                             self.max_model_len, seq.detokenizer)

    def _quiet(self, params: SamplingParams, num_prompt_tokens: int) -> tuple[frozenset[int], int] | None:
        """What `_finish_reason` guarantees (`decodelab.decoding.request.quiet_finish`; `SequenceState.quiet`)."""
        return quiet_finish(params, num_prompt_tokens, self.eos_token_ids, self.max_model_len)

    def _completion(self, seqs: list[SequenceState]) -> Completion:
        """A finished request's Completion from its samples (by index): sample 0's fields, and all n as `samples`."""
        request_id = seqs[0].request_id
        samples = [Completion(request_id, s.token_ids[:s.num_prompt_tokens], s.output_token_ids,
                              output_text(s.output_token_ids, s.params, self._decode), s.finish_reason,
                              logprobs=tuple(s.logprobs) if s.params.logprobs is not None else None)
                   for s in seqs]
        first = samples[0]
        prompt_logprobs = None if seqs[0].prompt_logprobs is None else tuple(seqs[0].prompt_logprobs)
        return Completion(request_id, first.prompt_token_ids, first.token_ids, first.text, first.finish_reason,
                          tuple(samples) if len(samples) > 1 else (), first.logprobs, prompt_logprobs)

    # -- whole runs ----------------------------------------------------------------------------------------
    def generate(self, prompts, params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[Completion]:
        """Complete every prompt (strings need a tokenizer) and return one Completion per prompt, in order.

        All prompts are checked before any is queued: bad input raises ValueError/TypeError and leaves the
        engine (and requests already in flight, which keep running) untouched. Requests queued before with
        `add_request` step along; one that finishes meanwhile is reported in a step output this call consumes.
        """
        if isinstance(prompts, str) or not isinstance(prompts, Sequence) or not prompts:
            raise ValueError(f"prompts must be a non-empty list of strings or token-id lists, got {prompts!r}")
        params = SamplingParams() if params is None else params
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        elif not isinstance(params, Sequence) or len(params) != len(prompts):
            raise ValueError(f"params must be one SamplingParams or one per prompt ({len(prompts)}), got "
                             f"{len(params) if isinstance(params, Sequence) else type(params).__name__}")
        prompt_ids = [self._prompt_ids(p, f"prompts[{i}]") for i, p in enumerate(prompts)]
        checked = [self._checked(ids, p, f"prompts[{i}]") for i, (ids, p) in enumerate(zip(prompt_ids, params))]
        request_ids = [self._add(request) for request in checked]
        done: dict[int, Completion] = dict.fromkeys(request_ids)
        try:
            pending = len(request_ids)
            while pending:
                for completion in self.step().finished:
                    if completion.request_id in done:
                        done[completion.request_id] = completion
                        pending -= 1
        except BaseException:  # Ctrl-C or an error mid-run: leave no request of this call running into the next
            for r in request_ids:
                if r in self.scheduler.requests:
                    self.abort(r)
            raise
        return [done[r] for r in request_ids]

    @property
    def stats(self) -> EngineStats:
        return EngineStats(self.pool.num_blocks, self.pool.num_free_blocks, self.scheduler.num_preemptions,
                           self.scheduler.num_cached_tokens, self._prefill_tokens, self._decode_tokens,
                           self._utilization_sum / max(self._steps, 1), self._steps, self.speculator.stats)
