"""benchmarks/noise.py: its two draws take only kept tokens and follow the same distribution, so its timings compare
like with like; its smoke run writes its JSON."""
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import noise  # noqa: E402  (benchmarks/noise.py)

from test_benchmarks import run_benchmark  # noqa: E402


def test_both_draws_pick_kept_tokens_at_their_probabilities():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2]]).expand(20000, -1).contiguous()    # [20000, 5]
    torch.manual_seed(0)
    for draw in (noise.exponential_race, noise.uniform_draw):
        counts = torch.bincount(draw(probs), minlength=5).double() / len(probs)
        assert counts[0] == 0 and counts[2] == 0
        # 3 standard errors of a share of 20,000 draws is at most 0.011
        assert torch.allclose(counts[[1, 3, 4]], torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64), atol=0.011)


@pytest.mark.slow
def test_noise_benchmark_smoke(tmp_path):
    out = tmp_path / "noise.json"
    table = run_benchmark("noise.py", out, "--rows", "1", "4")
    result = json.loads(out.read_text())
    assert "ns/entry" in table and result["meta"]["quick"] is True
    assert [(row["vocab"], row["rows"]) for row in result["rows"]] == [(473, 1), (473, 4), (2000, 1), (2000, 4)]
    assert all(row["exponential_us"] > 0 and row["uniform_us"] > 0 and row["exponential_ns_per_entry"] > 0
               for row in result["rows"])


def test_noise_benchmark_refuses_cuda_without_a_gpu(tmp_path):
    import subprocess

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the refusal is for machines without one")
    done = subprocess.run([sys.executable, str(Path(noise.__file__)), "--device", "cuda", "--out", str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "torch.cuda.is_available() is False" in done.stderr
    assert not (tmp_path / "x").exists()
