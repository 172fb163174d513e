"""benchmarks/step_batch.py's persistent batch (the alternative the engine measured and did not take) equals the
general builder whatever happens to the tables, so its timings compare like with like; its smoke run writes its JSON."""
import json
import random
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import step_batch  # noqa: E402  (benchmarks/step_batch.py)
from decodelab.engine.scheduler import ScheduledSeq  # noqa: E402

from test_benchmarks import run_benchmark  # noqa: E402


def seq(seq_id, blocks):
    return SimpleNamespace(seq_id=seq_id, table=SimpleNamespace(block_ids=blocks))


def decode_step(seqs, rng):
    return [ScheduledSeq(s, [rng.randrange(300)], 16 * len(s.table.block_ids) - 1, [rng.randrange(1000)]) for s in seqs]


def test_the_persistent_batch_sees_every_change_to_the_tables():
    rng = random.Random(0)
    batch = step_batch.PersistentBatch()
    reference = step_batch.builders()["build"]
    live = {i: seq(i, [10 * i + j for j in range(1 + i % 3)]) for i in range(6)}
    next_id, next_block = 6, 1000
    for _ in range(300):
        event = rng.random()
        if event < 0.15:                                   # a table gains a block
            rng.choice(list(live.values())).table.block_ids.append(next_block)
            next_block += 1
        elif event < 0.25:                                 # copy on write: the last block replaced
            rng.choice(list(live.values())).table.block_ids[-1] = next_block
            next_block += 1
        elif event < 0.32 and any(len(s.table.block_ids) > 1 for s in live.values()):   # draft blocks given back
            rng.choice([s for s in live.values() if len(s.table.block_ids) > 1]).table.block_ids.pop()
        elif event < 0.42 and len(live) > 1:               # one finishes (or is preempted)
            del live[rng.choice(list(live))]
        elif event < 0.55:                                 # one joins
            live[next_id] = seq(next_id, [next_block + j for j in range(rng.randrange(1, 6))])
            next_id, next_block = next_id + 1, next_block + 6
        elif event < 0.62:                                 # prefilled again: same length and last block, new middle
            s = rng.choice(list(live.values()))
            s.table.block_ids[:-1] = [next_block + j for j in range(len(s.table.block_ids) - 1)]
            next_block += len(s.table.block_ids)
            batch.forget([s.seq_id])
        order = list(live.values())
        if rng.random() < 0.2:
            rng.shuffle(order)
        scheduled = decode_step(order, rng)
        step_batch.check_equal(batch.build(scheduled), reference(scheduled), "persistent")
    assert 0 < batch.rows_written < 300 * 4        # most rows were kept, not rewritten


@pytest.mark.slow
def test_step_batch_benchmark_smoke(tmp_path):
    out = tmp_path / "step-batch.json"
    table = run_benchmark("step_batch.py", out, "--rows", "8", "--repeats", "1", "--rounds", "1")
    result = json.loads(out.read_text())
    assert "In the engine" in table and result["meta"]["quick"] is True
    assert [row["rows"] for row in result["rows"]] == [8]
    short = result["engine"]["short"]
    assert set(short) == {"build", "decode", "persistent", "buffers", "runs"} and "chat" not in result["engine"]
    assert all(short[v]["host_us_per_step"] > 0 and short[v]["wall_over_forward"] > 1 for v in step_batch.VARIANTS)
