"""Prefill and decode time per token across prompt lengths and batch sizes, and generation with and without a
KV cache, measured on this machine.

The model is a Llama with random weights (timing does not depend on the weights' values), larger than tiny-zh so
that the arithmetic, not Python overhead, dominates: 8 layers, hidden 512, 8 query / 4 KV heads, 2,048 positions.

    .venv/bin/python scripts/ch06_timing.py                 # writes chapters/data/06-timing.json
    .venv/bin/python scripts/ch06_timing.py --device cuda   # on a GPU (writes 06-timing-cuda.json)

Taught in: chapters/06-prefill-decode-kv-cache.ipynb
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from decodelab.decoding.generate import model_step
from decodelab.measure.timing import synced_seconds
from provenance import stamp  # scripts/provenance.py: the command and library commit

DATA = Path(__file__).resolve().parent.parent / "chapters" / "data"


def timing_model(device: str) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=473, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0, attn_implementation="sdpa")
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device).eval()


def seconds(fn, device: str, repeats: int) -> float:
    """Best of `repeats` wall-clock runs of fn() (after one warm-up run)."""
    fn()
    return min((synced_seconds(fn, device) for _ in range(repeats)), default=float("inf"))


@torch.inference_mode()
def prefill_and_decode(model, device: str, batch: int, prompt_len: int, decode_steps: int, repeats: int) -> dict:
    """Time one prefill of [batch, prompt_len] and `decode_steps` decode steps after it."""
    ids = torch.randint(3, 473, (batch, prompt_len), device=device)  # [B, L]
    prefill = seconds(lambda: model_step(model, ids), device, repeats)
    step_ids = torch.randint(3, 473, (batch, 1), device=device)  # [B, 1]

    def decode(cache) -> None:
        for _ in range(decode_steps):
            _, cache = model_step(model, step_ids, cache)

    decode_s = float("inf")
    for _ in range(repeats + 1):  # the first run warms up
        _, cache = model_step(model, ids)  # a fresh cache of prompt_len positions, not timed
        decode_s = min(decode_s, synced_seconds(lambda: decode(cache), device) / decode_steps)
    return {"batch": batch, "prompt_len": prompt_len, "prefill_s": prefill, "prefill_ms_per_token": 1e3 * prefill / (batch * prompt_len),
            "decode_step_ms": 1e3 * decode_s, "decode_ms_per_token": 1e3 * decode_s / batch}


@torch.inference_mode()
def generation(model, device: str, new_tokens: int, use_cache: bool) -> list[float]:
    """Cumulative seconds after each generated token, greedy from a 1-token prompt, with or without the cache."""
    ids = torch.tensor([[1]], device=device)
    times, start, cache = [], time.perf_counter(), None
    for _ in range(new_tokens):
        if use_cache:
            logits, cache = model_step(model, ids[:, -1:] if cache is not None else ids, cache)
        else:
            logits = model(input_ids=ids, use_cache=False).logits  # the whole text again, every step
        ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=1)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = timing_model(args.device)
    rows = []
    for batch in (1, 4, 16):
        for prompt_len in (16, 64, 256, 1024):
            rows.append(prefill_and_decode(model, args.device, batch, prompt_len, 8, args.repeats))
            r = rows[-1]
            print(f"B={batch:3d} L={prompt_len:5d} prefill {r['prefill_ms_per_token']:7.3f} ms/token   "
                  f"decode step {r['decode_step_ms']:7.2f} ms = {r['decode_ms_per_token']:7.3f} ms/token")
    curves = {name: generation(model, args.device, 384, use_cache) for name, use_cache in (("cache", True), ("no_cache", False))}
    print(f"384 tokens: {curves['cache'][-1]:.1f} s with the KV cache, {curves['no_cache'][-1]:.1f} s without")
    params = sum(p.numel() for p in model.parameters())
    result = {"command": f"python scripts/ch06_timing.py --device {args.device}", "device": args.device,
              "device_name": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or platform.machine(),
              "torch": torch.__version__, "threads": torch.get_num_threads(), "params": params,
              "model": model.config.to_diff_dict() | {"model_type": "llama"}, "rows": rows,
              "generation": {k: [round(t, 5) for t in v] for k, v in curves.items()}}
    result = stamp(result, result["command"])
    out = args.out or DATA / ("06-timing.json" if args.device == "cpu" else f"06-timing-{args.device}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
