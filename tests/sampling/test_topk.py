"""Top-k by chunk maxima (decodelab.sampling.ops.topk) equals torch.topk; the sampler's single pass keeps its checks."""
import pytest
import torch

from decodelab.sampling.ops.topk import MAXIMA_CHUNK, chunk_maxima, topk


@pytest.mark.parametrize("rows, vocab, k", [(64, 32768, 50), (3, 152064, 40), (1, 4096, 1), (5, 8192, 32),
                                            (2, 65536, 256)])
def test_equals_torch_topk(rows, vocab, k):
    x = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(vocab + k)) * 3
    x[:, ::7] = float("-inf")                               # masked tokens, as penalties or a grammar leave them
    want = torch.topk(x, k, dim=-1)
    values, ids = topk(x, k, chunk_maxima(x))
    assert torch.equal(values, want.values) and torch.equal(ids, want.indices)
    assert torch.equal(x.gather(1, ids), values)


def test_best_values_crowded_into_one_chunk():
    # all of the k best tokens sit in two adjacent chunks: the other chosen chunks hold nothing that is kept
    x = torch.randn(2, 64 * MAXIMA_CHUNK, generator=torch.Generator().manual_seed(1))
    x[:, 5 * MAXIMA_CHUNK: 7 * MAXIMA_CHUNK] += 100.0
    values, ids = topk(x, 16, chunk_maxima(x))
    assert torch.equal(values, torch.topk(x, 16).values)
    assert bool(((ids >= 5 * MAXIMA_CHUNK) & (ids < 7 * MAXIMA_CHUNK)).all())


def test_temperature_keeps_the_chunks():
    x = torch.randn(4, 16384, generator=torch.Generator().manual_seed(2))
    scale = torch.tensor([[0.5], [1.0], [1.7], [3.0]])
    values, ids = topk(x / scale, 20, chunk_maxima(x))      # maxima of x pick the chunks of x / scale too
    assert torch.equal(ids, torch.topk(x / scale, 20).indices)


def test_falls_back_where_chunks_do_not_pay():
    x = torch.randn(2, 473)                                 # tiny-zh's vocabulary is not a multiple of the chunk
    assert chunk_maxima(x) is None
    assert torch.equal(topk(x, 5, None)[1], torch.topk(x, 5).indices)
    wide = torch.randn(2, 4096)
    assert torch.equal(topk(wide, 64, chunk_maxima(wide))[1], torch.topk(wide, 64).indices)  # 64 chunks of 64: all


def test_rejects_chunk_maxima_of_another_shape():
    x = torch.randn(2, 8192)
    with pytest.raises(ValueError, match=r"chunk_max must have shape \[2, 128\], got \(2, 64\)"):
        topk(x, 4, torch.zeros(2, 64))


def test_sampler_fast_path_through_chunks_keeps_the_sort_paths_tokens():
    from decodelab.sampling.sampler import SamplingParams, process_logits
    logits = torch.randn(16, 32768, generator=torch.Generator().manual_seed(3)) * 3
    params = [SamplingParams(temperature=0.6 + 0.1 * i, top_k=50, top_p=0.9, repetition_penalty=1.2)
              for i in range(16)]
    seen = torch.randint(0, 32768, (16, 20), generator=torch.Generator().manual_seed(4))
    fast = process_logits(logits, params, seen, method="fast")
    sort = process_logits(logits, params, seen, method="sort")
    assert torch.equal(torch.isinf(fast), torch.isinf(sort))
    torch.testing.assert_close(fast.softmax(-1), sort.softmax(-1))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("params", [{"top_k": 50}, {"temperature": 0.8}, {"temperature": 0.8, "rng": "counter"}],
                         ids=["top-k: checked on the chunk maxima", "plain: checked on the logits", "plain, counter"])
def test_sampler_still_rejects_nan_and_inf_rows(bad, params):
    from decodelab.sampling.sampler import SamplingParams, make_generator, process_logits, sample
    params = dict(params)                 # pytest shares the parametrized dict between the values of `bad`
    rng = params.pop("rng", "torch")
    generators = [make_generator(i, rng=rng) for i in range(3)]
    logits = torch.randn(3, 32768)
    logits[1, 12345] = bad
    with pytest.raises(ValueError, match=r"logits rows \[1\] hold NaN or \+inf"):
        sample(logits, SamplingParams(**params), generators)
    with pytest.raises(ValueError, match=r"logits rows \[1\] hold NaN or \+inf"):
        process_logits(logits, SamplingParams(**params))
    logits[1] = float("-inf")
    with pytest.raises(ValueError, match=r"logits rows \[1\] hold NaN or \+inf, or only -inf"):
        sample(logits, SamplingParams(**params), generators)
