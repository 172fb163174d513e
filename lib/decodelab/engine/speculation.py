"""Speculative decoding inside the continuous-batching `Engine`: the draft's K/V live in the paged pool, rejected
drafts' slots are rolled back.

`Engine(target, tokenizer, speculative=SpeculativeConfig(draft, gamma))` runs each decode step as one speculative
round for every running sequence (Leviathan et al. 2023; vLLM's draft-model path). Speculation is a strategy of the
engine's one `step`, not a second one: the engine asks its speculator how many draft slots a sequence needs
(`lookahead`), to `propose` before the target runs and to `draw` after it; `NoSpeculation` answers none, nothing
and "sample", so an engine without speculation runs the same step with no branch for it.

1. the scheduler holds up to gamma empty slots past each sequence's last token (`ScheduledSeq.num_lookahead`, fewer
   near `max_tokens` or the end of the context), preempting as it would for one token;
2. `Speculator.propose`: the draft fills them. A smaller model keeps its own K/V tensor, addressed by the SAME block
   tables and slots as the target's (one batched forward per draft position), or the n-gram draft looks the tokens up
   in the sequence;
3. the target runs once over every sequence's [last token, drafts] (`PagedLlama.execute(plan, kv, drafts)`), with logits
   at every position;
4. `Speculator.verify`: `decodelab.decoding.speculative.verify` per sequence, with the sequence's own generator, keeps a prefix
   of the drafts (each with probability min(1, p/q)) and draws one more token (the residual's or the bonus);
5. `Scheduler.update_from_output` appends them in order up to the first that finishes the sequence, records the kept drafts
   in its block table (only kept tokens are ever hashed into the prefix cache) and gives back the blocks that only
   rejected drafts reached.

Prefill steps draw as without speculation; `propose` writes the draft model's K/V of the prompt. vLLM's masks are
served: `min_tokens`, `bad_words` and `allowed_token_ids` mask the draft's distribution at every draft position and
the target's at every judged position, each reading the output before that position (the sequence's, then the drafts
before it), so verify keeps the output distribution the target's with the masks, exactly as an engine without
speculation samples it. Requests with penalties, the n-gram ban, a grammar or `prompt_logprobs` are refused at
`add_request`; everything else (temperature, top-k/p, min-p, typical-p, seeds, n > 1, stop tokens and strings,
logprobs) is served. The Triton decode kernel reads one query per sequence, so
with `attention="triton"` a step that verifies drafts runs the torch reference attention (the draft model always
does).

    engine = Engine(target, tokenizer, speculative=SpeculativeConfig(draft=small_model, gamma=4))
    engine.generate(prompts, SamplingParams(temperature=0, max_tokens=64))
    engine.stats.speculative.acceptance_rate, engine.stats.speculative.tokens_per_target_forward

Measured in benchmarks/speculative.py --engine (the README's performance section).
Taught in: chapters/07b-speculative-decoding.ipynb
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from decodelab.decoding.speculative import NgramDraft, distributions, verify
from decodelab.engine.draw import TokenDrawer
from decodelab.engine.scheduler import Drawn, Schedule, StepKind, StepUpdate
from decodelab.engine.sequence import SequenceState
from decodelab.kv.contiguous_cache import kv_bytes_per_token
from decodelab.runner.model import PagedLlama, StepBatch
from decodelab.sampling.counter_rng import categorical
from decodelab.sampling.sampler import SamplingParams
from decodelab.validation import ParamError, as_scalar

MAX_GAMMA = 16
PENALTY_FIELDS = ("repetition_penalty", "frequency_penalty", "presence_penalty", "no_repeat_ngram_size")
OUTSIDE_SPECULATION = ("prompt_logprobs",)   # not served by a speculative engine


@dataclass(frozen=True)
class SpeculativeConfig:
    """How an `Engine` speculates. `draft`: a transformers Llama/Qwen2 causal LM with the target's vocabulary, on the
    target's device, with at least its context (its K/V go in the engine's block pool), or "ngram" / an `NgramDraft`
    (prompt lookup, no model). `gamma`: drafts per sequence and decode step, an int in [1, 16].

    >>> SpeculativeConfig("ngram", gamma=3).gamma
    3
    """
    draft: object
    gamma: int = 4

    def __post_init__(self) -> None:
        gamma = as_scalar(self.gamma)
        if isinstance(gamma, bool) or not isinstance(gamma, int) or not 1 <= gamma <= MAX_GAMMA:
            raise ValueError(f"gamma must be an int in [1, {MAX_GAMMA}], got {self.gamma!r}")
        object.__setattr__(self, "gamma", gamma)
        if isinstance(self.draft, str):
            if self.draft != "ngram":
                raise ValueError(f"draft must be a causal LM, an NgramDraft or 'ngram', got {self.draft!r}")
            object.__setattr__(self, "draft", NgramDraft())
        elif not isinstance(self.draft, NgramDraft) and not hasattr(self.draft, "config"):
            raise TypeError(f"draft must be a transformers causal LM, an NgramDraft or 'ngram', "
                            f"got {type(self.draft).__name__}")


@dataclass(frozen=True)
class Proposal:
    """One sequence's drafts for one step."""
    tokens: list[int]                      # k <= the scheduled sequence's num_lookahead drafts
    q: torch.Tensor | None                 # [k, V] float64, the draft's probabilities; None: point masses (n-gram)


@dataclass(frozen=True)
class Drafts:
    """A step's proposals, one per scheduled sequence of a speculative decode step; none in a prefill or without speculation."""
    proposals: tuple[Proposal, ...] = ()

    @property
    def tokens(self) -> list[list[int]] | None:
        """The drafts per scheduled sequence, as `PagedLlama.execute` takes them (None: one token per sequence)."""
        return [p.tokens for p in self.proposals] if self.proposals else None

    def by_sequence(self, plan: Schedule, drawn: Drawn) -> tuple[dict[int, tuple[int, ...]], dict[int, int]]:
        """For the step's output: seq_id -> drafts proposed, and seq_id -> how many of them verify kept."""
        if not self.proposals:
            return {}, {}
        return ({s.seq_id: tuple(p.tokens) for s, p in zip(plan.seqs, self.proposals)},
                {s.seq_id: len(tokens) - 1 for s, tokens in zip(plan.seqs, drawn.tokens)})


NO_DRAFTS = Drafts()


@dataclass(frozen=True)
class SpeculativeStats:
    """Counts over every speculative round so far (one round = one sequence in one decode step = one target forward
    for that sequence). Acceptance rate = kept / judged drafts (a rejection ends a round, so later drafts are never
    judged); `expected_acceptance` is the theory's rate on the same positions, the mean of 1 - TV(p, q)."""
    rounds: int
    drafted: int                           # drafts proposed
    judged: int                            # drafts the target judged
    accepted: int                          # drafts kept
    acceptance_prob_sum: float             # sum over judged positions of sum_x min(p(x), q(x))
    tokens: int                            # tokens the rounds appended (kept drafts + 1, up to a finish)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.judged if self.judged else float("nan")

    @property
    def expected_acceptance(self) -> float:
        return self.acceptance_prob_sum / self.judged if self.judged else float("nan")

    @property
    def tokens_per_target_forward(self) -> float:
        return self.tokens / self.rounds if self.rounds else float("nan")


class NoSpeculation:
    """The speculator of an engine without speculation: no draft slots, no proposals, every token sampled."""
    kv_bytes_per_token = 0
    stats = None

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        pass

    def check_params(self, params: SamplingParams, name: str) -> None:
        pass

    @staticmethod
    def lookahead(seq: SequenceState) -> int:
        return 0

    def propose(self, plan: Schedule, drawer: TokenDrawer) -> Drafts:
        return NO_DRAFTS

    def draw(self, plan: Schedule, drafts: Drafts, logits: torch.Tensor, drawer: TokenDrawer) -> Drawn:
        return drawer.draw(plan, logits)

    def record(self, drafts: Drafts, update: StepUpdate) -> None:
        pass


class Speculator:
    """The draft side of speculative decoding in an `Engine`, built by it from a `SpeculativeConfig`: how many draft
    slots a decode step holds for a sequence (`lookahead`), the draft model's K/V of prompts and the proposals
    (`propose`), and the acceptance rule on the target's logits (`draw`, by `verify`).

    A model draft's K/V tensor `[draft layers, 2, num_blocks, block_size, draft KVH, draft D]` is indexed by the
    target's block tables: slot s holds both models' K/V of the same token. Rolled-back drafts need no undo there:
    their slots are past the sequence's length and the next writes overwrite them. After a round that kept every
    draft, the draft model has not yet read the last of them; the next round feeds it together with the new token.
    A block published to the prefix cache in between may keep that one position unwritten in the draft's tensor; a
    prompt that later hits the block gets slightly worse proposals there, never a different output distribution
    (verify makes the output follow the target whatever the draft proposes).

    Taught in: chapters/07b-speculative-decoding.ipynb
    """

    def __init__(self, config: SpeculativeConfig, target: PagedLlama) -> None:
        if not isinstance(config, SpeculativeConfig):
            raise TypeError(f"speculative must be a SpeculativeConfig or None, got {type(config).__name__}")
        self.gamma = config.gamma
        self.max_model_len = target.max_model_len
        self.ngram = config.draft if isinstance(config.draft, NgramDraft) else None
        self.runner: PagedLlama | None = None
        self.kv_cache: torch.Tensor | None = None
        if self.ngram is None:
            self.runner = PagedLlama(config.draft)
            if self.runner.vocab_size != target.vocab_size:
                raise ValueError(f"draft and target must share a vocabulary: draft has {self.runner.vocab_size} "
                                 f"tokens, target {target.vocab_size}")
            if self.runner.max_model_len < target.max_model_len:
                raise ValueError(f"the draft's context ({self.runner.max_model_len} positions) must be at least the "
                                 f"target's ({target.max_model_len})")
            if self.runner.device != target.device:
                raise ValueError(f"draft and target must be on one device, got {self.runner.device} and "
                                 f"{target.device}")
        self._draft_len: weakref.WeakKeyDictionary[SequenceState, int] = weakref.WeakKeyDictionary()
        self._rounds = self._drafted = self._judged = self._accepted = self._tokens = 0
        self._acceptance_prob_sum = 0.0

    @property
    def kv_bytes_per_token(self) -> int:
        """The draft model's K/V bytes per token slot (0 for the n-gram draft)."""
        return 0 if self.runner is None else kv_bytes_per_token(self.runner.config, self.runner.dtype)

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        """The draft model's K/V tensor, the same blocks as the target's pool."""
        if self.runner is not None:
            self.kv_cache = self.runner.allocate_kv_cache(num_blocks, block_size)  # [L, 2, blocks, block_size, KVH, D]

    @staticmethod
    def check_params(params: SamplingParams, name: str) -> None:
        """ParamError for what a speculative engine does not serve: penalties, the n-gram ban and a grammar (it cannot
        verify them exactly), and prompt_logprobs."""
        for field in PENALTY_FIELDS:
            if getattr(params, field) != getattr(SamplingParams, field):
                raise ParamError(field, f"{field} for {name} is {getattr(params, field)!r}; an engine with "
                                        f"speculative decoding serves no penalties or n-gram ban, only temperature, "
                                        f"top-k, top-p, min-p and typical-p")
        if params.grammar is not None:
            raise ParamError("grammar", f"the grammar for {name} cannot run in an engine with speculative decoding; "
                                        f"use an engine without `speculative`")
        for field in OUTSIDE_SPECULATION:
            if getattr(params, field) != getattr(SamplingParams, field):
                raise ParamError(field, f"{field} for {name} is {getattr(params, field)!r:.100}; an engine with "
                                        f"speculative decoding does not serve it; use an engine without `speculative`")

    def lookahead(self, seq: SequenceState) -> int:
        """Draft slots for `seq`'s next decode step: gamma, fewer when max_tokens or the context leaves less room
        (a round appends at most drafts + 1 tokens, the last of them read at position len(token_ids) + drafts)."""
        left = seq.params.max_tokens - len(seq.output_token_ids) - 1
        return max(0, min(self.gamma, left, self.max_model_len - len(seq.token_ids)))

    def propose(self, plan: Schedule, drawer: TokenDrawer) -> Drafts:
        """A decode step's drafts, per scheduled sequence; a prefill step proposes none and writes the draft model's K/V of its
        tokens instead. `drawer` names the EOS tokens that `min_tokens` masks."""
        if plan.kind is StepKind.PREFILL:
            self._prefill(plan)
            return NO_DRAFTS
        return Drafts(tuple(self._propose(plan, drawer.eos_token_ids)))

    def draw(self, plan: Schedule, drafts: Drafts, logits: torch.Tensor, drawer: TokenDrawer) -> Drawn:
        """A prefill samples as without speculation; a decode step verifies each sequence's drafts on the target's logits
        `[sum(1 + k), V]` and takes each kept token's logprob from the row it was judged at."""
        if not drafts.proposals:
            return drawer.draw(plan, logits)
        tokens = self._verify(plan, drafts.proposals, logits, drawer.eos_token_ids)
        logprobs, offset = [], 0
        for seq, proposal, seq_tokens in zip(plan.seqs, drafts.proposals, tokens):   # token j: row offset + j
            logprobs.append(drawer.logprobs(logits[offset:offset + len(seq_tokens)], [seq] * len(seq_tokens),
                                            seq_tokens))
            offset += len(proposal.tokens) + 1
        return Drawn(tokens, logprobs)

    def _prefill(self, plan: Schedule) -> None:
        """Write the draft model's K/V of a prefill step's tokens (the target's plan, the draft's tensor)."""
        if self.runner is None:
            return
        self.runner.execute(plan, self.kv_cache)
        for seq in (*plan.seqs, *plan.forks):                 # forks share their prompt's blocks
            self._draft_len[seq] = seq.table.num_tokens

    @torch.inference_mode()
    def _propose(self, plan: Schedule, eos_token_ids: frozenset[int]) -> list[Proposal]:
        """Up to `sched.num_lookahead` drafts per scheduled sequence of a decode plan. A model draft feeds, per sequence, what it has
        not read yet (its last token, and the previous round's last kept draft if it never read it), draws d_1 from
        q_1, feeds d_1, ..., one batched forward per draft position, its K/V written to the slots the table holds."""
        if self.runner is None:
            return [Proposal(self.ngram.propose(sched.seq.token_ids, sched.num_lookahead, sched.seq.params, None)[0]
                             if sched.num_lookahead else [], None) for sched in plan.scheduled]
        for src, dst in plan.copies:                          # the target's copy-on-write, in the draft's tensor
            self.kv_cache[:, :, dst] = self.kv_cache[:, :, src]
        tokens: list[list[int]] = [[] for _ in plan.scheduled]
        rows: list[list[torch.Tensor]] = [[] for _ in plan.scheduled]
        feeds: dict[int, tuple[list[int], int]] = {}          # scheduled index -> (tokens to feed, position of the first)
        for i, sched in enumerate(plan.scheduled):
            if sched.num_lookahead:
                start = min(self._draft_len.get(sched.seq, 0), sched.start)
                feeds[i] = (sched.seq.token_ids[start:sched.start + 1], start)
        while feeds:
            order = list(feeds)
            batch = StepBatch.build([(feed, start, [plan.scheduled[i].seq.table.slot(p)
                                                    for p in range(start, start + len(feed))],
                                      plan.scheduled[i].seq.table.block_ids)
                                     for i, (feed, start) in feeds.items()], self.runner.device)
            logits = self.runner.forward(batch, self.kv_cache)                            # [B, V]
            q = _probs(logits, [plan.scheduled[i].seq for i in order], [tokens[i] for i in order],
                       eos_token_ids)                                                      # [B, V] float64
            for row, i in enumerate(order):
                seq = plan.scheduled[i].seq
                feed, start = feeds.pop(i)
                self._draft_len[seq] = start + len(feed)
                token = categorical(q[row], seq.generator)
                tokens[i].append(token)
                rows[i].append(q[row])
                if len(tokens[i]) < plan.scheduled[i].num_lookahead:
                    feeds[i] = ([token], start + len(feed))
        return [Proposal(drafted, torch.stack(q_rows) if q_rows else None) for drafted, q_rows in zip(tokens, rows)]

    def _verify(self, plan: Schedule, proposals: tuple[Proposal, ...], logits: torch.Tensor,
                eos_token_ids: frozenset[int]) -> list[list[int]]:
        """Judge each sequence's drafts on the target's logits `[sum(1 + k), V]` (sequence after sequence, as `PagedLlama.execute`
        returns them): the kept drafts and the target's next token, per sequence. Row j of a sequence judges the
        token after its output and drafts 1..j, which is what min_tokens reads there."""
        rows = [(sched.seq, proposal.tokens[:j]) for sched, proposal in zip(plan.scheduled, proposals)
                for j in range(len(proposal.tokens) + 1)]                                 # one per logits row
        p = _probs(logits, [seq for seq, _ in rows], [drafted for _, drafted in rows], eos_token_ids)
        # p: [sum(1 + k), V] float64
        out, offset = [], 0
        for sched, proposal in zip(plan.scheduled, proposals, strict=True):
            k = len(proposal.tokens)
            kept, token, betas = verify(proposal.tokens, proposal.q, p[offset:offset + k + 1], sched.seq.generator)
            offset += k + 1
            self._rounds += 1
            self._drafted += k
            self._judged += len(betas)
            self._accepted += kept
            self._acceptance_prob_sum += sum(betas)
            out.append(proposal.tokens[:kept] + [token])
        return out

    def record(self, drafts: Drafts, update: StepUpdate) -> None:
        """Count the tokens a decode step's rounds appended (after the finish rule cut them)."""
        if drafts.proposals:
            self._tokens += sum(map(len, update.tokens))

    @property
    def stats(self) -> SpeculativeStats:
        return SpeculativeStats(self._rounds, self._drafted, self._judged, self._accepted, self._acceptance_prob_sum,
                                self._tokens)


def _probs(logits: torch.Tensor, seqs: list[SequenceState], drafted: list[list[int]],
           eos_token_ids: frozenset[int]) -> torch.Tensor:
    """The distributions `[B, V]` (float64) row b samples from: `seqs[b]`'s params on `logits[b]`, whose output so far
    is the sequence's own followed by `drafted[b]` (what min_tokens counts and a bad word of several tokens reads)."""
    params = [seq.params for seq in seqs]
    outputs = ([seq.output_token_ids + list(d) for seq, d in zip(seqs, drafted)]
               if any(p.needs_output_tokens for p in params) else None)
    return distributions(logits, params, outputs, eos_token_ids)


def make_speculator(config: SpeculativeConfig | None, target: PagedLlama) -> NoSpeculation | Speculator:
    """The engine's speculation strategy: `NoSpeculation` for None, else a `Speculator` for the target."""
    return NoSpeculation() if config is None else Speculator(config, target)
