"""What a decode step's batch costs to build on the host, four ways, from the step's `ScheduledSeq`s as
`PagedLlama.execute` gets them:
  build       `StepBatch.build`, the general builder (any number of new tokens per sequence), what decode steps
              used first;
  decode      `StepBatch.decode`, one token per sequence, tables padded anew every step into a new array and tensor
              (what `PagedLlama.decode_batch` used before `DecodeBuffers`);
  persistent  the padded block tables kept in a host array from step to step, only the rows whose table changed
              rewritten (vLLM v1's `InputBatch` idea; `PersistentBatch` below, not in the library);
  buffers     `DecodeBuffers`: `decode`'s flat list written in place into the runner's buffer, the tensors and the
              StepBatch over it made once per shape, so a step makes no tensor (what `PagedLlama.decode_batch` uses
              now).

Part 1 builds batches alone, in the steady state that favours the persistent batch: the same B sequences decode step
after step at lengths of 16 to 200 tokens, a table growing a block every 16 steps, nothing finishing or joining.
Median of `--repeats` passes of 2,000 builds. Part 2 runs each inside the engine (`benchmarks/serving.py`'s run: 64
short requests, 32 running, temperature 1, seeded; and chat-length requests, 161 prompt and 338 output tokens on
average, under a 2,048-token context), where sequences finish and join, and reports the engine's host time around the
forward in `PagedLlama.execute` (building the batch, the block copies) per step and the whole run's wall time over
its forward, median over `--rounds` rounds, the three variants in rotating order within a round. Every variant's
batches are checked equal to `build`'s before timing. One torch thread.

    python benchmarks/step_batch.py [--rows 8 32 128] [--repeats 7] [--rounds 5] [--quick] [--out PATH]

`--quick` (a smoke run): 200 builds per pass, 16 short requests in the engine, no chat-length workload.

Writes benchmarks/results/step-batch.json. Quoted in the README's "Engine overhead" section.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import serving  # noqa: E402
from decodelab.engine import Engine  # noqa: E402
from decodelab.engine.scheduler import ScheduledSeq  # noqa: E402
from decodelab.runner.step_batch import DecodeBuffers, StepBatch  # noqa: E402
from decodelab.sampling import SamplingParams  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "step-batch.json"
BLOCK_SIZE = 16
VARIANTS = ("build", "decode", "persistent", "buffers")


class PersistentBatch:
    """The alternative measured (vLLM v1's persistent `InputBatch` idea, for the part of a decode batch that is
    large): the padded block tables of the last decode step's sequences kept in a host array, by row, with each row's
    table length and last block. Between two decode steps a running sequence's table changes only at its end (a new
    block, a copy-on-write of its last block, draft blocks given back), so a row is rewritten when its length or last
    block differs and kept otherwise; when sequences finish or join, the rows of those that stay are gathered into
    their new places. A sequence prefilled again (after a preemption) is `forget`-ten at that prefill.
    `build(scheduled)` equals `StepBatch.build` of the same sequences (checked below before any timing)."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self._ids: list[int] = []              # seq_id of each row
        self._rows: dict[int, int] = {}        # seq_id -> row
        self._tables = np.zeros((0, 0), dtype=np.int64)
        self._lengths: list[int] = []          # blocks the row holds
        self._lasts: list[int] = []            # its last block id (-1 for none)
        self.rows_written = 0                  # rows rewritten over all builds (the rest were kept)

    def __len__(self) -> int:
        return len(self._ids)

    def forget(self, seq_ids: Iterable[int]) -> None:
        """Mark the rows of `seq_ids` (those held) to be rewritten at the next build: their tables were rebuilt."""
        for seq_id in seq_ids:
            row = self._rows.get(seq_id)
            if row is not None:
                self._lengths[row], self._lasts[row] = 0, -1

    def build(self, scheduled: Sequence) -> StepBatch:
        """The `StepBatch` of a decode step of `scheduled` (`decodelab.engine.scheduler.ScheduledSeq`s, one new token
        and one slot each), equal to `StepBatch.build` of the same sequences."""
        token_ids = [t for sched in scheduled for t in sched.token_ids]
        slots = [slot for sched in scheduled for slot in sched.slots]
        if not scheduled or len(token_ids) != len(scheduled) or len(slots) != len(scheduled):
            raise ValueError(f"a decode batch needs at least one sequence and one new token and slot per sequence, got "
                             f"{len(scheduled)} sequences, {len(token_ids)} tokens and {len(slots)} slots")
        seqs = [sched.seq for sched in scheduled]
        tables = [seq.table.block_ids for seq in seqs]
        width = max(map(len, tables))
        ids = [seq.seq_id for seq in seqs]
        if ids != self._ids:
            self._regather(ids, width)
        elif width > self._tables.shape[1]:
            self._tables = np.pad(self._tables, ((0, 0), (0, width - self._tables.shape[1])))
        array, lengths, lasts = self._tables, self._lengths, self._lasts
        for row, table in enumerate(tables):
            count = len(table)
            if count != lengths[row] or (count and table[-1] != lasts[row]):
                array[row, :count] = table
                array[row, count:] = 0
                lengths[row], lasts[row] = count, (table[-1] if count else -1)
                self.rows_written += 1
        held = array if array.shape[1] == width else array[:, :width]
        return StepBatch.decode(token_ids, [sched.start for sched in scheduled], slots, held, self.device)

    def _regather(self, ids: list[int], width: int) -> None:
        """Rows for `ids`, in order: those held before move to their new places, the others start empty."""
        old_rows, old = self._rows, self._tables
        array = np.zeros((len(ids), max(width, old.shape[1])), dtype=np.int64)
        lengths, lasts = [0] * len(ids), [-1] * len(ids)
        kept = [(row, old_rows[seq_id]) for row, seq_id in enumerate(ids) if seq_id in old_rows]
        if kept:
            new_rows, from_rows = [row for row, _ in kept], [row for _, row in kept]
            array[new_rows, :old.shape[1]] = old[from_rows]
            for row, source in kept:
                lengths[row], lasts[row] = self._lengths[source], self._lasts[source]
        self._ids, self._rows = ids, {seq_id: row for row, seq_id in enumerate(ids)}
        self._tables, self._lengths, self._lasts = array, lengths, lasts


class _Table:
    __slots__ = ("block_ids",)

    def __init__(self, block_ids: list[int]) -> None:
        self.block_ids = block_ids


class _Seq:
    """What the builders read of a sequence: its id and its table's block ids."""
    __slots__ = ("seq_id", "table")

    def __init__(self, seq_id: int, table: _Table) -> None:
        self.seq_id, self.table = seq_id, table


def steps(num_seqs: int, count: int, seed: int = 0) -> list[list[ScheduledSeq]]:
    """`count` consecutive decode steps of `num_seqs` sequences, each a list of `ScheduledSeq` (one token each), the
    sequences at random lengths from 16 to 200 tokens, their tables growing a block every 16 steps."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(16, 200, num_seqs).tolist()
    seqs = [_Seq(b, _Table(list(range(1000 * b, 1000 * b + n // BLOCK_SIZE + 1)))) for b, n in enumerate(lengths)]
    out = []
    for _ in range(count):
        step = []
        for b, seq in enumerate(seqs):
            position = lengths[b]
            lengths[b] += 1
            blocks = seq.table.block_ids
            if len(blocks) <= position // BLOCK_SIZE:
                seq.table = _Table(blocks + [blocks[-1] + 1])     # a new list: the earlier steps keep theirs
            slot = seq.table.block_ids[position // BLOCK_SIZE] * BLOCK_SIZE + position % BLOCK_SIZE
            step.append(ScheduledSeq(_Seq(b, seq.table), [int(rng.integers(3, 400))], position, [slot]))
        out.append(step)
    return out


def check_equal(a: StepBatch, b: StepBatch, label: str) -> None:
    for name in StepBatch.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if x.dtype != y.dtype or not torch.equal(x, y):
            raise AssertionError(f"{label}: field {name} differs from StepBatch.build's")


def time_variant(make, workload, repeats: int) -> float:
    """Median microseconds per build over `repeats` passes of the workload."""
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        for step in workload:
            make(step)
        timings.append(1e6 * (time.perf_counter() - start) / len(workload))
    return statistics.median(timings)


def builders(persistent: PersistentBatch | None = None, buffers: DecodeBuffers | None = None) -> dict:
    """Each variant as a function of a decode step's `ScheduledSeq`s."""
    persistent = persistent or PersistentBatch("cpu")
    buffers = buffers or DecodeBuffers("cpu")
    return {
        "build": lambda step: StepBatch.build([(s.token_ids, s.start, s.slots, s.seq.table.block_ids) for s in step]),
        "decode": lambda step: StepBatch.decode([s.token_ids[0] for s in step], [s.start for s in step],
                                                [s.slots[0] for s in step], [s.seq.table.block_ids for s in step]),
        "persistent": persistent.build,
        "buffers": lambda step: buffers.batch([s.token_ids[0] for s in step], [s.start for s in step],
                                              [s.slots[0] for s in step], [s.seq.table.block_ids for s in step]),
    }


def engine_run(model, requests, variant: str, check: bool = False) -> dict:
    """One run of `requests` (seeded, temperature 1) through an Engine whose decode batches come from `variant`;
    with `check`, every decode batch is compared with `StepBatch.build`'s and nothing is timed."""
    engine = Engine(model, block_size=BLOCK_SIZE, max_num_seqs=32)
    runner = engine.runner
    persistent = PersistentBatch(runner.device)
    make = builders(persistent, DecodeBuffers(runner.device))[variant]
    reference = builders()["build"]

    def decode_batch(scheduled):
        batch = make(scheduled)
        if check:
            check_equal(batch, reference(scheduled), f"{variant} in the engine")
        return batch
    runner.decode_batch = decode_batch
    spent = {"forward": 0.0, "execute": 0.0}
    forward, execute = runner.forward, runner.execute

    def timed_forward(*args, **kwargs):
        begin = time.perf_counter()
        result = forward(*args, **kwargs)
        spent["forward"] += time.perf_counter() - begin
        return result

    def timed_execute(plan, *args, **kwargs):
        begin = time.perf_counter()
        if plan.kind == "prefill":                  # these tables were (re)built: their kept rows are stale
            persistent.forget(sched.seq.seq_id for sched in plan.scheduled)
        result = execute(plan, *args, **kwargs)
        spent["execute"] += time.perf_counter() - begin
        return result
    runner.forward, runner.execute = timed_forward, timed_execute
    for i, (prompt, out) in enumerate(requests):
        engine.add_request(prompt, SamplingParams(temperature=1.0, seed=i, max_tokens=out, ignore_eos=True))
    start = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    seconds = time.perf_counter() - start
    steps = engine.stats.steps
    return {"host_us_per_step": 1e6 * (spent["execute"] - spent["forward"]) / steps,
            "wall_over_forward": seconds / spent["forward"], "steps": steps}


def engine_comparison(model, requests, rounds: int) -> dict:
    """The three variants in the engine: each checked once, then `rounds` rounds in rotating order."""
    for variant in VARIANTS:
        engine_run(model, requests, variant, check=True)
    runs = {variant: [] for variant in VARIANTS}
    for r in range(rounds):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
        for variant in order:
            runs[variant].append(engine_run(model, requests, variant))
    out = {variant: {measure: statistics.median(run[measure] for run in runs[variant])
                     for measure in ("host_us_per_step", "wall_over_forward")} for variant in VARIANTS}
    for variant in VARIANTS[1:]:
        out[variant]["host_over_build"] = out[variant]["host_us_per_step"] / out["build"]["host_us_per_step"]
    out["runs"] = runs
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 32, 128], help="sequences per decode step")
    parser.add_argument("--repeats", type=int, default=7, help="timed passes per variant (the median is kept)")
    parser.add_argument("--rounds", type=int, default=5, help="engine runs per variant (the median is kept)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: fewer builds and requests, no chat lengths")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if any(r < 1 for r in args.rows) or args.repeats < 1 or args.rounds < 1:
        parser.error(f"--rows, --repeats and --rounds must be >= 1, got {args.rows}, {args.repeats} and {args.rounds}")
    torch.set_num_threads(1)
    results = []
    for num_seqs in args.rows:
        workload = steps(num_seqs, 200 if args.quick else 2000)
        variants = builders()
        for step in workload[:100]:
            reference = variants["build"](step)
            for name in VARIANTS[1:]:
                check_equal(variants[name](step), reference, f"{name} at B={num_seqs}")
        row = {"rows": num_seqs, **{f"{name}_us": time_variant(make, workload, args.repeats)
                                     for name, make in variants.items()}}
        row["decode_over_build"] = row["decode_us"] / row["build_us"]
        row["persistent_over_decode"] = row["persistent_us"] / row["decode_us"]
        row["buffers_over_decode"] = row["buffers_us"] / row["decode_us"]
        results.append(row)
    model, model_name = serving.load("cpu")
    vocab = model.config.vocab_size
    short = serving.workload(16 if args.quick else 64, vocab, model.config.max_position_embeddings, 0)
    engine = {"short": engine_comparison(model, short, args.rounds)}
    if not args.quick:
        chat = serving.workload(32, vocab, 2048, 0, prompt_median=110, output_median=230)
        engine["chat"] = engine_comparison(serving.with_context(model, 2048), chat, args.rounds)
    meta = {"date": datetime.date.today().isoformat(), "torch": torch.__version__, "machine": platform.machine(),
            "threads": 1, "repeats": args.repeats, "rounds": args.rounds, "builds_per_repeat": 200 if args.quick else 2000, "quick": args.quick,
            "block_size": BLOCK_SIZE, "model": model_name,
            "engine_workloads": {"short": f"serving.py's {len(short)} short requests, 32 running, seeded T=1",
                                 **({} if args.quick else {
                                     "chat": "32 chat-length requests (medians 110 and 230 tokens), 2048 context, "
                                             f"{args.rounds} rounds"})}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": results, "engine": engine}, indent=1) + "\n")
    print("Building alone (steady state), microseconds per batch:")
    print("| sequences | build | decode | persistent | buffers | decode / build | persistent / decode | buffers / decode |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['rows']} | {r['build_us']:.1f} | {r['decode_us']:.1f} | {r['persistent_us']:.1f} | "
              f"{r['buffers_us']:.1f} | {r['decode_over_build']:.2f} | {r['persistent_over_decode']:.2f} | "
              f"{r['buffers_over_decode']:.2f} |")
    print("In the engine: host time around the forward (us per step), wall / forward:")
    print("| workload | build | decode | persistent | buffers |")
    print("|---|---:|---:|---:|---:|")
    for name, result in engine.items():
        print(f"| {name} | " + " | ".join(f"{result[v]['host_us_per_step']:.0f} us, {result[v]['wall_over_forward']:.3f}x"
                                           for v in VARIANTS) + " |")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
