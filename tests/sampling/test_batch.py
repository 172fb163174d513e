"""decodelab.sampling.batch, decodelab.sampling.processors and the seam to decodelab.sampling.ops.fast_paths: the sampler as
params -> processors -> draw."""
import pytest
import torch

from decodelab.sampling.ops import fast_paths
from decodelab.sampling.processors import PROCESSORS, RowGroup, apply_processors
from decodelab.sampling.sampler import SamplingBatch, SamplingParams, make_generator, process_logits, sample

MIXED = [SamplingParams(temperature=0.0), SamplingParams(top_k=1, temperature=0.7),
         SamplingParams(temperature=0.7, top_k=20, top_p=0.9, seed=1), SamplingParams(top_p=0.8, seed=2),
         SamplingParams(min_p=0.1, temperature=1.3, seed=3), SamplingParams(typical_p=0.9, seed=4),
         SamplingParams(top_p=0.9, min_p=0.05, seed=5), SamplingParams(repetition_penalty=1.3, seed=6)]


def test_the_processors_run_in_transformers_order():
    assert [type(p).__name__ for p in PROCESSORS] == ["Temperature", "TopK", "TopP", "MinP", "Typical"]


def test_a_batch_knows_its_argmax_rows_and_columns():
    batch = SamplingBatch(MIXED)
    assert batch.argmax_rows == (0, 1) and batch.random_rows == (2, 3, 4, 5, 6, 7)
    temperature = batch.column("temperature", torch.float32)
    assert temperature.shape == (8, 1) and temperature[1, 0] == 1.0, "an argmax row is never divided"
    assert batch.column("temperature", torch.float32) is temperature, "a column is made once per dtype"
    assert batch.values("top_k")[1] == 0 and batch.has_penalties
    assert batch.uses("min_p") and not batch.uses("min_p", [0, 1, 2]) and batch.uses("top_k", [2])
    # 1 - top_p is taken in double precision, as transformers compares with the Python float 1 - top_p
    assert batch.column("one_minus_top_p", torch.float64)[3, 0].item() == 1.0 - 0.8


def test_a_prebuilt_batch_draws_what_the_params_draw_step_after_step():
    torch.manual_seed(0)
    steps = [torch.randn(8, 300) * 2 for _ in range(3)]
    history = [[5, 7]] * 8
    prebuilt = SamplingBatch(MIXED)
    fresh = [make_generator(p.seed) for p in MIXED]
    reused = [make_generator(p.seed) for p in MIXED]
    for logits in steps:
        torch.manual_seed(1)  # unseeded rows use the global RNG
        a = sample(logits, MIXED, fresh, history)
        torch.manual_seed(1)
        b = sample(logits, prebuilt, reused, history)
        assert torch.equal(a, b)
    assert torch.equal(process_logits(steps[0], MIXED, history), process_logits(steps[0], prebuilt, history))


@pytest.mark.parametrize("method", ["fast", "sort"])
def test_temperature_is_applied_once(method, monkeypatch):
    """The temperature processor divides every random row exactly once, whatever route the row takes."""
    from decodelab.sampling import processors

    seen = []
    original = processors.Temperature.__call__

    def spy(self, group, batch):
        seen.extend(group.rows)
        return original(self, group, batch)

    monkeypatch.setattr(processors.Temperature, "__call__", spy)
    params = [SamplingParams(temperature=0.5 + 0.1 * i, top_k=(i % 3) * 4, top_p=0.9 if i % 2 else 1.0,
                             min_p=0.05 if i == 4 else 0.0) for i in range(8)] + [SamplingParams(temperature=0.0)]
    sample(torch.randn(9, 500), params, method=method)
    assert sorted(seen) == list(range(8))


def test_the_fast_routes_are_fixed_by_the_parameters():
    batch = SamplingBatch(MIXED)
    routes = fast_paths.routes(batch, "fast", sampling=True)
    assert routes == fast_paths.Routes(top_k=(2,), rejection=(3,), dense=(4, 5, 6, 7))
    assert fast_paths.routes(batch, "fast", sampling=True) is routes, "computed once per batch"
    assert fast_paths.routes(batch, "fast", sampling=False).rejection == (), "process_logits needs the kept set"
    assert fast_paths.routes(batch, "sort", sampling=True) == fast_paths.Routes((), (), batch.random_rows)


def test_dense_processors_equal_the_reference_sort_path():
    torch.manual_seed(3)
    logits = torch.randn(8, 400) * 2
    batch = SamplingBatch(MIXED)
    rows = list(batch.random_rows)
    group = apply_processors(RowGroup.dense(rows, logits[rows]), batch)
    expected = process_logits(logits, MIXED, [[]] * 8, method="sort")[rows]
    assert torch.equal(group.logits, expected)


def test_many_rows_are_routed_in_linear_time():
    """20,000 rows with mixed parameters: building the batch and its routes is one pass over the rows (a set per
    row made this quadratic once); checked by counting, not timing."""
    params = [SamplingParams(top_p=0.9 if i % 2 else 1.0, top_k=i % 3) for i in range(20000)]
    batch = SamplingBatch(params)
    routes = fast_paths.routes(batch, "fast", sampling=True)
    assert len(routes.top_k) + len(routes.rejection) + len(routes.dense) + len(batch.argmax_rows) == 20000
    tokens = sample(torch.randn(20000, 16), batch)
    assert tokens.shape == (20000,)


@pytest.mark.parametrize("make, error, pattern", [
    (lambda: SamplingBatch([]), TypeError, "non-empty sequence"),
    (lambda: SamplingBatch(SamplingParams()), TypeError, "sequence of SamplingParams"),
    (lambda: SamplingBatch([SamplingParams(), {"temperature": 1.0}]), TypeError, r"params\[1\]"),
    (lambda: sample(torch.randn(3, 10), SamplingBatch([SamplingParams()] * 2)), ValueError, "holds 2 rows"),
    (lambda: process_logits(torch.randn(1, 10), SamplingBatch([SamplingParams()], "meta")), ValueError, "meta"),
])
def test_bad_batches_are_named(make, error, pattern):
    with pytest.raises(error, match=pattern):
        make()


def test_logit_bias_is_added_first_and_moves_the_argmax():
    logits = torch.tensor([[3.0, 1.0, 0.0, -1.0]] * 3)
    params = [SamplingParams(temperature=0.0, logit_bias={2: 5.0}),
              SamplingParams(temperature=0.0, logit_bias={0: -100.0}, repetition_penalty=2.0),
              SamplingParams(temperature=0.0)]
    # row 1: the bias first (token 0: 3 - 100 = -97), then the repetition penalty on the seen token 1 (1 -> 0.5),
    # which still beats token 2's 0
    assert sample(logits, params, output_tokens=[[], [1], []]).tolist() == [2, 1, 0]
    kept = process_logits(logits[:1], SamplingParams(logit_bias=[(3, 1.5), (1, -1.0)]))
    assert torch.allclose(kept, torch.tensor([[3.0, 0.0, 0.0, 0.5]]))


def test_a_strong_negative_bias_bans_a_token_when_sampling():
    logits = torch.zeros(4000, 3)
    tokens = sample(logits, SamplingParams(logit_bias={1: -100}, seed=None))
    assert (tokens != 1).all() and set(tokens.tolist()) == {0, 2}


@pytest.mark.parametrize("bias, pattern", [
    ({-1: 1.0}, "token ids"), ({1: 101.0}, r"\[-100, 100\]"), ({1: float("nan")}, r"\[-100, 100\]"),
    ("5", "dict or pairs"), ([(1, 2.0, 3.0)], "dict or pairs"), ([(1, 1.0), (1, 2.0)], "twice"),
])
def test_bad_logit_bias_is_named(bias, pattern):
    with pytest.raises(ValueError, match=pattern) as error:
        SamplingParams(logit_bias=bias)
    assert error.value.param == "logit_bias"


def test_logit_bias_outside_the_vocabulary_is_refused_before_generating(tiny):
    from decodelab.decoding.generate import generate

    model, tokenizer = tiny
    with pytest.raises(ValueError, match=r"logit_bias for params\[0\] must be < the vocabulary size"):
        generate(model, tokenizer, "小明", SamplingParams(logit_bias={10**6: 1.0}))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        sample(torch.zeros(1, 5), SamplingParams(logit_bias={5: 1.0}))


def test_the_engine_builds_a_batch_only_when_its_sequences_change(tiny, monkeypatch):
    import decodelab.engine.draw as engine_module          # the module that builds the step's SamplingBatch
    from decodelab.engine.engine import Engine

    built = []
    original = engine_module.SamplingBatch

    def counting(params, device="cpu"):
        built.append(len(params))
        return original(params, device)

    monkeypatch.setattr(engine_module, "SamplingBatch", counting)
    model, tokenizer = tiny
    engine = Engine(model, tokenizer, max_num_seqs=8)
    for i, length in enumerate((3, 9, 9, 20)):
        engine.add_request("小明", SamplingParams(seed=i, max_tokens=length, ignore_eos=True))
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    # one batch for the prefill and the decode steps after it (same sequences), one after the 3-token request ends,
    # one after both 9-token requests end: 3 builds in 20 steps
    assert steps == 20 and built == [4, 3, 1]


def test_a_batch_leaves_its_params_copyable_and_forgets_them_when_freed():
    """The per-row flags a batch reads are kept beside each params object, not in it: `SamplingParams(**p.__dict__)`
    (chapter 03 copies params this way) still works after a batch read `p`, and the entry goes when `p` is freed."""
    import gc

    from decodelab.sampling import params as params_module

    p = SamplingParams(temperature=0.7, top_k=5, repetition_penalty=1.2, seed=3)
    batch = SamplingBatch([p, SamplingParams(temperature=0.0)])
    assert SamplingParams(**{**p.__dict__, "seed": 4}) == SamplingParams(temperature=0.7, top_k=5,
                                                                         repetition_penalty=1.2, seed=4)
    assert params_module.batch_row(p) == (False, 5, 0, True, False, True, False, False, True, False, False, False)
    assert batch.has_penalties and batch.argmax_rows == (1,) and batch.top_k == (5, 0)
    key = id(p)
    assert key in params_module._BATCH_ROWS
    del p, batch
    gc.collect()
    assert key not in params_module._BATCH_ROWS


@pytest.mark.parametrize("temperatures", [(1.0, 1.0, 1.0), (1.0, 0.7, 1.3)])
def test_a_plain_batch_takes_the_routes_and_processors_the_general_rule_gives(temperatures):
    """A batch whose rows are all random without truncation (`SamplingBatch.plain`) is routed without reading its
    rows' values: one dense group of every row, whatever the method, through the temperature only when a row sets
    one. The same as the rule for any batch, which a batch with a single truncated row still follows."""
    from decodelab.sampling.ops import fast_paths
    from decodelab.sampling.processors import PROCESSORS, used_processors

    plain = SamplingBatch([SamplingParams(temperature=t, seed=i) for i, t in enumerate(temperatures)])
    assert plain.plain and plain.tempered == (temperatures != (1.0, 1.0, 1.0))
    for method in ("fast", "sort"):
        for sampling in (True, False):
            assert fast_paths.routes(plain, method, sampling) == fast_paths.Routes((), (), (0, 1, 2))
    assert used_processors(plain) == tuple(p for p in PROCESSORS if plain.uses(p.param))
    mixed = SamplingBatch([SamplingParams(temperature=t) for t in temperatures] + [SamplingParams(top_p=0.9)])
    assert not mixed.plain
    assert fast_paths.routes(mixed, "fast", True) == fast_paths.Routes((), (3,), (0, 1, 2))
    assert used_processors(mixed) == tuple(p for p in PROCESSORS if mixed.uses(p.param))
    assert not SamplingBatch([SamplingParams(temperature=0.0), SamplingParams()]).plain   # an argmax row


@pytest.mark.parametrize("params, untouched", [
    (SamplingParams(temperature=0.8, seed=1), True),
    (SamplingParams(top_k=5, top_p=0.9), True),                     # truncation happens in the processors
    (SamplingParams(logit_bias={3: 2.0}), False),
    (SamplingParams(repetition_penalty=1.2), False),
    (SamplingParams(no_repeat_ngram_size=2), False),
    (SamplingParams(min_tokens=2), False),
    (SamplingParams(allowed_token_ids=[1, 2]), False),
    (SamplingParams(bad_word_ids=[[4]]), False),
])
def test_a_batch_knows_whether_any_row_changes_the_logits_before_the_processors(params, untouched):
    """`untouched` lets the sampler skip step 2; a row that biases, penalises or masks turns it off, and the same
    logits then give what the full step 2 gives."""
    batch = SamplingBatch([SamplingParams(seed=0), params])
    assert batch.untouched is untouched
    logits = torch.randn(2, 30, generator=torch.Generator().manual_seed(0))
    seen = [[1, 2, 4], [4, 4]]
    assert torch.equal(process_logits(logits, batch, seen, prompt_tokens=[[], []], eos_token_ids={0}),
                       process_logits(logits, list(batch.params), seen, prompt_tokens=[[], []], eos_token_ids={0}))
    if untouched:   # skipping step 2 (no tokens passed) gives what step 2 over empty outputs gives
        assert torch.equal(process_logits(logits, batch),
                           process_logits(logits, batch, [[], []], prompt_tokens=[[], []], eos_token_ids={0}))


def test_a_tuple_of_counter_streams_is_checked_once_per_batch_and_a_new_one_again():
    """An engine passes the same tuple of streams at every step of a batch; the sampler checks it the first time.
    Another tuple, or a list, is checked whatever came before, so a stream on the wrong device is still refused."""
    from decodelab.sampling.counter_rng import CounterRNG

    params = [SamplingParams(seed=i) for i in range(3)]
    batch = SamplingBatch(params)
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(1))
    streams = tuple(CounterRNG(i) for i in range(3))
    first = sample(logits, batch, streams).tolist()
    assert batch.checked_streams is not None and batch.checked_streams[0] is streams
    streams[2].device = torch.device("meta")     # what a check would refuse; the tuple was checked with this batch
    sample(logits, batch, streams)                                       # the second step: not checked again
    assert [s.offset for s in streams] == [2, 2, 2] and batch.checked_streams[0] is streams
    with pytest.raises(ValueError, match=r"generators\[2\] is on meta"):
        sample(logits, batch, tuple(list(streams)))                      # the same streams in a new tuple: checked
    streams[2].device = torch.device("cpu")
    fresh = tuple(CounterRNG(i) for i in range(3))
    assert sample(logits, batch, fresh).tolist() == first, "a new tuple starts its own streams"
    wrong = (CounterRNG(0), CounterRNG(1), CounterRNG(2, device="meta"))
    with pytest.raises(ValueError, match=r"generators\[2\] is on meta, logits are on cpu"):
        sample(logits, batch, wrong)
    assert [s.offset for s in wrong] == [0, 0, 0]
    as_list = [CounterRNG(i) for i in range(3)]
    assert sample(logits, batch, as_list).tolist() == first and batch.checked_streams[0] is fresh


def test_a_tuple_of_torch_streams_is_checked_once_and_a_seed_without_a_stream_is_never_kept():
    """Torch generators and rows without one, in a tuple, are remembered with the batch like counter streams. A
    seeded row that comes without a generator gets a fresh one from its seed for that call only, so such a tuple
    is not remembered: each call repeats the row's first draw."""
    from decodelab.sampling.sampler import make_generator

    params = [SamplingParams(seed=0), SamplingParams(), SamplingParams(seed=2)]
    batch = SamplingBatch(params)
    logits = torch.zeros(3, 500)                                 # uniform rows: a repeat by chance is 1 in 500
    streams = (make_generator(0), None, make_generator(2))
    steps = [sample(logits, batch, streams).tolist() for _ in range(3)]
    assert batch.checked_streams[0] is streams and batch.checked_streams[3] is False
    assert len({step[2] for step in steps}) > 1                  # the kept generator moves on
    lacking = (make_generator(0), None, None)
    again = [sample(logits, batch, lacking).tolist()[2] for _ in range(3)]
    assert again == [again[0]] * 3 and batch.checked_streams[0] is streams


def test_the_engine_lets_finished_sequences_go(tiny):
    """The drawer keys its batch by the sequences themselves; once nothing runs it drops them, so a finished
    request's sequences (tokens, table, detokenizer) are freed, as when the key held their ids."""
    import gc
    import weakref

    from decodelab.engine.engine import Engine

    model, tokenizer = tiny
    engine = Engine(model, tokenizer, max_num_seqs=4)
    for i in range(3):
        engine.add_request("小明", SamplingParams(seed=i, max_tokens=4 + i, ignore_eos=True, n=1 + (i == 1)))
    engine.step()
    held = [weakref.ref(seq) for seq in engine.scheduler.running]
    assert len(held) == 4
    while engine.has_unfinished():
        engine.step()
    gc.collect()
    assert [ref() for ref in held] == [None] * 4
