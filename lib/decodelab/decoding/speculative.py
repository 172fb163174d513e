"""Speculative sampling: a cheap draft proposes gamma tokens, the target judges them all in one forward.

Leviathan et al. 2023 and Chen et al. 2023. Per round: the draft proposes x_1 .. x_k (k <= gamma) from its
distributions q_1 .. q_k; the target runs once over the context plus the drafts and gives p_1 .. p_{k+1}. Draft x_i
is kept with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection the target's token is drawn from the
residual normalize(max(0, p_i - q_i)); if all k are kept, a bonus token is drawn from p_{k+1}. Every token that comes
out is distributed exactly as the target's own sampling would give it; position i is kept with probability
sum_x min(p_i(x), q_i(x)) = 1 - TV(p_i, q_i).

p and q are the target's and the draft's distributions after the SAME `SamplingParams` processing (temperature,
top-k, top-p, min-p, typical-p: `process_logits`), so the output follows the target under those parameters. At
temperature 0 both are point masses on the argmax: a draft is kept while it equals the target's argmax, and the output
equals the target's greedy decoding token for token. Penalties and the n-gram ban are refused (they depend on the
tokens before each position; this module does not thread them through).

Drafts: `ModelDraft` (a smaller model with the same vocabulary, its own KV cache rolled back after each round) and
`NgramDraft` (prompt lookup: the continuation of the last earlier match of the context's final n-gram; its q is a point
mass, so a draft token is kept with probability p(x)). Any object with `propose(context, gamma, params, generator)`
returning (tokens, q `[k, V]` or None for point masses) is a draft.

    >>> from decodelab.decoding.speculative import ModelDraft, speculative_generate
    >>> from decodelab.models import load_model
    >>> from decodelab.sampling import SamplingParams
    >>> target, tokenizer = load_model("tiny-zh-doc", device="cpu")
    >>> draft = ModelDraft(load_model("tiny-zh-doc-small", device="cpu")[0])
    >>> result = speculative_generate(target, tokenizer, "这是小明在北京的一天。", SamplingParams(seed=0), draft, 4)
    >>> result.text, round(result.acceptance_rate, 3), result.tokens_per_target_forward
    ('小明正在咖啡馆等小明。张医生想喝', 0.938, 4.0)

Taught in: chapters/07b-speculative-decoding.ipynb
"""
from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from decodelab.decoding.generate import model_step
from decodelab.decoding.request import eos_token_ids, prompt_token_ids
from decodelab.sampling.counter_rng import DEFAULT_RNG, CounterRNG, categorical, check_rng, uniform
from decodelab.sampling.sampler import SamplingParams, make_generator, process_logits
from decodelab.validation import check_int, check_model


def distributions(logits: torch.Tensor, params: SamplingParams | Sequence[SamplingParams],
                  output_tokens: Sequence[Sequence[int]] | None = None,
                  eos_token_ids: Collection[int] | None = None) -> torch.Tensor:
    """Rows of logits `[k, V]` -> the probabilities `[k, V]` (float64) that `params` (one for every row, or one per
    row) samples from. `output_tokens` (the output before each row) and `eos_token_ids` are what `min_tokens` reads,
    as in `process_logits`."""
    return torch.softmax(process_logits(logits.double(), params, output_tokens, eos_token_ids=eos_token_ids), dim=-1)


def _draw(probs: torch.Tensor, generator: torch.Generator | CounterRNG | None) -> int:
    return categorical(probs, generator)


def residual(p: torch.Tensor, q: torch.Tensor | None, token: int) -> torch.Tensor:
    """What the target draws from after rejecting draft `token` at one position: normalize(max(0, p - q)) `[V]`, with q
    the draft's distribution `[V]` there, or None for a point mass on `token`. Where p == q up to rounding (rejection
    had probability ~0) it is p itself. Unnormalized: `torch.multinomial` and `judged_distribution` normalize it.

    >>> residual(torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.6, 0.2]), 1)
    tensor([0.3000, 0.0000, 0.0000])
    """
    if q is None:
        rest = p.clone()
        rest[token] = 0.0  # max(0, p - point mass)
    else:
        rest = (p - q).clamp_min(0.0)  # [V]
    return rest if float(rest.sum()) > 0.0 else p


def judged_distribution(p: torch.Tensor, q: torch.Tensor | None, token: int | None = None,
                        residual_rule=None) -> torch.Tensor:
    """The exact distribution `[V]` of the token one judged position emits under `verify`'s rule: the draft proposes
    x ~ q (or the point mass `token` when q is None), keeps it with probability min(1, p(x)/q(x)), and otherwise the
    target draws from `residual_rule(p, q, x)` (default: `residual`, normalized). The rule is right when this equals
    p, whatever q is; a wrong residual shows up as a gap that grows with the rejection probability.

    >>> p, q = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64), torch.tensor([0.2, 0.6, 0.2], dtype=torch.float64)
    >>> [round(v, 12) for v in judged_distribution(p, q).tolist() + judged_distribution(p, None, token=1).tolist()]
    [0.5, 0.3, 0.2, 0.5, 0.3, 0.2]
    >>> from_p = lambda p, q, x: p                 # a planted bug: the residual drawn from p itself
    >>> [round(v, 2) for v in judged_distribution(p, q, residual_rule=from_p).tolist()]
    [0.35, 0.39, 0.26]
    """
    rule = residual if residual_rule is None else residual_rule
    proposals = [(token, 1.0)] if q is None else [(x, float(q[x])) for x in (q > 0).nonzero().flatten().tolist()]
    out = torch.zeros_like(p)
    for x, q_x in proposals:
        keep = min(1.0, float(p[x]) / q_x)
        out[x] += q_x * keep
        rest = rule(p, q, x)
        out += q_x * (1.0 - keep) * rest / rest.sum()
    return out


def verify(drafted: list[int], q: torch.Tensor | None, p: torch.Tensor,
           generator: torch.Generator | CounterRNG | None) -> tuple[int, int, list[float]]:
    """The acceptance rule on one round: drafts `drafted` (k tokens) with draft probabilities `q` `[k, V]` (None:
    point masses on the drafts) and target probabilities `p` `[k + 1, V]`. Returns (number kept, the target's token
    after them, the acceptance probability sum_x min(p_i, q_i) of each judged position).

    >>> verify([3], None, torch.tensor([[0.0, 0, 0, 1], [1.0, 0, 0, 0]]), None)
    (1, 0, [1.0])
    """
    betas = []
    for i, token in enumerate(drafted):
        q_token = 1.0 if q is None else float(q[i, token])
        betas.append(float(p[i, token]) if q is None else float(torch.minimum(p[i], q[i]).sum()))
        if uniform(generator) * q_token < float(p[i, token]):
            continue  # kept with probability min(1, p / q)
        return i, _draw(residual(p[i], None if q is None else q[i], token), generator), betas
    return len(drafted), _draw(p[len(drafted)], generator), betas


class ModelDraft:
    """A smaller causal LM with the target's vocabulary as the draft. It keeps a KV cache over the tokens it has
    seen and, each round, crops it back to the longest prefix it shares with the new context (the rejected drafts go).
    One request at a time."""

    def __init__(self, model) -> None:
        self.vocab_size = check_model(model, "ModelDraft(model)")
        self.model = model
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        self._cache = None
        self._cached: list[int] = []

    @torch.no_grad()
    def propose(self, context: list[int], gamma: int, params: SamplingParams,
                generator: torch.Generator | CounterRNG | None) -> tuple[list[int], torch.Tensor]:
        """Draw `gamma` tokens one at a time from q (the draft's processed distribution); returns them and q
        `[gamma, V]`."""
        self._cache, self._cached = _reuse(self._cache, self._cached, context)
        device = next(self.model.parameters()).device
        feed = context[len(self._cached):]
        tokens, rows = [], []
        for _ in range(gamma):
            logits, self._cache = model_step(self.model, torch.tensor([feed], device=device), self._cache)
            self._cached += feed
            q = distributions(logits[0, -1:], params)[0]  # [V]
            rows.append(q)
            tokens.append(_draw(q, generator))
            feed = tokens[-1:]
        return tokens, torch.stack(rows)  # [gamma, V]


class NgramDraft:
    """Prompt lookup: find the last earlier occurrence of the context's final n tokens (n from `max_n` down to
    `min_n`) and propose the up to gamma tokens that followed it. No model; q is a point mass on each proposal."""

    def __init__(self, max_n: int = 3, min_n: int = 1) -> None:
        self.max_n = check_int(max_n, "max_n", 1)
        self.min_n = check_int(min_n, "min_n", 1)
        if self.min_n > self.max_n:
            raise ValueError(f"min_n must be <= max_n, got min_n={min_n}, max_n={max_n}")

    def propose(self, context: list[int], gamma: int, params: SamplingParams,
                generator: torch.Generator | CounterRNG | None) -> tuple[list[int], None]:
        for n in range(min(self.max_n, len(context) - 1), self.min_n - 1, -1):
            suffix = context[-n:]
            for start in range(len(context) - n - 1, -1, -1):  # latest match first, not the suffix itself
                if context[start:start + n] == suffix:
                    return context[start + n:start + n + gamma], None
        return [], None


def _reuse(cache, cached: list[int], context: list[int]):
    """Crop `cache` (over the tokens `cached`) to their longest common prefix with `context`, keeping at least the
    last context token out, so the next forward has something to read its logits from."""
    keep = 0
    limit = min(len(cached), len(context) - 1)
    while keep < limit and cached[keep] == context[keep]:
        keep += 1
    if keep == 0:
        return None, []
    if keep < len(cached):
        cache.crop(keep - len(cached))  # a negative count removes that many positions from the end
    return cache, cached[:keep]


@dataclass(frozen=True)
class Round:
    """One target forward: the draft's proposals, how many were kept (a prefix), the target's own token after them
    (the residual draw or the bonus), and sum_x min(p, q) = 1 - TV(p, q) at each position the target judged."""

    drafted: tuple[int, ...]
    accepted: int
    token: int
    acceptance_probs: tuple[float, ...]


@dataclass(frozen=True)
class SpeculativeResult:
    """The generated tokens (as `Completion`: EOS or stop token included), their text, why it ended, and every
    round. Acceptance rate = kept / judged positions (a rejection ends a round, so later drafts are never judged)."""

    token_ids: list[int]
    text: str | None
    finish_reason: str
    rounds: list[Round]

    @property
    def proposed(self) -> int:
        return sum(len(r.drafted) for r in self.rounds)

    @property
    def accepted(self) -> int:
        return sum(r.accepted for r in self.rounds)

    @property
    def target_forwards(self) -> int:
        return len(self.rounds)

    @property
    def judged(self) -> int:
        return sum(len(r.acceptance_probs) for r in self.rounds)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.judged if self.judged else float("nan")

    @property
    def expected_acceptance(self) -> float:
        """The theory's acceptance rate on the same positions: the mean of 1 - TV(p, q)."""
        return sum(sum(r.acceptance_probs) for r in self.rounds) / self.judged if self.judged else float("nan")

    @property
    def tokens_per_target_forward(self) -> float:
        return len(self.token_ids) / self.target_forwards


def _check_inputs(target, params, draft, gamma: int, prompt_len: int) -> None:
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
    if params.has_penalties:
        raise ValueError("speculative_generate supports temperature, top-k, top-p, min-p and typical-p; penalties "
                         "and no_repeat_ngram_size are not supported, got " + repr(params))
    if params.n != 1:
        raise ValueError(f"params.n must be 1 (one sample per call), got {params.n}")
    if not callable(getattr(draft, "propose", None)):
        raise TypeError(f"draft must be a ModelDraft, an NgramDraft or have propose(), got {type(draft).__name__}")
    vocab = getattr(draft, "vocab_size", None)
    if vocab is not None and vocab != target.config.vocab_size:
        raise ValueError(f"draft and target must share a vocabulary: draft has {vocab} tokens, "
                         f"target {target.config.vocab_size}")
    needed = prompt_len + params.max_tokens + gamma
    for name, limit in (("target", getattr(target.config, "max_position_embeddings", None)),
                        ("draft", getattr(draft, "max_positions", None))):
        if limit is not None and needed > limit:
            raise ValueError(f"prompt ({prompt_len}) + max_tokens ({params.max_tokens}) + gamma ({gamma}) = {needed} "
                             f"exceeds the {name}'s context of {limit} positions")


@torch.no_grad()
def speculative_generate(target, tokenizer, prompt: str | list[int], params: SamplingParams, draft,
                         gamma: int = 4, rng: str = DEFAULT_RNG) -> SpeculativeResult:
    """Generate for one prompt (a string or token ids) with the target `target`, speculating `gamma` >= 1 tokens a
    round with `draft`. Stops as `generate` does: EOS (unless `ignore_eos`), a stop token, or `max_tokens`. The
    request's randomness (draft draws, acceptance tests, residual and bonus draws) comes from one stream of kind
    `rng` ("torch" or "counter", as `generate` takes it), seeded with `params.seed` (`make_generator`: an unseeded
    request with `rng="torch"` draws from torch's global RNG).

    Taught in: chapters/07b-speculative-decoding.ipynb
    """
    vocab = check_model(target, "speculative_generate(target, tokenizer, prompt, params, draft)", "target")
    gamma = check_int(gamma, "gamma", 1)
    check_rng(rng)
    context = prompt_token_ids(prompt, tokenizer, "prompt", vocab)
    _check_inputs(target, params, draft, gamma, len(context))
    device = next(target.parameters()).device
    generator = make_generator(params.seed, device, rng)
    eos = set() if params.ignore_eos else eos_token_ids(target, tokenizer)
    stops = eos | set(params.stop_token_ids)
    cache, cached = None, []
    generated: list[int] = []
    rounds: list[Round] = []
    reason = "length"
    while True:
        drafted, q = draft.propose(list(context), gamma, params, generator)
        drafted = list(drafted)
        if len(drafted) > gamma or any(not 0 <= t < vocab for t in drafted):
            raise ValueError(f"the draft must propose at most gamma={gamma} token ids < {vocab}, got {drafted}")
        if q is not None and tuple(q.shape) != (len(drafted), vocab):
            raise ValueError(f"the draft's q must have shape [{len(drafted)}, {vocab}], got {tuple(q.shape)}")
        cache, cached = _reuse(cache, cached, context)
        feed = context[len(cached):] + drafted
        logits, cache = model_step(target, torch.tensor([feed], device=device), cache)  # [1, len(feed), V]
        cached = cached + feed
        p = distributions(logits[0, -(len(drafted) + 1):], params)  # [k + 1, V]
        kept, token, betas = verify(drafted, None if q is None else q.double(), p, generator)
        rounds.append(Round(tuple(drafted), kept, token, tuple(betas)))
        for new in drafted[:kept] + [token]:
            generated.append(new)
            context.append(new)
            if new in stops or len(generated) >= params.max_tokens:
                reason = "stop" if new in stops else "length"
                text = None if tokenizer is None else tokenizer.decode(generated, skip_special_tokens=True)
                return SpeculativeResult(generated, text, reason, rounds)
