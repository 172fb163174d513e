"""Where an engine decode step's time goes: the GPU's busy time against the wall clock, and kernel launches per step.

On a GPU an eager PyTorch forward is launch-bound when the host takes longer to issue its kernels than the GPU takes
to run them: the GPU then idles between kernels, and the step's wall time is the host's. This benchmark settles
whether that is so for the engine's decode steps, instead of inferring it from bandwidth and FLOP floors:

  1. 32 requests (prompts of 64 tokens, 64 new tokens each, temperature 1, seeded) run until every one is decoding;
  2. the next `--steps` decode steps are timed on the wall clock (the GPU drained before and after);
  3. as many further steps run under `torch.profiler`, which gives the GPU's kernel time (the sum of the kernels'
     own device time: an upper bound on its busy time, since kernels of one stream do not overlap) and the number
     of kernel launches the host issued.

Rows: tiny-zh with the torch reference attention, tiny-zh with the Triton decode kernel (CUDA only), and the serving
benchmark's wider random Llama (hidden 2048, 16 layers, 806M parameters, float32). On a CPU it runs too (the
profiler then sees host time only; useful as a smoke test).

    python benchmarks/profile_step.py [--device cpu|cuda] [--steps 20] [--quick] [--out PATH]

Prints a table and the top operators by device time, and writes benchmarks/results/profile_step.json.
Taught in: README.md (Performance, GPU check)
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import wider  # noqa: E402  (the same wider Llama the serving benchmark measures)

from decodelab import Engine, SamplingParams, load_model  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "profile_step.json"
BATCH, PROMPT, NEW = 32, 64, 64
# the host calls that launch a kernel (torch's own, and the driver API that Triton's launcher uses)
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


def drained(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decoding_engine(model, attention: str, seed: int) -> Engine:
    """An engine whose `BATCH` requests have all been prefilled: every further step is a decode step."""
    engine = Engine(model, block_size=16, max_num_seqs=BATCH, attention=attention)
    generator = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    for i in range(BATCH):
        prompt = torch.randint(3, vocab, (PROMPT,), generator=generator).tolist()
        engine.add_request(prompt, SamplingParams(temperature=1.0, seed=i, max_tokens=NEW, ignore_eos=True))
    while engine.stats.prefill_tokens < BATCH * PROMPT:
        engine.step()
    for _ in range(3):  # warm-up decode steps (Triton compiles its kernel on the first)
        engine.step()
    return engine


def measure(model, attention: str, steps: int, seed: int) -> dict:
    device = next(model.parameters()).device
    engine = decoding_engine(model, attention, seed)
    drained(device)
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    drained(device)
    wall = (time.perf_counter() - start) / steps

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            engine.step()
        drained(device)
    events = prof.key_averages()
    # kernels are the events on the GPU; an operator's own "device time" is its kernels' time again, so only the
    # kernel events are summed (summing every event would count each kernel twice)
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    kernel_us = sum(e.self_device_time_total for e in kernels) / steps
    launches = sum(e.count for e in events if e.key in LAUNCHES) / steps
    host_ops = [e for e in events if e.device_type == DeviceType.CPU and e.key.startswith("aten::")]
    return {"attention": attention, "parameters": sum(p.numel() for p in model.parameters()),
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."), "layers": model.config.num_hidden_layers,
            "hidden": model.config.hidden_size, "steps": steps, "wall_ms_per_step": wall * 1e3,
            "gpu_kernel_ms_per_step": kernel_us / 1e3, "gpu_busy_share": kernel_us / 1e3 / (wall * 1e3),
            "kernels_per_step": sum(e.count for e in kernels) / steps, "kernel_launches_per_step": launches,
            "top_kernels": [{"kernel": e.key, "calls_per_step": e.count / steps,
                             "device_us_per_step": e.self_device_time_total / steps}
                            for e in sorted(kernels, key=lambda e: e.self_device_time_total, reverse=True)[:6]],
            "top_host_ops": [{"op": e.key, "calls_per_step": e.count / steps,
                              "cpu_us_per_step": e.self_cpu_time_total / steps}
                             for e in sorted(host_ops, key=lambda e: e.self_cpu_time_total, reverse=True)[:6]]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="a smaller wider model (hidden 256, 4 layers)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help=f"where the JSON goes (default {RESULTS})")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False on this machine")
    torch.manual_seed(args.seed)
    model, _ = load_model("tiny-zh", device=args.device)
    rows = [("tiny-zh", model, "torch")]
    if args.device == "cuda":
        rows.append(("tiny-zh", model, "triton"))
    shape = (256, 4) if args.quick else (2048, 16)
    rows.append((f"random Llama {shape[0]} x {shape[1]}", wider(model, *shape), "torch"))
    results = []
    for name, row_model, attention in rows:
        result = {"model": name, **measure(row_model, attention, args.steps, args.seed)}
        results.append(result)
        print(f"{name:28} {attention:6}  wall {result['wall_ms_per_step']:7.2f} ms/step | GPU kernels "
              f"{result['gpu_kernel_ms_per_step']:6.2f} ms/step ({result['gpu_busy_share']:.0%} of the wall) | "
              f"{result['kernels_per_step']:.0f} kernels, {result['kernel_launches_per_step']:.0f} launch calls/step")
        for k in result["top_kernels"]:
            print(f"    GPU  {k['device_us_per_step']:8.1f} us/step {k['calls_per_step']:6.1f}x  {k['kernel'][:70]}")
        for op in result["top_host_ops"]:
            print(f"    host {op['cpu_us_per_step']:8.1f} us/step {op['calls_per_step']:6.1f}x  {op['op'][:70]}")
    out = {"device": args.device, "torch": torch.__version__, "batch": BATCH, "prompt": PROMPT, "rows": results,
           "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None}
    path = args.out or RESULTS
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}")
    return out


if __name__ == "__main__":
    main()
