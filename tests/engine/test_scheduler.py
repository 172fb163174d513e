"""The scheduler on its own, with no model: plans, preemption, prefix caching, forks for n > 1, the admission that
touches nothing when it fails, and `update_from_output` as the one writer of request state. Tokens are drawn by
hand (`drawn`), as a sampler would."""
import random

import pytest

from decodelab.engine.scheduler import Drawn, Scheduler, StepKind
from decodelab.engine.sequence import Status
from decodelab.kv.layout import SlabLayout, PagedLayout
from decodelab.sampling import SamplingParams

EOS = 0


def finish_rule(seq, token):
    if token == EOS:
        return "stop"
    return "length" if len(seq.output_token_ids) >= seq.params.max_tokens else None


def make(num_blocks=16, block_size=2, max_num_seqs=8, max_num_batched_tokens=64, layout=None, **kwargs):
    layout = layout or PagedLayout(num_blocks, block_size, max_model_len=64)
    return Scheduler(layout, max_num_seqs, max_num_batched_tokens, finish_rule, **kwargs)


def add(scheduler, request_id, prompt, max_tokens=8, n=1):
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, n=n)
    seq = scheduler.new_sequence(request_id, prompt, params,
                                 scheduler.layout.new_table(len(prompt), max_tokens), None)
    scheduler.add(seq)
    return seq


def drawn(plan, *tokens):
    """One token (or list of tokens) per sample of the plan, no logprobs."""
    lists = [t if isinstance(t, list) else [t] for t in tokens]
    return Drawn(lists, [[None] * len(t) for t in lists])


def test_plan_prefills_the_waiting_then_decodes_the_running():
    scheduler = make()
    a, b = add(scheduler, 0, [1, 2, 3]), add(scheduler, 1, [4, 5])
    plan = scheduler.schedule()
    assert plan.kind == "prefill" and plan.kind is StepKind.PREFILL
    assert [(r.seq, r.token_ids, r.start) for r in plan.scheduled] == [(a, [1, 2, 3], 0), (b, [4, 5], 0)]
    assert [len(r.slots) for r in plan.scheduled] == [3, 2] and plan.samples == [(0, a), (1, b)]
    assert a.status is b.status is Status.RUNNING and not scheduler.waiting
    update = scheduler.update_from_output(plan, drawn(plan, 7, 8))
    assert update.tokens == [[7], [8]] and update.reasons == [None, None] and not update.finished
    assert a.token_ids == [1, 2, 3, 7] and a.table.num_tokens == 3   # the new token's K/V come next step
    plan = scheduler.schedule()
    assert plan.kind == "decode"
    assert [(r.token_ids, r.start) for r in plan.scheduled] == [([7], 3), ([8], 2)]
    assert a.table.num_tokens == 4 and b.table.num_tokens == 3


def test_the_token_budget_and_max_num_seqs_bound_a_prefill():
    scheduler = make(max_num_seqs=2, max_num_batched_tokens=5)
    seqs = [add(scheduler, i, [1 + i] * 3) for i in range(3)]
    plan = scheduler.schedule()
    assert plan.seqs == seqs[:1], "3 + 3 tokens exceed the budget of 5"
    scheduler.update_from_output(plan, drawn(plan, 9))
    plan = scheduler.schedule()
    assert plan.seqs == seqs[1:2], "max_num_seqs=2 leaves room for one more"
    assert list(scheduler.waiting) == seqs[2:]


def test_update_from_output_finishes_frees_and_completes_the_request():
    scheduler = make()
    seq = add(scheduler, 0, [1, 2, 3], max_tokens=2)
    plan = scheduler.schedule()
    scheduler.update_from_output(plan, drawn(plan, 5))
    plan = scheduler.schedule()
    update = scheduler.update_from_output(plan, drawn(plan, 6))
    assert update.reasons == ["length"] and update.finished == [[seq]]
    assert seq.status is Status.FINISHED and seq.finish_reason == "length" and seq.output_token_ids == [5, 6]
    assert scheduler.pool.num_used_blocks == 0 and not scheduler.requests and not scheduler.has_unfinished()
    with pytest.raises(ValueError, match="one token list and one logprob list per sample"):
        scheduler.update_from_output(plan, Drawn([], []))


def test_a_finish_drops_the_tokens_after_it_and_their_logprobs():
    scheduler = make(lookahead=lambda seq: 2)
    seq = add(scheduler, 0, [1, 2, 3])
    plan = scheduler.schedule()
    scheduler.update_from_output(plan, drawn(plan, 5))
    plan = scheduler.schedule()
    assert plan.scheduled[0].num_lookahead == 2 and seq.table.num_slots >= 4 + 2
    update = scheduler.update_from_output(plan, Drawn([[6, EOS, 9]], [["a", "b", "c"]]))
    assert update.tokens == [[6, EOS]] and update.logprobs == [["a", "b"]] and update.reasons == ["stop"]
    assert seq.logprobs == ["a", "b"] and seq.output_token_ids == [5, 6, EOS]


def test_a_speculative_round_keeps_the_drafts_and_gives_back_the_rest():
    scheduler = make(block_size=2, lookahead=lambda seq: 3)
    seq = add(scheduler, 0, [1, 2, 3])
    plan = scheduler.schedule()
    scheduler.update_from_output(plan, drawn(plan, 5))
    plan = scheduler.schedule()                              # token 5 at position 3, drafts at 4, 5, 6
    assert len(seq.table.block_ids) == 4
    scheduler.update_from_output(plan, drawn(plan, [6, 7]))  # one draft kept, then the target's token
    assert seq.token_ids == [1, 2, 3, 5, 6, 7] and seq.table.num_tokens == 5
    assert len(seq.table.block_ids) == 3, "the block only rejected drafts reached is given back"


def test_preemption_frees_the_newest_and_recomputes_it_first():
    scheduler = make(num_blocks=4, block_size=2)
    old, new = add(scheduler, 0, [1, 2, 3]), add(scheduler, 1, [4, 5, 6])
    plan = scheduler.schedule()                              # 2 blocks each: the pool is full
    scheduler.update_from_output(plan, drawn(plan, 7, 8))
    plan = scheduler.schedule()                              # both fill their second block
    scheduler.update_from_output(plan, drawn(plan, 9, 10))
    plan = scheduler.schedule()                              # `old` needs a third block: `new` gives its back
    assert plan.kind == "decode" and plan.preempted == [new] and plan.seqs == [old]
    assert new.status is Status.WAITING and list(scheduler.waiting) == [new] and new.table.num_tokens == 0
    assert scheduler.num_preemptions == 1 and new.token_ids == [4, 5, 6, 8, 10], "its output is kept"
    scheduler.update_from_output(plan, drawn(plan, EOS))     # `old` ends: its blocks come back
    plan = scheduler.schedule()
    assert plan.kind == "prefill" and plan.seqs == [new]
    [sched] = plan.scheduled                                        # prompt and output again; its full block is cached
    assert (sched.num_cached, sched.start, sched.token_ids) == (2, 2, [6, 8, 10])


def test_prefix_cache_hits_skip_the_cached_blocks():
    scheduler = make(block_size=2)
    first = add(scheduler, 0, [1, 2, 3, 4, 5])
    plan = scheduler.schedule()
    scheduler.update_from_output(plan, drawn(plan, EOS))     # finished: blocks [1, 2], [3, 4] stay cached
    assert first.status is Status.FINISHED
    second = add(scheduler, 1, [1, 2, 3, 4, 6, 7])
    plan = scheduler.schedule()
    [sched] = plan.scheduled
    assert (sched.num_cached, sched.start, sched.token_ids) == (4, 4, [6, 7])
    assert scheduler.num_cached_tokens == 4 and second.table.num_tokens == 6


def test_forks_for_n_share_the_prompt_and_complete_together():
    scheduler = make(block_size=2)
    parent = add(scheduler, 0, [1, 2, 3], max_tokens=2, n=3)
    assert parent.width == 3
    plan = scheduler.schedule()
    assert [c.sample_index for c in plan.forks] == [1, 2] and [row for row, _ in plan.samples] == [0, 0, 0]
    assert scheduler.requests[0] == [parent, *plan.forks] and len(scheduler.running) == 3
    assert all(c.table.block_ids == parent.table.block_ids for c in plan.forks)
    assert scheduler.pool.ref_count(parent.table.block_ids[0]) == 3
    update = scheduler.update_from_output(plan, drawn(plan, 5, 6, EOS))
    assert update.reasons == [None, None, "stop"] and not update.finished, "two samples still run"
    plan = scheduler.schedule()
    assert len(plan.copies) == 1, "the first writer copies the last block it shares, the other writes in place"
    update = scheduler.update_from_output(plan, drawn(plan, 8, 9))
    [samples] = update.finished
    assert [s.sample_index for s in samples] == [0, 1, 2] and not scheduler.requests
    assert scheduler.pool.num_used_blocks == 0


def test_a_failed_admission_leaves_the_free_queue_untouched():
    """vLLM's rule: the waiting head that does not fit takes none of its cached blocks, so the LRU order stays."""
    scheduler = make(num_blocks=10, block_size=2)
    add(scheduler, 0, [1, 2, 3, 4, 5])
    add(scheduler, 1, [6, 6, 6, 6, 6])
    runner = add(scheduler, 2, [7, 7, 7, 7, 7])
    plan = scheduler.schedule()                              # 3 blocks each, one block free
    scheduler.update_from_output(plan, drawn(plan, EOS, EOS, 8))
    pool = scheduler.pool
    free, cached = pool.free_block_ids, pool.cached_block_ids
    hits = [b for b in free if pool.block_tokens[b] in ([1, 2], [3, 4])]
    assert len(hits) == 2 and free[-1] not in hits, "the cached prefix is not at the tail of the free queue"
    waiting = add(scheduler, 3, [1, 2, 3, 4] + [9] * 11)    # 4 cached tokens, 6 new blocks; 7 free - 2 hits = 5
    plan = scheduler.schedule()
    assert plan.kind == "decode" and plan.seqs == [runner] and list(scheduler.waiting) == [waiting]
    assert pool.free_block_ids == free and set(cached) <= set(pool.cached_block_ids)
    assert waiting.table.block_ids == [] and all(pool.ref_count(b) == 0 for b in hits)


def test_slab_admission_waits_for_a_free_extent():
    scheduler = make(layout=SlabLayout(num_slots=20, max_model_len=64))
    first = add(scheduler, 0, [1, 2, 3], max_tokens=9)       # reserves 12 slots
    second = add(scheduler, 1, [4, 5, 6], max_tokens=9)      # 12 more do not fit in the 8 left
    plan = scheduler.schedule()
    assert plan.seqs == [first] and list(scheduler.waiting) == [second]
    assert scheduler.pool.free_extents == [(12, 8)] and scheduler.pool.filled_slots() == 3
    scheduler.update_from_output(plan, drawn(plan, EOS))
    assert scheduler.pool.filled_slots() == 0 and scheduler.pool.free_extents == [(0, 20)]
    assert scheduler.schedule().seqs == [second]


class Vouching(PagedLayout):
    """A paged layout that records its answers to `decode_step_fits`, or with `never`, never vouches for a decode
    step, so the scheduler asks each table in turn."""

    def __init__(self, *args, never=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.never, self.answers = never, []

    def decode_step_fits(self, num_seqs):
        self.answers.append(not self.never and super().decode_step_fits(num_seqs))
        return self.answers[-1]


def plan_state(plan, pool):
    return (plan.kind, [(s.seq.seq_id, s.token_ids, s.start, s.slots, s.num_cached) for s in plan.scheduled],
            plan.copies, [s.seq_id for s in plan.preempted], [(row, s.seq_id) for row, s in plan.samples],
            pool.free_block_ids, pool.ref_counts, pool.cached_block_ids, pool.filled_slots())


@pytest.mark.parametrize("seed", range(4))
def test_the_one_pass_decode_step_plans_what_asking_each_table_plans(seed):
    """The same random run (arrivals, n > 1 forks writing into shared blocks, EOS, a pool tight enough to preempt)
    through the scheduler as it is and through one whose layout never vouches for a decode step: the same plans,
    updates and pool at every step."""
    rng = random.Random(seed)
    script = [(rng.randrange(4), [rng.randrange(1, 9) for _ in range(rng.randrange(1, 7))], rng.randrange(1, 9),
               rng.choice([1, 1, 2, 3])) for _ in range(12)]
    draws = [rng.choice([EOS] + list(range(1, 9)) * 6) for _ in range(2000)]
    layouts = [Vouching(14, 2, max_model_len=64), Vouching(14, 2, max_model_len=64, never=True)]
    runs, kinds = [[], []], set()
    for layout, states in zip(layouts, runs):
        scheduler, arrivals, tokens = make(layout=layout), list(script), iter(draws)
        for step in range(200):
            while arrivals and arrivals[0][0] <= step % 4:
                _, prompt, max_tokens, n = arrivals.pop(0)
                add(scheduler, len(script) - len(arrivals), prompt, max_tokens, n)
            if not scheduler.has_unfinished() and not arrivals:
                break
            plan = scheduler.schedule()
            kinds.add((plan.kind, bool(plan.preempted), bool(plan.copies)))
            update = scheduler.update_from_output(plan, drawn(plan, *[next(tokens) for _ in plan.samples]))
            states.append((plan_state(plan, scheduler.pool), update.tokens, update.reasons,
                           [[s.seq_id for s in done] for done in update.finished]))
        assert not scheduler.has_unfinished() and scheduler.pool.num_used_blocks == 0
    assert runs[0] == runs[1]
    assert True in layouts[0].answers and False in layouts[0].answers, "one of the two decode paths was not taken"
    assert any(kind == "decode" and preempted for kind, preempted, _ in kinds), "no preemption was reached"
    assert any(kind == "decode" and copies for kind, _, copies in kinds), "no copy-on-write was reached"


@pytest.mark.parametrize("quiet", [[frozenset(), 5], (frozenset(), 5, 1), ({2}, 5), (frozenset({2}), 5.0),
                                   (frozenset({2}), -1)])
def test_a_bad_quiet_hint_is_refused_by_name(quiet):
    scheduler = make()
    with pytest.raises(ValueError, match="quiet must be None or"):
        scheduler.new_sequence(0, [5, 6], SamplingParams(max_tokens=4), scheduler.layout.new_table(2, 4), None,
                               quiet=quiet)
    assert not scheduler.requests and not scheduler.waiting          # nothing queued
    seq = scheduler.new_sequence(0, [5, 6], SamplingParams(max_tokens=4), scheduler.layout.new_table(2, 4), None,
                                 quiet=(frozenset({2}), 6))
    assert seq.quiet == (frozenset({2}), 6)
