"""A continuous-batching engine over the paged KV cache, vLLM's design in plain PyTorch.

Requests join between steps and leave the moment they finish; each step is a prefill or a decode of every
running sequence (see `decodelab.engine.scheduler`); blocks that run out trigger preemption by recompute; full
prompt blocks are reused through the prefix cache; n > 1 samples fork the prompt's blocks (copy-on-write).
`kv_layout="contiguous"` swaps the block pool for the baseline paging replaced (`decodelab.kv.slab`): one slab
of the same number of slots, each request reserving one run of prompt + max_tokens (or max_model_len) slots at
admission, first fit; scheduler and model stay the same.
`speculative=SpeculativeConfig(draft, gamma)` makes every decode step a speculative round per sequence: a draft model
(its K/V in the same block pool) or the n-gram draft proposes up to gamma tokens, the target judges them in one
forward, rejected drafts' slots are rolled back (`decodelab.engine.speculation`).
Sampling is `decodelab.sampling.sampler.sample` with one `SamplingParams` per row, so greedy and random requests share
a batch. A seeded request keeps one generator per sample (sample i of n draws from `sample_seed(seed, i)`), so its
tokens do not depend on what else is in the batch.

    engine = Engine(hf_model, tokenizer)
    [c] = engine.generate(["从前"], SamplingParams(temperature=0, max_tokens=20))
    c.text, c.finish_reason, engine.stats.kv_utilization

Taught in: chapters/07-paged-attention.ipynb
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from decodelab.kv.slab import FirstFitSlab, Reservation
from decodelab.grammar.base import mask_logits
from decodelab.kv.contiguous_cache import kv_bytes_per_token
from decodelab.runner.model import PagedLlama
from decodelab.kv.blocks import BlockPool, BlockTable
from decodelab.decoding.request import (Completion, TokenLogprob, check_vocabulary_ids, eos_token_ids, finish_reason,
                                output_text, prompt_token_ids, text_decoder)
from decodelab.sampling.sampler import SamplingBatch, SamplingParams, make_generator, sample
from decodelab.engine.scheduler import Schedule, Scheduler, SequenceState, Status
from decodelab.engine.speculation import SpeculativeConfig, SpeculativeStats, Speculator
from decodelab.sampling.truncation import take_rows
from decodelab.validation import ParamError, check_int

DEFAULT_KV_BYTES = 1 << 30  # the default pool holds at most 1 GiB of K/V
KV_LAYOUTS = ("paged", "contiguous")
RESERVATIONS = ("max_tokens", "max_model_len")


@dataclass(frozen=True)
class TokenEvent:
    """One token a step produced for one sample of a request, for streaming: what a server sends as it happens."""
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


@dataclass(frozen=True)
class StepOutput:
    """What one `Engine.step()` did: the public observation API (the chapter's stepper, the server, metrics).
    `plan` is the scheduler's decision for the step (`decodelab.engine.scheduler.Schedule`: runs with their slots and
    prefix-cache hits, block copies, preemptions, forks)."""
    kind: str                              # "prefill" | "decode" | "idle"
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


@dataclass(frozen=True)
class SequenceView:
    """An unfinished sequence as observers (the chapter's stepper, scripts, metrics) see it, without the engine's
    internals: `Engine.sequences()` lists them."""
    seq_id: int
    request_id: int
    sample_index: int
    status: str                            # "running" (holds blocks) or "waiting" (queued for a prefill)
    block_ids: tuple[int, ...]             # its block table (a contiguous run's slots when kv_layout="contiguous")
    num_tokens: int                        # tokens whose K/V its blocks hold
    num_slots: int                         # slots its table holds (blocks × block_size, or the reservation)
    num_prompt_tokens: int
    num_output_tokens: int
    max_tokens: int


def _kv_memory_limit(device: torch.device) -> int | None:
    """Bytes the K/V cache may take on `device`: free GPU memory, or the machine's available RAM (Linux)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


class Engine:
    """Serve many requests at once from a transformers Llama/Qwen2 causal LM over a paged KV cache.

    num_blocks defaults to what max_num_seqs sequences of full context need, capped at 1 GiB of K/V.
    attention: "torch" (the reference, any device) or "triton" (decode steps by the Triton kernel; CUDA).
    kv_layout: "paged" (blocks of `block_size`) or "contiguous" (one slab of num_blocks × block_size slots, one run
    per request, first fit; `reserve` sizes the run: "max_tokens" = prompt + max_tokens, "max_model_len" = the
    model's context). The contiguous layout shares nothing: no prefix caching, n must be 1.
    speculative: a `SpeculativeConfig` for speculative decoding (paged layout only; `decodelab.engine.speculation`).
    Taught in: chapters/07-paged-attention.ipynb
    """

    def __init__(self, model, tokenizer=None, block_size: int = 16, num_blocks: int | None = None,
                 max_num_seqs: int = 32, max_num_batched_tokens: int | None = None,
                 enable_prefix_caching: bool = True, attention: str = "torch", kv_layout: str = "paged",
                 reserve: str = "max_tokens", speculative: SpeculativeConfig | None = None) -> None:
        self.runner = PagedLlama(model, attention)
        self.speculator = None if speculative is None else Speculator(speculative, self.runner)
        self.tokenizer = tokenizer
        self.max_model_len = self.runner.max_model_len
        block_size = check_int(block_size, "block_size")
        if block_size > self.max_model_len:
            raise ValueError(f"block_size must be at most the model's context ({self.max_model_len}), got {block_size}")
        max_num_seqs = check_int(max_num_seqs, "max_num_seqs")
        if not isinstance(enable_prefix_caching, bool):
            raise TypeError(f"enable_prefix_caching must be True or False, got {enable_prefix_caching!r}")
        draft_bytes = 0 if self.speculator is None else self.speculator.kv_bytes_per_token
        bytes_per_block = (kv_bytes_per_token(model.config, self.runner.dtype) + draft_bytes) * block_size
        if num_blocks is None:
            affordable = DEFAULT_KV_BYTES // bytes_per_block
            num_blocks = max(1, min(-(-max_num_seqs * self.max_model_len // block_size), affordable))
        num_blocks = check_int(num_blocks, "num_blocks")
        limit = _kv_memory_limit(self.runner.device)
        if limit is not None and num_blocks * bytes_per_block > limit:
            raise ValueError(f"num_blocks={num_blocks} needs {num_blocks * bytes_per_block / 2**30:.1f} GiB of K/V, "
                             f"more than this device can hold ({limit / 2**30:.1f} GiB free); pass fewer blocks")
        if max_num_batched_tokens is None:
            max_num_batched_tokens = max(2048, self.max_model_len)
        max_num_batched_tokens = check_int(max_num_batched_tokens, "max_num_batched_tokens")
        if max_num_batched_tokens < self.max_model_len:  # no chunked prefill: the longest prompt is one step
            raise ValueError(f"max_num_batched_tokens must be at least the model's context ({self.max_model_len}), "
                             f"got {max_num_batched_tokens}")
        if kv_layout not in KV_LAYOUTS or reserve not in RESERVATIONS:
            raise ValueError(f"kv_layout must be one of {KV_LAYOUTS} and reserve one of {RESERVATIONS}, "
                             f"got {kv_layout!r} and {reserve!r}")
        if self.speculator is not None and kv_layout != "paged":
            raise ValueError(f"speculative decoding needs kv_layout='paged' (rejected drafts give back blocks), "
                             f"got {kv_layout!r}")
        self.kv_layout, self.reserve = kv_layout, reserve
        if kv_layout == "paged":
            self.block_size = block_size
            self.pool = BlockPool(num_blocks, block_size, enable_prefix_caching)
        else:                                  # the same memory as num_blocks blocks, as one slab of 1-slot blocks
            self.block_size = 1
            self.pool = FirstFitSlab(num_blocks * block_size)
        self.kv_cache = self.runner.allocate_kv_cache(self.pool.num_blocks, self.block_size)  # [L, 2, blocks, block_size, KVH, D]
        if self.speculator is not None:
            self.speculator.allocate_kv_cache(self.pool.num_blocks, self.block_size)
        self.scheduler = Scheduler(self.pool, max_num_seqs, max_num_batched_tokens, self._finish_reason,
                                   None if self.speculator is None else self.speculator.lookahead)
        self.eos_token_ids = eos_token_ids(model, tokenizer)
        self._decode = text_decoder(tokenizer)
        self.completed: dict[int, Completion] = {}   # every finished request by id (generate() takes its own out)
        self._requests: dict[int, list[SequenceState]] = {}
        self._request_ids = itertools.count()
        self._steps = self._prefill_tokens = self._decode_tokens = 0
        self._utilization_sum = 0.0
        self._sampling_key: tuple[int, ...] | None = None   # the sequences the cached SamplingBatch was built for
        self._sampling: SamplingBatch | None = None

    # -- requests ------------------------------------------------------------------------------------------
    def _prompt_ids(self, prompt, name: str) -> list[int]:
        return prompt_token_ids(prompt, self.tokenizer, name, self.runner.vocab_size, self.max_model_len)

    def _check_request(self, prompt_ids: list[int], params, name: str) -> None:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params for {name} must be a SamplingParams, got {type(params).__name__}")
        check_vocabulary_ids(params, self.runner.vocab_size, name)   # stop_token_ids, logit_bias
        if params.grammar is not None and params.grammar.vocab_size > self.runner.vocab_size:
            raise ParamError("grammar", f"the grammar for {name} masks {params.grammar.vocab_size} tokens, more than "
                                        f"the model's vocabulary of {self.runner.vocab_size}")
        if params.stop and self.tokenizer is None:
            raise ParamError("stop", f"stop strings for {name} need text: give the engine a tokenizer, or use "
                                     f"stop_token_ids")
        if self.speculator is not None:
            self.speculator.check_params(params, name)
        if params.n > self.scheduler.max_num_seqs:
            raise ParamError("n", f"n for {name} is {params.n}, more than max_num_seqs={self.scheduler.max_num_seqs}")
        if self.kv_layout == "contiguous":
            if params.n > 1:
                raise ParamError("n", f"n for {name} is {params.n}; a contiguous reservation cannot share a prompt, "
                                      f"use kv_layout='paged' for n > 1")
            size = self._reservation_size(len(prompt_ids), params)
            if size > self.pool.num_slots:
                raise ParamError("max_tokens", f"{name} reserves {size} slots, more than the whole slab of "
                                               f"{self.pool.num_slots}; lower max_tokens or give the engine more memory")
            return
        slots = min(len(prompt_ids) + params.max_tokens - 1, self.max_model_len)
        blocks = -(-slots // self.block_size)
        if blocks > self.pool.num_blocks:
            raise ParamError("max_tokens", f"{name} needs up to {blocks} blocks ({slots} tokens), more than the whole "
                                           f"pool of {self.pool.num_blocks}; lower max_tokens or give the engine "
                                           f"more blocks")

    def _reservation_size(self, num_prompt_tokens: int, params: SamplingParams) -> int:
        if self.reserve == "max_model_len":
            return self.max_model_len
        return min(num_prompt_tokens + params.max_tokens, self.max_model_len)

    def check_request(self, prompt, params: SamplingParams, name: str = "prompt") -> list[int]:
        """The prompt's token ids if this engine can serve the request; otherwise ParamError (a ValueError naming the
        field: the prompt, `n`, `max_tokens`, `stop`, ...) or TypeError. Reads the engine's configuration only, so a
        server may call it while a step runs."""
        prompt_ids = self._prompt_ids(prompt, name)
        self._check_request(prompt_ids, params, name)
        return prompt_ids

    def add_request(self, prompt, params: SamplingParams | None = None) -> int:
        """Queue a request (a string or token ids) and return its id; it joins the batch at the next step."""
        params = SamplingParams() if params is None else params
        return self._add(self.check_request(prompt, params), params)

    def _add(self, prompt_ids: list[int], params: SamplingParams) -> int:
        request_id = next(self._request_ids)
        table = (BlockTable(self.block_size) if self.kv_layout == "paged"
                 else Reservation(self._reservation_size(len(prompt_ids), params)))
        seq = self.scheduler.new_sequence(request_id, prompt_ids, params, table,
                                          make_generator(params.seed, self.runner.device))
        self._requests[request_id] = [seq]
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
        return self.scheduler.max_num_seqs

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

        Raises KeyError for an id that is unknown or already finished (finished ones are in `completed`)."""
        if request_id not in self._requests:
            raise KeyError(f"request {request_id!r} is not in flight (unknown, aborted or finished; "
                           f"finished requests are in engine.completed)")
        for seq in self._requests.pop(request_id):
            self.scheduler.abort(seq)

    # -- one step ------------------------------------------------------------------------------------------
    def step(self) -> StepOutput:
        """One iteration, top to bottom: the scheduler plans it, the runner runs the model, the sampler draws,
        the scheduler postprocesses. Everything about where K/V go is decided before the model runs (`plan`).
        With speculation, a decode step is `_speculative_decode` (the draft proposes, the target judges, verify
        draws)."""
        plan = self.scheduler.schedule()                 # who runs, their slots, block copies, preemptions, forks
        if plan.kind == "idle":
            return StepOutput("idle", {}, (), (), {}, 0, 0, 0, self.num_waiting, plan=plan)
        if self.speculator is not None and plan.kind == "decode":
            return self._speculative_decode(plan)
        logits = self.runner.run(plan, self.kv_cache)     # [len(plan.runs), V]; the copies, then one forward
        if self.speculator is not None:
            self.speculator.prefill(plan)                 # the draft model's K/V of the same tokens
        holding = self._account(plan)                    # (live slots, allocated slots, sequences holding blocks)
        rows, seqs = [row for row, _ in plan.samples], [seq for _, seq in plan.samples]
        row_logits = take_rows(logits, rows)              # [len(seqs), V]; forks draw from their prompt's row
        row_logits = mask_logits(row_logits, [self._grammar_state(s) for s in seqs])   # requests with a grammar
        tokens = self._sample(row_logits, seqs)
        logprobs = self._logprobs(row_logits, seqs, tokens)
        appended, reasons = self.scheduler.postprocess(plan, [[t] for t in tokens])   # append, finish, free blocks
        return self._output(plan, seqs, appended, [[lp] for lp in logprobs], reasons, *holding)

    def _speculative_decode(self, plan: Schedule) -> StepOutput:
        """A decode step with speculation (`decodelab.engine.speculation`): the draft proposes up to
        `run.num_lookahead` tokens per sequence into the slots the plan holds, the target judges every sequence's last
        token and drafts in one forward, `verify` keeps a prefix of the drafts and draws one more token, and the
        scheduler appends them up to a finish and rolls back the slots of the rest."""
        proposals = self.speculator.propose(plan)         # per run: drafts and their q
        logits = self.runner.run(plan, self.kv_cache, [p.tokens for p in proposals])   # [sum(1 + k), V]
        holding = self._account(plan)
        drawn = self.speculator.verify(plan, proposals, logits)   # per run: kept drafts + the target's token
        appended, reasons = self.scheduler.postprocess(plan, drawn)
        self.speculator.record(appended)
        logprobs, offset = [], 0
        for seq, proposal, tokens in zip(plan.seqs, proposals, appended):   # token j was drawn from row offset + j
            logprobs.append(self._logprobs(logits[offset:offset + len(tokens)], [seq] * len(tokens), tokens))
            offset += len(proposal.tokens) + 1
        out = self._output(plan, plan.seqs, appended, logprobs, reasons, *holding)
        return replace(out, drafts={s.seq_id: tuple(p.tokens) for s, p in zip(plan.seqs, proposals)},
                       accepted={s.seq_id: len(tokens) - 1 for s, tokens in zip(plan.seqs, drawn)})

    @staticmethod
    def _grammar_state(seq: SequenceState):
        """The sequence's place in its request's grammar (None without one), started and caught up on first use."""
        if seq.params.grammar is None:
            return None
        if seq.grammar_state is None:
            seq.grammar_state = seq.params.grammar.start()
            for token in seq.output_token_ids:
                seq.grammar_state.advance(token)
        return seq.grammar_state

    def _account(self, plan: Schedule) -> tuple[int, int, int]:
        """Count the step's tokens; return, as the model ran, the slots holding live K/V, the slots allocated and
        the sequences holding blocks."""
        live, allocated = self.pool.filled_slots(), self.pool.num_used_blocks * self.block_size
        self._steps += 1
        self._utilization_sum += live / allocated
        num_new = sum(len(run.token_ids) for run in plan.runs)
        if plan.kind == "prefill":
            self._prefill_tokens += num_new
        else:
            self._decode_tokens += num_new
        return live, allocated, len(self.scheduler.running)

    def _output(self, plan: Schedule, seqs: list[SequenceState], tokens: list[list[int]],
                logprobs: list[list[TokenLogprob | None]], reasons: list[str | None], live: int, allocated: int,
                num_running: int) -> StepOutput:
        """The step's StepOutput; `tokens` and `logprobs` hold, per sample, what it appended (one token, or several
        in a speculative step) and `reasons` its finish reason, which belongs to its last token."""
        for child in plan.forks:                          # the request's other samples, started by this prefill
            self._requests[child.request_id].append(child)
        events = []
        for seq, seq_tokens, seq_logprobs, reason in zip(seqs, tokens, logprobs, reasons):
            for index, (token, logprob) in enumerate(zip(seq_tokens, seq_logprobs)):
                token_reason = reason if index == len(seq_tokens) - 1 else None
                if logprob is not None:
                    seq.logprobs.append(logprob)
                if seq.grammar_state is not None and token_reason is None:
                    seq.grammar_state.advance(token)
                events.append(TokenEvent(seq.request_id, seq.sample_index, token, logprob, token_reason))
        ended = dict.fromkeys(seq.request_id for seq, reason in zip(seqs, reasons) if reason is not None)
        finished = [done for done in map(self._maybe_complete, ended) if done is not None]
        tables = {s.seq_id: list(s.table.block_ids) for s in self.scheduler.running}
        return StepOutput(plan.kind, {s.seq_id: t[-1] for s, t in zip(seqs, tokens)},
                          tuple(s.seq_id for s in plan.preempted), tuple(finished), tables, live, allocated,
                          num_running, self.num_waiting, tuple(events), plan)

    def _sample(self, logits: torch.Tensor, seqs: list[SequenceState]) -> list[int]:
        batch = self._sampling_batch(seqs)
        generators = [s.generator for s in seqs]
        if not batch.has_penalties:
            return sample(logits, batch, generators).tolist()
        # what each penalty sees is decodelab.sampling.penalties' rule, the same as generate()'s
        return sample(logits, batch, generators, [s.output_token_ids for s in seqs],
                      prompt_tokens=[s.token_ids[:s.num_prompt_tokens] for s in seqs]).tolist()

    def _sampling_batch(self, seqs: list[SequenceState]) -> SamplingBatch:
        """The rows' parameters as tensors, rebuilt only when the sequences drawing this step change."""
        key = tuple(s.seq_id for s in seqs)
        if self._sampling_key != key:
            self._sampling_key, self._sampling = key, SamplingBatch([s.params for s in seqs], self.runner.device)
        return self._sampling

    @staticmethod
    def _logprobs(logits: torch.Tensor, seqs: list[SequenceState], tokens: list[int]) -> list[TokenLogprob | None]:
        """Each token's log-probability under the raw logits, with the top alternatives, for rows that asked."""
        wanted = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
        out: list[TokenLogprob | None] = [None] * len(seqs)
        if not wanted:
            return out
        logp = torch.log_softmax(logits[wanted].float(), dim=-1)             # [len(wanted), V]
        chosen = logp.gather(1, torch.tensor([[tokens[i]] for i in wanted], device=logp.device)).squeeze(1).tolist()
        k = max(seqs[i].params.logprobs for i in wanted)
        top_values, top_ids = logp.topk(k, dim=-1) if k else (logp[:, :0], logp[:, :0].long())
        top_values, top_ids = top_values.tolist(), top_ids.tolist()
        for j, i in enumerate(wanted):
            n = seqs[i].params.logprobs
            out[i] = TokenLogprob(tokens[i], chosen[j], tuple(zip(top_ids[j][:n], top_values[j][:n])))
        return out

    def _finish_reason(self, seq: SequenceState, token: int) -> str | None:
        return finish_reason(seq.params, token, seq.output_token_ids, len(seq.token_ids), self.eos_token_ids,
                             self.max_model_len, self._decode)

    def _maybe_complete(self, request_id: int) -> Completion | None:
        seqs = self._requests[request_id]
        if len(seqs) < seqs[0].params.n or any(s.status is not Status.FINISHED for s in seqs):
            return None
        del self._requests[request_id]
        samples = [Completion(request_id, s.token_ids[:s.num_prompt_tokens], s.output_token_ids,
                              output_text(s.output_token_ids, s.params, self._decode), s.finish_reason,
                              logprobs=tuple(s.logprobs) if s.params.logprobs is not None else None)
                   for s in sorted(seqs, key=lambda s: s.sample_index)]
        first = samples[0]
        done = Completion(request_id, first.prompt_token_ids, first.token_ids, first.text, first.finish_reason,
                          tuple(samples) if len(samples) > 1 else (), first.logprobs)
        self.completed[request_id] = done
        return done

    # -- whole runs ----------------------------------------------------------------------------------------
    def generate(self, prompts, params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[Completion]:
        """Complete every prompt (strings need a tokenizer) and return one Completion per prompt, in order.

        All prompts are checked before any is queued: bad input raises ValueError/TypeError and leaves the
        engine (and requests already in flight, which keep running) untouched.
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
        for i, (ids, p) in enumerate(zip(prompt_ids, params)):
            self._check_request(ids, p, f"prompts[{i}]")
        request_ids = [self._add(ids, p) for ids, p in zip(prompt_ids, params)]
        try:
            while any(r not in self.completed for r in request_ids):
                self.step()
        except BaseException:  # Ctrl-C or an error mid-run: leave no request of this call running into the next
            for r in request_ids:
                if r in self._requests:
                    self.abort(r)
                self.completed.pop(r, None)
            raise
        return [self.completed.pop(r) for r in request_ids]

    @property
    def stats(self) -> EngineStats:
        return EngineStats(self.pool.num_blocks, self.pool.num_free_blocks, self.scheduler.num_preemptions,
                           self.scheduler.num_cached_tokens, self._prefill_tokens, self._decode_tokens,
                           self._utilization_sum / max(self._steps, 1), self._steps,
                           None if self.speculator is None else self.speculator.stats)
