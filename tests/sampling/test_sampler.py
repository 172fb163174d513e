"""decodelab.sampling.sampler: parameters, processing against transformers, sampling statistics, seeds, bad input."""
import random

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from decodelab.sampling.counter_rng import inverse_cdf
from decodelab.sampling.sampler import SamplingParams, make_generator, process_logits, sample
from sampling_checks import chi_square_critical, peaked_logits

METHODS = ["fast", "sort"]


def transformers_reference(row: torch.Tensor, params: SamplingParams, seen: torch.Tensor) -> torch.Tensor:
    """One row through transformers' processors with scalar values, in transformers' order."""
    scores = row.unsqueeze(0).clone()
    if params.repetition_penalty != 1.0:
        scores = RepetitionPenaltyLogitsProcessor(params.repetition_penalty)(seen.unsqueeze(0), scores)
    if params.temperature != 1.0:
        scores = TemperatureLogitsWarper(params.temperature)(None, scores)
    if params.top_k:
        scores = TopKLogitsWarper(params.top_k)(None, scores)
    if params.top_p < 1.0:
        scores = TopPLogitsWarper(params.top_p)(None, scores)
    if params.min_p > 0.0:
        scores = MinPLogitsWarper(params.min_p)(None, scores)
    if params.typical_p < 1.0:
        scores = TypicalLogitsWarper(params.typical_p)(None, scores)
    return scores[0]


def mixed_params(batch: int, seed: int) -> list[SamplingParams]:
    rng = random.Random(seed)
    return [SamplingParams(temperature=rng.choice([0.5, 1.0, 1.7]), top_k=rng.choice([0, 0, 5, 50, 700]),
                           top_p=rng.choice([1.0, 0.9, 0.5, 0.99]), min_p=rng.choice([0.0, 0.0, 0.05]),
                           typical_p=rng.choice([1.0, 1.0, 0.9]), repetition_penalty=rng.choice([1.0, 1.3, 0.8]))
            for _ in range(batch)]


# ---------------------------------------------------------------- SamplingParams

def test_params_defaults_and_conversion():
    params = SamplingParams(temperature=1, stop_token_ids=[5, 7])
    assert params.temperature == 1.0 and isinstance(params.temperature, float)
    assert params.stop_token_ids == (5, 7)
    assert (params.top_k, params.top_p, params.min_p, params.typical_p, params.max_tokens) == (0, 1.0, 0.0, 1.0, 16)
    with pytest.raises(AttributeError):
        params.temperature = 2.0  # frozen


@pytest.mark.parametrize("field, value", [
    ("temperature", -0.1), ("temperature", float("nan")), ("temperature", float("inf")), ("temperature", 1e-9),
    ("temperature", "1"), ("top_k", -1), ("top_k", 2.0), ("top_k", True), ("top_p", 0.0), ("top_p", 1.5),
    ("top_p", float("nan")), ("min_p", -0.1), ("min_p", 1.1), ("typical_p", 0.0), ("typical_p", 1.01),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0), ("repetition_penalty", float("inf")),
    ("frequency_penalty", 2.5), ("frequency_penalty", float("nan")), ("presence_penalty", -3.0),
    ("seed", -1), ("seed", 1.5), ("seed", True), ("n", 0), ("max_tokens", 0), ("max_tokens", 3.0),
    ("stop_token_ids", (-1,)), ("stop_token_ids", ("a",)), ("stop_token_ids", 5), ("ignore_eos", 1),
])
def test_params_reject_bad_values(field, value):
    with pytest.raises(ValueError, match=field) as info:
        SamplingParams(**{field: value})
    assert repr(value) in str(info.value)


def test_make_generator():
    assert make_generator(None, "cpu") is None
    a, b = make_generator(3, "cpu"), make_generator(3, "cpu")
    assert torch.equal(torch.rand(5, generator=a), torch.rand(5, generator=b))
    with pytest.raises(ValueError, match="seed"):
        make_generator(-2, "cpu")


# ---------------------------------------------------------------- process_logits against transformers

@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("vocab_size, sigma", [(1000, 3.0), (4096, 3.0), (4096, 1.0), (32768, 3.0)])
def test_process_logits_equals_transformers(method, vocab_size, sigma):
    torch.manual_seed(vocab_size)
    batch = 24
    logits = torch.randn(batch, vocab_size) * sigma  # continuous values: no ties
    seen = torch.randint(0, vocab_size, (batch, 12))
    params = mixed_params(batch, seed=vocab_size)
    before = logits.clone()
    out = process_logits(logits, params, seen, method=method)
    assert torch.equal(logits, before), "the input must not be modified"
    for i in range(batch):
        ref = transformers_reference(logits[i], params[i], seen[i])
        assert torch.equal(torch.isinf(ref), torch.isinf(out[i])), f"row {i}: kept set differs for {params[i]}"
        torch.testing.assert_close(out[i].softmax(-1), ref.softmax(-1), rtol=1e-5, atol=1e-8)


def test_fast_and_sort_keep_the_same_tokens():
    torch.manual_seed(1)
    for sigma in (0.5, 1.0, 3.0, 6.0):
        logits = torch.randn(16, 8192) * sigma
        params = [SamplingParams(top_p=p, top_k=k) for p in (0.3, 0.9, 0.99, 1.0) for k in (0, 0, 20, 3000)]
        fast = process_logits(logits, params, method="fast")
        sort = process_logits(logits, params, method="sort")
        assert torch.equal(torch.isinf(fast), torch.isinf(sort)), f"sigma={sigma}"
        torch.testing.assert_close(fast.softmax(-1), sort.softmax(-1), rtol=1e-5, atol=1e-8)


def test_frequency_and_presence_penalties_follow_openai():
    logits = torch.zeros(2, 6)
    seen = [[1, 1, 1, 4], []]
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    out = process_logits(logits, params, seen)
    assert out[0].tolist() == [0.0, -1.75, 0.0, 0.0, -0.75, 0.0]  # 3*0.5+0.25 and 1*0.5+0.25
    assert out[1].tolist() == [0.0] * 6
    padded = torch.tensor([[1, 1, 1, 4], [-1, -1, -1, -1]])  # negative ids are padding
    assert torch.equal(process_logits(logits, params, padded), out)


def test_repetition_penalty_sees_each_token_once():
    logits = torch.tensor([[2.0, -2.0, 1.0]])
    out = process_logits(logits, SamplingParams(repetition_penalty=2.0), [[0, 0, 1]])
    assert out[0].tolist() == [1.0, -4.0, 1.0]


@pytest.mark.parametrize("method", METHODS)
def test_at_least_one_token_survives_the_harshest_settings(method):
    torch.manual_seed(2)
    logits = torch.randn(4, 3000) * 2
    params = [SamplingParams(top_k=1), SamplingParams(top_p=1e-6), SamplingParams(min_p=1.0),
              SamplingParams(top_p=1e-6, min_p=1.0, typical_p=1e-6, top_k=1, temperature=0.01)]
    out = process_logits(logits, params, method=method)
    kept = torch.isfinite(out).sum(dim=1)
    assert kept.tolist() == [1, 1, 1, 1]
    assert torch.equal(out.argmax(dim=1), logits.argmax(dim=1))


# ---------------------------------------------------------------- greedy rows

def test_greedy_rows_keep_only_the_argmax_and_ignore_their_neighbours():
    torch.manual_seed(3)
    logits = torch.randn(6, 500)
    greedy = SamplingParams(temperature=0.0, top_k=3, typical_p=0.5)
    params = [greedy, SamplingParams(top_p=0.5), greedy, SamplingParams(temperature=2.0), greedy, greedy]
    out = process_logits(logits, params)
    for i in (0, 2, 4, 5):
        assert torch.isfinite(out[i]).sum() == 1 and out[i].argmax() == logits[i].argmax()
    for step in range(5):
        tokens = sample(logits, params)
        assert tokens[[0, 2, 4, 5]].tolist() == logits[[0, 2, 4, 5]].argmax(dim=1).tolist()


def test_greedy_with_penalty_picks_the_penalised_argmax():
    logits = torch.tensor([[3.0, 2.9, 0.0]])
    params = SamplingParams(temperature=0.0, repetition_penalty=1.5)
    assert sample(logits, params, output_tokens=[[0]]).tolist() == [1]


# ---------------------------------------------------------------- sampling statistics

def _streams(rng: str, rows: int) -> list | None:
    """No generator ("global": torch's global RNG), or one seeded stream per row of that kind."""
    return None if rng == "global" else [make_generator(seed, rng=rng) for seed in range(rows)]


@pytest.mark.parametrize("rng", ["global", "torch", "counter"])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("params", [
    SamplingParams(top_p=0.85), SamplingParams(top_k=5, temperature=0.7), SamplingParams(min_p=0.1, top_p=0.95),
    SamplingParams(temperature=1.3),
], ids=["top_p", "top_k+temperature", "min_p+top_p", "temperature"])
def test_sampled_frequencies_match_the_processed_distribution(method, params, rng):
    """Every route of the draw: rows without a generator (on the CPU one uniform each from torch's global RNG and
    the inverse CDF; top-p rows alone under "fast" by rejection), one seeded torch.Generator per row (the
    exponential race) and one seeded counter stream per row (the inverse CDF, decodelab.sampling.counter_rng)."""
    torch.manual_seed(5)
    logits = peaked_logits(1024)
    expected = process_logits(logits, params, method=method).softmax(-1)[0]  # [V]
    draws, rows = 4, 2000
    streams = _streams(rng, rows)
    counts = torch.zeros(1024)
    for _ in range(draws):
        tokens = sample(logits.expand(rows, -1), params, streams, method=method)
        counts += torch.bincount(tokens, minlength=1024)
    total = draws * rows
    assert counts[expected == 0].sum() == 0, "a token of probability 0 was drawn"
    kept = (expected > 0).nonzero().flatten()
    likely = kept[expected[kept] * total >= 5]  # cells with enough expected counts; the rest are pooled
    observed = torch.cat([counts[likely], counts[kept].sum(0, keepdim=True) - counts[likely].sum()])
    wanted = torch.cat([expected[likely], expected[kept].sum(0, keepdim=True) - expected[likely].sum()]) * total
    observed, wanted = observed[wanted > 0], wanted[wanted > 0]
    statistic = float(((observed - wanted) ** 2 / wanted).sum())
    assert statistic < chi_square_critical(len(wanted) - 1), (statistic, observed.tolist(), wanted.tolist())


@pytest.mark.parametrize("rng", ["global", "torch", "counter"])
def test_zero_probability_tokens_are_never_drawn_with_a_huge_vocabulary(rng):
    torch.manual_seed(6)
    logits = torch.randn(64, 40000) * 3
    params = [SamplingParams(top_k=k, top_p=p) for k in (0, 3, 40, 400) for p in (0.1, 0.5, 0.9, 1.0)] * 4
    streams = _streams(rng, len(params))
    for method in METHODS:
        kept = torch.isfinite(process_logits(logits, params, method=method))
        for _ in range(3):
            tokens = sample(logits, params, streams, method=method)
            assert kept.gather(1, tokens.unsqueeze(1)).all()


# ---------------------------------------------------------------- seeds

@pytest.mark.parametrize("method", METHODS)
def test_seeded_rows_do_not_depend_on_the_batch(method):
    torch.manual_seed(7)
    vocab_size = 2048
    row = torch.randn(1, vocab_size) * 3
    mine = SamplingParams(temperature=0.9, top_p=0.9, seed=42)
    alone_gen = make_generator(42, "cpu")
    alone = [int(sample(row, [mine], [alone_gen], method=method)) for _ in range(8)]
    neighbours = [SamplingParams(top_k=700), SamplingParams(temperature=0.0), SamplingParams(top_p=0.5, seed=1)]
    gens = [make_generator(42, "cpu"), None, None, make_generator(1, "cpu")]
    shared = []
    for _ in range(8):
        batch = torch.cat([row, torch.randn(3, vocab_size) * 0.5])
        shared.append(int(sample(batch, [mine] + neighbours, gens, method=method)[0]))
    assert shared == alone
    assert len(set(alone)) > 1, "successive steps must use fresh noise"


def test_seed_without_generator_repeats_for_one_call():
    torch.manual_seed(8)
    logits = torch.randn(3, 300)
    params = SamplingParams(seed=11)
    first = sample(logits, params)
    torch.manual_seed(99)
    assert torch.equal(sample(logits, params), first)


# ---------------------------------------------------------------- rows without a generator

def _inverse_cdf_tokens(probs: torch.Tensor, seed: int) -> list[int]:
    """What rows without a generator draw on the CPU after `torch.manual_seed(seed)`: one float64 uniform each from
    torch's global RNG, in row order, and the first column whose cumulative sum reaches (1 - u) times the total."""
    torch.manual_seed(seed)
    u = torch.rand(probs.shape[0], dtype=torch.float64)
    return inverse_cdf(probs, u).tolist()


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7), SamplingParams(temperature=1.0)],
                         ids=["tempered", "T=1"])
def test_unseeded_cpu_rows_draw_one_uniform_each_from_the_global_rng(params):
    """A plain batch of rows without a generator: one `torch.rand` call for the batch and the inverse CDF, not V
    Exponential numbers per row; `torch.manual_seed` repeats it, and the global RNG moves by that one call."""
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(2)) * 2
    probs = torch.softmax(logits / torch.tensor(params.temperature), dim=-1)   # the sampler's float32 temperature
    expected = _inverse_cdf_tokens(probs, seed=3)
    after_rand = torch.rand(4)
    torch.manual_seed(3)
    tokens = sample(logits, params).tolist()
    assert tokens == expected and len(set(tokens)) > 1
    assert torch.equal(torch.rand(4), after_rand)          # nothing else was drawn from the global RNG


def test_unseeded_cpu_rows_draw_on_the_cpu_whatever_the_default_device():
    """The uniforms of CPU rows come from the CPU's global RNG even when torch's default device is another (as the
    Exponential noise, made like the logits, did): the same tokens as with the CPU as the default."""
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(3))
    torch.manual_seed(1)
    expected = sample(logits, SamplingParams()).tolist()
    torch.manual_seed(1)
    torch.set_default_device("meta")
    try:
        tokens = sample(logits, SamplingParams()).tolist()
    finally:
        torch.set_default_device(None)
    assert tokens == expected


def test_counter_rows_draw_on_the_cpu_whatever_the_default_device():
    """An engine's counter streams (a tuple, with its SamplingBatch) are read into a CPU tensor whatever torch's
    default device: the same tokens, over steps, as with the CPU as the default."""
    from decodelab.sampling.batch import SamplingBatch
    from decodelab.sampling.counter_rng import CounterRNG
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(3))

    def run(default_device):
        batch, streams = SamplingBatch([SamplingParams(seed=i) for i in range(4)]), tuple(map(CounterRNG, range(4)))
        torch.set_default_device(default_device)
        try:
            return [sample(logits, batch, streams).tolist() for _ in range(3)]
        finally:
            torch.set_default_device(None)

    expected = run(None)
    assert run("meta") == expected and len({t for step in expected for t in step}) > 1


def test_no_rows_draw_nothing():
    """The draw's uniforms for no rows are an empty float64 tensor, and the search over them is empty (benchmarks
    call these helpers directly)."""
    from decodelab.sampling.counter_rng import _draw_columns
    from decodelab.sampling.sampler import _rests
    rest = _rests([])
    assert rest.dtype == torch.float64 and rest.shape == (0,)
    assert _draw_columns(torch.rand(0, 5), rest).shape == (0,)


def test_unseeded_rows_of_a_top_k_group_draw_only_their_candidates():
    """Rows without a generator in a top-k group (candidate columns, a row's columns past its k hold probability
    0) draw by their uniform too, and only among their own k best tokens."""
    logits = torch.randn(8, 500, generator=torch.Generator().manual_seed(4))
    params = [SamplingParams(top_k=k) for k in (1, 2, 5, 40)] * 2         # top_k = 1: argmax rows in the batch
    torch.manual_seed(0)
    for _ in range(50):
        tokens = sample(logits, params)
        for row, k in enumerate((1, 2, 5, 40) * 2):
            assert int(tokens[row]) in logits[row].topk(k).indices.tolist()
    torch.manual_seed(9)
    first = sample(logits, params)
    torch.manual_seed(9)
    assert torch.equal(sample(logits, params), first)


def test_unseeded_counter_and_torch_rows_share_a_call_each_by_its_own_route():
    """A caller's mixed list: a torch.Generator row draws what it draws alone (its own exponential race), a
    CounterRNG row what it draws alone, and the rows without a generator their uniforms from the global RNG."""
    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(5)) * 2
    params = SamplingParams(temperature=0.9)
    streams = [None, make_generator(1), make_generator(2, rng="counter"), None]
    torch.manual_seed(6)
    mixed = [sample(logits, params, streams).tolist() for _ in range(6)]
    alone_torch, alone_counter = make_generator(1), make_generator(2, rng="counter")
    assert [m[1] for m in mixed] == [int(sample(logits[1:2], params, [alone_torch])) for _ in range(6)]
    assert [m[2] for m in mixed] == [int(sample(logits[2:3], params, [alone_counter])) for _ in range(6)]
    probs = torch.softmax(logits[[0, 3]] / torch.tensor(0.9), dim=-1)
    torch.manual_seed(6)
    expected = [inverse_cdf(probs, torch.rand(2, dtype=torch.float64)).tolist() for _ in range(6)]
    assert [[m[0], m[3]] for m in mixed] == expected


def test_unseeded_rows_are_checked_before_the_global_rng_moves():
    """A bad row in a plain unseeded batch (checked on the softmax's sums, inside the draw) is refused by name, and
    torch's global RNG has not moved: the next draw is what it would have been."""
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(7))
    logits[1, 4] = float("nan")
    torch.manual_seed(8)
    with pytest.raises(ValueError, match=r"logits rows \[1\] hold NaN"):
        sample(logits, SamplingParams(temperature=0.8))
    drawn = torch.rand(3)
    torch.manual_seed(8)
    assert torch.equal(drawn, torch.rand(3))


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("func", [process_logits, sample])
def test_bad_rows_name_the_row(func):
    logits = torch.randn(3, 10)
    for value, row in ((float("nan"), 1), (float("inf"), 2)):
        bad = logits.clone()
        bad[row, 4] = value
        with pytest.raises(ValueError, match=rf"rows \[{row}\]"):
            func(bad, SamplingParams())
    bad = logits.clone()
    bad[0] = float("-inf")
    with pytest.raises(ValueError, match=r"rows \[0\]"):
        func(bad, SamplingParams())


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(logits=torch.randn(10)), ValueError, "shape"),
    (dict(logits=torch.zeros(2, 5, dtype=torch.long)), TypeError, "floating"),
    (dict(logits=[[0.0, 1.0]]), TypeError, "logits"),
    (dict(params=[SamplingParams()]), ValueError, "one SamplingParams per row"),
    (dict(params=[SamplingParams(), "x"]), TypeError, r"params\[1\]"),
    (dict(params=0.5), TypeError, "params"),
    (dict(method="heap"), ValueError, "method"),
    (dict(params=SamplingParams(repetition_penalty=1.2)), ValueError, "output_tokens"),
    (dict(output_tokens=torch.zeros(3, 2, dtype=torch.long)), ValueError, "output_tokens"),
    (dict(output_tokens=[[1], [99]]), ValueError, "output_tokens"),
    (dict(output_tokens=[[1], [-1]]), ValueError, r"output_tokens\[1\]"),
])
def test_process_logits_rejects_bad_input(kwargs, error, pattern):
    args = dict(logits=torch.randn(2, 8), params=SamplingParams(), output_tokens=None, method="fast")
    args.update(kwargs)
    with pytest.raises(error, match=pattern):
        process_logits(args["logits"], args["params"], args["output_tokens"], method=args["method"])


def test_sample_rejects_bad_generators():
    logits = torch.randn(2, 8)
    with pytest.raises(ValueError, match="generators"):
        sample(logits, SamplingParams(), [None])
    with pytest.raises(TypeError, match=r"generators\[0\]"):
        sample(logits, SamplingParams(), [123, None])


# ---------------------------------------------------------------- CUDA

@pytest.mark.cuda
@pytest.mark.parametrize("method", METHODS)
def test_cuda_matches_transformers_and_draws_only_kept_tokens(method):
    torch.manual_seed(9)
    batch, vocab_size = 32, 32000
    logits = (torch.randn(batch, vocab_size) * 3).cuda()
    seen = torch.randint(0, vocab_size, (batch, 12)).cuda()
    params = mixed_params(batch, seed=9)
    out = process_logits(logits, params, seen, method=method)
    for i in range(batch):
        ref = transformers_reference(logits[i], params[i], seen[i])
        assert torch.equal(torch.isinf(ref), torch.isinf(out[i])), f"row {i}"
    gens = [make_generator(i, "cuda") for i in range(batch)]
    tokens = sample(logits, params, gens, seen, method=method)
    assert tokens.device.type == "cuda"
    assert torch.isfinite(out.gather(1, tokens.unsqueeze(1))).all()


@pytest.mark.cuda
def test_cuda_seeded_rows_do_not_depend_on_the_batch():
    torch.manual_seed(10)
    row = (torch.randn(1, 4096) * 3).cuda()
    mine = SamplingParams(top_p=0.9, seed=5)
    alone = sample(row, [mine], [make_generator(5, "cuda")])
    batch = torch.cat([row, torch.randn(3, 4096, device="cuda")])
    shared = sample(batch, [mine, SamplingParams(), SamplingParams(top_k=9), SamplingParams(temperature=0.0)],
                    [make_generator(5, "cuda"), None, None, None])
    assert int(shared[0]) == int(alone[0])


def test_params_accept_torch_and_numpy_scalars():
    """A 0-d tensor or numpy scalar is a number (it is what a tensor computation hands back); anything else is named."""
    import numpy as np

    params = SamplingParams(temperature=torch.tensor(0.5), top_k=np.int64(5), top_p=np.float64(0.9),
                            seed=torch.tensor(3), max_tokens=np.int32(8), stop_token_ids=[np.int64(2)])
    assert (params.temperature, params.top_k, params.top_p, params.seed, params.max_tokens) == (0.5, 5, 0.9, 3, 8)
    assert type(params.top_k) is int and type(params.seed) is int and params.stop_token_ids == (2,)
    with pytest.raises(ValueError, match=r"temperature must be .*, got Tensor tensor\(\[0.5000, 0.6000\]\)"):
        SamplingParams(temperature=torch.tensor([0.5, 0.6]))
    with pytest.raises(ValueError, match="top_k must be an int >= 0, got True"):
        SamplingParams(top_k=torch.tensor(True))
    with pytest.raises(ValueError, match="seed must be None or an int"):
        SamplingParams(seed=np.float64(1.5))


@pytest.mark.parametrize("rows", [[0, 1, 2], [0, 0, 2], [2, 1, 0], [0, 2, 2], [1], []])
def test_take_rows_is_x_rows_for_any_rows(rows):
    """All rows in order come back without a copy; any other list (repeats, another order, a subset of the same
    length as the batch) is a real selection, as an engine's forks draw from their prompt's row."""
    from decodelab.sampling.truncation import take_rows

    x = torch.arange(12.0).view(3, 4)
    taken = take_rows(x, rows)
    assert torch.equal(taken, x[torch.tensor(rows, dtype=torch.long)])
    assert (taken is x) == (rows == [0, 1, 2])
