"""benchmarks/rng_ab.py: the summary of alternating torch/counter runs is the median paired ratio with its interval,
computed from fixed numbers here, so nothing depends on the machine's speed."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import rng_ab  # noqa: E402  (benchmarks/rng_ab.py)


def run(wall: float, overhead: float, forward: float, sample: float) -> dict:
    return {"wall_over_forward": wall, "overhead_us_per_step": overhead, "forward_us_per_step": forward,
            "shares": {"sample": sample, "sample: noise": sample / 2}}


def test_summary_is_the_median_paired_ratio_counter_over_torch():
    runs = [{"torch": run(1.2, 800, 4000, 0.10), "counter": run(1.1, 400, 4000, 0.05)},
            {"torch": run(1.3, 1000, 3000, 0.12), "counter": run(1.2, 600, 3000, 0.06)},
            {"torch": run(1.2, 900, 3500, 0.11), "counter": run(1.1, 450, 3500, 0.05)}]
    summary = rng_ab.summarize(runs)
    overhead = summary["overhead_us_per_step"]
    assert overhead["torch_median"] == 900 and overhead["counter_median"] == 450
    assert overhead["counter_over_torch"] == pytest.approx(0.5)   # ratios 0.5, 0.6, 0.5: the median pairs, not medians
    low, high = overhead["interval_95"]
    assert low <= 0.5 <= high <= 0.6
    assert summary["forward_us_per_step"]["counter_over_torch"] == 1.0
    assert summary["sample_share"] == {"torch": 0.11, "counter": 0.05}


def test_too_few_pairs_are_refused(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["rng_ab.py", "--pairs", "1"])
    with pytest.raises(SystemExit, match="--pairs must be at least 2, got 1"):
        rng_ab.main()


@pytest.mark.parametrize("batch", ["0", "-3"])
def test_no_running_sequence_is_refused(monkeypatch, batch):
    monkeypatch.setattr(sys, "argv", ["rng_ab.py", "--batch", batch])
    with pytest.raises(SystemExit, match=f"--batch must be at least 1, got {batch}"):
        rng_ab.main()


def test_targets_say_which_stream_meets_each():
    def setting(torch_value, counter_value, measure):
        return {"summary": {measure: {"torch_median": torch_value, "counter_median": counter_value}}}
    results = {"seeded": setting(1.19, 1.09, "wall_over_forward"),
               "unseeded": setting(510.0, 300.0, "overhead_us_per_step")}
    checked = rng_ab.targets(results)
    assert [t["setting"] for t in checked] == ["seeded", "unseeded"]   # the 25M setting did not run: left out
    assert (checked[0]["torch"]["met"], checked[0]["counter"]["met"]) == (False, True)
    assert (checked[1]["torch"]["met"], checked[1]["counter"]["met"]) == (False, True)   # 300 us meets "<= 300"
    assert checked[1]["bound"] == 300.0 and checked[0]["counter"]["median"] == 1.09
