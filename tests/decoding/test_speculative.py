"""decodelab.decoding.speculative: greedy equals the target's greedy token for token; sampled output follows the target's
distribution (chi-square at fixed seeds, with good, bad and n-gram drafts); acceptance matches 1 - TV; bad input."""
import math
from collections import Counter

import pytest
import torch

from decodelab.decoding.generate import generate
from decodelab.models.load import load_model
from decodelab.sampling.sampler import SamplingParams
from decodelab.decoding.speculative import ModelDraft, NgramDraft, speculative_generate, verify
from decodelab.toy.documents import DocumentLanguage
from speculative_checks import INTRO, NAMED, chi_square_p_value, target_sequence_probs

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def models():
    target, tokenizer = load_model("tiny-zh-doc", device="cpu")
    return {"target": target, "tokenizer": tokenizer, "small": load_model("tiny-zh-doc-small", device="cpu")[0],
            "sentences": load_model("tiny-zh", device="cpu")[0]}


class UniformDraft:
    """A deliberately bad draft: every token equally likely, whatever the context."""

    vocab_size = 473

    def propose(self, context, gamma, params, generator):
        q = torch.full((gamma, self.vocab_size), 1.0 / self.vocab_size, dtype=torch.float64)
        return torch.multinomial(q, 1, generator=generator).flatten().tolist(), q


def sampled_sequences(models, prompt, params, draft, gamma, length, runs):
    counts = Counter()
    for seed in range(runs):
        run = SamplingParams(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=seed,
                             max_tokens=length, ignore_eos=True)
        counts[tuple(speculative_generate(models["target"], models["tokenizer"], prompt, run, draft,
                                          gamma).token_ids)] += 1
    return counts


@pytest.mark.parametrize("gamma", [1, 3, 5])
@pytest.mark.parametrize("draft_name", ["small", "ngram"])
def test_greedy_equals_target_greedy(models, gamma, draft_name):
    docs = DocumentLanguage().sample(3, seed=1)
    prompts = [docs[0][:11], docs[1][:40], docs[2][:90]]
    params = SamplingParams(temperature=0.0, max_tokens=40)
    for prompt in prompts:
        expected = generate(models["target"], models["tokenizer"], prompt, params)[0]
        draft = ModelDraft(models["small"]) if draft_name == "small" else NgramDraft()
        result = speculative_generate(models["target"], models["tokenizer"], prompt, params, draft, gamma)
        assert result.token_ids == expected.token_ids
        assert result.finish_reason == expected.finish_reason
        assert result.target_forwards <= len(result.token_ids)


@pytest.mark.slow
@pytest.mark.parametrize("q_kind", ["dense", "point", "disjoint"])
def test_verify_first_token_follows_p(q_kind):
    gen = torch.Generator().manual_seed(0)
    vocab, runs = 6, 20000
    p = torch.softmax(torch.randn(3, vocab, generator=gen, dtype=torch.float64), dim=-1)
    if q_kind == "dense":
        q = torch.softmax(2 * torch.randn(2, vocab, generator=gen, dtype=torch.float64), dim=-1)
    elif q_kind == "disjoint":  # q puts mass where p has none and none where p has most
        p[0, 5] = 0.0
        p[0] /= p[0].sum()
        q = torch.tensor([[0.0, 0.1, 0.2, 0.3, 0.0, 0.4]] * 2, dtype=torch.float64)
    else:
        q = None
    counts = Counter()
    for _ in range(runs):
        drafted = ([int(torch.multinomial(q[0], 1, generator=gen)), int(torch.multinomial(q[1], 1, generator=gen))]
                   if q is not None else [2, 4])
        kept, token, _ = verify(drafted, q, p, gen)
        counts[drafted[0] if kept else token] += 1
    assert chi_square_p_value(counts, dict(enumerate(p[0].tolist())), runs) > 1e-3


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.8, top_k=20),
                                    SamplingParams(top_p=0.9)], ids=["T=1", "top-k", "top-p"])
@pytest.mark.slow
@pytest.mark.parametrize("draft_name", ["small", "ngram"])
def test_first_token_follows_target(models, params, draft_name):
    draft = ModelDraft(models["small"]) if draft_name == "small" else NgramDraft()
    expected = target_sequence_probs(models, NAMED, params, 1)
    counts = sampled_sequences(models, NAMED, params, draft, 3, 1, 800)
    assert chi_square_p_value(counts, expected, 800) > 1e-3


@pytest.mark.slow
def test_two_and_three_token_sequences_follow_target(models):
    for params, length in ((SamplingParams(), 2), (SamplingParams(top_k=3, top_p=0.9), 3)):
        expected = target_sequence_probs(models, NAMED, params, length)
        counts = sampled_sequences(models, NAMED, params, ModelDraft(models["small"]), 2, length, 800)
        assert chi_square_p_value(counts, expected, 800) > 1e-3, (params, counts.most_common(5))


@pytest.mark.slow
@pytest.mark.parametrize("draft_name", ["uniform", "sentences"])
def test_bad_draft_is_rarely_accepted_yet_the_output_follows_target(models, draft_name):
    draft = UniformDraft() if draft_name == "uniform" else ModelDraft(models["sentences"])
    params = SamplingParams()
    expected = target_sequence_probs(models, INTRO, params, 1)
    counts = sampled_sequences(models, INTRO, params, draft, 2, 1, 800)
    assert chi_square_p_value(counts, expected, 800) > 1e-3
    result = speculative_generate(models["target"], models["tokenizer"], INTRO, SamplingParams(seed=0, max_tokens=60),
                                  draft, 4)
    good = speculative_generate(models["target"], models["tokenizer"], INTRO, SamplingParams(seed=0, max_tokens=60),
                                ModelDraft(models["small"]), 4)
    assert result.acceptance_rate < 0.7 < good.acceptance_rate


@pytest.mark.slow
def test_acceptance_rate_matches_one_minus_tv(models):
    """Position i is kept with probability beta_i = sum min(p_i, q_i) given everything before it, so the kept count
    minus the sum of the betas is a martingale: its standard deviation is sqrt(sum beta (1 - beta)). Tolerance: 4 of
    those standard deviations (about 1 in 16,000 for a correct implementation)."""
    kept, betas = 0, []
    for seed, prompt in enumerate([INTRO, "这是老王在昆明的一天。", "这是姐姐在青岛的一天。"]):
        for draft in (ModelDraft(models["small"]), ModelDraft(models["sentences"])):
            result = speculative_generate(models["target"], models["tokenizer"], prompt,
                                          SamplingParams(seed=seed, max_tokens=80), draft, 4)
            kept += result.accepted
            betas += [b for r in result.rounds for b in r.acceptance_probs]
    sd = math.sqrt(sum(b * (1 - b) for b in betas))
    assert abs(kept - sum(betas)) <= 4 * sd, (kept, sum(betas), sd)


def test_ngram_draft_proposes_the_last_match():
    draft = NgramDraft(max_n=2)
    assert draft.propose([5, 6, 7, 8, 5, 6, 9, 5, 6], 3, SamplingParams(), None) == ([9, 5, 6], None)
    assert draft.propose([1, 2, 3], 3, SamplingParams(), None) == ([], None)
    assert NgramDraft(max_n=3).propose([4, 4], 5, SamplingParams(), None) == ([4], None)


@pytest.mark.parametrize("rng", ["torch", "counter"])
def test_a_kind_of_stream_reproduces_and_the_two_kinds_differ(models, rng):
    """`rng` picks the request's one stream, as generate's does: the same seed gives the same tokens again, and the
    other kind gives other tokens (the same distribution: tests/engine/test_speculation.py's chi-square tests run
    both kinds)."""
    other = {"torch": "counter", "counter": "torch"}[rng]
    run = lambda kind: speculative_generate(models["target"], models["tokenizer"], INTRO,  # noqa: E731
                                            SamplingParams(seed=3, max_tokens=20), ModelDraft(models["small"]), 4,
                                            rng=kind).token_ids
    first = run(rng)
    assert run(rng) == first and run(other) != first


def test_an_unknown_kind_of_stream_is_refused(models):
    with pytest.raises(ValueError, match=r"rng must be one of \('torch', 'counter'\), got 'numpy'"):
        speculative_generate(models["target"], models["tokenizer"], INTRO, SamplingParams(seed=3), NgramDraft(), 4,
                             rng="numpy")


def test_stops_and_seed_reproduce(models):
    params = SamplingParams(seed=3, max_tokens=30)
    first = speculative_generate(models["target"], models["tokenizer"], INTRO, params, ModelDraft(models["small"]), 4)
    again = speculative_generate(models["target"], models["tokenizer"], INTRO, params, ModelDraft(models["small"]), 4)
    assert first.token_ids == again.token_ids and len(first.token_ids) == 30 and first.finish_reason == "length"
    stop = first.token_ids[5]
    ended = speculative_generate(models["target"], models["tokenizer"], INTRO,
                                 SamplingParams(seed=3, max_tokens=30, stop_token_ids=(stop,)),
                                 ModelDraft(models["small"]), 4)
    assert ended.finish_reason == "stop" and ended.token_ids[-1] == stop and stop not in ended.token_ids[:-1]


class WrongDraft:
    def __init__(self, tokens, q=None, vocab_size=None):
        self.tokens, self.q, self.vocab_size = tokens, q, vocab_size

    def propose(self, context, gamma, params, generator):
        return self.tokens, self.q


@pytest.mark.parametrize("kwargs, message", [
    (dict(gamma=0), "gamma must be an int >= 1, got 0"),
    (dict(gamma=2.5), "gamma must be an int >= 1, got 2.5"),
    (dict(gamma=True), "gamma must be an int >= 1, got True"),
    (dict(draft=WrongDraft([], vocab_size=100)), "draft and target must share a vocabulary: draft has 100"),
    (dict(draft=object()), "draft must be a ModelDraft, an NgramDraft or have propose()"),
    (dict(draft=WrongDraft([1, 2, 3, 4, 5, 6])), "the draft must propose at most gamma=4"),
    (dict(draft=WrongDraft([999])), "token ids < 473"),
    (dict(draft=WrongDraft([5], torch.ones(2, 473))), "the draft's q must have shape [1, 473]"),
    (dict(params=SamplingParams(repetition_penalty=1.2)), "penalties and no_repeat_ngram_size are not supported"),
    (dict(params=SamplingParams(n=2)), "params.n must be 1"),
    (dict(params="greedy"), "params must be a SamplingParams"),
    (dict(params=SamplingParams(max_tokens=600)), "exceeds the target's context of 512 positions"),
    (dict(prompt=[]), "prompt must hold at least one token, got an empty prompt"),
    (dict(prompt=[1, 5000]), "prompt token ids must be in [0, 473), got 1..5000"),
])
def test_bad_inputs_raise_clear_errors(models, kwargs, message):
    call = dict(prompt=INTRO, params=SamplingParams(max_tokens=4), draft=NgramDraft(), gamma=4) | kwargs
    with pytest.raises((ValueError, TypeError)) as error:
        speculative_generate(models["target"], models["tokenizer"], **call)
    assert message in str(error.value)


def test_ngram_draft_arguments():
    with pytest.raises(ValueError, match="min_n must be <= max_n, got min_n=3, max_n=2"):
        NgramDraft(max_n=2, min_n=3)
    with pytest.raises(ValueError, match="max_n must be an int >= 1, got 0"):
        NgramDraft(max_n=0)
