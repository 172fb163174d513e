"""Widgets of chapters 05-07: the computations behind them, their inputs, and stable reprs."""
import json

import matplotlib
import pytest

from decodelab.engine.engine import Engine
from decodelab.sampling.sampler import SamplingParams
from decodelab.book.widgets.paged_stepper import Arrival, PagedStepper, draw_block_tables, record_frames

matplotlib.use("Agg")


# ---- PagedAttention stepper -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def frames(random_llama):
    greedy = SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True)
    arrivals = [Arrival(0, tuple(range(10, 19)), greedy),           # 9 tokens: 3 blocks of 4 (last one partly)
                Arrival(0, tuple(range(40, 46)), greedy),
                Arrival(2, tuple(range(10, 17)) + (99,), greedy),   # shares the first full block with request 0
                Arrival(4, (7, 8, 9), SamplingParams(temperature=1.0, seed=0, n=2, max_tokens=6, ignore_eos=True))]
    engine = Engine(random_llama, block_size=4, num_blocks=10, max_num_seqs=4)
    return record_frames(engine, arrivals, token_text=str), engine


def test_frames_match_the_pool_bookkeeping(frames):
    recorded, engine = frames
    assert recorded[0]["kind"] == "start" and recorded[0]["free"] == list(range(10))
    for frame in recorded:
        holders = [0] * 10
        for seq in frame["sequences"]:
            assert len(seq["blocks"]) == -(-seq["num_tokens"] // 4)   # ceil(tokens / block_size) blocks
            for block_id in seq["blocks"]:
                holders[block_id] += 1
        assert holders == frame["ref_counts"]
        assert sorted(frame["free"]) == [b for b in range(10) if frame["ref_counts"][b] == 0]
        assert frame["allocated_slots"] == 4 * (10 - len(frame["free"]))
        assert frame["live_tokens"] <= frame["allocated_slots"]
    assert recorded[-1]["sequences"] == [] and not engine.has_unfinished()
    json.dumps(recorded)  # stored in the widget state


def test_frames_show_sharing_copy_on_write_and_preemption(frames):
    recorded, _ = frames
    events = [e for frame in recorded for e in frame["events"]]
    assert any("prefix cache" in e for e in events)
    assert any("共享 prompt" in e for e in events)                       # the n = 2 fork
    assert any("copy-on-write" in e for e in events)
    assert any("抢占" in e for e in events)                              # 10 blocks are too few for all
    assert max(max(frame["ref_counts"]) for frame in recorded) >= 2
    assert sum(e.count("完成") for e in events) == 4
    finished = [request_id for frame in recorded[1:] for request_id, _ in frame["finished"]]
    assert sorted(finished) == [0, 1, 2, 3]                              # each request reported once


def test_record_frames_rejects_bad_input(random_llama):
    engine = Engine(random_llama, block_size=4, num_blocks=8)
    with pytest.raises(ValueError, match="arrivals"):
        record_frames(engine, [])
    with pytest.raises(ValueError, match="max_steps"):
        record_frames(engine, [Arrival(0, (5, 6), SamplingParams(max_tokens=2))], max_steps=0)
    with pytest.raises(RuntimeError, match="max_steps=2"):
        record_frames(engine, [Arrival(0, (5, 6), SamplingParams(max_tokens=8, ignore_eos=True))], max_steps=2)
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        Arrival(-1, (5,), SamplingParams())
    with pytest.raises(TypeError, match="SamplingParams"):
        Arrival(0, (5,), {"temperature": 0})


def test_stepper_widget_state_and_repr(frames):
    recorded, _ = frames
    widget = PagedStepper(recorded, block_size=4, index=2, title="t")
    assert repr(widget) == f"PagedStepper(frames={len(recorded)}, index=2, block_size=4, lecture=False)"
    assert widget.frame() == recorded[2]
    assert "Next" not in widget._esm and "下一步" in widget._esm and "export default" in widget._esm
    assert PagedStepper(recorded, block_size=4, lecture=True).lecture is True
    with pytest.raises(ValueError, match="index must be an int in"):
        PagedStepper(recorded, block_size=4, index=len(recorded))
    with pytest.raises(ValueError, match="frames must hold at least one frame"):
        PagedStepper([], block_size=4)
    with pytest.raises(ValueError, match="block_size"):
        PagedStepper(recorded, block_size=0)
    with pytest.raises(ValueError, match="record_frames"):
        PagedStepper([{"step": 0}], block_size=4)


def test_draw_block_tables_draws_every_block(frames):
    recorded, _ = frames
    frame = max(recorded, key=lambda f: len(f["sequences"]))
    ax = draw_block_tables(frame, block_size=4)
    labels = [t.get_text() for t in ax.texts]
    assert all(any(label.startswith(f"#{b}") for label in labels) for b in range(10))
    assert sum(label.startswith("序列") for label in labels) == len(frame["sequences"])
    ax.figure.canvas.draw()  # the CJK glyphs must exist (pytest turns a missing glyph into an error)
    with pytest.raises(ValueError, match="record_frames"):
        draw_block_tables({"step": 0}, block_size=4)


# ---- prefill/decode cost explorer -----------------------------------------------------------------------------

from transformers import LlamaConfig  # noqa: E402

from decodelab.kv.contiguous_cache import kv_bytes_per_token  # noqa: E402
from decodelab.book.widgets.cost import GPUS, CostExplorer, GpuSpec, ModelSpec, cost_state, model_spec  # noqa: E402

LLAMA3_8B = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                        num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False)
H100 = next(g for g in GPUS if g.name.startswith("H100"))


@pytest.fixture(scope="module")
def llama_spec():
    return model_spec("Llama-3-8B", LLAMA3_8B)


def test_model_spec_counts_the_published_sizes(llama_spec):
    import torch

    assert llama_spec.num_params == 8_030_261_248  # Meta's model card: 8.03B
    assert (llama_spec.num_layers, llama_spec.num_heads, llama_spec.num_kv_heads, llama_spec.head_dim) == (32, 32, 8, 128)
    assert llama_spec.kv_bytes_per_token(2) == kv_bytes_per_token(LLAMA3_8B, torch.bfloat16) == 128 * 1024


def test_cost_state_memory_and_roofline(llama_spec):
    one = cost_state(llama_spec, H100, 1, 8192)
    assert one.weight_bytes == 2 * llama_spec.num_params and one.kv_bytes == 8192 * 128 * 1024
    assert one.max_batch == int((80e9 - one.weight_bytes) // (8192 * 128 * 1024)) == 59
    assert cost_state(llama_spec, H100, 59, 8192).fits and not cost_state(llama_spec, H100, 64, 8192).fits
    assert one.intensity < 2 and one.ridge == pytest.approx(989 / 3.35)
    assert one.step_ms == one.memory_ms > 100 * one.compute_ms           # decode is memory-bound
    big = cost_state(llama_spec, H100, 512, 512)
    assert big.intensity > 4 * one.intensity and big.tokens_per_s > 100 * one.tokens_per_s
    tiny_gpu = GpuSpec("tiny", 8.0, 1.0, 100.0)
    assert cost_state(llama_spec, tiny_gpu, 1, 512).max_batch == 0        # weights alone do not fit
    assert one.prefill_ms == pytest.approx(1e3 * (2 * llama_spec.num_params * 8192 + 2 * 32 * 32 * 128 * 8192**2) / 989e12)


def test_cost_state_rejects_bad_input(llama_spec):
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        cost_state(llama_spec, H100, 0, 8)
    with pytest.raises(ValueError, match="context_len"):
        cost_state(llama_spec, H100, 1, 2.5)
    with pytest.raises(TypeError, match="ModelSpec"):
        cost_state("llama", H100, 1, 8)
    with pytest.raises(ValueError, match="name"):
        model_spec("", LLAMA3_8B)


def test_cost_explorer_state_and_repr(llama_spec):
    widget = CostExplorer([llama_spec], batch_size=8, context_len=8192)
    assert repr(widget) == ("CostExplorer(models=['Llama-3-8B'], gpu='H100 SXM (80 GB)', batch_size=8, "
                            "context_len=8192, lecture=False)")
    assert widget.state() == cost_state(llama_spec, H100, 8, 8192)
    assert "export function costState" in widget._esm and "export default" in widget._esm
    with pytest.raises(ValueError, match="batch_size must be one of"):
        CostExplorer([llama_spec], batch_size=3)
    with pytest.raises(ValueError, match="gpu must be one of"):
        CostExplorer([llama_spec], gpu="TPU")
    with pytest.raises(ValueError, match="models must be a non-empty list of ModelSpec"):
        CostExplorer([])
    assert isinstance(ModelSpec(**widget.models[0]), ModelSpec)


# ---- exposure-bias drift explorer -----------------------------------------------------------------------------

from dataclasses import asdict  # noqa: E402

from decodelab.toy.sentences import ToyLanguage  # noqa: E402
from decodelab.book.widgets.drift import (DriftExplorer, forbidden_char, inject_and_continue, position_errors,  # noqa: E402
                                     sample_with_verifier)

LANG = ToyLanguage()


def test_position_errors_on_true_sentences(tiny):
    model, tokenizer = tiny
    texts = LANG.sample(12, seed=1)
    errors = position_errors(model, tokenizer, LANG, texts, max_position=8)
    assert errors.counts[0] == 12 and errors.viable[:9] == [1.0] * 9       # true prefixes are always viable
    assert all(0.0 <= m < 0.05 for m in errors.invalid_mass[:9])           # the shipped model is close to the truth
    assert all(k >= 0.0 for k in errors.kl[:9])
    hot = position_errors(model, tokenizer, LANG, texts, max_position=8, temperature=3.0)
    assert sum(hot.invalid_mass[:9]) > 3 * sum(errors.invalid_mass[:9])    # a flatter distribution leaks more mass
    broken = position_errors(model, tokenizer, LANG, ["小明喜雾"], max_position=5)
    assert broken.viable[3] == 1.0 and broken.viable[4] == 0.0
    with pytest.raises(ValueError, match="texts must be a non-empty list"):
        position_errors(model, tokenizer, LANG, "小明")
    with pytest.raises(ValueError, match="temperature must be a number > 0"):
        position_errors(model, tokenizer, LANG, texts, temperature=0)


def test_inject_and_continue_judges_against_the_meant_sentence():
    text = "小明喜欢吃米饭。"
    wrong = forbidden_char(LANG, "小明喜", __import__("random").Random(0))
    assert not LANG.prefix_is_viable("小明喜" + wrong)
    recovered = inject_and_continue(LANG, [text], [3], lambda prefixes: ["吃米饭。"] * len(prefixes))
    drifted = inject_and_continue(LANG, [text], [3], lambda prefixes: ["很好吃。"] * len(prefixes))
    assert recovered[0].recovered and not drifted[0].recovered
    assert recovered[0].position == 3 and recovered[0].text == text and not recovered[0].valid_anyway
    with pytest.raises(ValueError, match="no text is longer"):
        inject_and_continue(LANG, ["祝你生日快乐！"], [30], lambda p: p)


def test_verifier_sampling_is_valid_and_seeded(tiny):
    model, tokenizer = tiny
    checked = [sample_with_verifier(model, tokenizer, LANG, 4, 1.5, seed=s) for s in range(6)]
    assert all(s.valid for s in checked)
    assert all(s.model_calls >= len(s.text) + 1 for s in checked)
    again = sample_with_verifier(model, tokenizer, LANG, 4, 1.5, seed=2)
    assert again == checked[2]
    plain = sample_with_verifier(model, tokenizer, LANG, None, 1.5, seed=0)
    assert plain.resamples == 0
    with pytest.raises(ValueError, match="horizon must be None or an int >= 1"):
        sample_with_verifier(model, tokenizer, LANG, 0, 1.0, seed=0)
    with pytest.raises(ValueError, match="temperature"):
        sample_with_verifier(model, tokenizer, LANG, 1, -1.0, seed=0)


def test_drift_explorer_state_and_repr():
    errors = asdict(__import__("decodelab.book.widgets.drift", fromlist=["PositionErrors"]).PositionErrors(
        viable=[1.0, 0.5, float("nan")], invalid_mass=[0.1, 0.2, float("nan")], kl=[0.0, 0.1, float("nan")],
        counts=[2, 2, 0]))
    runs = [{"temperature": t, "teacher_forcing": errors, "free_running": errors, "valid": 0.5, "nll": 0.8}
            for t in (1.0, 1.5)]
    widget = DriftExplorer(runs, run_index=1)
    assert repr(widget) == "DriftExplorer(temperatures=[1.0, 1.5], run_index=1, lecture=False)"
    assert widget.runs[0]["viable"] == [1.0, 0.5, None]                      # NaN is not JSON
    json.dumps(widget.runs)
    assert "export default" in widget._esm
    with pytest.raises(ValueError, match="run_index"):
        DriftExplorer(runs, run_index=2)
    with pytest.raises(ValueError, match="runs must hold at least one"):
        DriftExplorer([])
    with pytest.raises(ValueError, match="each run needs"):
        DriftExplorer([{"temperature": 1.0}])
