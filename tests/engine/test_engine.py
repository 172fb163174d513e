"""The continuous-batching engine equals transformers token for token (chapter 7)."""
import pytest
import torch

from decodelab.engine.engine import Completion, Engine
from decodelab.sampling.sampler import SamplingParams, sample_seed

pytestmark = pytest.mark.usefixtures("one_thread")  # these models are tiny (tests/conftest.py)

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)
LENGTHS = (1, 2, 3, 5, 8, 13, 16, 17, 21, 30, 33, 47)


def hf_greedy(model, prompt, max_tokens):
    out = model.generate(torch.tensor([prompt], device=model.device), do_sample=False, max_new_tokens=max_tokens,
                         pad_token_id=model.config.pad_token_id)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def prompts():
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(3, 300, (n,), generator=gen).tolist() for n in LENGTHS]


@pytest.fixture(scope="module")
def references(random_llama, prompts):
    return [hf_greedy(random_llama, p, GREEDY.max_tokens) for p in prompts]


def check_all_free(engine):
    assert engine.stats.free_blocks == engine.stats.num_blocks
    assert max(engine.pool.ref_counts) == 0 and not engine.has_unfinished()


def test_greedy_equals_transformers(random_llama, prompts, references):
    engine = Engine(random_llama, block_size=4, max_num_seqs=5)
    outputs = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in outputs] == references
    for out, ref in zip(outputs, references):
        eos_at_end = ref[-1] == random_llama.config.eos_token_id
        assert out.finish_reason == ("stop" if eos_at_end else "length") and out.text is None
    check_all_free(engine)
    stats = engine.stats
    assert stats.steps > len(LENGTHS) and 0.5 < stats.kv_utilization <= 1.0 and stats.preemptions == 0


def test_preemption_gives_the_same_outputs(random_llama, prompts, references):
    # 47 + 15 tokens need 16 blocks of 4: the whole pool for one request, so the others must be preempted
    engine = Engine(random_llama, block_size=4, num_blocks=16, max_num_seqs=8)
    assert [o.token_ids for o in engine.generate(prompts, GREEDY)] == references
    assert engine.stats.preemptions > 0
    check_all_free(engine)


def test_prefix_caching_gives_the_same_outputs(random_llama):
    gen = torch.Generator().manual_seed(3)
    system = torch.randint(3, 300, (21,), generator=gen).tolist()
    prompts = [system + torch.randint(3, 300, (n,), generator=gen).tolist() for n in (1, 4, 9, 2)]
    results = {}
    for caching in (True, False):
        engine = Engine(random_llama, block_size=4, max_num_seqs=2, enable_prefix_caching=caching)
        results[caching] = [o.token_ids for o in engine.generate(prompts, GREEDY)]
        # every prompt after the first reuses the 5 full blocks of the system prompt, even the one prefilled in the
        # same step: all K/V of a layer are written before any of its attention reads them
        assert engine.stats.prefix_cache_hit_tokens == (3 * 20 if caching else 0)
        check_all_free(engine)
    assert results[True] == results[False]


@pytest.mark.parametrize("rng", ["torch", "counter"])
def test_seeded_sampling_does_not_depend_on_the_batch(random_llama, prompts, rng):
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=11, max_tokens=12, ignore_eos=True)
    alone = Engine(random_llama, block_size=4, rng=rng).generate([prompts[5]], params)[0].token_ids
    others = [SamplingParams(temperature=0.7, max_tokens=m) for m in (3, 9, 14)] + [GREEDY]
    crowded = Engine(random_llama, block_size=4, max_num_seqs=3, rng=rng)
    # the seeded request arrives after others, shares decode steps with greedy and random rows
    outputs = crowded.generate(prompts[:4] + [prompts[5]], others + [params])
    assert outputs[-1].token_ids == alone
    small_pool = Engine(random_llama, block_size=4, num_blocks=14, rng=rng)
    assert small_pool.generate(prompts[:4] + [prompts[5]], others + [params])[-1].token_ids == alone
    # preempted and recomputed: the stream goes on where it stopped (16 blocks hold 47 + 15 tokens, see above)
    tight = Engine(random_llama, block_size=4, num_blocks=16, max_num_seqs=8, rng=rng)
    seeded = [SamplingParams(temperature=1.0, seed=s, max_tokens=15, ignore_eos=True) for s in range(len(prompts))]
    assert [o.token_ids for o in tight.generate(prompts, seeded)] == \
           [Engine(random_llama, block_size=4, rng=rng).generate([p], s)[0].token_ids for p, s in zip(prompts, seeded)]
    assert tight.stats.preemptions > 0


@pytest.mark.parametrize("rng", ["torch", "counter"])
def test_n_samples_share_prompt_blocks(random_llama, prompts, rng):
    prompt = prompts[9]                                    # 30 tokens: 7 full blocks of 4 + 2 tokens
    params = SamplingParams(temperature=1.0, seed=5, n=3, max_tokens=6, ignore_eos=True)
    engine = Engine(random_llama, block_size=4, rng=rng)
    engine.add_request(prompt, params)
    first = engine.step()
    assert first.kind == "prefill" and len(first.new_tokens) == 3
    tables = list(first.block_tables.values())
    assert tables[0] == tables[1] == tables[2] and engine.pool.num_used_blocks == 8
    second = engine.step()                                 # each sample copies the shared last block on write
    assert second.kind == "decode" and engine.pool.num_used_blocks == 7 + 3
    assert len({t[-1] for t in second.block_tables.values()}) == 3
    finished = [*first.finished, *second.finished]
    while engine.has_unfinished():
        finished += engine.step().finished
    [done] = finished
    assert len(done.samples) == 3 and done.token_ids == done.samples[0].token_ids
    # sample i of a seeded request is the single request seeded with sample_seed(seed, i); the samples differ
    for i, sample in enumerate(done.samples):
        single = SamplingParams(temperature=1.0, seed=sample_seed(5, i), max_tokens=6, ignore_eos=True)
        assert Engine(random_llama, block_size=4, rng=rng).generate([prompt], single)[0].token_ids == sample.token_ids
    assert len({tuple(s.token_ids) for s in done.samples}) == 3
    check_all_free(engine)


def test_requests_join_between_steps(random_llama, prompts, references):
    engine = Engine(random_llama, block_size=4)
    first = engine.add_request(prompts[3], GREEDY)
    prefill = engine.step()                                # 5 prompt tokens in 2 blocks of 4
    assert (prefill.live_tokens, prefill.allocated_slots, prefill.num_running) == (5, 8, 1)
    decode = engine.step()
    assert (decode.live_tokens, decode.allocated_slots) == (6, 8)
    second = engine.add_request(prompts[7], GREEDY)
    assert engine.step().kind == "prefill"
    joint = engine.step()
    assert joint.kind == "decode" and len(joint.new_tokens) == 2
    done = {}
    while engine.has_unfinished():
        done |= {c.request_id: c for c in engine.step().finished}
    assert done[first].token_ids == references[3]
    assert done[second].token_ids == references[7]


def test_stop_tokens_and_lengths(random_llama, prompts, references):
    ref = references[4]
    stop = ref[5]
    engine = Engine(random_llama, block_size=4)
    [out] = engine.generate([prompts[4]], SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=(stop,)))
    assert out.token_ids == ref[: ref.index(stop) + 1] and out.finish_reason == "stop"
    [out] = engine.generate([prompts[4]], SamplingParams(temperature=0.0, max_tokens=3))
    assert out.token_ids == ref[:3] and out.finish_reason == "length"
    context = random_llama.config.max_position_embeddings
    [out] = engine.generate([[5] * (context - 2)], SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))
    assert len(out.token_ids) == 2 and out.finish_reason == "length"


def test_bad_input_leaves_other_requests_intact(random_llama, prompts, references, monkeypatch):
    engine = Engine(random_llama, block_size=4, num_blocks=20, max_num_seqs=4)
    good = engine.add_request(prompts[6], GREEDY)
    done, step = {}, engine.step

    def recording_step():                                  # generate() consumes the outputs that report `good`
        out = step()
        done.update((c.request_id, c) for c in out.finished)
        return out

    monkeypatch.setattr(engine, "step", recording_step)
    engine.step()
    context = random_llama.config.max_position_embeddings
    bad = [
        (lambda: engine.add_request([], GREEDY), ValueError, "at least one token"),
        (lambda: engine.add_request([5] * (context + 1), GREEDY), ValueError, "longer than the model's context"),
        (lambda: engine.add_request([5] * 60, SamplingParams(max_tokens=30)), ValueError, "more than the whole pool"),
        (lambda: engine.add_request([5, 300], GREEDY), ValueError, r"must be in \[0, 300\)"),
        (lambda: engine.add_request("hello", GREEDY), TypeError, "no tokenizer"),
        (lambda: engine.add_request([5], SamplingParams(n=5)), ValueError, "more than max_num_seqs=4"),
        (lambda: engine.generate([prompts[0], prompts[1]], [GREEDY]), ValueError, r"one per prompt \(2\)"),
        (lambda: engine.generate([prompts[0], []], GREEDY), ValueError, r"prompts\[1\] must hold at least one"),
        (lambda: engine.generate([], GREEDY), ValueError, "non-empty list"),
        (lambda: engine.generate([prompts[0]], {"temperature": 0}), ValueError, "one SamplingParams or one per"),
    ]
    for call, error, message in bad:
        with pytest.raises(error, match=message):
            call()
    assert engine.has_unfinished() and len(engine.sequences()) == 1
    [other] = engine.generate([prompts[2]], GREEDY)        # drives the earlier request to its end as well
    assert other.token_ids == references[2]
    while engine.has_unfinished():
        engine.step()
    assert done[good].token_ids == references[6]
    check_all_free(engine)
    with pytest.raises(ValueError, match="block_size must be an int >= 1"):
        Engine(random_llama, block_size=0)


def test_shipped_model_greedy_equals_transformers(tiny):
    model, tokenizer = tiny
    texts = ["从前", "今天天气很好，我们", "小猫"]
    engine = Engine(model, tokenizer, block_size=8, max_num_seqs=2)
    outputs = engine.generate(texts, SamplingParams(temperature=0.0, max_tokens=24))
    for text, out in zip(texts, outputs):
        prompt = tokenizer(text).input_ids
        assert out.prompt_token_ids == prompt
        assert out.token_ids == hf_greedy(model, prompt, 24)
        assert out.text == tokenizer.decode(out.token_ids, skip_special_tokens=True)
    assert isinstance(outputs[0], Completion)
    check_all_free(engine)


@pytest.mark.cuda
def test_greedy_equals_transformers_on_cuda(random_llama, prompts):
    import copy

    model = copy.deepcopy(random_llama).to("cuda")
    engine = Engine(model, block_size=4, max_num_seqs=5)
    outputs = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in outputs] == [hf_greedy(model, p, GREEDY.max_tokens) for p in prompts]
    seeded = SamplingParams(temperature=1.0, seed=3, max_tokens=8, ignore_eos=True)
    alone = engine.generate([prompts[2]], seeded)[0].token_ids
    assert engine.generate(prompts[:3], [GREEDY, GREEDY, seeded])[2].token_ids == alone
    check_all_free(engine)
    counter = Engine(model, block_size=4, max_num_seqs=5, rng="counter")    # host-made uniforms, GPU search
    alone = counter.generate([prompts[2]], seeded)[0].token_ids
    assert counter.generate(prompts[:3], [GREEDY, GREEDY, seeded])[2].token_ids == alone
    check_all_free(counter)


def test_neighbouring_seeds_do_not_share_streams(random_llama):
    """Request seed=0 with n=2 must not reproduce, as its sample 1, what request seed=1 draws as its sample 0."""
    prompt = [1, 7, 9, 11]
    engine = Engine(random_llama, block_size=4)
    pair = engine.generate([prompt], SamplingParams(temperature=1.0, seed=0, n=2, max_tokens=8, ignore_eos=True))[0]
    other = engine.generate([prompt], SamplingParams(temperature=1.0, seed=1, max_tokens=8, ignore_eos=True))[0]
    assert pair.samples[1].token_ids != other.token_ids
    assert sample_seed(0, 1) != sample_seed(1, 0) and sample_seed(9, 0) == 9 and sample_seed(None, 2) is None
    with pytest.raises(ValueError, match="index must be an int >= 0"):
        sample_seed(3, -1)


def test_abort_frees_blocks_and_ctrl_c_leaves_the_engine_clean(random_llama, monkeypatch):
    engine = Engine(random_llama, block_size=4)
    params = SamplingParams(temperature=1.0, seed=2, n=3, max_tokens=20, ignore_eos=True)
    running = engine.add_request([1, 7, 9, 11, 13], params)
    waiting = engine.add_request([1, 5, 6], SamplingParams(max_tokens=20, ignore_eos=True))
    engine.step()
    engine.step()
    engine.abort(running)
    engine.abort(waiting)
    assert not engine.has_unfinished() and engine.pool.num_used_blocks == 0 and not engine.scheduler.requests
    with pytest.raises(KeyError, match="is not in flight"):
        engine.abort(running)

    real_step, calls = engine.step, []

    def interrupted_step():
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_step()

    monkeypatch.setattr(engine, "step", interrupted_step)
    with pytest.raises(KeyboardInterrupt):
        engine.generate([[1, 7, 9], [1, 8]], SamplingParams(max_tokens=30, ignore_eos=True))
    monkeypatch.undo()
    assert not engine.has_unfinished() and engine.pool.num_used_blocks == 0 and not engine.scheduler.requests
    [again] = engine.generate([[1, 7, 9]], SamplingParams(temperature=0.0, max_tokens=5))
    assert len(again.token_ids) == 5


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"max_num_batched_tokens": 0}, ValueError, "max_num_batched_tokens must be an int >= 1, got 0"),
    ({"max_num_batched_tokens": 8}, ValueError, "max_num_batched_tokens must be at least the model's context"),
    ({"enable_prefix_caching": "no"}, TypeError, "enable_prefix_caching must be True or False, got 'no'"),
    ({"num_blocks": 10**12}, ValueError, r"num_blocks=1000000000000 needs .* GiB of K/V, more than this device"),
    ({"num_blocks": 0}, ValueError, "num_blocks must be an int >= 1, got 0"),
    ({"block_size": 10**6}, ValueError, "block_size must be at most the model's context"),
    ({"max_num_seqs": True}, ValueError, "max_num_seqs must be an int >= 1, got True"),
    ({"rng": "philox"}, ValueError, r"rng must be one of \('torch', 'counter'\), got 'philox'"),
])
def test_every_engine_argument_is_checked(random_llama, kwargs, error, message):
    with pytest.raises(error, match=message):
        Engine(random_llama, **kwargs)


def test_stop_ids_outside_the_vocabulary_are_refused(random_llama):
    engine = Engine(random_llama, block_size=4)
    with pytest.raises(ValueError, match=r"stop_token_ids for prompt must be < the vocabulary size"):
        engine.add_request([1, 2, 3], SamplingParams(stop_token_ids=(10**6,)))
    assert not engine.has_unfinished()


def test_a_missing_or_swapped_model_is_named(tiny):
    from decodelab.validation import ParamError

    model, tokenizer = tiny
    with pytest.raises(ParamError, match="model must be a transformers causal LM, got NoneType"):
        Engine(None, tokenizer)
    with pytest.raises(ParamError, match=r"got a tokenizer where the model goes: call Engine\(model, tokenizer"):
        Engine(tokenizer, model)


def test_the_quiet_finish_hint_ends_every_sample_where_the_rule_does(random_llama):
    """The scheduler skips the finish rule for a token that cannot end a sample (`SequenceState.quiet`, set by the
    engine for requests without stop strings): the same tokens and reasons as asking the rule at every token, over
    EOS, stop tokens, min_tokens, max_tokens, the context's end, n = 2 forks and preemption."""
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 300, (n,), generator=gen).tolist() for n in (3, 9, 17, 200, 240, 5)]
    bias = {2: 4.0}                                                     # EOS likely enough to end some samples
    params = [SamplingParams(temperature=1.0, seed=1, max_tokens=30, logit_bias=bias),
              SamplingParams(temperature=1.0, seed=2, max_tokens=30, stop_token_ids=list(range(10, 40))),
              SamplingParams(temperature=1.0, seed=3, max_tokens=30, min_tokens=12, logit_bias=bias, n=2),
              SamplingParams(temperature=1.0, seed=4, max_tokens=50, ignore_eos=True, logit_bias=bias),
              SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),          # ends at the context (256)
              SamplingParams(temperature=1.0, seed=6, max_tokens=30, min_tokens=5,
                             stop_token_ids=list(range(10, 40)), n=2)]

    def run(quiet: bool):
        engine = Engine(random_llama, block_size=4, num_blocks=66, max_num_seqs=6)   # few blocks: preemption
        if not quiet:
            engine._quiet = lambda params, num_prompt_tokens: None
        out = engine.generate(prompts, params)
        assert engine.scheduler.num_preemptions > 0
        return [[(s.token_ids, s.finish_reason) for s in (c.samples or (c,))] for c in out]

    hinted, asked = run(True), run(False)
    assert hinted == asked
    reasons = [reason for samples in hinted for _, reason in samples]
    ends = [tokens[-1] for samples in hinted for tokens, _ in samples]
    assert {"stop", "length"} <= set(reasons) and 2 in ends and any(10 <= t < 40 for t in ends)
    assert len(hinted[4][0][0]) == 256 - 240                                      # the context ended it
    assert all(len(tokens) >= 12 for tokens, _ in hinted[2])                       # min_tokens held off EOS
