"""Temperature on logits that overflow when divided: finite, the same argmax, and ordinary rows left bit for bit."""
import pytest
import torch

from decodelab.sampling.batch import SamplingBatch
from decodelab.sampling.processors import RowGroup, Temperature
from decodelab.sampling.sampler import SamplingParams, process_logits, sample

HUGE = torch.tensor([[1e38, 3e38, 0.0, -3e38, float("-inf")]])  # 3e38 / 0.01 overflows float32


@pytest.mark.parametrize("method", ["fast", "sort"])
@pytest.mark.parametrize("extra", [{}, {"top_p": 0.9}, {"top_k": 3}, {"min_p": 0.1}, {"typical_p": 0.9}])
def test_sample_at_a_low_temperature_on_huge_logits_returns_the_argmax(method, extra):
    params = SamplingParams(temperature=0.01, seed=0, **extra)
    assert sample(HUGE, [params], method=method).tolist() == [1]
    processed = process_logits(HUGE, [params])
    assert not processed.isnan().any() and not processed.isposinf().any()
    assert torch.softmax(processed, dim=-1)[0, 1] == 1.0


def test_ordinary_rows_are_divided_as_before_and_huge_rows_are_shifted():
    logits = torch.cat([torch.randn(1, 5, generator=torch.Generator().manual_seed(0)) * 7, HUGE])  # [2, 5]
    batch = SamplingBatch([SamplingParams(temperature=0.37), SamplingParams(temperature=0.01)])
    group = RowGroup.dense([0, 1], logits, row_max=logits.amax(dim=1, keepdim=True))
    Temperature()(group, batch)
    assert torch.equal(group.logits[0], logits[0] / torch.tensor(0.37))  # bit for bit: seeded draws stay the same
    assert group.logits[1, 1] == 0.0 and not group.logits[1].isnan().any() and not group.logits[1].isposinf().any()
    assert torch.equal(group.row_max, group.logits.amax(dim=1, keepdim=True))
