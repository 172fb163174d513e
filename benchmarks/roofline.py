"""This machine's roofline, measured: memory bandwidth, matmul peak, and where decode and prefill steps sit.

  1. Streaming bandwidth over arrays far larger than the last-level cache (8x it, at most 2 GiB on a CPU, 4 GiB on a
     GPU): read (`torch.dot` of the array's two halves, bytes = the array; BLAS streams it faster than `x.sum()`,
     14 against 18 GB/s here) and copy (`y.copy_(x)`, bytes = read + write), at 1 and 2 threads.
  2. Matmul peak: n x n float32 matmuls (2 n^3 FLOPs each, n = 1,024 and 2,048), at 1 and 2 threads; bfloat16 too
     on a GPU. Both are measured before the model points and again (1 thread) after them; the ceilings are the best
     figures of the two passes, since on a shared machine a neighbour's burst only ever slows a measurement down.
  3. A random-weight Llama whose weights exceed the last-level cache many times (6 layers, hidden 2,048, vocabulary
     32k: 1.6 GB in float32), run by `decodelab.runner.model.PagedLlama` (the engine's forward) at one thread:
     decode steps for batch 1..128 (context 128 each) and prefills of 4..1,024 tokens (batch 1). Each point gets its
     FLOPs and its compulsory bytes (weights read once, K/V read and written once; activations not counted), so
     achieved FLOP/s and bytes/s place it on the measured roofline. The bandwidth ceiling is the best streaming
     figure at 1 thread (read or copy, whichever is higher).

    python benchmarks/roofline.py [--device cpu|cuda] [--quick] [--repeats N] [--out PATH]

Prints a table and writes benchmarks/results/roofline.json (the chapter's copy: chapters/data/06-roofline.json).
Taught in: chapters/06-prefill-decode-kv-cache.ipynb
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from decodelab.runner import PagedLlama, StepBatch
from decodelab.measure.timing import synced_seconds

RESULTS = Path(__file__).parent / "results" / "roofline.json"
BLOCK_SIZE = 16
CONTEXT = 128                                     # tokens each sequence holds before a timed decode step


def last_level_cache_bytes() -> int | None:
    """The largest CPU cache this machine reports (Linux sysfs), or None."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        text = (index / "size").read_text().strip() if (index / "size").exists() else ""
        if text[:-1].isdigit():
            sizes.append(int(text[:-1]) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1))
    return max(sizes, default=None)


def best_seconds(fn, device: str, repeats: int) -> float:
    """Fastest of `repeats` timed calls after one warm-up: on a shared machine slower runs measure the neighbours."""
    fn()
    return min(synced_seconds(fn, device) for _ in range(repeats))


def bandwidth(device: str, nbytes: int, repeats: int) -> dict:
    """Read and copy bandwidth in bytes/s over float32 arrays of `nbytes`."""
    x = torch.ones(nbytes // 4, device=device)                       # [N] float32
    y = torch.empty_like(x)
    half = x.numel() // 2
    read = best_seconds(lambda: torch.dot(x[:half], x[half:2 * half]), device, repeats)
    copy = best_seconds(lambda: y.copy_(x), device, repeats)
    return {"array_bytes": x.numel() * 4, "read_bytes_per_s": 2 * half * 4 / read,
            "copy_bytes_per_s": 2 * x.numel() * 4 / copy}


def matmul_peak(device: str, n: int, dtype: torch.dtype, repeats: int) -> dict:
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in "ab")  # [n, n]
    seconds = best_seconds(lambda: a @ b, device, repeats)
    return {"n": n, "dtype": str(dtype).removeprefix("torch."), "flop_per_s": 2 * n**3 / seconds}


def roofline_model(device: str, dtype: torch.dtype, quick: bool):
    from transformers import LlamaConfig, LlamaForCausalLM
    shape = (dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=1000) if quick else
             dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=6, num_attention_heads=16,
                  num_key_value_heads=4, vocab_size=32000))
    config = LlamaConfig(**shape, max_position_embeddings=2048, tie_word_embeddings=False, bos_token_id=1,
                         eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
    return model, PagedLlama(model)


def step_cost(runner: PagedLlama, num_seqs: int, new_tokens: int, context: int) -> tuple[float, float]:
    """(FLOPs, compulsory bytes) of one forward of `num_seqs` sequences, each adding `new_tokens` to a context of
    `context` tokens (its own new ones included). Weights are read once; K/V of the context read once, the new
    tokens' K/V written once; logits only for each sequence's last token (what the engine computes)."""
    element = torch.finfo(runner.dtype).bits // 8
    layer_params = sum(w.numel() for layer in runner.layers for w, _ in (layer.qkv, layer.out, layer.gate_up, layer.down))
    head_params = runner.lm_head.weight.numel()
    hidden = runner.embed.shape[1]
    tokens = num_seqs * new_tokens
    past = context - new_tokens
    # each query attends over the keys before it and itself: sum over the new tokens of (past + i + 1)
    keys_seen = num_seqs * (new_tokens * past + new_tokens * (new_tokens + 1) // 2)
    flops = (2 * layer_params * tokens + 2 * head_params * num_seqs
             + 4 * runner.num_layers * runner.num_heads * runner.head_dim * keys_seen)
    kv_per_token = 2 * runner.num_layers * runner.num_kv_heads * runner.head_dim * element
    weight_bytes = (layer_params + head_params) * element + tokens * hidden * element  # + the embedding rows read
    kv_bytes = kv_per_token * num_seqs * context  # past read once + new written once = context tokens per sequence
    return float(flops), float(weight_bytes + kv_bytes)


def time_step(runner: PagedLlama, device: str, num_seqs: int, new_tokens: int, context: int, repeats: int) -> dict:
    """Time one forward of `num_seqs` sequences with `new_tokens` each at the end of `context` tokens."""
    blocks_per_seq = -(-context // BLOCK_SIZE)
    kv_cache = runner.allocate_kv_cache(num_seqs * blocks_per_seq, BLOCK_SIZE)
    sequences = []
    start = context - new_tokens
    for seq in range(num_seqs):
        blocks = list(range(seq * blocks_per_seq, (seq + 1) * blocks_per_seq))
        slots = [blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(start, context)]
        sequences.append((torch.randint(3, runner.vocab_size, (new_tokens,)).tolist(), start, slots, blocks))
    batch = StepBatch.build(sequences, device)
    seconds = best_seconds(lambda: runner.forward(batch, kv_cache), device, repeats)
    flops, nbytes = step_cost(runner, num_seqs, new_tokens, context)
    return {"batch": num_seqs, "new_tokens": new_tokens, "context": context, "seconds": seconds, "flops": flops,
            "bytes": nbytes, "intensity": flops / nbytes, "flop_per_s": flops / seconds, "bytes_per_s": nbytes / seconds}


def measure_ceilings(device: str, threads: int, array_bytes: int, quick: bool, repeats: int) -> tuple[dict, list]:
    """(bandwidth, matmul peaks) at `threads` threads."""
    torch.set_num_threads(threads)
    cuda = device == "cuda"
    sizes = [512] if quick else ([8192] if cuda else [1024, 2048])
    peaks = [matmul_peak(device, n, torch.float32, repeats) for n in sizes]
    if cuda:
        peaks.append(matmul_peak(device, 8192, torch.bfloat16, repeats))
    return bandwidth(device, array_bytes, repeats), peaks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--quick", action="store_true", help="small arrays and a small model, for a smoke run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="where the JSON goes (default results/roofline.json)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda asked for, but torch.cuda.is_available() is False")
    cuda = args.device == "cuda"
    load_before = os.getloadavg()
    started = time.perf_counter()
    llc = None if cuda else last_level_cache_bytes()
    if args.quick:
        array_bytes = 64 << 20
    elif cuda:
        array_bytes = 4 << 30
    else:
        array_bytes = min(2 << 30, 8 * (llc or 256 << 20))
    thread_counts = [1] if cuda else [1, 2]
    memory, matmul = {}, {}
    print("| threads | read GB/s | copy GB/s | matmul fp32 GFLOP/s |")
    print("|---:|---:|---:|---:|")
    for threads in thread_counts:
        memory[threads], matmul[threads] = measure_ceilings(args.device, threads, array_bytes, args.quick,
                                                            args.repeats)
        print(f"| {threads} | {memory[threads]['read_bytes_per_s'] / 1e9:.1f} | "
              f"{memory[threads]['copy_bytes_per_s'] / 1e9:.1f} | "
              f"{max(m['flop_per_s'] for m in matmul[threads] if m['dtype'] == 'float32') / 1e9:.1f} |", flush=True)
    torch.set_num_threads(1)
    dtype = torch.bfloat16 if cuda else torch.float32
    model, runner = roofline_model(args.device, dtype, args.quick)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    batches = [1, 4] if args.quick else ([1, 4, 16, 64, 256, 512] if cuda else [1, 2, 4, 8, 16, 32, 64, 128])
    lengths = [16, 64] if args.quick else ([16, 128, 512, 2048] if cuda else [4, 16, 64, 256, 1024])
    peak_dtype = str(dtype).removeprefix("torch.")
    print(f"\nmodel: {weight_bytes / 1e9:.2f} GB of {peak_dtype} weights; one thread")
    points = {"decode": [], "prefill": []}
    for kind, sizes in (("decode", batches), ("prefill", lengths)):
        for size in sizes:
            point = (time_step(runner, args.device, size, 1, CONTEXT, args.repeats) if kind == "decode" else
                     time_step(runner, args.device, 1, size, size, max(1, args.repeats - 1) if size >= 256 else args.repeats))
            points[kind].append(point)
            print(f"{kind} batch {point['batch']} tokens {point['batch'] * point['new_tokens']}: "
                  f"{point['seconds'] * 1e3:.1f} ms", flush=True)
    after = measure_ceilings(args.device, 1, array_bytes, args.quick, args.repeats)
    torch.set_num_threads(1)
    bandwidth_ceiling = max(m[k] for m in (memory[1], after[0]) for k in ("read_bytes_per_s", "copy_bytes_per_s"))
    peak = max(m["flop_per_s"] for m in matmul[1] + after[1] if m["dtype"] == peak_dtype)
    print(f"ceilings at one thread, best of the passes before and after: {bandwidth_ceiling / 1e9:.1f} GB/s, "
          f"{peak / 1e9:.1f} GFLOP/s")
    print("| step | batch | tokens | ms | GB/s | share of bandwidth | GFLOP/s | share of matmul peak | FLOP/byte |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind in points:
        for point in points[kind]:
            print(f"| {kind} | {point['batch']} | {point['batch'] * point['new_tokens']} | {point['seconds'] * 1e3:.1f} | "
                  f"{point['bytes_per_s'] / 1e9:.1f} | {point['bytes_per_s'] / bandwidth_ceiling:.0%} | "
                  f"{point['flop_per_s'] / 1e9:.1f} | {point['flop_per_s'] / peak:.0%} | {point['intensity']:.1f} |")
    result = {"command": "python benchmarks/roofline.py" + (" --quick" if args.quick else "") +
              f" --device {args.device} --repeats {args.repeats}",
              "device": args.device, "device_name": torch.cuda.get_device_name() if cuda else
              (platform.processor() or platform.machine()), "cpu_count": os.cpu_count(), "torch": torch.__version__,
              "quick": args.quick, "repeats": args.repeats, "last_level_cache_bytes": llc,
              "load_average_before": [round(x, 2) for x in load_before],
              "load_average_after": [round(x, 2) for x in os.getloadavg()],
              "memory": {str(t): m for t, m in memory.items()}, "matmul": {str(t): m for t, m in matmul.items()},
              "model": {"config": {k: getattr(model.config, k) for k in ("hidden_size", "intermediate_size",
                        "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size")},
                        "dtype": peak_dtype, "weight_bytes": weight_bytes, "threads": 1, "block_size": BLOCK_SIZE,
                        "decode_context": CONTEXT},
              "memory_after": after[0], "matmul_after": after[1],
              "ceilings": {"bytes_per_s": bandwidth_ceiling, "matmul_flop_per_s": peak, "threads": 1},
              "decode": points["decode"], "prefill": points["prefill"],
              "seconds": time.perf_counter() - started}
    out = args.out or RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
