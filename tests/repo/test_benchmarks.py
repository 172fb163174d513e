"""The benchmarks still run and write their JSON (smoke runs with --quick). Their figures are not asserted here:
speed is measured in the benchmarks, never in timed tests; only what does not depend on the machine is checked."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # each runs a benchmark script in a subprocess

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def run_benchmark(name: str, out: Path, *args: str) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(BENCHMARKS / name), "--quick", "--out", str(out), *args],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"wrote {out}" in done.stdout
    return done.stdout


def test_serving_benchmark_smoke(tmp_path):
    out = tmp_path / "serving.json"
    table = run_benchmark("serving.py", out, "--repeats", "1")
    result = json.loads(out.read_text())
    assert result["model"] == "tiny-zh (shipped)" and result["quick"]
    from decodelab.sampling.counter_rng import DEFAULT_RNG

    # the torch and counter rows each name their kind of stream, whatever the default
    assert result["default_rng"] == DEFAULT_RNG and result["engine_overhead"]["rng"] == "torch"
    assert result["engine_overhead_counter"]["rng"] == "counter"
    assert result["engine_overhead_unseeded"]["rng"] == "torch"
    assert "KV utilization, paged engine (block 16)" in table
    # machine-independent facts: utilization is a ratio of token counts, the outputs of the cached run are equal
    assert result["prefix_caching"]["same_outputs"] is True
    chat = result["chat_lengths"]
    assert chat["max_model_len"] == 2048 and chat["mean_output_tokens"] > 200
    assert chat["kv_utilization_reserve_max_len"] < chat["kv_utilization_paged"] <= 1.0
    sizes = result["kv_utilization_by_block_size"]
    assert sizes["4"] > sizes["8"] > sizes["16"], "a smaller block wastes fewer slots in each sequence's last block"
    assert result["n4_sharing"]["peak_blocks_shared"] < result["n4_sharing"]["peak_blocks_separate"]
    assert result["engine_overhead_wider_model"]["hidden"] == 256
    for key, seeded in (("engine_overhead", True), ("engine_overhead_unseeded", False),
                        ("engine_overhead_wider_model", True)):
        overhead = result[key]
        assert overhead["seeded"] is seeded
        assert overhead["wall_over_forward"] > overhead["wall_over_forward_without_noise"] >= 1.0
        assert 0.0 < overhead["shares"]["sample: noise"] < overhead["shares"]["sample"] < 1.0
        assert overhead["overhead_us_per_step"] > 0 and 0.0 < overhead["shares"]["forward"] < 1.0
    # the fixed part of a step: the same requests one at a time (a step per token) beside 32 running at once
    assert "Engine cost per step, seeded, rng='counter'" in table
    for rng in ("torch", "counter"):
        cost = result["engine_cost_per_step"][rng]
        assert cost["batch"] == 32 and cost["one_sequence_us"] > cost["one_sequence_sample_us"] > 0
        assert 1.0 < cost["rows_per_step"] <= 32.0     # rows drawn per step with up to 32 running: counted, not assumed
    alone, full = result["engine_overhead_counter_one_sequence"], result["engine_overhead_counter"]
    assert alone["rows_per_step"] == 1.0 and alone["steps"] > full["steps"]   # one at a time: a step per token
    assert alone["steps"] == round(full["rows_per_step"] * full["steps"])      # the same tokens drawn in both
    assert result["date"] and result["library_commit"]                       # where the figures came from
    if "error" not in result["generate_batch"]:  # transformers' continuous batching, same limits, same workload
        assert result["generate_batch"]["same_tokens"] is True


def test_sampling_benchmark_smoke(tmp_path):
    out = tmp_path / "sampling.json"
    run_benchmark("sampling.py", out, "--repeats", "1")
    result = json.loads(out.read_text())
    assert {(row["B"], row["V"]) for row in result["rows"]} == {(1, 32768), (64, 32768)}
    assert all(row["fast_ms"] > 0 and row["fast_prebuilt_ms"] > 0 and row["transformers_ms"] > 0
               for row in result["rows"])
    assert {check["target"].split(":")[0] for check in result["targets"]} >= {"top-k+top-p"}
    assert result["scaling"]["us_per_row_20000"] > 0 and any("quadratic" in c["target"] for c in result["targets"])


def test_attention_benchmark_smoke(tmp_path):
    out = tmp_path / "attention.json"
    table = run_benchmark("attention.py", out, "--repeats", "3")
    result = json.loads(out.read_text())
    assert [(row["batch"], row["context"]) for row in result["rows"]] == [(4, 256)]
    assert result["rows"][0]["reference_ms"] > 0
    if result["device"] == "cpu":
        assert "timed on CUDA only" in table and "triton_ms" not in result["rows"][0]


@pytest.mark.parametrize("name", ["serving.py", "sampling.py", "attention.py"])
def test_benchmark_refuses_cuda_without_a_gpu(name, tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the refusal is for machines without one")
    done = subprocess.run([sys.executable, str(BENCHMARKS / name), "--device", "cuda", "--out", str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "torch.cuda.is_available() is False" in done.stderr


def test_roofline_benchmark_smoke(tmp_path):
    out = tmp_path / "roofline.json"
    table = run_benchmark("roofline.py", out, "--repeats", "1")
    result = json.loads(out.read_text())
    assert result["quick"] and "share of bandwidth" in table
    assert set(result["memory"]) == {"1", "2"} and set(result["matmul"]) == {"1", "2"}
    assert all(m["read_bytes_per_s"] > 0 and m["copy_bytes_per_s"] > 0 for m in result["memory"].values())
    assert [p["batch"] for p in result["decode"]] == [1, 4] and [p["new_tokens"] for p in result["prefill"]] == [16, 64]
    # machine-independent: FLOPs and bytes are counted, not timed; prefill of 64 tokens does more work per byte
    decode, prefill = result["decode"][0], result["prefill"][-1]
    assert decode["intensity"] < 1 < prefill["intensity"]
    assert len(result["load_average_before"]) == 3


def test_roofline_refuses_cuda_without_a_gpu(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the refusal is for machines without one")
    done = subprocess.run([sys.executable, str(BENCHMARKS / "roofline.py"), "--device", "cuda", "--out",
                           str(tmp_path / "x")], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "torch.cuda.is_available() is False" in done.stderr


def test_gpu_check_steps_keep_to_their_budget():
    """The GPU check runs as one command on a lent machine, at most 600 s. Its steps' limits, each with the 10 s
    `timeout --kill-after` grants before a kill, keep to the 560 s the script states, which leaves 40 s for what runs
    before the first step without a limit (the environment probe: imports and nvidia-smi). Read from the script, so
    a raised limit is caught here."""
    import re
    script = (BENCHMARKS.parent / "scripts" / "gpu_check.sh").read_text()
    limits = [int(limit) for limit in re.findall(r"^step [\w-]+ (\d+) ", script, flags=re.MULTILINE)]
    assert len(limits) >= 7 and sum(limits) + 10 * len(limits) <= 560, limits
    assert "limits add up to 490 s (560 s with each step's 10 s grace" in script and sum(limits) == 490


def test_gpu_check_refuses_without_a_gpu(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the refusal is for machines without one")
    script = BENCHMARKS.parent / "scripts" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    done = subprocess.run(["bash", str(script), str(tmp_path / "out")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 2 and "no CUDA GPU" in done.stderr
    assert not any((tmp_path / "out").iterdir()), "nothing runs without a GPU"


def test_speculative_benchmark_smoke(tmp_path):
    out = tmp_path / "speculative.json"
    table = run_benchmark("speculative.py", out)
    result = json.loads(out.read_text())
    assert result["quick"] and result["threads"] == 1 and "speed-up" in table
    assert {(row["draft"], row["gamma"]) for row in result["rows"]} == {
        (draft, gamma) for draft in ("tiny-zh-doc-small", "n-gram (max n 3)") for gamma in (1, 4)}
    for row in result["rows"]:  # machine-independent: counts of tokens and forwards
        assert 1.0 <= row["tokens_per_target_forward"] <= row["gamma"] + 1
        assert 0.0 <= row["acceptance_rate"] <= 1.0 and row["spec_ms_per_token"] > 0
    model_rows = [row for row in result["rows"] if row["draft"] == "tiny-zh-doc-small"]
    assert model_rows[1]["tokens_per_target_forward"] > model_rows[0]["tokens_per_target_forward"]


def test_speculative_engine_benchmark_smoke(tmp_path):
    out = tmp_path / "speculative-engine.json"
    run_benchmark("speculative.py", out, "--engine", "--repeats", "1")
    result = json.loads(out.read_text())
    assert result["mode"] == "engine" and result["quick"]
    for row in result["rows"]:  # machine-independent: steps and tokens, the same tokens as without speculation
        assert row["tokens"] == row["plain_tokens"] and row["steps"] < row["plain_steps"]
        assert 1.0 <= row["tokens_per_target_forward"] <= row["gamma"] + 1


def test_load_benchmark_smoke(tmp_path):
    """200 concurrent streaming clients against the server on 127.0.0.1: every request completes or is refused."""
    out = tmp_path / "load.json"
    table = run_benchmark("load.py", out)
    result = json.loads(out.read_text())
    runs = result["runs"]
    assert [(r["batching"], r["rate"]) for r in runs] == [("continuous", 16.0), ("continuous", "burst")]
    assert "TTFT p99 ms" in table
    burst = runs[1]
    assert burst["requests"] == 200 and burst["peak_in_flight"] == 200
    for run in runs:
        assert run["lost"] == 0 and run["completed"] + run["refused"] == run["requests"], run
        assert run["seed"] == 0 and run["load_average_1min_before"] >= 0
        assert 0 < run["ttft_p50_s"] <= run["ttft_p99_s"] and run["throughput_tok_s"] > 0


@pytest.mark.parametrize("args, message", [
    (["--base-url", "http://example.com:8000/v1"], "must be on loopback"),
    (["--rates", "fast"], "--rates takes numbers"),
    (["--requests", "0"], "--requests must be >= 1"),
    (["--seeds", "0,x"], "--seeds takes non-negative integers"),
    (["--seeds", "1,1"], "--seeds must be distinct non-negative integers"),
])
def test_load_benchmark_refuses_bad_arguments(args, message):
    done = subprocess.run([sys.executable, str(BENCHMARKS / "load.py"), *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0 and message in done.stderr


def test_cold_draw_benchmark_smoke(tmp_path):
    out = tmp_path / "cold-draw.json"
    table = run_benchmark("cold_draw.py", out)
    result = json.loads(out.read_text())
    assert result["meta"]["quick"] and result["meta"]["trials"] == 5 and "cold / warm" in table
    assert [(r["setting"], r["rows"]) for r in result["results"]] == [
        (setting, rows) for setting in ("torch", "counter", "unseeded") for rows in (1, 4)]
    for r in result["results"]:
        for part in ("draw", "one_call"):
            low, high = r[part]["interval_95"]
            assert r[part]["cold_us"] > 0 and r[part]["warm_us"] > 0 and low <= r[part]["cold_over_warm"] <= high


@pytest.mark.parametrize("args, message", [(["--trials", "1"], "--trials must be at least 2 (the interval needs two "
                                                               "pairs), got 1"),
                                           (["--trials", "0"], "--trials must be at least 2"),
                                           (["--rows", "14", "0"], "--rows must each be at least 1, got [14, 0]"),
                                           (["--rows", "x"], "argument --rows: invalid int value: 'x'")])
def test_cold_draw_refuses_bad_arguments(args, message):
    done = subprocess.run([sys.executable, str(BENCHMARKS / "cold_draw.py"), *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and message in done.stderr


def test_bookkeeping_benchmark_smoke(tmp_path):
    out = tmp_path / "bookkeeping.json"
    table = run_benchmark("bookkeeping.py", out)
    result = json.loads(out.read_text())
    assert result["quick"] and result["block_size"] == 16 and result["prompt_tokens"] == 64
    assert [row["sequences"] for row in result["rows"]] == [8, 32]
    assert all(row["decodelab_us"] > 0 and "ratio" not in row for row in result["rows"]), "no nano-vllm given"
    assert "schedule() + update_from_output() per decode step" in table


def test_bookkeeping_benchmark_refuses_a_folder_that_is_not_nano_vllm(tmp_path):
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bookkeeping.py"), "--quick", "--nano-vllm", str(tmp_path),
                           "--out", str(tmp_path / "x.json")], capture_output=True, text=True, timeout=600)
    assert done.returncode != 0
    assert "--nano-vllm must point at a nano-vllm checkout (with nanovllm/engine/scheduler.py)" in done.stderr


def load_module(name: str = "load"):
    """benchmarks/`name`.py as a module, to test its functions in this process."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_load_summary_over_seeds_gives_median_and_quartiles():
    load = load_module()
    runs = [{"batching": "static", "rate": "burst", "seed": s, "requests": 200, "completed": 199, "refused": 1,
             "lost": 0, **{key: 0.1 * (s + 1) for key in load.SUMMARIZED}} for s in (3, 1, 4, 0, 2)]
    [row] = load.over_seeds(runs)
    assert row["seeds"] == [3, 1, 4, 0, 2] and (row["completed"], row["refused"], row["lost"]) == (995, 5, 0)
    assert row["ttft_p99_s"] == pytest.approx({"median": 0.3, "q1": 0.2, "q3": 0.4})
    with pytest.raises(ValueError, match="runs must be a non-empty list"):
        load.over_seeds([])
    with pytest.raises(ValueError, match=r"runs\[0\] lacks \['seed'\]"):
        load.over_seeds([{k: v for k, v in runs[0].items() if k != "seed"}])


def test_profile_step_smoke(tmp_path):
    """On a CPU the profiler sees host time only: every row has a wall time, no GPU time, and the wider model."""
    out = tmp_path / "profile_step.json"
    run_benchmark("profile_step.py", out, "--steps", "1")
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["gpu"] is None
    assert [row["model"] for row in result["rows"]] == ["tiny-zh", "random Llama 256 x 4"]
    for row in result["rows"]:
        assert row["wall_ms_per_step"] > 0 and row["gpu_kernel_ms_per_step"] == 0 and row["kernels_per_step"] == 0
        assert row["top_host_ops"], "the profiler saw no host operator"


def test_profile_step_refuses_a_bad_step_count(tmp_path):
    done = subprocess.run([sys.executable, str(BENCHMARKS / "profile_step.py"), "--steps", "0",
                           "--out", str(tmp_path / "p.json")], capture_output=True, text=True)
    assert done.returncode == 2 and "--steps must be at least 1, got 0" in done.stderr


def test_draw_rounding_benchmark_smoke(tmp_path):
    out = tmp_path / "draw-rounding.json"
    table = run_benchmark("draw_rounding.py", out)
    result = json.loads(out.read_text())
    meta = result["meta"]
    assert meta["quick"] and (meta["docs"], meta["draws_per_row"]) == (2, 4) and meta["kernels"][0] == "DEFAULT"
    # every pair of the kernel sets this CPU has (the portable ones, AVX2's if it has AVX2, its own), at each temperature
    kernels = meta["kernels"]
    pairs = [[x, y] for i, x in enumerate(kernels) for y in kernels[i + 1:]]
    assert len(kernels) >= 2 and "flips, per million" in table
    assert [(r["temperature"], r["kernels"]) for r in result["results"]] == [(t, p) for t in (1.0, 2.0) for p in pairs]
    methods = ("inverse CDF, as the library draws", "inverse CDF from a float64 softmax", "exponential race")
    for r in result["results"]:
        for name in methods:
            m = r[name]
            assert m["draws"] == meta["positions"] * 4 and 0 <= m["flips"] <= m["draws"]
            assert m["low_per_million"] <= m["per_million"] <= m["high_per_million"]
        assert len(r["inverse_cdf_flips_at"]) == r[methods[0]]["flips"]


def test_draw_rounding_counts_a_flip_where_a_boundary_moves_past_the_draw():
    """The counting itself, on made-up rows: a draw flips when, and only when, the other logits put a different token
    under the same random numbers."""
    module = load_module("draw_rounding")
    z = torch.zeros(1, 4)                                   # four tokens of 0.25: boundaries at 0.25, 0.5, 0.75, 1
    nudged = torch.tensor([[0.01, 0.0, 0.0, 0.0]])          # token 0 a little likelier: the first boundary moves up
    uniforms = torch.tensor([[0.2497, 0.3, 0.8]], dtype=torch.float64)  # targets 1 - u: 0.7503, 0.7, 0.2 of the total
    before = module.inverse_cdf_tokens(z, uniforms, True)
    after = module.inverse_cdf_tokens(nudged, uniforms, True)
    assert before.tolist() == [[3, 2, 0]] and after.tolist() == [[2, 2, 0]]   # only the draw next to a boundary moves
    same = module.race_tokens({"a": z, "b": z.clone()}, 50)
    assert torch.equal(same["a"], same["b"]) and len(set(same["a"].flatten().tolist())) > 1   # the same noise for both
    other = module.race_tokens({"a": z, "b": torch.tensor([[30.0, 0.0, 0.0, 0.0]])}, 50)
    assert (other["b"] == 0).all() and not torch.equal(other["a"], other["b"])              # very different logits


@pytest.mark.parametrize("args, message", [
    (["--docs", "0"], "--docs and --draws must be at least 1, got 0 and 512"),
    (["--temperatures", "1", "0"], "--temperatures must be positive, got [1.0, 0.0]"),
])
def test_draw_rounding_refuses_bad_arguments(args, message):
    done = subprocess.run([sys.executable, str(BENCHMARKS / "draw_rounding.py"), *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and message in done.stderr
