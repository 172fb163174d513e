"""Counter-based streams (`decodelab.sampling.counter_rng`): draw i depends on (seed, i) alone, the uniforms are
uniform, the inverse CDF never draws a removed token, and counter rows keep to themselves in a batch. That `sample`
with CounterRNG rows draws each row's processed distribution, and never a removed token, is tested beside the
exponential race in test_sampler.py (parametrized by `rng`)."""
import math

import numpy as np
import pytest
import torch

from decodelab.sampling.counter_rng import (CounterRNG, batch_uniforms, categorical, check_rng, inverse_cdf,
                                            uniform)
from decodelab.sampling.ops.fast_paths import METHODS
from decodelab.sampling.sampler import SamplingParams, make_generator, process_logits, sample
from sampling_checks import chi_square_critical


def test_a_draw_depends_on_seed_and_offset_alone():
    a, b = CounterRNG(5), CounterRNG(5)
    first = [a.uniform() for _ in range(4)]
    # b draws its first two alone, then two in a batch with strangers: the same four numbers
    second = [b.uniform(), b.uniform()]
    second += [float(batch_uniforms([CounterRNG(9), b, CounterRNG(6)])[1]) for _ in range(2)]
    assert first == second and len(set(first)) == 4 and a.offset == b.offset == 4
    assert CounterRNG(6).uniform() != CounterRNG(5).uniform()
    assert all(0.0 <= u < 1.0 for u in first)


def _splitmix64(key: int, count: int) -> list[float]:
    """The first `count` outputs of SplitMix64 started at `key`, stepped one by one in Python integers (Steele, Lea
    and Flood 2014), as uniforms with 53 random bits: the definition the vectorised hash must reproduce."""
    mask, out, state = (1 << 64) - 1, [], key
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        out.append(((z ^ (z >> 31)) >> 11) * 2.0 ** -53)
    return out


def test_draws_hashed_ahead_are_splitmix64_at_every_offset():
    """Draws are hashed ahead in blocks (32, 64, ... 256) and for several streams at once; whatever the block, draw i
    is output i + 1 of SplitMix64 from the key, across block ends, with the same stream twice in one batch (both rows
    read the same draw before it advances by two, as every row reads before any stream moves), and after `offset` is
    set by hand."""
    a, b, c = CounterRNG(5), CounterRNG(6), CounterRNG(5)
    drawn = [batch_uniforms([a, b, a]).tolist() for _ in range(300)]       # a named twice per batch, b once
    assert [row[0] for row in drawn] == [row[2] for row in drawn] == _splitmix64(a.key, 600)[0::2]
    assert [row[1] for row in drawn] == _splitmix64(b.key, 300)
    assert (a.offset, b.offset) == (600, 300)
    c.offset = 1000                                                        # past every block hashed so far
    assert c.uniform() == _splitmix64(c.key, 1001)[1000]
    c.offset = 3                                                           # back, before the block just hashed
    assert [c.uniform() for _ in range(40)] == _splitmix64(c.key, 43)[3:]
    d, e = CounterRNG(9), CounterRNG(10)
    d.uniform()                                  # d at an odd offset: named twice, it reaches a block's end past it
    drawn = [batch_uniforms([d, e, d]).tolist() for _ in range(40)]
    assert [row[0] for row in drawn] == [row[2] for row in drawn] == _splitmix64(d.key, 81)[1::2]
    assert [row[1] for row in drawn] == _splitmix64(e.key, 40) and d.offset == 81
    with pytest.raises(ValueError, match="offset"):
        c.offset = -5                                                      # refused: the stream stays where it was
    assert (c.offset, c.uniform()) == (43, _splitmix64(c.key, 44)[43])


def test_uniforms_are_uniform_and_independent_across_seeds_and_offsets():
    rngs = [CounterRNG(seed) for seed in range(2000)]           # neighbouring seeds, 64 draws each
    u = np.stack([batch_uniforms(rngs) for _ in range(64)])      # [64, 2000]
    counts = np.bincount((u.ravel() * 64).astype(int), minlength=64)
    expected = u.size / 64
    assert float(((counts - expected) ** 2 / expected).sum()) < chi_square_critical(63)
    # neighbouring seeds and neighbouring offsets are uncorrelated (|r| < 4.5 standard errors)
    for x, y in ((u[:, :-1], u[:, 1:]), (u[:-1], u[1:])):
        r = np.corrcoef(x.ravel(), y.ravel())[0, 1]
        assert abs(r) < 4.5 / math.sqrt(x.size), r


def test_inverse_cdf_never_draws_a_removed_token_even_at_the_ends():
    probs = torch.tensor([[0.0, 0.3, 0.0, 0.7, 0.0], [0.0, 0.0, 1e-12, 0.0, 1.0]]).repeat(3, 1)   # [6, 5]
    u = torch.tensor([0.0, 0.0, 1 - 2 ** -53, 1 - 2 ** -53, 0.5, 1 - 5e-13], dtype=torch.float64)
    assert inverse_cdf(probs, u).tolist() == [3, 4, 1, 2, 3, 2]
    # a token of probability 1e-12 keeps its share: 1 - u = 5e-13 lands on it, which a float32 cdf could not resolve


def test_categorical_and_uniform_take_both_kinds_of_stream():
    probs = torch.tensor([0.0, 0.25, 0.75])
    rng, again = CounterRNG(3), CounterRNG(3)
    assert [categorical(probs, rng) for _ in range(20)] == [categorical(probs, again) for _ in range(20)]
    assert categorical(probs, torch.Generator().manual_seed(0)) in (1, 2)
    assert 0.0 <= uniform(None) < 1.0 and 0.0 <= uniform(CounterRNG(1)) < 1.0


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: CounterRNG(-1), ValueError, "seed must be an int >= 0, got -1"),
    (lambda: CounterRNG(2 ** 63), ValueError, r"seed must be an int in \[0, 2\*\*63\)"),
    (lambda: CounterRNG(1.5), ValueError, "seed must be an int"),
    (lambda: CounterRNG(True), ValueError, "seed must be an int"),
    (lambda: check_rng("philox"), ValueError, r"rng must be one of \('torch', 'counter'\), got 'philox'"),
    (lambda: make_generator(3, rng="numpy"), ValueError, "rng must be one of"),
    (lambda: make_generator(-3, rng="counter"), ValueError, r"seed must be None or an int in \[0, 2\*\*63\)"),
    (lambda: sample(torch.zeros(1, 3), SamplingParams(), [object()]), TypeError,
     "generators\\[0\\] must be a torch.Generator, a CounterRNG or None, got object"),
    (lambda: setattr(CounterRNG(1), "offset", -1), ValueError, "offset must be an int >= 0, got -1"),
    (lambda: setattr(CounterRNG(1), "offset", 2.5), ValueError, "offset must be an int"),
])
def test_bad_streams_are_refused_by_name(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_an_unseeded_counter_stream_follows_torch_manual_seed():
    torch.manual_seed(1)
    first = make_generator(None, rng="counter")
    torch.manual_seed(1)
    assert make_generator(None, rng="counter").seed == first.seed
    assert make_generator(None, rng="counter").seed != first.seed


@pytest.mark.parametrize("method", METHODS)
def test_counter_rows_do_not_depend_on_the_batch_and_mix_with_torch_rows(method):
    torch.manual_seed(7)
    row = torch.randn(1, 2048) * 3
    mine = SamplingParams(temperature=0.9, top_p=0.9, seed=42)
    alone_rng = make_generator(42, rng="counter")
    alone = [int(sample(row, [mine], [alone_rng], method=method)) for _ in range(8)]
    neighbours = [SamplingParams(top_k=700, seed=3), SamplingParams(temperature=0.0), SamplingParams(top_p=0.5)]
    streams = [make_generator(42, rng="counter"), make_generator(3, rng="counter"), None,
               make_generator(1, rng="torch")]                     # a torch.Generator row in the same call
    theirs = torch.randn(1, 2048) * 2                                  # the torch.Generator row's logits
    shared, torch_row = [], []
    for _ in range(8):
        batch = torch.cat([row, torch.randn(2, 2048) * 0.5, theirs])
        tokens = sample(batch, [mine] + neighbours, streams, method=method)
        shared.append(int(tokens[0]))
        torch_row.append(int(tokens[3]))
    assert shared == alone and len(set(alone)) > 1
    # the torch.Generator row of the mixed call drew what it draws alone from the same generator
    torch_alone = make_generator(1, rng="torch")
    assert torch_row == [int(sample(theirs, [neighbours[2]], [torch_alone], method=method)) for _ in range(8)]
    assert len(set(torch_row)) > 1
    torch_stream = make_generator(42, rng="torch")
    assert [int(sample(row, [mine], [torch_stream], method=method)) for _ in range(8)] != alone


@pytest.mark.cuda
@pytest.mark.parametrize("method", METHODS)
def test_cuda_counter_rows_draw_kept_tokens_and_match_the_cpu(method):
    """On CUDA the uniforms are made on the host and the cumulative sum and search run on the GPU: the same seeds
    pick the same tokens as on the CPU (float64 sums of the same probabilities), and only kept tokens."""
    torch.manual_seed(11)
    logits = torch.randn(64, 32000) * 3
    params = [SamplingParams(top_k=k, top_p=p) for k in (0, 40) for p in (0.5, 1.0)] * 16
    kept = torch.isfinite(process_logits(logits.cuda(), params, method=method))
    on_gpu = sample(logits.cuda(), params, [make_generator(i, "cuda", "counter") for i in range(64)], method=method)
    on_cpu = sample(logits, params, [make_generator(i, "cpu", "counter") for i in range(64)], method=method)
    assert on_gpu.device.type == "cuda" and kept.gather(1, on_gpu.unsqueeze(1)).all()
    # the softmaxes may differ in the last bit; a uniform within 1e-7 of a boundary would be needed to change a token
    assert torch.equal(on_gpu.cpu(), on_cpu)


def test_a_zero_column_never_wins_even_with_a_denormal_total():
    # a total of 1e-320 makes (1 - u) * total round to 0; a zero column before it must still lose
    probs = torch.tensor([[0.0, 1e-320, 0.0]], dtype=torch.float64)
    assert inverse_cdf(probs, torch.tensor([1 - 2 ** -53], dtype=torch.float64)).tolist() == [1]
    # zero columns between and after the positive ones lose over the whole range of u
    probs = torch.tensor([[0.25, 0.0, 0.75, 0.0]])
    assert set(inverse_cdf(probs.expand(64, -1), np.linspace(0, 1, 64, endpoint=False)).tolist()) == {0, 2}


@pytest.mark.parametrize("u", [np.array([1.0]), np.array([-0.1]), np.array([np.nan]), torch.tensor([1.5])])
def test_inverse_cdf_refuses_u_outside_the_unit_interval(u):
    with pytest.raises(ValueError, match=r"u must lie in \[0, 1\)"):
        inverse_cdf(torch.tensor([[0.5, 0.5]]), u)
    with pytest.raises(ValueError, match="one u per row"):
        inverse_cdf(torch.tensor([[0.5, 0.5]]), np.array([0.1, 0.2]))


def test_the_gpu_guard_flattens_zero_columns_a_parallel_scan_left_a_step_above():
    """What inverse_cdf does on a GPU (not on the CPU, whose running sum adds in order): a cdf whose zero columns a
    scan left one rounding step above their neighbour, or below it, becomes flat there and monotone."""
    from decodelab.sampling.counter_rng import _zero_columns_flat

    torch.manual_seed(3)
    probs = torch.softmax(torch.randn(32, 500) * 3, dim=-1).masked_fill(torch.rand(32, 500) < 0.5, 0.0)
    probs[:, 0] = 0.0                                                        # a removed first token too
    exact = probs.cumsum(dim=-1, dtype=torch.float64)
    wobble = torch.where(torch.rand(32, 500) < 0.5, 1.0, -1.0) * 1e-16     # about one rounding step of a cdf near 1
    scanned = torch.where(probs > 0, exact, exact + wobble)
    flat = _zero_columns_flat(scanned, probs)
    assert bool((flat[:, 1:] >= flat[:, :-1]).all()) and bool(torch.isneginf(flat[:, 0]).all())
    zero = (probs[:, 1:] == 0)
    assert torch.equal(flat[:, 1:][zero], flat[:, :-1][zero])               # equal to the left neighbour
    u = torch.linspace(0, 1, 1001, dtype=torch.float64)[:-1]
    for row in range(32):
        target = flat[row, -1] * (1.0 - u)
        chosen = torch.searchsorted(flat[row].expand(len(u), -1).contiguous(), target[:, None]).flatten()
        assert bool((probs[row, chosen] > 0).all())


@pytest.mark.parametrize("temperature", [1.0, 0.01])
def test_counter_rows_are_checked_on_their_sums_before_any_stream_advances(temperature):
    """A plain batch of counter rows is checked on its softmax's sums, inside the draw: the same rows are refused as
    by the check of every other route (NaN, +inf, all -inf; not a partly masked row, nor a huge finite logit that
    the temperature would overflow), and no stream has moved when it refuses."""
    logits = torch.randn(6, 100, generator=torch.Generator().manual_seed(0))
    logits[1, 3], logits[2, 7], logits[3] = float("nan"), float("inf"), float("-inf")
    logits[4, :50] = float("-inf")                      # partly masked: fine
    logits[5, 0] = 3e38                                 # finite; at T = 0.01 the temperature shifts it first
    params = SamplingParams(temperature=temperature)
    streams = [make_generator(i, rng="counter") for i in range(6)]
    message = r"logits rows \[1, 2, 3\] hold NaN or \+inf, or only -inf"
    with pytest.raises(ValueError, match=message):
        sample(logits, params, streams)
    with pytest.raises(ValueError, match=message):       # the route with its own check refuses the same rows
        sample(logits, params, [make_generator(i, rng="torch") for i in range(6)])
    assert [s.offset for s in streams] == [0] * 6
    good = [0, 4, 5]
    tokens = sample(logits[good], params, [streams[i] for i in good]).tolist()
    assert tokens[2] == 0 and tokens[1] >= 50 and [streams[i].offset for i in good] == [1, 1, 1]


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.8), SamplingParams(top_p=0.8)],
                         ids=["plain batch", "top-p rows, densified"])
def test_rows_sharing_a_stream_read_the_same_draw_whatever_their_order(params):
    """A stream named by several rows of one call gives each of them the draw it held when the call began (every row
    reads before any stream moves), so identical rows pick the same token, and the stream advances once per row."""
    row = torch.randn(1, 200, generator=torch.Generator().manual_seed(2)) * 2
    other = torch.randn(1, 200, generator=torch.Generator().manual_seed(3))
    shared, alone = make_generator(4, rng="counter"), make_generator(5, rng="counter")
    for step in range(40):                     # past the first block of hashed draws (32)
        tokens = sample(torch.cat([row, other, row]), [params] * 3, [shared, alone, shared]).tolist()
        assert tokens[0] == tokens[2], step
    assert (shared.offset, alone.offset) == (80, 40)


def test_the_entry_points_take_the_one_default_stream():
    """The default kind of stream is named once (`DEFAULT_RNG`): make_generator, generate, Engine, EngineConfig,
    speculative_generate and constrained_generate take it (the server's --rng too, by the same name), so switching it
    is one line in the library."""
    import inspect

    from decodelab.decoding.constrained import constrained_generate
    from decodelab.decoding.generate import generate
    from decodelab.decoding.speculative import speculative_generate
    from decodelab.engine import Engine, EngineConfig
    from decodelab.sampling.counter_rng import DEFAULT_RNG, RNGS

    assert DEFAULT_RNG in RNGS
    for entry in (make_generator, generate, Engine, speculative_generate, constrained_generate):
        assert inspect.signature(entry).parameters["rng"].default == DEFAULT_RNG, entry
    assert EngineConfig.__dataclass_fields__["rng"].default == DEFAULT_RNG
    expected = torch.Generator if DEFAULT_RNG == "torch" else CounterRNG
    assert type(make_generator(3)) is expected
