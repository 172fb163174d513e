"""benchmarks/seeded_noise.py: its two ways give the same numbers (so its timings compare like with like), and its
smoke run and refusals."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import seeded_noise  # noqa: E402  (benchmarks/seeded_noise.py)

from test_benchmarks import run_benchmark  # noqa: E402


def test_the_two_ways_give_the_same_numbers_and_count_no_difference():
    row = seeded_noise.measure(vocab=300, rows=5, repeats=1, calls=2)
    assert row["entries_differing"] == 0 and row["entries_compared"] == 2 * 5 * 300
    assert row["exponential_us"] > 0 and row["batched_us"] > 0
    # the former way itself: each row from its own generator
    gens = [torch.Generator().manual_seed(j) for j in range(3)]
    noise = seeded_noise.row_by_row(gens, 10)
    assert torch.equal(noise[1], torch.empty(10).exponential_(generator=torch.Generator().manual_seed(1)))


@pytest.mark.slow
def test_seeded_noise_benchmark_smoke(tmp_path):
    out = tmp_path / "seeded-noise.json"
    table = run_benchmark("seeded_noise.py", out, "--rows", "1", "4")
    result = json.loads(out.read_text())
    assert "differing" in table and result["meta"]["quick"] is True
    assert [(r["vocab"], r["rows"]) for r in result["rows"]] == [(473, 1), (473, 4), (2000, 1), (2000, 4)]
    assert all(r["entries_differing"] == 0 and r["entries_compared"] > 0 for r in result["rows"])
    assert isinstance(result["meta"]["rule_took_the_slower_way"], list)
    bits = result["meta"]["log1p_last_bit"]           # each log1p within 1 ulp of the exact value: 2 apart at most
    assert bits["entries"] == 100_000 and 0.0 <= bits["share_differing"] < 0.5 and bits["max_ulps"] <= 2
    assert all(1 <= r["calls_per_pass"] <= 5 for r in result["rows"])


@pytest.mark.parametrize("args, message", [(["--rows", "0"], "--rows"), (["--vocab", "1"], "--vocab"),
                                           (["--repeats", "0"], "--repeats")])
def test_seeded_noise_benchmark_refuses_bad_sizes(tmp_path, args, message):
    done = subprocess.run([sys.executable, str(Path(seeded_noise.__file__)), *args, "--out", str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and message in done.stderr
    assert not (tmp_path / "x").exists()
