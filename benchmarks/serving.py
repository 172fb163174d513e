"""Serving benchmark: the paged continuous-batching Engine against transformers, on the shipped tiny-zh model.

One run reports
  1. KV utilization (live tokens / allocated slots, mean over steps) of the paged engine against reserving the
     model's maximum length per request (the PagedAttention paper's Figure 2 comparison), on the short workload
     below at block sizes 4, 8 and 16, and on chat-length requests (the paper's ShareGPT means, 161 prompt and
     338 output tokens) at the default block size 16;
  2. throughput (generated tokens/s) of Engine, of transformers `generate` with static padded batches, and of
     transformers' own continuous batching `generate_batch`;
  3. prefill tokens saved by prefix caching when every request shares a system prompt;
  4. KV blocks saved when n = 4 parallel samples of a long prompt share the prompt's blocks;
  5. the engine's own overhead: wall time against time inside the model's forward, seeded and unseeded
     sampling, with the share of the sampler's noise draw, on tiny-zh and on a wider random-weight Llama;
  6. the engine's cost per step with one running sequence against up to 32: its fixed part, and what each row drawn
     in a step adds.

    python benchmarks/serving.py [--device cpu|cuda] [--quick] [--out PATH]

Writes benchmarks/results/serving.json (serving-quick.json with --quick). Taught in: chapters/07-paged-attention.ipynb
"""
from __future__ import annotations

import argparse
import copy
import datetime
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import numpy as np
import torch

from decodelab.engine import Engine
from decodelab.sampling import SamplingParams
from decodelab.sampling.counter_rng import DEFAULT_RNG

sys.path.append(str(Path(__file__).resolve().parents[1] / "scripts"))
import provenance  # noqa: E402  (scripts/provenance.py: where a figure came from)

RESULTS = Path(__file__).parent / "results" / "serving.json"


def library_commit() -> str | None:
    """The library commit the run used (`scripts/provenance.py`'s, as chapters/data records it); None outside a git
    checkout."""
    try:
        return provenance.library_commit()
    except (OSError, subprocess.CalledProcessError):
        return None


def load(device: str):
    """The shipped model, or a random Llama of the same shape when the assets are missing (said in the output)."""
    try:
        from decodelab.models import load_model
        model, _ = load_model("tiny-zh", device=device, dtype="float32")
        return model, "tiny-zh (shipped)"
    except (FileNotFoundError, OSError, ValueError, ImportError) as err:
        from transformers import LlamaForCausalLM
        from decodelab.models.train import TrainParams, model_config
        torch.manual_seed(0)
        model = LlamaForCausalLM(model_config(473, TrainParams())).to(device).eval()  # 473: tiny-zh's vocabulary
        return model, f"RANDOM Llama of tiny-zh's shape (assets missing: {type(err).__name__})"


def workload(num_requests: int, vocab: int, max_len: int, seed: int, prompt_median: int = 24,
             output_median: int = 20) -> list[tuple[list[int], int]]:
    """Heavy-tailed (log-normal, sigma 0.9) prompt and output lengths, random token prompts, fixed seed."""
    rng = np.random.default_rng(seed)
    prompt_lens = np.clip(rng.lognormal(np.log(prompt_median), 0.9, num_requests), 4, max_len // 2).astype(int)
    output_lens = np.clip(rng.lognormal(np.log(output_median), 0.9, num_requests), 2, max_len // 2).astype(int)
    return [(rng.integers(3, vocab, p).tolist(), int(o)) for p, o in zip(prompt_lens, output_lens)]


def greedy(max_tokens: int, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kwargs)


def best_of(repeats: int, run) -> dict:
    """The fastest of `repeats` runs: on a shared CPU the slower ones measure the neighbours, not the code."""
    return min((run() for _ in range(repeats)), key=lambda result: result.get("seconds", 0.0))


def run_engine(model, requests, batch: int, block_size: int = 16, attention: str = "torch") -> dict:
    engine = Engine(model, block_size=block_size, max_num_seqs=batch, attention=attention)
    for prompt, out in requests:
        engine.add_request(prompt, greedy(out))
    paged, reserved = [], []
    start = time.perf_counter()
    while engine.has_unfinished():
        step = engine.step()
        paged.append(step.live_tokens / step.allocated_slots)
        reserved.append(step.live_tokens / (step.num_running * engine.max_model_len))
    seconds = time.perf_counter() - start
    tokens = sum(out for _, out in requests)
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds, "steps": engine.stats.steps,
            "kv_utilization_paged": float(np.mean(paged)), "kv_utilization_reserve_max_len": float(np.mean(reserved)),
            "preemptions": engine.stats.preemptions}


def run_overhead(model, requests, batch: int, seeded: bool = True, rng: str = DEFAULT_RNG) -> dict:
    """The engine's own cost: wall time of a whole run against the time inside the model's forward, on the same
    requests with temperature-1 sampling, seeded (each request its own generator, as a server runs a request that
    sets `seed`) or not (torch's global RNG: on the CPU one uniform per row and the inverse CDF; off it one noise
    tensor for the batch, as nano-vllm always draws). Also where the rest goes:
    scheduling, building the step's batch, sampling (with its draw's noise or uniforms, cdf and search on their own),
    postprocessing (`Scheduler.update_from_output`), and the engine's cost per step in microseconds. nano-vllm
    reaches about 1.1x on a GPU. `rng="counter"` gives every request a counter-based stream (one hashed uniform
    per row, inverse CDF; `decodelab.sampling.counter_rng`), and "sample: noise" is then that draw."""
    from decodelab.sampling import sampler as sampling

    engine = Engine(model, block_size=16, max_num_seqs=batch, rng=rng)
    spent = {"forward": 0.0, "schedule": 0.0, "execute (batch + forward)": 0.0, "sample": 0.0, "sample: noise": 0.0,
             "postprocess": 0.0}
    patched = []

    # On a GPU a forward returns once its kernels are queued, and the wait for them would fall on whatever reads a
    # result next (the sampler's draw). So on CUDA the forward is bracketed by synchronizations: the GPU is idle when
    # it starts and done when it returns, and the forward's share is the GPU's time plus the launches, not launches
    # alone. The two synchronizations per step (tens of microseconds) count as the engine's overhead.
    on_cuda = next(model.parameters()).device.type == "cuda"

    def timed(owner, name: str, label: str) -> None:
        call = getattr(owner, name)
        synced = on_cuda and label == "forward"

        def wrapper(*args, **kwargs):
            if synced:
                torch.cuda.synchronize()
            begin = time.perf_counter()
            result = call(*args, **kwargs)
            if synced:
                torch.cuda.synchronize()
            spent[label] += time.perf_counter() - begin
            return result
        setattr(owner, name, wrapper)
        patched.append((owner, name, call))

    timed(engine.runner, "forward", "forward")
    timed(engine.runner, "execute", "execute (batch + forward)")
    timed(engine.scheduler, "schedule", "schedule")
    timed(engine.scheduler, "update_from_output", "postprocess")
    timed(engine.drawer, "_sample", "sample")                # the draw (draw() calls it with the batch)
    timed(sampling, "_exponential_noise", "sample: noise")   # module functions: put back below
    timed(sampling, "_rests", "sample: noise")                # the draw by one uniform per row: the uniforms ...
    timed(sampling, "_draw_columns", "sample: noise")          # ... and where they fall (mixed groups),
    timed(sampling, "_cdf", "sample: noise")                   # or, for a plain batch of uniform rows, the cdf
    timed(sampling, "_search", "sample: noise")                # and the search on it
    try:
        for i, (prompt, out) in enumerate(requests):
            engine.add_request(prompt, SamplingParams(temperature=1.0, seed=i if seeded else None, max_tokens=out,
                                                      ignore_eos=True))
        start, drawn = time.perf_counter(), 0
        while engine.has_unfinished():
            drawn += len(engine.step().new_tokens)       # the sequences that drew a token this step
        seconds = time.perf_counter() - start
    finally:
        for owner, name, call in patched:
            setattr(owner, name, call)
    share = {label: value / seconds for label, value in spent.items()}
    steps = engine.stats.steps
    return {"seconds": seconds, "steps": steps, "seeded": seeded, "rng": rng, "rows_per_step": drawn / steps,
            "wall_over_forward": seconds / spent["forward"],
            "shares": share, "overhead_us_per_step": 1e6 * (seconds - spent["forward"]) / steps,
            "forward_us_per_step": 1e6 * spent["forward"] / steps,
            "wall_over_forward_without_noise": (seconds - spent["sample: noise"]) / spent["forward"]}


def per_step_cost(alone: dict, full: dict, batch: int) -> dict:
    """The engine's cost per step outside the forward (`run_overhead`'s) with one running sequence and with up to
    `batch`, the draw's part of the first (`sample`, in microseconds per step), and the slope between them: what each
    further row drawn in a step adds, if the cost grows linearly with the rows. The runs hold the same requests, so
    the same rows and prompt tokens in all; with up to `batch` running a step draws `rows_per_step` rows on average
    (far fewer than `batch` in the short workload: requests finish, and prefill steps draw only their new
    sequences), with one running it draws one. Then cost = fixed + rows x slope gives
    slope = (full - alone) / (rows_per_step - 1) and fixed = alone - slope."""
    one, whole, rows = alone["overhead_us_per_step"], full["overhead_us_per_step"], full["rows_per_step"]
    slope = (whole - one) / (rows - 1)
    return {"one_sequence_us": one, "full_batch_us": whole, "batch": batch, "rows_per_step": rows,
            "one_sequence_sample_us": 1e6 * alone["shares"]["sample"] * alone["seconds"] / alone["steps"],
            "per_row_us": slope, "fixed_us": one - slope}


def wider(model, hidden: int, layers: int):
    """A random-weight Llama with tiny-zh's vocabulary and context but `hidden` wide (heads of 128, two query heads
    per K/V head) and `layers` deep, so that the forward, not the engine's fixed cost per step, fills a step (as on a
    real model). The engine and the sampler see the same vocabulary, so their work per step is what it is on tiny-zh.
    The weights are made on the model's device."""
    from transformers import LlamaForCausalLM
    config = copy.deepcopy(model.config)
    config.hidden_size, config.intermediate_size, config.num_hidden_layers = hidden, 3 * hidden, layers
    config.num_attention_heads = max(2, hidden // 128)
    config.num_key_value_heads = config.num_attention_heads // 2
    config.head_dim = hidden // config.num_attention_heads
    torch.manual_seed(0)
    with torch.device(model.device):
        wide = LlamaForCausalLM(config)
    return wide.to(dtype=model.dtype).eval()


def with_context(model, max_len: int):
    """The same weights under a config with a `max_len`-token context (RoPE is computed per position, so nothing
    else changes). Memory accounting needs long sequences, not meaningful ones: the prompts are random tokens."""
    config = copy.deepcopy(model.config)
    config.max_position_embeddings = max_len
    longer = type(model)(config).to(device=model.device, dtype=model.dtype).eval()
    longer.load_state_dict(model.state_dict())
    return longer


def run_chat_lengths(model, batch: int, seed: int, num_requests: int = 64, max_len: int = 2048) -> dict:
    """KV utilization at the default block size on requests as long as the paper's ShareGPT trace (means 161
    prompt and 338 output tokens; log-normal medians 110 and 230 give those means), which tiny-zh's 256-token
    context cannot hold, so the weights run under a `max_len` context."""
    requests = workload(num_requests, model.config.vocab_size, max_len, seed, prompt_median=110, output_median=230)
    result = run_engine(with_context(model, max_len), requests, batch)
    result.update(max_model_len=max_len, mean_prompt_tokens=float(np.mean([len(p) for p, _ in requests])),
                  mean_output_tokens=float(np.mean([out for _, out in requests])))
    return result


def run_static(model, requests, batch: int) -> dict:
    """transformers generate, batches of `batch` in arrival order, left-padded, each run to its longest output."""
    pad = model.config.pad_token_id
    produced, start = 0, time.perf_counter()
    for i in range(0, len(requests), batch):
        chunk = requests[i:i + batch]
        width = max(len(p) for p, _ in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p, _ in chunk], device=model.device)   # [b, width]
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in chunk], device=model.device)
        longest = max(out for _, out in chunk)
        model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=longest, min_new_tokens=longest,
                       pad_token_id=pad)
        produced += longest * len(chunk)
    seconds = time.perf_counter() - start
    tokens = sum(out for _, out in requests)
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds, "tokens_computed": produced}


def run_generate_batch(model, requests, batch: int) -> dict:
    """transformers' continuous batching against our Engine under the same limits: its API takes one max_new_tokens,
    so every request gets the mean length (greedy, EOS off) in both; at most `batch` requests and 512 tokens per
    step, blocks of 16. Reports both throughputs, their ratio and whether the tokens are equal."""
    try:
        from transformers import ContinuousBatchingConfig, GenerationConfig
    except ImportError as err:
        return {"error": f"generate_batch needs ContinuousBatchingConfig: {err}"}
    mean_out = round(float(np.mean([out for _, out in requests])))
    prompts = [p for p, _ in requests]
    config = GenerationConfig(max_new_tokens=mean_out, do_sample=False, eos_token_id=None,
                              pad_token_id=model.config.pad_token_id)
    # newer transformers call it page_size and deprecate block_size; pass the name this version knows
    size_name = "page_size" if "page_size" in inspect.signature(ContinuousBatchingConfig).parameters else "block_size"
    cb = ContinuousBatchingConfig(num_blocks=512, max_batch_tokens=512, max_requests_per_batch=batch, **{size_name: 16})
    try:
        start = time.perf_counter()
        outputs = model.generate_batch(prompts, config, continuous_batching_config=cb, warmup=False)
        seconds = time.perf_counter() - start
    except Exception as err:  # report, never hide: transformers' CPU path changes between versions
        return {"error": f"{type(err).__name__}: {err}"[:300]}
    theirs = [list(outputs[f"req_{i}"].generated_tokens) for i in range(len(prompts))]
    engine = Engine(model, block_size=16, num_blocks=512, max_num_seqs=batch, max_num_batched_tokens=512)
    start = time.perf_counter()
    ours = [c.token_ids for c in engine.generate(prompts, greedy(mean_out))]
    engine_seconds = time.perf_counter() - start
    tokens = sum(map(len, theirs))
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
            "engine_same_limits_tokens_per_s": sum(map(len, ours)) / engine_seconds,
            "engine_vs_generate_batch": (sum(map(len, ours)) / engine_seconds) / (tokens / seconds),
            "same_tokens": ours == theirs,
            "note": f"one max_new_tokens={mean_out} for every request (its API), greedy, EOS off, both engines"}


def run_prefix(model, num_requests: int, system_len: int, seed: int) -> dict:
    rng = np.random.default_rng(seed + 1)
    vocab = model.config.vocab_size
    system = rng.integers(3, vocab, system_len).tolist()
    prompts = [system + rng.integers(3, vocab, int(rng.integers(4, 24))).tolist() for _ in range(num_requests)]
    result = {"requests": num_requests, "system_prompt_tokens": system_len, "prompt_tokens": sum(map(len, prompts))}
    outputs = {}
    for caching in (False, True):
        engine = Engine(model, block_size=16, max_num_seqs=16, enable_prefix_caching=caching)
        start = time.perf_counter()
        outputs[caching] = [o.token_ids for o in engine.generate(prompts, greedy(8))]
        key = "with_cache" if caching else "without_cache"
        result[key] = {"prefill_tokens": engine.stats.prefill_tokens, "seconds": time.perf_counter() - start,
                       "hit_tokens": engine.stats.prefix_cache_hit_tokens}
    result["same_outputs"] = outputs[True] == outputs[False]
    result["prefill_saved"] = 1 - result["with_cache"]["prefill_tokens"] / result["without_cache"]["prefill_tokens"]
    return result


def peak_blocks(engine: Engine) -> int:
    peak = 0
    while engine.has_unfinished():
        peak = max(peak, engine.step().allocated_slots // engine.block_size)
    return peak


def run_sharing(model, prompt_len: int, max_tokens: int, seed: int) -> dict:
    rng = np.random.default_rng(seed + 2)
    prompt = rng.integers(3, model.config.vocab_size, prompt_len).tolist()
    shared = Engine(model, block_size=16, enable_prefix_caching=False)
    shared.add_request(prompt, SamplingParams(temperature=1.0, seed=seed, n=4, max_tokens=max_tokens, ignore_eos=True))
    separate = Engine(model, block_size=16, enable_prefix_caching=False)
    for i in range(4):
        separate.add_request(prompt, SamplingParams(temperature=1.0, seed=seed + i, max_tokens=max_tokens,
                                                    ignore_eos=True))
    result = {"prompt_tokens": prompt_len, "max_tokens": max_tokens,
              "peak_blocks_shared": peak_blocks(shared), "peak_blocks_separate": peak_blocks(separate)}
    result["blocks_saved"] = 1 - result["peak_blocks_shared"] / result["peak_blocks_separate"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--quick", action="store_true", help="64 short requests, for a smoke run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="where the JSON goes (default results/serving.json, "
                                                  "serving-quick.json with --quick)")
    parser.add_argument("--repeats", type=int, default=3, help="time each contender this many times, keep the best")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads for every contender; the tiny model's matmuls gain nothing from more, and "
                             "on a shared machine extra threads spin-wait")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda asked for, but torch.cuda.is_available() is False")
    torch.manual_seed(args.seed)
    model, model_name = load(args.device)
    max_len = model.config.max_position_embeddings
    batch = 32
    requests = workload(64, model.config.vocab_size, max_len, args.seed)
    if args.quick:
        requests = [(p[:32], min(out, 16)) for p, out in requests]
    repeats = 1 if args.quick else args.repeats
    run_engine(model, requests[:4], batch)                         # warm-up of every contender
    run_static(model, requests[:4], batch)
    run_generate_batch(model, requests[:4], batch)
    engine = best_of(repeats, lambda: run_engine(model, requests, batch))
    utilization_by_block_size = {size: run_engine(model, requests, batch, size)["kv_utilization_paged"]
                                 for size in (4, 8)}
    utilization_by_block_size[16] = engine["kv_utilization_paged"]
    kernel = (best_of(repeats, lambda: run_engine(model, requests, batch, attention="triton"))
              if args.device == "cuda" else None)       # decode attention by the Triton kernel (a GPU only)
    chat = run_chat_lengths(model, batch, args.seed, num_requests=16 if args.quick else 64)
    static = best_of(repeats, lambda: run_static(model, requests, batch))
    cont = best_of(repeats, lambda: run_generate_batch(model, requests, batch))
    # both kinds of stream, each named ("engine_overhead*" is rng='torch', "engine_overhead_counter*" the counter kind)
    overhead = best_of(repeats, lambda: run_overhead(model, requests, batch, rng="torch"))
    overhead_unseeded = best_of(repeats, lambda: run_overhead(model, requests, batch, seeded=False, rng="torch"))
    counter = best_of(repeats, lambda: run_overhead(model, requests, batch, rng="counter"))
    counter_unseeded = best_of(repeats, lambda: run_overhead(model, requests, batch, seeded=False, rng="counter"))
    # the same requests one at a time: what a step costs the engine whatever its batch (its fixed cost), and so,
    # against the 32-sequence runs, what each further running sequence adds
    alone = {rng: best_of(repeats, lambda: run_overhead(model, requests, 1, rng=rng)) for rng in ("torch", "counter")}
    per_step = {rng: per_step_cost(alone[rng], full, batch) for rng, full in (("torch", overhead), ("counter", counter))}
    # hidden, layers: on a GPU about Qwen3-0.6B's size (0.8B parameters here), where nano-vllm reports its 1.1x
    wide_shape = (256, 4) if args.quick else (2048, 16) if args.device == "cuda" else (512, 8)
    wide = wider(model, *wide_shape)
    overhead_wide = best_of(min(repeats, 3), lambda: run_overhead(wide, requests, batch, rng="torch"))
    counter_wide = best_of(min(repeats, 3), lambda: run_overhead(wide, requests, batch, rng="counter"))
    for o in (overhead_wide, counter_wide):
        o.update(hidden=wide_shape[0], layers=wide_shape[1], parameters=sum(p.numel() for p in wide.parameters()),
                 dtype=str(next(wide.parameters()).dtype).removeprefix("torch."))
    prefix = run_prefix(model, 16 if args.quick else 64, 96, args.seed)
    sharing = run_sharing(model, 192, 16 if args.quick else 48, args.seed)
    results = {"date": datetime.date.today().isoformat(), "library_commit": library_commit(),
               "model": model_name, "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
               "device": args.device, "quick": args.quick, "threads": args.threads,
               "repeats": repeats,
               "torch": torch.__version__,
               "default_rng": DEFAULT_RNG,
               "requests": len(requests), "batch": batch, "engine": engine, "engine_triton": kernel,
               "kv_utilization_by_block_size": utilization_by_block_size, "chat_lengths": chat,
               "static_generate": static,
               "generate_batch": cont, "engine_overhead": overhead,
               "engine_overhead_unseeded": overhead_unseeded, "engine_overhead_wider_model": overhead_wide,
               "engine_overhead_counter": counter, "engine_overhead_counter_unseeded": counter_unseeded,
               "engine_overhead_counter_wider_model": counter_wide,
               "engine_overhead_one_sequence": alone["torch"], "engine_overhead_counter_one_sequence": alone["counter"],
               "engine_cost_per_step": per_step,
               "prefix_caching": prefix, "n4_sharing": sharing,
               "speedup_vs_static": engine["tokens_per_s"] / static["tokens_per_s"]}
    rows = [
        ("model", model_name),
        ("workload", f"{len(requests)} requests, prompts {min(len(p) for p, _ in requests)}-"
                     f"{max(len(p) for p, _ in requests)} tokens, outputs {min(o for _, o in requests)}-"
                     f"{max(o for _, o in requests)} tokens (log-normal)"),
        ("KV utilization, paged engine", ", ".join(f"{u:.1%} (block size {size})" for size, u in
                                                   sorted(utilization_by_block_size.items())) + "  (target >= 95%)"),
        ("KV utilization, reserve max length", f"{engine['kv_utilization_reserve_max_len']:.1%}"),
        ("chat-length workload", f"{chat['mean_prompt_tokens']:.0f} prompt + {chat['mean_output_tokens']:.0f} output "
                                 f"tokens on average, context {chat['max_model_len']}"),
        ("  KV utilization, paged engine (block 16)", f"{chat['kv_utilization_paged']:.1%}  (target >= 95%)"),
        ("  KV utilization, reserve max length", f"{chat['kv_utilization_reserve_max_len']:.1%}"),
        ("Engine tokens/s", f"{engine['tokens_per_s']:.0f}  ({engine['steps']} steps)"),
        *([("Engine tokens/s, attention='triton'", f"{kernel['tokens_per_s']:.0f}")] if kernel else []),
        ("transformers generate, static batches, tokens/s", f"{static['tokens_per_s']:.0f}"),
        ("transformers generate_batch, tokens/s", f"{cont['tokens_per_s']:.0f}  ({cont['note']})"
         if "tokens_per_s" in cont else cont["error"]),
        *([("  Engine under the same limits, tokens/s", f"{cont['engine_same_limits_tokens_per_s']:.0f}  "
                                                     f"({cont['engine_vs_generate_batch']:.2f}x generate_batch; "
                                                     f"same tokens: {cont['same_tokens']})")]
          if "tokens_per_s" in cont else []),
        ("Engine / static generate", f"{results['speedup_vs_static']:.2f}x  (target >= 2x)"),
        *[(f"Engine wall time / time in the model's forward, {label}",
           f"{o['wall_over_forward']:.2f}x  ({goal}; " + ", ".join(f"{k} {v:.0%}" for k, v in o["shares"].items())
           + f" of wall; {o['overhead_us_per_step']:.0f} us per step beside a {o['forward_us_per_step']:.0f} us "
             f"forward; {o['wall_over_forward_without_noise']:.2f}x without the noise)")
          for label, o, goal in (
              ("seeded, rng='torch'", overhead, "goal <= 1.1x"),
              ("unseeded, rng='torch'", overhead_unseeded, "goal <= 300 us per step"),
              (f"seeded, rng='torch', random Llama hidden {wide_shape[0]} x {wide_shape[1]} layers "
               f"({overhead_wide['parameters'] / 1e6:.0f}M parameters)", overhead_wide, "goal <= 1.02x at 25M"),
              ("seeded, rng='counter'", counter, "goal <= 1.1x"),
              ("unseeded, rng='counter'", counter_unseeded, "goal <= 300 us per step"),
              ("seeded, rng='counter', the random Llama", counter_wide, "goal <= 1.02x at 25M"))],
        *[(f"Engine cost per step, seeded, rng={rng!r}",
           f"{c['one_sequence_us']:.0f} us with one running sequence (the draw {c['one_sequence_sample_us']:.0f} us of "
           f"it), {c['full_batch_us']:.0f} us with up to {batch} ({c['rows_per_step']:.1f} rows drawn per step): "
           f"about {c['fixed_us']:.0f} us per step and {c['per_row_us']:.1f} us per row")
          for rng, c in per_step.items()],
        ("prefix caching: prefill tokens", f"{prefix['without_cache']['prefill_tokens']} -> "
                                           f"{prefix['with_cache']['prefill_tokens']}, saved {prefix['prefill_saved']:.1%}, "
                                           f"same outputs: {prefix['same_outputs']}"),
        ("n = 4 samples: peak KV blocks", f"{sharing['peak_blocks_separate']} separate -> {sharing['peak_blocks_shared']} "
                                          f"shared, saved {sharing['blocks_saved']:.1%}  (target >= 50%)"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    out = args.out or (RESULTS.with_name("serving-quick.json") if args.quick else RESULTS)  # smoke runs keep the real figures
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
