"""The tokens a seed gives are pinned: both kinds of stream, four steps of a batch that takes every route (plain,
temperature, top-k, top-p, min-p with temperature, argmax), and the same seeds in a plain batch of two rows.

Every stored output of the book is made of these streams, and performance work on the sampler must leave them as
they are. The values were drawn at 3195095 and again after the per-step trims that followed it, the same under
ATEN_CPU_CAPABILITY=default and avx2 (the logits sit far from any rounding boundary that would move a draw)."""
import pytest
import torch

from decodelab.sampling import SamplingParams
from decodelab.sampling.sampler import make_generator, sample

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

PARAMS = [SamplingParams(seed=11), SamplingParams(temperature=0.7, seed=12), SamplingParams(top_k=20, seed=13),
          SamplingParams(top_p=0.9, seed=14), SamplingParams(min_p=0.05, temperature=1.3, seed=15),
          SamplingParams(temperature=0.0)]
PINNED = {
    "torch": [[210, 26, 64, 104, 99, 209], [123, 231, 105, 104, 279, 209], [78, 16, 213, 83, 220, 209],
              [210, 160, 116, 285, 285, 209]],
    "counter": [[241, 180, 120, 107, 282, 209], [16, 244, 116, 83, 99, 209], [208, 152, 179, 83, 100, 209],
                [143, 1, 124, 104, 251, 209]],
}


@pytest.mark.parametrize("rng", ["torch", "counter"])
def test_seeded_streams_give_the_pinned_tokens(rng):
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(5)) * 2
    streams = [make_generator(p.seed, rng=rng) for p in PARAMS]
    assert [sample(logits, PARAMS, streams).tolist() for _ in range(4)] == PINNED[rng]
    # the first two rows alone make a plain batch (its own route): the same tokens as in the mixed one
    streams = [make_generator(p.seed, rng=rng) for p in PARAMS[:2]]
    assert [sample(logits[:2], PARAMS[:2], streams).tolist() for _ in range(4)] == [row[:2] for row in PINNED[rng]]
