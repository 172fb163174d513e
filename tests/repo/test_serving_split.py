"""benchmarks/serving.py's split of the engine's cost into a fixed part per step and a part per row drawn, computed
from fixed numbers here (nothing depends on the machine's speed): the same requests one at a time and up to `batch`
at once, cost per step = fixed + rows x per_row."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import serving  # noqa: E402  (benchmarks/serving.py)


def run(overhead_us: float, rows_per_step: float, steps: int, sample_share: float, seconds: float) -> dict:
    return {"overhead_us_per_step": overhead_us, "rows_per_step": rows_per_step, "steps": steps,
            "shares": {"sample": sample_share}, "seconds": seconds}


def test_the_split_recovers_a_linear_cost():
    """A cost of 100 us per step and 20 us per row: one row per step costs 120 us, 13.7 rows per step 374 us; the
    split gives back 100 and 20, by the rows actually drawn, not by the batch's limit."""
    fixed, per_row, rows = 100.0, 20.0, 13.7
    alone = run(fixed + per_row, 1.0, 1903, 0.5, 1903 * 1e-3)
    full = run(fixed + rows * per_row, rows, 139, 0.1, 139 * 3e-3)
    split = serving.per_step_cost(alone, full, 32)
    assert split["per_row_us"] == pytest.approx(per_row) and split["fixed_us"] == pytest.approx(fixed)
    assert split["one_sequence_us"] == fixed + per_row and split["full_batch_us"] == full["overhead_us_per_step"]
    assert split["rows_per_step"] == rows and split["batch"] == 32
    assert split["one_sequence_sample_us"] == pytest.approx(0.5 * 1e-3 * 1e6)   # the draw's share of a 1 ms step
    dividing_by_the_limit = (full["overhead_us_per_step"] - alone["overhead_us_per_step"]) / 31
    assert split["per_row_us"] > 2 * dividing_by_the_limit   # what the first version of the split got wrong
