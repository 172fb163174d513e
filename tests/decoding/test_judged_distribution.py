"""The acceptance rule computed exactly (decodelab.decoding.speculative.judged_distribution, on the `residual` that
`verify` draws from): it equals p for any draft distribution q or point mass, and a planted residual bug does not."""
import pytest
import torch

from decodelab.decoding.speculative import judged_distribution, residual, verify


def random_distribution(generator: torch.Generator, vocab: int, zeros: int) -> torch.Tensor:
    probs = torch.rand(vocab, generator=generator, dtype=torch.float64) ** 3
    probs[torch.randperm(vocab, generator=generator)[:zeros]] = 0.0
    return probs / probs.sum()


@pytest.mark.parametrize("seed", range(20))
def test_the_rule_emits_p_whatever_the_draft(seed):
    generator = torch.Generator().manual_seed(seed)
    p, q = random_distribution(generator, 12, zeros=3), random_distribution(generator, 12, zeros=4)
    assert torch.allclose(judged_distribution(p, q), p, atol=1e-12)
    token = int(torch.randint(12, (), generator=generator))
    assert torch.allclose(judged_distribution(p, None, token=token), p, atol=1e-12)   # the n-gram draft's point mass


def test_a_residual_drawn_from_p_is_caught_where_drafts_are_rejected():
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    wrong = judged_distribution(p, torch.tensor([0.1, 0.1, 0.8], dtype=torch.float64), residual_rule=lambda p, q, x: p)
    assert 0.5 * float((wrong - p).abs().sum()) > 0.1
    same = judged_distribution(p, p.clone(), residual_rule=lambda p, q, x: p)        # q == p: nothing is rejected
    assert torch.allclose(same, p, atol=1e-12)


def test_verify_draws_its_rejections_from_residual():
    p = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    q = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)                        # the draft is always wrong
    assert verify([0], q, p, torch.Generator().manual_seed(0))[:2] == (0, 1)
    assert residual(p[0], q[0], 0).tolist() == [0.0, 1.0, 0.0]
    assert residual(p[0], p[0], 1).tolist() == p[0].tolist(), "p == q: the residual falls back to p"
