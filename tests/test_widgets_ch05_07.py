"""Widgets of chapters 05-07: the computations behind them, their inputs, and stable reprs."""
import json

import matplotlib
import pytest

from decodelab.engine import Engine
from decodelab.sampling import SamplingParams
from decodelab.widgets.paged_stepper import Arrival, PagedStepper, draw_block_tables, record_frames

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
