"""decodelab.sampling.ops.rejection: top-p by rejection with a rising pivot, the route of `sample(method="fast")` for top-p alone."""
import math

import pytest
import torch

import decodelab.sampling.ops.fast_paths as fast_paths
from decodelab.sampling.ops.rejection import top_p_rejection
from decodelab.sampling.sampler import SamplingParams, make_generator, process_logits, sample


def chi_square_check(counts: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    """Chi-square statistic of `counts` against probabilities `expected` (cells expecting < 5 pooled), and the upper
    0.999 quantile for its degrees of freedom (Wilson-Hilferty)."""
    total = float(counts.sum())
    assert counts[expected == 0].sum() == 0, "a token of probability 0 was drawn"
    kept = (expected > 0).nonzero().flatten()
    big = kept[expected[kept] * total >= 5]
    observed = torch.cat([counts[big], (counts[kept].sum() - counts[big].sum()).view(1)]).double()
    wanted = torch.cat([expected[big], (expected[kept].sum() - expected[big].sum()).view(1)]).double() * total
    observed, wanted = observed[wanted > 0], wanted[wanted > 0]
    dof = len(wanted) - 1
    h = 2.0 / (9.0 * dof)
    return float(((observed - wanted) ** 2 / wanted).sum()), dof * (1.0 - h + 3.09 * math.sqrt(h)) ** 3


def draw_counts(logits: torch.Tensor, params: SamplingParams, rows: int, calls: int) -> torch.Tensor:
    counts = torch.zeros(logits.shape[1])
    for _ in range(calls):
        counts += torch.bincount(sample(logits.expand(rows, -1), params, method="fast"), minlength=logits.shape[1])
    return counts


@pytest.mark.parametrize("vocab_size, sigma, top_p, temperature", [
    (1000, 3.0, 0.9, 1.0), (1000, 1.0, 0.9, 1.0), (300, 1.0, 0.6, 0.7), (37, 1.0, 0.95, 1.3), (4096, 3.0, 0.9, 1.0),
], ids=["sigma3", "sigma1-flat", "small-V", "V-not-a-chunk-multiple", "V4096"])
def test_frequencies_match_the_sort_paths_distribution(vocab_size, sigma, top_p, temperature):
    torch.manual_seed(vocab_size)
    logits = torch.randn(1, vocab_size) * sigma
    params = SamplingParams(top_p=top_p, temperature=temperature)
    expected = process_logits(logits, params, method="sort").softmax(-1)[0]  # [V]
    statistic, critical = chi_square_check(draw_counts(logits, params, rows=4000, calls=5), expected)
    assert statistic < critical, (statistic, critical)


def test_handing_pending_rows_to_the_sort_path_keeps_the_distribution(monkeypatch):
    """One rejection round, then the sort path for the rest: still p renormalised over the nucleus."""
    calls = []

    def one_round(*args, **kwargs):
        tokens, pending = top_p_rejection(*args, max_rounds=1, **kwargs)
        calls.append(len(pending))
        return tokens, pending

    monkeypatch.setattr(fast_paths, "top_p_rejection", one_round)
    torch.manual_seed(11)
    logits = torch.randn(1, 700) * 2
    params = SamplingParams(top_p=0.4)
    expected = process_logits(logits, params, method="sort").softmax(-1)[0]
    statistic, critical = chi_square_check(draw_counts(logits, params, rows=4000, calls=4), expected)
    assert statistic < critical, (statistic, critical)
    assert min(calls) > 1000, "about 60% of rows should be left pending after one round"


@pytest.mark.parametrize("sigma", [1.0, 3.0])
def test_tokens_outside_the_nucleus_are_never_drawn(sigma):
    torch.manual_seed(int(sigma * 10))
    logits = torch.randn(48, 40000) * sigma
    params = [SamplingParams(top_p=p, temperature=t) for p in (0.05, 0.3, 0.6, 0.9, 0.97, 0.999) for t in (0.6, 1.5)]
    params = params * 4
    kept = torch.isfinite(process_logits(logits, params, method="sort"))  # [B, V]
    for _ in range(10):
        tokens = sample(logits, params, method="fast")
        assert kept.gather(1, tokens.unsqueeze(1)).all()


def test_the_drawn_set_is_the_sort_paths_kept_set_near_the_boundary():
    """Eight likely tokens: for top-p values on both sides of every cumulative boundary, the tokens drawn over many
    rows are exactly those the sort path keeps (so the boundary convention is transformers')."""
    probs = torch.tensor([0.3, 0.2, 0.15, 0.12, 0.1, 0.07, 0.04, 0.02], dtype=torch.float64)
    logits = probs.log().float().unsqueeze(0)  # [1, 8]
    ascending = probs.flip(0).cumsum(0).tolist()  # the cumulative masses transformers compares with 1 - top_p
    torch.manual_seed(12)
    for edge in ascending[:-1]:
        for top_p in (1.0 - edge - 1e-3, 1.0 - edge + 1e-3):
            params = SamplingParams(top_p=top_p)
            kept = torch.isfinite(process_logits(logits, params, method="sort"))[0]
            drawn = torch.zeros(8, dtype=torch.bool)
            drawn[sample(logits.expand(3000, -1), params, method="fast")] = True
            assert torch.equal(drawn, kept), (top_p, drawn.tolist(), kept.tolist())


@pytest.mark.parametrize("sigma, top_p", [(3.0, 0.9), (1.0, 0.2)])
def test_seeded_rows_draw_the_same_alone_and_in_a_mixed_batch(sigma, top_p):
    """top_p 0.2 on flat logits needs several rounds, so a batch-dependent number of draws would show."""
    torch.manual_seed(13)
    vocab_size = 5000
    rows = torch.randn(2, vocab_size) * sigma
    mine = [SamplingParams(top_p=top_p, seed=3), SamplingParams(top_p=top_p, temperature=0.8, seed=4)]
    alone = [make_generator(3, rng="torch"), make_generator(4, rng="torch")]
    together = [make_generator(3, rng="torch"), make_generator(4, rng="torch")]
    neighbours = [SamplingParams(top_p=0.5), SamplingParams(top_k=20, top_p=0.9, seed=8), SamplingParams(min_p=0.1),
                  SamplingParams(temperature=0.0), SamplingParams(top_p=0.3, seed=9)]
    first, second = [], []
    for _ in range(12):
        first += [int(sample(rows[:1], mine[:1], alone[:1])), int(sample(rows[1:], mine[1:], alone[1:]))]
        batch = torch.cat([torch.randn(3, vocab_size), rows[:1], torch.randn(2, vocab_size) * 0.3, rows[1:]])
        params = neighbours[:3] + mine[:1] + neighbours[3:] + mine[1:]
        gens = [None, make_generator(8, rng="torch"), None, together[0], None, make_generator(9, rng="torch"),
                together[1]]
        drawn = sample(batch, params, gens)
        second += [int(drawn[3]), int(drawn[6])]
    assert first == second
    assert len(set(first)) > 4, "successive steps must use fresh randomness"
    assert torch.equal(alone[0].get_state(), together[0].get_state()), "a seeded row consumed a batch-dependent amount"


def test_only_rows_with_top_p_alone_take_the_rejection_route(monkeypatch):
    seen = []

    def spy(logits, top_p, generators, **kwargs):
        seen.append((logits.clone(), list(top_p)))
        return top_p_rejection(logits, top_p, generators, **kwargs)

    monkeypatch.setattr(fast_paths, "top_p_rejection", spy)
    torch.manual_seed(14)
    logits = torch.randn(8, 600)
    params = [SamplingParams(top_p=0.9), SamplingParams(top_k=5, top_p=0.9), SamplingParams(min_p=0.1, top_p=0.9),
              SamplingParams(typical_p=0.9, top_p=0.9), SamplingParams(top_p=0.5, temperature=0.5),
              SamplingParams(temperature=0.0, top_p=0.9), SamplingParams(), SamplingParams(top_k=3)]
    tokens = sample(logits, params, method="fast")
    assert len(seen) == 1
    routed, top_p = seen[0]
    assert top_p == [0.9, 0.5]
    # the temperature processor ran first: the rejection sees tempered logits
    torch.testing.assert_close(routed, torch.stack([logits[0], logits[4] / 0.5]))
    kept = torch.isfinite(process_logits(logits, params, method="sort"))
    assert kept.gather(1, tokens.unsqueeze(1)).all()
    sample(logits, params, method="sort")
    process_logits(logits, params, method="fast")
    assert len(seen) == 1, "the sort method and process_logits never use rejection"


def test_round_cap_returns_the_undecided_rows_and_accepted_rows_hold_the_nucleus():
    torch.manual_seed(15)
    logits = torch.randn(64, 3000)  # flat; top_p 1e-6 keeps only the most likely token, rarely drawn in one round
    tokens, pending = top_p_rejection(logits, [1e-6] * 64, [None] * 64, max_rounds=1)
    assert 0 < len(pending) < 64
    done = [i for i in range(64) if i not in set(pending)]
    assert torch.equal(tokens[done], logits[done].argmax(dim=1))
    tokens, pending = top_p_rejection(logits, [1e-6] * 64, [None] * 64)
    assert pending == [] and torch.equal(tokens, logits.argmax(dim=1))


def test_tiny_vocabularies_float64_and_removed_tokens():
    torch.manual_seed(16)
    one = torch.randn(3, 1, dtype=torch.float64)
    assert top_p_rejection(one, [0.5, 0.9, 1e-3], [None] * 3)[0].tolist() == [0, 0, 0]
    logits = torch.randn(4, 300, dtype=torch.float64)
    logits[:, ::2] = float("-inf")  # removed beforehand: never drawn, even at top_p 1
    for _ in range(5):
        tokens, pending = top_p_rejection(logits, [1.0, 0.9, 0.5, 0.99],
                                          [None, make_generator(1, rng="torch"), None, None])
        assert pending == [] and (tokens % 2 == 1).all()


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(logits=torch.randn(5)), ValueError, "logits"),
    (dict(logits=torch.zeros(2, 5, dtype=torch.long)), ValueError, "logits"),
    (dict(top_p=[0.9]), ValueError, "top_p"),
    (dict(top_p=[0.9, 0.0]), ValueError, "top_p"),
    (dict(top_p=[0.9, 1]), ValueError, "top_p"),
    (dict(generators=[None]), ValueError, "generators"),
    (dict(generators=torch.Generator()), ValueError, "generators"),
    (dict(generators=[None, 7]), TypeError, r"generators\[1\]"),
    (dict(max_rounds=0), ValueError, "max_rounds"),
    (dict(max_rounds=True), ValueError, "max_rounds"),
    (dict(logits=torch.tensor([[0.0, 1.0], [float("-inf"), float("-inf")]])), ValueError, "finite"),
    (dict(logits=torch.tensor([[0.0, float("nan")], [0.0, 1.0]])), ValueError, "finite"),
    (dict(row_max=torch.zeros(2)), ValueError, r"row_max must be None or a tensor \[2, 1\]"),
    (dict(row_max=[1.0, 2.0]), ValueError, "row_max"),
    (dict(row_max=torch.tensor([[1.0], [float("inf")]])), ValueError, "finite"),
])
def test_rejects_bad_input(kwargs, error, pattern):
    args = dict(logits=torch.randn(2, 5), top_p=[0.9, 0.5], generators=[None, None], max_rounds=4, row_max=None)
    args.update(kwargs)
    with pytest.raises(error, match=pattern):
        top_p_rejection(args["logits"], args["top_p"], args["generators"], args["max_rounds"],
                        row_max=args["row_max"])


@pytest.mark.cuda
def test_cuda_seeded_rows_and_nucleus():
    torch.manual_seed(17)
    logits = (torch.randn(32, 32000) * 3).cuda()
    params = [SamplingParams(top_p=0.9, seed=i) for i in range(32)]
    kept = torch.isfinite(process_logits(logits, params, method="sort"))
    tokens = sample(logits, params, [make_generator(i, "cuda", rng="torch") for i in range(32)])
    assert kept.gather(1, tokens.unsqueeze(1)).all()
    alone = sample(logits[5:6], params[5:6], [make_generator(5, "cuda", rng="torch")])
    assert int(alone[0]) == int(tokens[5])



def test_fast_top_k_candidates_equal_the_reference_processors():
    """The fast route chooses each top-k row's candidates on untempered logits (dividing keeps the order); the
    processors then divide only those, and the result equals the dense reference."""
    from decodelab.sampling.processors import RowGroup, apply_processors
    from decodelab.sampling.batch import SamplingBatch

    torch.manual_seed(18)
    logits = torch.randn(3, 2000) * 3
    batch = SamplingBatch([SamplingParams(top_k=5, top_p=0.9, temperature=0.5), SamplingParams(top_k=40),
                           SamplingParams(top_k=300, top_p=0.8, temperature=1.7)])
    reference = apply_processors(RowGroup.dense([0, 1, 2], logits), batch).logits
    fast = apply_processors(fast_paths.top_k_candidates(logits, [0, 1, 2], batch, None), batch)
    assert fast.top_k_candidates and fast.widths == [5, 40, 300]
    assert torch.equal(fast.to_vocabulary(2000), reference)


def test_rejection_can_use_the_callers_tensor_as_scratch():
    torch.manual_seed(19)
    logits = torch.randn(4, 1000) * 2
    kept = logits.clone()
    copied, _ = top_p_rejection(logits, [0.9] * 4, [make_generator(i, rng="torch") for i in range(4)])
    assert torch.equal(logits, kept), "without overwrite the input is left as it was"
    scratch, _ = top_p_rejection(logits, [0.9] * 4, [make_generator(i, rng="torch") for i in range(4)],
                                 overwrite=True)
    assert torch.equal(copied, scratch)


@pytest.mark.parametrize("rows, vocab_size", [(9, 32768), (3, 1000), (40, 4096)])
def test_a_known_row_maximum_and_the_cache_blocks_change_no_draw(rows, vocab_size, monkeypatch):
    """Passing each row's exact maximum (as the fast path does from its chunk maxima) and cutting the rows into cache
    blocks of any size give the same tokens as one block with the maximum found by a pass: at 32k columns a block
    holds 4 rows, so 9 rows are three blocks with a short last one; 1,000 columns are padded to whole chunks."""
    import decodelab.sampling.ops.rejection as rejection

    torch.manual_seed(20)
    logits = torch.randn(rows, vocab_size) * 3
    top_p = [0.5 + 0.45 * i / rows for i in range(rows)]

    def draw(**kwargs):
        return top_p_rejection(logits.clone(), top_p, [make_generator(i, rng="torch") for i in range(rows)],
                               overwrite=True, **kwargs)

    reference, pending = draw()
    assert pending == []
    assert torch.equal(draw(row_max=logits.amax(dim=1, keepdim=True))[0], reference)
    for block_bytes in (1, 3 * vocab_size * 4, 1 << 40):   # one row per block, three rows, every row at once
        monkeypatch.setattr(rejection, "CACHE_BLOCK_BYTES", block_bytes)
        assert torch.equal(draw()[0], reference)


def test_the_fast_path_gets_the_tempered_row_maximum_from_the_chunk_maxima():
    """draw_by_rejection takes each row's maximum from the chunk maxima and Temperature divides it with the row:
    the result is exactly the maximum of the tempered row, so the draws equal those of a fresh pass."""
    from decodelab.sampling.processors import RowGroup, Temperature
    from decodelab.sampling.batch import SamplingBatch
    from decodelab.sampling.ops.topk import chunk_maxima

    torch.manual_seed(21)
    logits = torch.randn(6, 32768) * 3
    batch = SamplingBatch([SamplingParams(temperature=0.3 + 0.37 * i, top_p=0.9) for i in range(6)])
    group = RowGroup.dense(list(range(6)), logits, chunk_maxima(logits).amax(dim=1, keepdim=True))
    Temperature()(group, batch)
    assert torch.equal(group.row_max, group.logits.amax(dim=1, keepdim=True))
    generators = [make_generator(i, rng="torch") for i in range(6)]
    with_max, _ = fast_paths.draw_by_rejection(logits, list(range(6)), batch, generators, chunk_maxima(logits))
    generators = [make_generator(i, rng="torch") for i in range(6)]
    without, _ = fast_paths.draw_by_rejection(logits, list(range(6)), batch, generators, None)
    assert torch.equal(with_max, without)
