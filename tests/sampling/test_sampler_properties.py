"""Property tests for decodelab.sampling.sampler (hypothesis, derandomised so every run checks the same cases)."""
import torch
from hypothesis import given, settings, strategies as st

from decodelab.sampling.sampler import SamplingParams, process_logits, sample

params_strategy = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.3, 1.0, 2.5]),
    top_k=st.integers(0, 600),
    top_p=st.floats(0.01, 1.0),
    min_p=st.sampled_from([0.0, 0.0, 0.02, 0.5, 1.0]),
    typical_p=st.sampled_from([1.0, 1.0, 0.2, 0.95]),
    repetition_penalty=st.sampled_from([1.0, 0.7, 1.5]),
    frequency_penalty=st.sampled_from([0.0, 0.5, -0.5]),
    presence_penalty=st.sampled_from([0.0, 1.0]),
)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(rows=st.lists(params_strategy, min_size=1, max_size=6), vocab_size=st.sampled_from([2, 50, 1100, 3000]),
       sigma=st.sampled_from([0.1, 1.0, 4.0]), seed=st.integers(0, 2**16))
def test_processing_invariants(rows, vocab_size, sigma, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(rows), vocab_size, generator=gen) * sigma
    logits[0, 0] = float("-inf")  # a token removed beforehand stays removed
    seen = torch.randint(0, vocab_size, (len(rows), 5), generator=gen)
    before = logits.clone()
    fast = process_logits(logits, rows, seen, method="fast")
    sort = process_logits(logits, rows, seen, method="sort")
    assert torch.equal(logits, before)
    kept = torch.isfinite(fast)
    assert torch.equal(kept, torch.isfinite(sort)), "the two paths keep different tokens"
    assert kept.any(dim=1).all(), "every row keeps a token"
    assert not kept[0, 0]
    assert torch.allclose(fast.softmax(-1), sort.softmax(-1), rtol=1e-5, atol=1e-7)
    for i, row in enumerate(rows):
        if row.greedy:
            assert kept[i].sum() == 1
        if row.top_k:
            assert kept[i].sum() <= row.top_k
    tokens = sample(logits, rows, output_tokens=seen)
    assert kept.gather(1, tokens.unsqueeze(1)).all(), "a removed token was drawn"


@settings(max_examples=15, deadline=None, derandomize=True)
@given(temperature=st.floats(1e-3, 10.0), vocab_size=st.integers(1, 400), seed=st.integers(0, 2**16))
def test_temperature_keeps_the_order_and_greedy_is_argmax(temperature, vocab_size, seed):
    logits = torch.randn(2, vocab_size, generator=torch.Generator().manual_seed(seed))
    out = process_logits(logits, [SamplingParams(temperature=temperature), SamplingParams(temperature=0.0)])
    assert torch.equal(out[0].argsort(), (logits[0] / temperature).argsort())
    assert int(sample(logits, SamplingParams(temperature=0.0))[1]) == int(logits[1].argmax())
