"""Paged decode attention: the torch reference (gather the blocks, then SDPA) against the Triton kernel that reads
the blocks in place, on Llama-3-8B's attention shape (32 query heads, 8 KV heads, head_dim 128, block size 16).

The kernel is timed as the engine calls it (`paged_decode_attention(..., check_lengths=False)`): with the split count
it chooses (`splits`, split-K over the context when batch x kv_heads leaves the GPU's SMs idle) and forced to the
single pass (`num_splits=1`) for comparison.

    python benchmarks/attention.py --device cuda [--quick] [--out PATH]

On CPU only the reference is timed (the kernel needs a GPU; under Triton's interpreter it is a correctness tool,
not a contender). Writes benchmarks/results/attention.json. Taught in: chapters/07-paged-attention.ipynb
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from decodelab.runner.attention import paged_attention
from decodelab.measure.timing import synced_seconds
from decodelab.runner.triton_attention import choose_num_splits, paged_decode_attention, unavailable_reason

RESULTS = Path(__file__).parent / "results" / "attention.json"
HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16


def make_case(batch: int, context: int, device: str, dtype: torch.dtype, seed: int = 0):
    """A pool twice as large as the batch needs, each sequence's blocks scattered over it."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = -(-context // BLOCK_SIZE)
    num_blocks = 2 * batch * blocks_per_seq
    key_cache, value_cache = (torch.randn(num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM, generator=gen).to(device, dtype)
                              for _ in "kv")                        # [num_blocks, block_size, kv_heads, head_dim]
    tables = torch.randperm(num_blocks, generator=gen)[:batch * blocks_per_seq].view(batch, blocks_per_seq)
    lens = torch.full((batch,), context)
    query = torch.randn(batch, HEADS, HEAD_DIM, generator=gen).to(device, dtype)   # [B, H, D]
    return query, key_cache, value_cache, tables.to(device), lens.to(device)


def reference(query, key_cache, value_cache, tables, lens):
    return paged_attention(query[:, None], key_cache, value_cache, tables, lens, (lens - 1)[:, None])[:, 0]


def time_ms(fn, device: str, repeats: int) -> float:
    """Median milliseconds per call after two warm-up calls."""
    fn(), fn()
    return statistics.median(synced_seconds(fn, device) for _ in range(repeats)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--quick", action="store_true", help="one small shape, for a smoke run")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, help="where the JSON goes (default results/attention.json)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda asked for, but torch.cuda.is_available() is False")
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    kernel_reason = unavailable_reason(args.device) if args.device == "cuda" else "timed on CUDA only"
    shapes = [(4, 256)] if args.quick else [(8, 512), (8, 2048), (32, 512), (32, 2048), (64, 4096), (1, 8192)]
    rows = []
    print("| batch | context | reference ms | triton ms | splits | single-pass ms | triton vs reference | "
          "max abs diff |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for batch, context in shapes:
        case = make_case(batch, context, args.device, dtype)
        row = {"batch": batch, "context": context, "reference_ms": time_ms(lambda: reference(*case), args.device,
                                                                             args.repeats)}
        if kernel_reason is None:
            sms = torch.cuda.get_device_properties(args.device).multi_processor_count
            row["num_splits"] = choose_num_splits(batch, KV_HEADS, case[3].shape[1] * BLOCK_SIZE, sms)
            row["triton_ms"] = time_ms(lambda: paged_decode_attention(*case, check_lengths=False), args.device,
                                       args.repeats)
            row["single_pass_ms"] = time_ms(lambda: paged_decode_attention(*case, check_lengths=False, num_splits=1),
                                            args.device, args.repeats)
            row["speedup"] = row["reference_ms"] / row["triton_ms"]
            row["max_abs_diff"] = float((paged_decode_attention(*case).float() - reference(*case).float()).abs().max())
        rows.append(row)
        cells = (f"{row['triton_ms']:.3f} | {row['num_splits']} | {row['single_pass_ms']:.3f} | "
                 f"{row['speedup']:.1f}x | {row['max_abs_diff']:.1e}" if "triton_ms" in row
                 else f"- | - | - | - | ({kernel_reason})")
        print(f"| {batch} | {context} | {row['reference_ms']:.3f} | {cells} |", flush=True)
    out = args.out or RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": args.device if args.device == "cpu" else torch.cuda.get_device_name(),
                               "torch": torch.__version__, "dtype": str(dtype), "repeats": args.repeats,
                               "shape": {"heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
                                         "block_size": BLOCK_SIZE}, "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
