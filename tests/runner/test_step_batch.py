"""A decode step's batch (`StepBatch.decode`, and the runner's `DecodeBuffers` through `PagedLlama.decode_batch`)
equals the general builder's, in every engine step whatever happens to the tables; bad input is named."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from decodelab.engine.engine import Engine
from decodelab.engine.scheduler import ScheduledSeq
from decodelab.runner.step_batch import DecodeBuffers, StepBatch
from decodelab.sampling.sampler import SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")


def reference(scheduled):
    return StepBatch.build([(s.token_ids, s.start, s.slots, s.seq.table.block_ids) for s in scheduled])


def assert_same(batch, expected):
    for name in StepBatch.__dataclass_fields__:
        got, want = getattr(batch, name), getattr(expected, name)
        assert got.dtype == want.dtype and torch.equal(got, want), name


def seq(seq_id, blocks):
    return SimpleNamespace(seq_id=seq_id, table=SimpleNamespace(block_ids=blocks))


def test_decode_equals_build_from_lists_and_from_an_array():
    tables = [[4, 5, 6], [7], [8, 9]]
    expected = StepBatch.build([([11], 40, [70], tables[0]), ([12], 3, [115], tables[1]), ([13], 20, [132], tables[2])])
    as_lists = StepBatch.decode([11, 12, 13], [40, 3, 20], [70, 115, 132], tables)
    as_array = StepBatch.decode([11, 12, 13], [40, 3, 20], [70, 115, 132],
                                np.array([[4, 5, 6], [7, 0, 0], [8, 9, 0]], dtype=np.int64))
    assert_same(as_lists, expected)
    assert_same(as_array, expected)


def test_decode_batches_do_not_share_what_they_are_made_from():
    tables = [[1, 2], [3]]
    first = StepBatch.decode([5, 6], [20, 3], [36, 51], tables)
    kept = first.block_tables.clone()
    tables[1].append(4)
    second = StepBatch.decode([7, 8], [21, 4], [37, 52], tables)
    assert torch.equal(first.block_tables, kept) and second.block_tables.shape == (2, 2)


@pytest.mark.parametrize("args, message", [
    (([], [], [], []), "at least one"),
    (([1, 2], [0], [0, 1], [[0], [1]]), "one token, position, slot and block table per sequence"),
    (([1], [-1], [0], [[0]]), "positions must be >= 0, got [-1]"),
    (([1], [0], [0], np.zeros((1, 2), dtype=np.int32)), "int64 [B, max_blocks], got int32"),
])
def test_decode_names_bad_input(args, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        StepBatch.decode(*args)


def test_decode_buffers_equal_decode_and_are_rewritten_in_place():
    """Steps of one shape get the same StepBatch, its values rewritten (a batch is valid until the next call); a new
    shape makes new views, a larger one a larger buffer; every batch equals `StepBatch.decode` of its lists."""
    buffers = DecodeBuffers("cpu")
    steps = [([11, 12, 13], [40, 3, 20], [70, 115, 132], [[4, 5, 6], [7], [8, 9]]),
             ([21, 22, 23], [41, 4, 21], [71, 116, 133], [[4, 5, 6], [7], [8, 9]]),     # the same shape
             ([31, 32], [42, 5], [72, 117], [[4, 5, 6], [7]]),                          # fewer sequences
             ([1] * 9, list(range(9)), list(range(9)), [[b, b + 1, b + 2, b + 3] for b in range(9)])]   # larger
    batches = []
    for args in steps:
        batch = buffers.batch(*args)
        assert_same(batch, StepBatch.decode(*args))
        batches.append(batch)
    assert batches[0] is batches[1] and batches[2] is not batches[0] and batches[3] is not batches[0]
    again = buffers.batch(*steps[2])                 # after the buffer grew, the shape is made again, in the new one
    assert again is not batches[2]
    assert_same(again, StepBatch.decode(*steps[2]))


@pytest.mark.cuda
def test_decode_buffers_on_cuda_copy_each_step_to_the_device():
    buffers = DecodeBuffers("cuda")
    for args in [([11, 12], [40, 3], [70, 115], [[4, 5, 6], [7]]), ([21, 22], [41, 4], [71, 116], [[4, 5, 6], [7]])]:
        batch = buffers.batch(*args)
        assert batch.input_ids.device.type == "cuda"
        assert_same(batch, StepBatch.decode(*args, device="cuda"))


@pytest.mark.parametrize("first_inside", [True, False])
def test_decode_buffers_work_in_and_out_of_inference_mode(first_inside):
    """An engine makes a shape inside `torch.inference_mode()`; a caller may come back outside it (and the other way
    round). Off the CPU the step copies into the device buffer, which must then still take the write ("meta" stands
    in for a GPU here: it copies shapes, not values)."""
    for device in ("cpu", "meta"):
        buffers = DecodeBuffers(device)
        args = ([5, 6], [20, 3], [36, 51], [[1, 2], [3]])
        for inside in (first_inside, not first_inside, first_inside):
            with torch.inference_mode(inside):
                batch = buffers.batch(*args)
            assert batch.block_tables.shape == (2, 2) and batch.input_ids.device.type == device
        if device == "cpu":
            assert_same(batch, StepBatch.decode(*args))


def test_decode_buffers_keep_their_last_batch_when_refusing_bad_input():
    buffers = DecodeBuffers("cpu")
    good = ([5, 6], [20, 3], [36, 51], [[1, 2], [3]])
    batch = buffers.batch(*good)
    for bad, message in [(([5, 6], [20, -1], [36, 51], [[1, 2], [3]]), "positions must be >= 0, got [20, -1]"),
                         (([5, 6], [20], [36, 51], [[1, 2], [3]]), "one token, position, slot and block table"),
                         (([], [], [], []), "at least one")]:
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
            buffers.batch(*bad)
    assert_same(batch, StepBatch.decode(*good))


def test_decode_buffers_bound_the_shapes_they_keep():
    buffers = DecodeBuffers("cpu", max_shapes=3)
    for width in range(1, 8):
        args = ([1, 2], [0, 1], [0, 1], [[0] * width, [1]])
        assert_same(buffers.batch(*args), StepBatch.decode(*args))
        assert len(buffers._shapes) <= 3


def test_the_runner_names_a_step_that_is_not_a_decode(random_llama):
    runner = Engine(random_llama).runner
    with pytest.raises(ValueError, match="one token into one slot per sequence, got 1 sequences, 2 tokens and 2 slots"):
        runner.decode_batch([ScheduledSeq(seq(0, [0]), [5, 6], 0, [0, 1])])


def test_every_decode_step_of_the_engine_equals_the_general_batch(random_llama, monkeypatch):
    """Preemption, n = 2 forks (copy on write of a shared last block), prefix-cache hits and an abort: every decode
    batch the engine builds equals `StepBatch.build` of the same step."""
    engine = Engine(random_llama, block_size=4, num_blocks=24, max_num_seqs=6)
    decode_batch, checked = engine.runner.decode_batch, []

    def checking(scheduled):
        batch = decode_batch(scheduled)
        assert_same(batch, reference(scheduled))
        checked.append(len(scheduled))
        return batch
    monkeypatch.setattr(engine.runner, "decode_batch", checking)
    gen = torch.Generator().manual_seed(3)
    shared = torch.randint(3, 300, (9,), generator=gen).tolist()
    ids = []
    for i in range(14):
        prompt = shared + torch.randint(3, 300, (1 + i % 5,), generator=gen).tolist()
        params = SamplingParams(temperature=1.0, seed=i, max_tokens=10 + 4 * (i % 4), n=1 + (i % 3 == 0),
                                ignore_eos=True)
        ids.append(engine.add_request(prompt, params))
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
        if steps == 5:
            engine.abort(ids[1])
    stats = engine.stats
    assert stats.preemptions > 0 and stats.prefix_cache_hit_tokens > 0 and len(checked) > 20
    assert stats.free_blocks == stats.num_blocks
