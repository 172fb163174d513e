"""The slab-reservation baseline (kv_layout="slab"): first-fit placement, merging on free, external fragmentation, bad input,
and the engine running over it with the same scheduler and model as the paged layout."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decodelab.kv.slab import FirstFitSlab, Reservation


def test_first_fit_takes_the_lowest_run_that_holds_the_request():
    slab = FirstFitSlab(20)
    a, b, c = slab.allocate(4), slab.allocate(6), slab.allocate(3)
    assert (a, b, c) == (0, 4, 10)
    slab.free(a)                                   # free: [0, 4) and [13, 20)
    assert slab.allocate(5) == 13, "the 4-slot gap at 0 is too short; first fit moves on"
    assert slab.allocate(2) == 0, "a short request fills the first gap"
    assert slab.free_extents == [(2, 2), (18, 2)]


def test_free_merges_neighbours_in_any_order():
    slab = FirstFitSlab(12)
    starts = [slab.allocate(3) for _ in range(4)]
    for start in (starts[1], starts[3], starts[2], starts[0]):
        slab.free(start)
    assert slab.free_extents == [(0, 12)] and slab.reservations == {}


def test_external_fragmentation_blocks_a_request_that_fits_in_total():
    slab = FirstFitSlab(10)
    a, _, c = slab.allocate(3), slab.allocate(4), slab.allocate(3)
    slab.free(a)
    slab.free(c)
    assert slab.num_free_blocks == 6 and slab.largest_free_extent() == 3
    assert slab.find(5) is None and slab.external_fragmentation(5) == 6
    assert slab.external_fragmentation(3) == 0
    with pytest.raises(RuntimeError, match="no free extent of 5 slots: 6 of 10 slots are free, the longest extent holds 3"):
        slab.allocate(5)


@pytest.mark.parametrize("size", [0, -1, 2.5, True, "3"])
def test_bad_sizes_are_rejected(size):
    with pytest.raises(ValueError, match="size must be an int >= 1"):
        FirstFitSlab(8).allocate(size)


def test_bad_frees_are_rejected():
    slab = FirstFitSlab(8)
    start = slab.allocate(3)
    with pytest.raises(ValueError, match=r"start must be the start of a held extent \[0\], got 1"):
        slab.free(1)
    slab.free(start)
    with pytest.raises(ValueError, match="got 0"):
        slab.free(start)                           # twice
    with pytest.raises(ValueError, match="num_slots must be an int >= 1, got 0"):
        FirstFitSlab(0)


def test_reservation_reserves_at_admission_and_frees_at_release():
    slab = FirstFitSlab(32)
    table = Reservation(size=10)
    assert table.can_append(slab, 4) and slab.num_used_blocks == 0
    slots, copies = table.append(slab, [7, 8, 9, 10])
    assert slots == [0, 1, 2, 3] and copies == [] and table.block_ids == [0, 1, 2, 3]
    assert slab.num_used_blocks == 10 and slab.filled_slots() == 4   # reserved 10, written 4
    assert table.append(slab, [11])[0] == [4]
    assert not table.can_append(slab, 6)
    with pytest.raises(RuntimeError, match="holds 10 slots; 5 are written, 6 more do not fit"):
        table.append(slab, [1] * 6)
    table.release(slab)
    assert slab.num_used_blocks == 0 and slab.filled_slots() == 0 and table.block_ids == []
    with pytest.raises(ValueError, match="cannot share"):
        table.fork(slab)


def test_reservation_waits_when_no_run_is_long_enough():
    slab = FirstFitSlab(10)
    Reservation(6).append(slab, [1])
    waiting = Reservation(6)
    assert not waiting.can_append(slab, 1) and slab.num_free_blocks == 4


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 9)), max_size=60))
def test_slab_invariants_hold_under_any_sequence(ops):
    slab = FirstFitSlab(40)
    held = []
    for allocate, size in ops:
        if allocate or not held:
            start = slab.find(size)
            if start is None:
                assert slab.largest_free_extent() < size
                continue
            assert slab.allocate(size) == start
            held.append((start, size))
        else:
            start, size = held.pop(size % len(held))
            slab.free(start)
        extents = slab.free_extents
        assert sum(n for _, n in extents) + sum(n for _, n in held) == 40
        assert all(s1 + n1 < s2 for (s1, n1), (s2, _) in zip(extents, extents[1:])), "free extents never touch"
        covered = sorted([(s, n) for s, n in held] + extents)
        assert all(s1 + n1 == s2 for (s1, n1), (s2, _) in zip(covered, covered[1:])) and covered[0][0] == 0


@pytest.fixture(scope="module")
def tiny():
    from decodelab.models.load import load_model
    return load_model("tiny-zh", device="cpu")


def test_engine_over_the_slab_generates_what_the_paged_engine_does(tiny):
    from decodelab.engine.engine import Engine
    from decodelab.sampling.sampler import SamplingParams
    model, tokenizer = tiny
    prompts = ["今天，小明在公园", "因为下雨了，", "床前", "小明"]
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=m) for i, m in enumerate((12, 20, 8, 30))]
    paged = Engine(model, tokenizer, block_size=16, num_blocks=8).generate(prompts, params)
    for reserve in ("max_tokens", "max_model_len"):
        engine = Engine(model, tokenizer, block_size=16, num_blocks=40, kv_layout="slab", reserve=reserve)
        assert [c.token_ids for c in engine.generate(prompts, params)] == [c.token_ids for c in paged]
        assert engine.pool.num_free_blocks == 640 and engine.stats.preemptions == 0


def test_engine_reservations_limit_concurrency(tiny):
    from decodelab.engine.engine import Engine
    from decodelab.sampling.sampler import SamplingParams
    model, tokenizer = tiny
    engine = Engine(model, tokenizer, block_size=16, num_blocks=32, kv_layout="slab", reserve="max_model_len")
    for prompt in ["小明", "床前", "今天"]:
        engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=4))
    first = engine.step()
    assert first.kind == "prefill" and first.num_running == 2 and first.num_waiting == 1   # 512 slots: two extents of 256
    assert first.allocated_slots == 512


def test_engine_rejects_what_a_slab_cannot_do(tiny):
    from decodelab.engine.engine import Engine
    from decodelab.sampling.sampler import SamplingParams
    model, tokenizer = tiny
    engine = Engine(model, tokenizer, block_size=16, num_blocks=8, kv_layout="slab")
    with pytest.raises(ValueError, match="cannot share a prompt"):
        engine.add_request("小明", SamplingParams(n=2))
    with pytest.raises(ValueError, match="reserves 203 slots, more than the whole slab of 128"):
        engine.add_request("小明", SamplingParams(max_tokens=200))
    with pytest.raises(ValueError, match="kv_layout must be one of"):
        Engine(model, tokenizer, kv_layout="ring")
