"""The draw step of an engine step: from the model's logits to each sample's token and logprob, writing nothing.

For a plan's samples, in order (vLLM's `v1/sample/sampler.py` lists its steps the same way):
1. each sample's logits row (`plan.samples`: forks draw from their prompt's row), `[len(samples), V]`;
2. its grammar's mask (`decodelab.grammar.base.mask_logits`; rows without a grammar pass untouched);
3. `decodelab.sampling.sampler.sample` with one `SamplingParams` and one generator per row (the penalties read the
   sample's prompt and output);
4. the token's logprob under those logits, with the top alternatives, for rows whose request asked.

A speculative round draws by `Speculator.verify` instead and takes only step 4 from here.

    drawer = TokenDrawer(device)
    drawn = drawer.draw(plan, logits)            # Drawn: per sample [token], [logprob or None]

Taught in: chapters/07-paged-attention.ipynb
"""
from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from decodelab.decoding.request import TokenLogprob
from decodelab.engine.scheduler import Drawn, Schedule
from decodelab.engine.sequence import SequenceState
from decodelab.grammar.base import mask_logits
from decodelab.sampling.sampler import SamplingBatch, sample
from decodelab.sampling.truncation import take_rows


class TokenDrawer:
    """Samples a plan's tokens on `device`, keeping the rows' `SamplingBatch` while the same sequences draw."""

    def __init__(self, device: torch.device, eos_token_ids: Collection[int] = ()) -> None:
        self.device = device
        self.eos_token_ids = frozenset(eos_token_ids)          # masked with stop_token_ids until min_tokens
        # the sequences of the cached batch, in order (held until the next draw, or `forget`)
        self._sampling_key: tuple[SequenceState, ...] | None = None
        self._sampling: SamplingBatch | None = None
        self._generators: tuple = ()                         # their streams, in the same order

    def draw(self, plan: Schedule, logits: torch.Tensor) -> Drawn:
        """One token per sample of `plan` from `logits` `[len(plan.scheduled), V]` (one row per scheduled sequence)."""
        rows, seqs = zip(*plan.samples)                                        # one pass, two tuples
        row_logits = take_rows(logits, rows)                                   # [len(seqs), V]
        batch = self._sampling_batch(seqs)
        if batch.has_grammar:                                                  # requests with a grammar
            row_logits = mask_logits(row_logits, [s.grammar_state for s in seqs])
        tokens = self._sample(row_logits, seqs, batch)
        if not batch.has_logprobs:
            return Drawn([[t] for t in tokens], [[None] for _ in tokens])
        logprobs = self.logprobs(row_logits, seqs, tokens)
        return Drawn([[t] for t in tokens], [[lp] for lp in logprobs])

    def sample(self, logits: torch.Tensor, seqs: list[SequenceState]) -> list[int]:
        """One token per sequence from `logits` `[len(seqs), V]` (already masked by grammars), by each one's params
        and stream."""
        return self._sample(logits, seqs, self._sampling_batch(seqs))

    def _sample(self, logits: torch.Tensor, seqs: list[SequenceState], batch: SamplingBatch) -> list[int]:
        generators = self._generators         # `batch`'s streams: both callers take it from `_sampling_batch`
        if not batch.needs_output_tokens:
            return sample(logits, batch, generators, eos_token_ids=self.eos_token_ids).tolist()
        # what each penalty sees is decodelab.sampling.penalties' rule, the same as generate()'s; min_tokens and
        # bad words read the output too (decodelab.sampling.constraints)
        return sample(logits, batch, generators, [s.output_token_ids for s in seqs],
                      prompt_tokens=[s.token_ids[:s.num_prompt_tokens] for s in seqs],
                      eos_token_ids=self.eos_token_ids).tolist()

    def forget(self) -> None:
        """Drop the cached batch, its sequences and their streams (the engine calls it when nothing is running, so
        finished sequences are not kept alive by the cache)."""
        self._sampling_key, self._sampling, self._generators = None, None, ()

    def _sampling_batch(self, seqs: Sequence[SequenceState]) -> SamplingBatch:
        """The rows' parameters as tensors, and their streams, rebuilt only when the sequences drawing this step
        change (a sequence keeps its params and its stream for its life, preempted or not)."""
        key = seqs if type(seqs) is tuple else tuple(seqs)      # compared by identity first: one C loop
        if self._sampling_key != key:
            self._sampling_key, self._sampling = key, SamplingBatch([s.params for s in seqs], self.device)
            self._generators = tuple(s.generator for s in seqs)   # a tuple: the sampler checks it once
        return self._sampling

    @staticmethod
    def prompt_logprobs(logits: torch.Tensor, seq: SequenceState) -> list[TokenLogprob | None]:
        """The prompt's log-probabilities from `logits` `[L, V]`, the model's logits at each of the L prompt
        tokens (row j predicts token j + 1): None for the first token (nothing predicts it), then each token's
        log-softmax under the raw logits, its rank and the `params.prompt_logprobs` most likely tokens."""
        prompt = seq.token_ids[:seq.num_prompt_tokens]
        if logits.shape[0] != len(prompt):
            raise ValueError(f"prompt_logprobs needs the logits of all {len(prompt)} prompt tokens, got "
                             f"{logits.shape[0]} rows")
        logp = torch.log_softmax(logits[:-1].float(), dim=-1)                      # [L - 1, V]
        targets = torch.tensor(prompt[1:], device=logp.device).unsqueeze(1)      # [L - 1, 1]
        chosen = logp.gather(1, targets)                                          # [L - 1, 1]
        ranks = (logp > chosen).sum(dim=1).add(1).tolist()
        k = seq.params.prompt_logprobs
        top_values, top_ids = logp.topk(k, dim=-1) if k else (logp[:, :0], logp[:, :0].long())
        top_values, top_ids = top_values.tolist(), top_ids.tolist()
        return [None] + [TokenLogprob(token, value, tuple(zip(ids, values)), rank) for token, value, ids, values, rank
                         in zip(prompt[1:], chosen.squeeze(1).tolist(), top_ids, top_values, ranks)]

    @staticmethod
    def logprobs(logits: torch.Tensor, seqs: list[SequenceState], tokens: list[int]) -> list[TokenLogprob | None]:
        """Each token's log-probability under `logits` (row i for token i), with the top alternatives, for rows that
        asked."""
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
