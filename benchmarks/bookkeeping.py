"""Bookkeeping benchmark: the scheduler and the block pool alone, per decode step, no model and no sampler.

Workload (issue 31's): N sequences with 64-token prompts (distinct random tokens, fixed seed), each decoding 128
tokens, blocks of 16, a pool large enough that nothing is preempted. A step is `Scheduler.schedule()` followed by
`Scheduler.update_from_output(plan, drawn)` with the drawn tokens made up in advance; the finish rule is the one
nano-vllm's `postprocess` applies (EOS, or max_tokens reached), so both sides do the same work. Reported: the median
over `--repeats` runs of the mean time per decode step, in microseconds, at N = 8, 32 and 128.

With `--nano-vllm PATH` (a checkout of https://github.com/GeeeekExplorer/nano-vllm; it needs `xxhash` installed),
nano-vllm's own `Scheduler` + `BlockManager` run the same workload in the same process, in alternation with ours,
and the table shows the ratio. Only their `engine/sequence.py`, `engine/block_manager.py`, `engine/scheduler.py` and
`sampling_params.py` are loaded (their `config.py` and the model code need transformers and flash-attn), with a
stand-in for the three fields of `Config` the scheduler reads. Nothing of theirs is copied into this repository.

    python benchmarks/bookkeeping.py [--quick] [--nano-vllm PATH] [--clock wall|cpu] [--out PATH]

`--clock cpu` reads this thread's CPU time instead of the wall clock: on a shared machine the time another job
holds the core is then not counted (what that job does to the caches still is).

Writes benchmarks/results/bookkeeping.json (bookkeeping-quick.json with --quick). CPU figures, one thread.
Taught in: chapters/07-paged-attention.ipynb
"""
from __future__ import annotations

import argparse
import datetime
import gc
import importlib.util
import json
import platform
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

from decodelab.book.tables import Table
from decodelab.decoding.request import quiet_finish
from decodelab.engine.scheduler import Drawn, Scheduler
from decodelab.kv.blocks import BlockTable
from decodelab.kv.layout import PagedLayout
from decodelab.sampling import SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import library_commit  # noqa: E402  (benchmarks/serving.py: the library commit a run used)

RESULTS = Path(__file__).parent / "results" / "bookkeeping.json"
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
EOS = 2
VOCAB = 473


def workload(num_seqs: int, prompt_len: int, seed: int = 0) -> list[list[int]]:
    """`num_seqs` prompts of random token ids in [3, VOCAB) (no EOS, no shared prefix), fixed seed."""
    rng = np.random.default_rng(seed)
    return rng.integers(3, VOCAB, size=(num_seqs, prompt_len)).tolist()


def num_blocks_for(num_seqs: int, prompt_len: int, decode_steps: int, block_size: int) -> int:
    return num_seqs * (-(-(prompt_len + decode_steps + 1) // block_size) + 1)


def time_decodelab(prompts: list[list[int]], decode_steps: int, block_size: int, clock=time.perf_counter) -> float:
    """Mean seconds per decode step of our Scheduler over a PagedLayout (prefill step excluded), read on `clock`."""
    num_seqs = len(prompts)
    layout = PagedLayout(num_blocks_for(num_seqs, len(prompts[0]), decode_steps, block_size), block_size,
                         max_model_len=4096)
    params = SamplingParams(temperature=0.0, max_tokens=decode_steps, ignore_eos=False)

    def finish(seq, token: int) -> str | None:          # nano-vllm's rule: EOS, or max_tokens reached
        if token == EOS:
            return "stop"
        return "length" if len(seq.token_ids) - seq.num_prompt_tokens >= seq.params.max_tokens else None

    scheduler = Scheduler(layout, max_num_seqs=num_seqs, max_num_batched_tokens=1 << 20, finish_rule=finish)
    for i, prompt in enumerate(prompts):
        # the engine's hint that only EOS or the length can end it (`quiet_finish`), so the rule runs only then
        scheduler.add(scheduler.new_sequence(i, prompt, params, BlockTable(block_size), None,
                                             quiet=quiet_finish(params, len(prompt), {EOS}, None)))
    tokens = [[[3 + (i * 7 + step) % (VOCAB - 3)] for i in range(num_seqs)] for step in range(decode_steps)]
    none = [[None] for _ in range(num_seqs)]
    plan = scheduler.schedule()                         # the prefill step, not timed
    scheduler.update_from_output(plan, Drawn([[5] for _ in plan.samples], [[None] for _ in plan.samples]))
    steps = 0
    begin = clock()
    while scheduler.has_unfinished():
        plan = scheduler.schedule()
        scheduler.update_from_output(plan, Drawn(tokens[steps][:len(plan.samples)], none[:len(plan.samples)]))
        steps += 1
    seconds = clock() - begin
    assert steps == decode_steps - 1 and not scheduler.requests, (steps, len(scheduler.requests))
    return seconds / steps


def load_nano_vllm(root: Path) -> types.SimpleNamespace:
    """nano-vllm's Scheduler, Sequence and SamplingParams from a checkout at `root`, without its model code."""
    package = root / "nanovllm"
    if not (package / "engine" / "scheduler.py").is_file():
        raise SystemExit(f"--nano-vllm must point at a nano-vllm checkout (with nanovllm/engine/scheduler.py), "
                         f"got {root}")
    try:
        import xxhash  # noqa: F401  (their block manager hashes with it)
    except ImportError:
        raise SystemExit("nano-vllm's BlockManager needs xxhash: pip install xxhash") from None
    for name, path in [("nanovllm", package), ("nanovllm.engine", package / "engine")]:
        module = types.ModuleType(name)
        module.__path__ = [str(path)]
        sys.modules[name] = module
    config = types.ModuleType("nanovllm.config")

    class Config:  # the fields their Scheduler reads
        def __init__(self, **fields):
            self.__dict__.update(fields)
    config.Config = Config
    sys.modules["nanovllm.config"] = config
    loaded = {}
    for name, rel in [("nanovllm.sampling_params", "sampling_params.py"), ("nanovllm.engine.sequence", "engine/sequence.py"),
                      ("nanovllm.engine.block_manager", "engine/block_manager.py"),
                      ("nanovllm.engine.scheduler", "engine/scheduler.py")]:
        spec = importlib.util.spec_from_file_location(name, package / rel)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        loaded[name.rsplit(".", 1)[-1]] = module
    return types.SimpleNamespace(Config=Config, Scheduler=loaded["scheduler"].Scheduler,
                                 Sequence=loaded["sequence"].Sequence, SamplingParams=loaded["sampling_params"].SamplingParams)


def time_nano_vllm(nano: types.SimpleNamespace, prompts: list[list[int]], decode_steps: int, block_size: int,
                   clock=time.perf_counter) -> float:
    """Mean seconds per decode step of nano-vllm's Scheduler + BlockManager on the same workload, read on `clock`."""
    num_seqs = len(prompts)
    nano.Sequence.block_size = block_size
    config = nano.Config(max_num_seqs=num_seqs, max_num_batched_tokens=1 << 20, eos=EOS, kvcache_block_size=block_size,
                         num_kvcache_blocks=num_blocks_for(num_seqs, len(prompts[0]), decode_steps, block_size))
    scheduler = nano.Scheduler(config)
    params = nano.SamplingParams(temperature=1.0, max_tokens=decode_steps)   # their params refuse temperature 0
    for prompt in prompts:
        scheduler.add(nano.Sequence(prompt, params))
    tokens = [[3 + (i * 7 + step) % (VOCAB - 3) for i in range(num_seqs)] for step in range(decode_steps)]
    seqs, is_prefill = scheduler.schedule()
    scheduler.postprocess(seqs, [5] * len(seqs), is_prefill)
    steps = 0
    begin = clock()
    while not scheduler.is_finished():
        seqs, is_prefill = scheduler.schedule()
        scheduler.postprocess(seqs, tokens[steps][:len(seqs)], is_prefill)
        steps += 1
    seconds = clock() - begin
    assert steps == decode_steps - 1, steps
    return seconds / steps


def median_of(repeats: int, fn) -> float:
    """Median of `repeats` calls, each after a garbage collection (so one run's garbage is not the next's cost)."""
    values = []
    for _ in range(repeats):
        gc.collect()
        values.append(fn())
    return statistics.median(values)


def source_commit(path: Path) -> str | None:
    """The commit of the nano-vllm checkout at `path`; None when it is not a git checkout."""
    try:
        found = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True)
    except OSError:                                   # no git: the run's figures are kept all the same
        return None
    return found.stdout.strip() if found.returncode == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 8 and 32, 32 decode steps, 2 repeats")
    parser.add_argument("--nano-vllm", type=Path, default=None, help="a nano-vllm checkout to compare with")
    parser.add_argument("--repeats", type=int, default=5, help="runs per row; the median is reported (default 5)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall: time.perf_counter (default); cpu: time.thread_time, this thread's CPU time, so "
                             "the time other jobs hold a shared core is not counted")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    torch.set_num_threads(1)
    sizes, prompt_len, decode_steps, block_size = ([8, 32], 64, 32, 16) if args.quick else ([8, 32, 128], 64, 128, 16)
    repeats = min(args.repeats, 2) if args.quick else args.repeats
    nano = load_nano_vllm(args.nano_vllm.resolve()) if args.nano_vllm else None
    clock = CLOCKS[args.clock]
    rows = []
    for num_seqs in sizes:
        prompts = workload(num_seqs, prompt_len)
        ours, theirs = [], []
        for _ in range(repeats):                        # alternate, so a change in load hits both
            gc.collect()
            ours.append(time_decodelab(prompts, decode_steps, block_size, clock))
            if nano is not None:
                gc.collect()
                theirs.append(time_nano_vllm(nano, prompts, decode_steps, block_size, clock))
        row = {"sequences": num_seqs, "decodelab_us": statistics.median(ours) * 1e6}
        if nano is not None:
            row["nano_vllm_us"] = statistics.median(theirs) * 1e6
            row["ratio"] = statistics.median(a / b for a, b in zip(ours, theirs))   # median paired ratio
        rows.append(row)
    headers = ["sequences", "decodelab µs/step"] + (["nano-vllm µs/step", "ratio (paired median)"] if nano else [])
    table = Table(headers, [[r["sequences"], f"{r['decodelab_us']:.0f}"]
                            + ([f"{r['nano_vllm_us']:.0f}", f"{r['ratio']:.2f}×"] if nano else []) for r in rows],
                  caption=f"schedule() + update_from_output() per decode step: {prompt_len}-token prompts, "
                          f"{decode_steps} tokens each, blocks of {block_size}, median of {repeats} (CPU, one thread, "
                          f"{args.clock} clock)")
    print(table)
    result = {"date": started, "library_commit": library_commit(),
              "nano_vllm_commit": source_commit(args.nano_vllm) if nano else None,
              "command": "python benchmarks/bookkeeping.py" + (" --quick" if args.quick else "")
              + (" --nano-vllm PATH" if nano else "") + (" --clock cpu" if args.clock == "cpu" else ""), "quick": args.quick, "repeats": repeats,
              "prompt_tokens": prompt_len, "decode_steps": decode_steps, "block_size": block_size,
              "machine": platform.processor() or platform.machine(), "python": platform.python_version(),
              "threads": 1, "clock": args.clock, "rows": rows,
              "note": "CPU figures: bookkeeping only (no model, no sampler); ratio = median over repeats of "
                      "ours / nano-vllm's, run alternately in one process"}
    out = args.out or (RESULTS.with_name("bookkeeping-quick.json") if args.quick else RESULTS)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
