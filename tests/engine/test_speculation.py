"""Speculative decoding in Engine (decodelab.engine.speculation): greedy equals the engine without it and `generate`
token for token, finishes mid-round included; sampled output follows the target's exact distribution (chi-square at
fixed seeds); rejected drafts' blocks go back to the pool and are never hashed; bad configs and params are refused."""
import math
from collections import Counter

import pytest
import torch

from decodelab.grammar.backends import ToyLanguageGrammar
from decodelab.engine.engine import Engine
from decodelab.decoding.generate import generate
from decodelab.models.load import load_model
from decodelab.kv.blocks import BlockPool, BlockTable
from decodelab.sampling.sampler import SamplingParams
from decodelab.engine.speculation import SpeculativeConfig
from decodelab.toy.documents import DocumentLanguage
from decodelab.decoding.speculative import distributions
from speculative_checks import NAMED, chi_square_p_value, target_sequence_probs

pytestmark = pytest.mark.usefixtures("one_thread")
# The first token (明, from the prefill) is nearly certain; the n-gram draft then proposes 在 (from 。小明在公园), which
# the target gives p = 0.11: a verify that drew from p instead of the residual would make 在 come out with p(2 - p) =
# 0.21, and the chi-square test below fails it at p ~ 1e-7 (checked by hand). The small draft agrees with the target
# too well (acceptance ~ 0.97) for a wrong residual to show at 800 runs.
REPEATED = "这是小明在北京的一天。小明在公园跑步。小"


@pytest.fixture(scope="module")
def models():
    target, tokenizer = load_model("tiny-zh-doc", device="cpu")
    return {"target": target, "tokenizer": tokenizer, "small": load_model("tiny-zh-doc-small", device="cpu")[0]}


def draft_of(models, name):
    return models["small"] if name == "small" else "ngram"


@pytest.fixture(scope="module")
def greedy_requests(models):
    """Prompts that end in EOS, at max_tokens and at a stop token, in the middle of a speculative round."""
    docs = DocumentLanguage().sample(6, seed=1)
    prompts = [docs[0][:-12], docs[1][:-12], docs[2][:30], docs[3][:45], docs[4][:11], docs[5][:60]]
    params = [SamplingParams(temperature=0, max_tokens=40), SamplingParams(temperature=0, max_tokens=40),
              SamplingParams(temperature=0, max_tokens=7), SamplingParams(temperature=0, max_tokens=13),
              SamplingParams(temperature=0, max_tokens=33), SamplingParams(temperature=0, max_tokens=40)]
    stop = generate(models["target"], models["tokenizer"], prompts[5], params[5])[0].token_ids[9]
    params[5] = SamplingParams(temperature=0, max_tokens=40, stop_token_ids=(stop,))
    expected = [generate(models["target"], models["tokenizer"], p, q)[0] for p, q in zip(prompts, params)]
    assert {c.finish_reason for c in expected} == {"stop", "length"}
    return prompts, params, expected


def check_pool(engine, seen):
    """Running sequences hold exactly the blocks their kept tokens need, which record exactly those tokens; the pool's
    used blocks are those; every block in the prefix cache holds an aligned chunk of the real tokens of a sequence
    seen so far (`seen`: seq_id -> sequence), never a rejected draft."""
    block_size, pool = engine.block_size, engine.pool
    held = set()
    for seq in engine.scheduler.running:
        table = seq.table
        assert table.num_tokens == len(seq.token_ids) - 1
        assert len(table.block_ids) == math.ceil(table.num_tokens / block_size)
        assert table.token_ids(pool) == seq.token_ids[:-1]
        held |= set(table.block_ids)
    assert pool.num_used_blocks == len(held)
    chunks = {tuple(seq.token_ids[i:i + block_size]) for seq in seen.values()
              for i in range(0, len(seq.token_ids) - block_size + 1, block_size)}
    for block in pool.cached_block_ids:
        assert tuple(pool.block_tokens[block]) in chunks


def run_checked(engine, prompts, params):
    """Engine.generate's loop, checking the pool after every step; returns completions in prompt order."""
    ids = [engine.add_request(p, q) for p, q in zip(prompts, params)]
    seen, done = {}, {}
    while engine.has_unfinished():
        done |= {c.request_id: c for c in engine.step().finished}
        seen |= {seq.seq_id: seq for seq in (*engine.scheduler.running, *engine.scheduler.waiting)}
        check_pool(engine, seen)
    assert engine.pool.num_free_blocks == engine.pool.num_blocks and max(engine.pool.ref_counts) == 0
    return [done[i] for i in ids]


@pytest.mark.parametrize("gamma", [1, 4])
@pytest.mark.parametrize("draft_name", ["small", "ngram"])
def test_greedy_equals_engine_without_speculation_and_generate(models, greedy_requests, draft_name, gamma):
    prompts, params, expected = greedy_requests
    plain = Engine(models["target"], models["tokenizer"], block_size=4).generate(prompts, params)
    engine = Engine(models["target"], models["tokenizer"], block_size=4,
                    speculative=SpeculativeConfig(draft_of(models, draft_name), gamma))
    outputs = run_checked(engine, prompts, params)
    for out, ref, base in zip(outputs, expected, plain):
        assert out.token_ids == ref.token_ids == base.token_ids
        assert out.finish_reason == ref.finish_reason == base.finish_reason and out.text == ref.text
    stats = engine.stats.speculative
    assert stats.rounds < sum(len(o.token_ids) for o in outputs) - len(outputs)   # fewer forwards than tokens
    assert stats.tokens_per_target_forward > 1 and 0 < stats.acceptance_rate <= 1


@pytest.mark.parametrize("draft_name", ["small", "ngram"])
def test_greedy_with_preemption_and_shared_prefixes(models, greedy_requests, draft_name):
    prompts, params, expected = greedy_requests
    order = [2, 2, 0, 1, 3, 4, 5, 3]                      # the second 2 hits the first's blocks in the prefix cache
    engine = Engine(models["target"], models["tokenizer"], block_size=4, num_blocks=50, max_num_seqs=6,
                    speculative=SpeculativeConfig(draft_of(models, draft_name), 6))
    outputs = run_checked(engine, [prompts[i] for i in order], [params[i] for i in order])
    assert [o.token_ids for o in outputs] == [expected[i].token_ids for i in order]
    assert engine.stats.preemptions > 0 and engine.stats.prefix_cache_hit_tokens > 0


@pytest.mark.parametrize("rng", ["torch", "counter"])
def test_sampled_requests_keep_the_pool_exact_with_n_and_preemption(models, rng):
    engine = Engine(models["target"], models["tokenizer"], block_size=4, num_blocks=48, max_num_seqs=8,
                    speculative=SpeculativeConfig(models["small"], 5), rng=rng)
    prompts = [doc[:20] for doc in DocumentLanguage().sample(4, seed=2)]
    params = [SamplingParams(seed=i, max_tokens=30, n=2, top_p=0.95) for i in range(4)]
    outputs = run_checked(engine, prompts, params)
    assert all(len(o.samples) == 2 for o in outputs) and engine.stats.preemptions > 0
    stats = engine.stats.speculative
    assert stats.accepted < stats.judged <= stats.drafted                 # some drafts rejected and rolled back


def sampled_counts(models, draft, prompt, params, length, runs, rng="torch"):
    """How often each `length`-token start comes out of `runs` seeded requests of `prompt` in one Engine batch, and
    the engine's speculative stats."""
    engine = Engine(models["target"], models["tokenizer"], max_num_seqs=64,
                    speculative=SpeculativeConfig(draft, 3), rng=rng)
    batch = [SamplingParams(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=seed,
                            max_tokens=length + 4, ignore_eos=True) for seed in range(runs)]
    outputs = engine.generate([prompt] * runs, batch)
    return Counter(tuple(o.token_ids[:length]) for o in outputs), engine.stats.speculative


@pytest.mark.parametrize("rng", ["torch", "counter"])
@pytest.mark.parametrize("draft_name", ["small", "ngram"])
def test_sampled_tokens_follow_the_target(models, draft_name, rng):
    params = SamplingParams()
    expected = target_sequence_probs(models, REPEATED, params, 2)
    counts, stats = sampled_counts(models, draft_of(models, draft_name), REPEATED, params, 2, 800, rng)
    assert stats.judged > 400                                              # drafts were really judged
    assert chi_square_p_value(counts, expected, 800) > 1e-3, counts.most_common(5)


def test_three_sampled_tokens_follow_the_target_under_top_k_top_p(models):
    params = SamplingParams(top_k=3, top_p=0.9)
    expected = target_sequence_probs(models, NAMED, params, 3)
    counts, _ = sampled_counts(models, models["small"], NAMED, params, 3, 800)
    assert chi_square_p_value(counts, expected, 800) > 1e-3, counts.most_common(5)


@pytest.mark.parametrize("draft_name", ["small", "ngram"])
def test_the_context_end_finishes_mid_round(models, draft_name):
    """Prompts 7 and 14 tokens short of the 512-token context: gamma = 6 drafts must shrink to fit, and the output
    ends at the context ("length") exactly where the engine without speculation ends it."""
    ids = models["tokenizer"]("".join(DocumentLanguage().sample(4, seed=3)))["input_ids"][:505]
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    plain = Engine(models["target"], models["tokenizer"], block_size=4).generate([ids, ids[:498]], params)
    engine = Engine(models["target"], models["tokenizer"], block_size=4,
                    speculative=SpeculativeConfig(draft_of(models, draft_name), 6))
    outputs = run_checked(engine, [ids, ids[:498]], [params, params])
    assert [o.token_ids for o in outputs] == [o.token_ids for o in plain]
    assert [(len(o.token_ids), o.finish_reason) for o in outputs] == [(7, "length"), (14, "length")]


def test_logprobs_and_events_match_the_engine_without_speculation(models):
    prompts = [doc[:25] for doc in DocumentLanguage().sample(3, seed=4)]
    params = SamplingParams(temperature=0, max_tokens=12, logprobs=2)
    plain = Engine(models["target"], models["tokenizer"]).generate(prompts, params)
    engine = Engine(models["target"], models["tokenizer"], speculative=SpeculativeConfig(models["small"], 4))
    ids = [engine.add_request(p, params) for p in prompts]
    events, drafted, accepted, done = [], 0, 0, {}
    while engine.has_unfinished():
        out = engine.step()
        done |= {c.request_id: c for c in out.finished}
        events += out.events
        drafted += sum(map(len, out.drafts.values()))
        accepted += sum(out.accepted.values())
    assert (drafted, accepted) == (engine.stats.speculative.drafted, engine.stats.speculative.accepted) != (0, 0)
    for request_id, base in zip(ids, plain):
        out = done[request_id]
        assert [e.token_id for e in events if e.request_id == request_id] == out.token_ids == base.token_ids
        assert [e.finish_reason for e in events if e.request_id == request_id][-1] == base.finish_reason
        for mine, theirs in zip(out.logprobs, base.logprobs):
            assert mine.token_id == theirs.token_id and mine.logprob == pytest.approx(theirs.logprob, abs=1e-4)
            assert [t for t, _ in mine.top] == [t for t, _ in theirs.top]


@pytest.mark.parametrize("draft_name", ["small", "ngram"])
def test_min_tokens_greedy_equals_the_engine_without_speculation(models, draft_name):
    """Whole documents, after which EOS is the target's argmax (p ~ 0.5): min_tokens holds it back across several
    rounds of gamma = 4, and every token equals the engine's without speculation and generate's. A document short of
    its last two characters ends with EOS as its third token, the first that min_tokens = 2 allows: inside a round,
    the rows after the first count the drafts before them as output."""
    docs = DocumentLanguage().sample(3, seed=5)
    eos = models["tokenizer"].eos_token_id
    [ended] = Engine(models["target"], models["tokenizer"]).generate([docs[0]], SamplingParams(temperature=0))
    assert ended.token_ids == [eos]                                       # unconstrained, EOS comes first
    docs.append(docs[0][:-2])
    params = [SamplingParams(temperature=0, max_tokens=40, min_tokens=k) for k in (1, 9, 23, 2)]
    plain = Engine(models["target"], models["tokenizer"]).generate(docs, params)
    engine = Engine(models["target"], models["tokenizer"], block_size=4,
                    speculative=SpeculativeConfig(draft_of(models, draft_name), 4))
    outputs = run_checked(engine, docs, params)
    assert [o.token_ids for o in outputs] == [o.token_ids for o in plain]
    assert [o.token_ids for o in outputs] == [generate(models["target"], models["tokenizer"], d, q)[0].token_ids
                                              for d, q in zip(docs, params)]
    for output, param in zip(outputs, params):
        assert eos not in output.token_ids[:param.min_tokens] and len(output.token_ids) >= param.min_tokens
    assert outputs[3].token_ids[2] == eos and outputs[3].finish_reason == "stop"
    assert engine.stats.speculative.judged > 0


@pytest.mark.parametrize("draft_name", ["small", "ngram"])
def test_bad_words_and_allowed_token_ids_greedy_equal_the_engine_without_speculation(models, draft_name):
    """Bad words of two and three tokens (the ban reads the drafts before each row) and an allowed set that removes
    tokens greedy wants: every token equals the engine's without speculation and generate's, and the masks hold."""
    tokenizer = models["tokenizer"]
    docs = [doc[:30] for doc in DocumentLanguage().sample(3, seed=6)]
    [free] = Engine(models["target"], tokenizer).generate([docs[0]], SamplingParams(temperature=0, max_tokens=40))
    words = ("小明", "的一天", free.text[2:4])                                # the last one greedy writes
    allowed = tuple(sorted(set(tokenizer(free.text, add_special_tokens=False)["input_ids"]) - {free.token_ids[1]}))
    params = [SamplingParams(temperature=0, max_tokens=40, bad_words=words),
              SamplingParams(temperature=0, max_tokens=40, allowed_token_ids=allowed + (tokenizer.eos_token_id,)),
              SamplingParams(temperature=0, max_tokens=40, bad_words=words[:2], min_tokens=12)]
    plain = Engine(models["target"], tokenizer).generate(docs, params)
    engine = Engine(models["target"], tokenizer, block_size=4,
                    speculative=SpeculativeConfig(draft_of(models, draft_name), 4))
    outputs = run_checked(engine, docs, params)
    assert [o.token_ids for o in outputs] == [o.token_ids for o in plain]
    assert [o.token_ids for o in outputs] == [generate(models["target"], tokenizer, d, q)[0].token_ids
                                              for d, q in zip(docs, params)]
    assert not any(w in outputs[0].text for w in words) and free.text[2:4] in free.text
    assert set(outputs[1].token_ids) <= set(allowed) | {tokenizer.eos_token_id}
    assert outputs[1].token_ids != free.token_ids and engine.stats.speculative.judged > 0


@torch.no_grad()
def masked_sequence_probs(models, ids: list[int], params: SamplingParams, length: int) -> dict:
    """Exact probabilities of every continuation of up to `length` tokens under the target with min_tokens' mask
    (EOS masked while the output is shorter than min_tokens), computed by a full forward per prefix; a branch ends at
    EOS. Branches below 1e-4 are left to the pooled cell."""
    eos = models["tokenizer"].eos_token_id
    out, done = {(): 1.0}, {}
    for _ in range(length):
        grown = {}
        for prefix, prob in out.items():
            logits = models["target"](torch.tensor([ids + list(prefix)])).logits[0, -1:]
            p = distributions(logits, params, [list(prefix)], {eos})[0]
            for token in (p * prob > 1e-4).nonzero().flatten().tolist():
                (done if token == eos else grown)[prefix + (token,)] = prob * float(p[token])
        out = grown
    return out | done


@pytest.mark.slow
@pytest.mark.parametrize("draft_name", ["small", "ngram"])
def test_min_tokens_sampled_follows_the_masked_target(models, draft_name):
    """A document without its last two characters: the target finishes the sentence, and its third token is EOS with
    p ~ 0.5. With min_tokens = 3 that EOS is masked at the third row of a gamma = 3 round: 800 seeded samples of the
    first three tokens against the exact masked distribution (chi-square), and never an EOS among them."""
    doc = DocumentLanguage().sample(1, seed=5)[0]
    ids = models["tokenizer"](doc[:-2])["input_ids"]
    eos = models["tokenizer"].eos_token_id
    free = masked_sequence_probs(models, ids, SamplingParams(), 3)
    assert sum(p for seq, p in free.items() if eos in seq) > 0.2           # without the mask EOS is a real outcome
    expected = masked_sequence_probs(models, ids, SamplingParams(min_tokens=3), 3)
    assert not any(eos in seq for seq in expected)
    engine = Engine(models["target"], models["tokenizer"], max_num_seqs=64,
                    speculative=SpeculativeConfig(draft_of(models, draft_name), 3))
    outputs = engine.generate([ids] * 800, [SamplingParams(seed=seed, max_tokens=6, min_tokens=3)
                                            for seed in range(800)])
    assert all(eos not in o.token_ids[:3] for o in outputs) and engine.stats.speculative.judged > 400
    counts = Counter(tuple(o.token_ids[:3]) for o in outputs)
    assert chi_square_p_value(counts, expected, 800) > 1e-3, counts.most_common(5)


def random_draft(vocab_size, context):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=context))


@pytest.mark.parametrize("make, error, message", [
    (lambda m: SpeculativeConfig("ngram", gamma=0), ValueError, "gamma must be an int in [1, 16], got 0"),
    (lambda m: SpeculativeConfig("ngram", gamma=17), ValueError, "gamma must be an int in [1, 16], got 17"),
    (lambda m: SpeculativeConfig("ngram", gamma=2.5), ValueError, "gamma must be an int in [1, 16], got 2.5"),
    (lambda m: SpeculativeConfig("ngram", gamma=True), ValueError, "gamma must be an int in [1, 16], got True"),
    (lambda m: SpeculativeConfig("eagle"), ValueError,
     "draft must be a causal LM, an NgramDraft or 'ngram', got 'eagle'"),
    (lambda m: SpeculativeConfig(object()), TypeError, "draft must be a transformers causal LM, an NgramDraft"),
    (lambda m: Engine(m["target"], speculative="ngram"), TypeError, "speculative must be a SpeculativeConfig or None"),
    (lambda m: Engine(m["target"], speculative=SpeculativeConfig(random_draft(300, 512))), ValueError,
     "draft and target must share a vocabulary: draft has 300 tokens, target 473"),
    (lambda m: Engine(m["target"], speculative=SpeculativeConfig(random_draft(473, 64))), ValueError,
     "the draft's context (64 positions) must be at least the target's (512)"),
    (lambda m: Engine(m["target"], kv_layout="slab", speculative=SpeculativeConfig("ngram")), ValueError,
     "speculative decoding needs kv_layout='paged'"),
])
def test_bad_configs_are_refused(models, make, error, message):
    with pytest.raises(error) as raised:
        make(models)
    assert message in str(raised.value)


@pytest.mark.parametrize("params, message", [
    (SamplingParams(repetition_penalty=1.2), "repetition_penalty for prompt is 1.2; an engine with speculative"),
    (SamplingParams(presence_penalty=0.5), "presence_penalty for prompt is 0.5"),
    (SamplingParams(no_repeat_ngram_size=3), "no_repeat_ngram_size for prompt is 3"),
    ("grammar", "the grammar for prompt cannot run in an engine with speculative decoding"),
])
def test_params_speculation_cannot_verify_are_refused(models, params, message):
    if params == "grammar":
        params = SamplingParams(grammar=ToyLanguageGrammar(models["tokenizer"], prefix="小明"))
    engine = Engine(models["target"], models["tokenizer"], speculative=SpeculativeConfig("ngram"))
    with pytest.raises(ValueError) as raised:
        engine.add_request("小明", params)
    assert message in str(raised.value) and not engine.has_unfinished()


def test_reserve_and_trim_give_back_only_the_draft_blocks():
    pool = BlockPool(num_blocks=8, block_size=4)
    table = BlockTable(block_size=4)
    table.append(pool, [1, 2, 3])
    table.reserve(pool, 6)                                  # slots for tokens 3..8: three blocks in all
    assert len(table.block_ids) == 3 and pool.num_used_blocks == 3 and table.num_tokens == 3
    table.append(pool, [4, 5])                              # two drafts kept: the first block is full and hashed
    assert pool.cached_block_ids == [table.block_ids[0]] and pool.num_used_blocks == 3
    table.trim(pool)
    assert len(table.block_ids) == 2 and pool.num_used_blocks == 2 and table.token_ids(pool) == [1, 2, 3, 4, 5]
