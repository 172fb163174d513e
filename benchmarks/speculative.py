"""Speculative sampling benchmark: acceptance, tokens per target forward and wall-clock speed-up against gamma.

Target tiny-zh-doc (4 layers, hidden 128); drafts: tiny-zh-doc-small (2 layers, hidden 64, same documents) and the
n-gram prompt-lookup draft (max n 3). Each prompt is a document's first sentence ("这是{P}在{CITY}的一天。", 12
documents of `DocumentLanguage`, seed 7); every run samples at temperature 1 with its own seed and stops at EOS or
after `--tokens` tokens. For gamma in {1, 2, 3, 4, 6, 8} it reports:

  - acceptance rate: kept drafts / judged drafts (a rejection ends a round, so later drafts are never judged);
  - alpha: the theory's acceptance rate on the same positions, the mean of 1 - TV(p, q) = sum min(p, q);
  - tokens per target forward, measured, next to the theory's (1 - alpha^(gamma+1)) / (1 - alpha), which assumes
    gamma drafts every round (the n-gram draft proposes fewer when its match is short or absent);
  - wall-clock ms per token of speculative_generate and of plain `generate` on the same prompts and seeds, and the
    speed-up. A CPU figure at `--threads` threads: with these tiny models a draft forward costs about half a target
    forward (the ratio c is measured and printed), far from the small c that makes speculation pay on a GPU.

The acceptance figures depend only on the seeds, not on the machine; the times do.

`--engine` measures speculation inside the continuous-batching `Engine` instead (`decodelab.engine.speculation`):
16 document openings in one batch, temperature 0 and 1, gamma in {2, 4, 6}, the same two drafts. Per row: acceptance
and alpha as above, drafts per round and tokens per target forward (a round is one sequence in one decode step; the
target runs one batched forward a step), the theory's (1 - alpha^(gamma+1)) / (1 - alpha), engine steps, and
wall-clock tokens/s of the batch with and without speculation, timed in turn `--repeats` times, the fastest kept.
CPU figures at `--threads` threads.

    python benchmarks/speculative.py [--quick] [--engine] [--tokens N] [--threads N] [--out PATH]

Prints a markdown table and writes benchmarks/results/speculative.json (speculative-engine.json with `--engine`).
Taught in: chapters/07b-speculative-decoding.ipynb
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from decodelab.engine import Engine
from decodelab.decoding.generate import generate, model_step
from decodelab.models import load_model
from decodelab.sampling import SamplingParams
from decodelab.decoding.speculative import ModelDraft, NgramDraft, speculative_generate
from decodelab.engine.speculation import SpeculativeConfig
from decodelab.toy import DocumentLanguage

RESULTS = Path(__file__).parent / "results" / "speculative.json"
ENGINE_RESULTS = Path(__file__).parent / "results" / "speculative-engine.json"
GAMMAS = (1, 2, 3, 4, 6, 8)
ENGINE_GAMMAS = (2, 4, 6)
ENGINE_TEMPERATURES = (0.0, 1.0)


def prompts(count: int) -> list[str]:
    return [doc[:doc.index("。") + 1] for doc in DocumentLanguage().sample(count, seed=7)]


def theory_tokens_per_forward(alpha: float, gamma: int) -> float:
    """Expected tokens per target forward with gamma drafts a round, each kept with probability alpha."""
    return gamma + 1.0 if alpha >= 1.0 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


@torch.no_grad()
def forward_ms(model, steps: int = 40) -> float:
    """Median ms of one decode step (one new token over a 64-token cache)."""
    _, cache = model_step(model, torch.arange(3, 67).unsqueeze(0))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        model_step(model, torch.tensor([[5]]), cache)
        times.append(time.perf_counter() - start)
        cache.crop(-1)
    return sorted(times)[len(times) // 2] * 1e3


def measure(target, tokenizer, drafts: dict, gammas, texts: list[str], tokens: int) -> list[dict]:
    """One row per (draft, gamma): acceptance, alpha, tokens per target forward (measured and theory) and ms per
    token of speculative and plain generation, the two timed in turn on each prompt so load changes hit both."""
    rows = []
    for name, draft in drafts.items():
        for gamma in gammas:
            kept = judged = proposed = forwards = made = plain_made = 0
            beta_sum = spec_s = plain_s = 0.0
            for seed, text in enumerate(texts):
                params = SamplingParams(seed=seed, max_tokens=tokens)
                start = time.perf_counter()
                plain_made += len(generate(target, tokenizer, text, params)[0].token_ids)
                plain_s += time.perf_counter() - start
                start = time.perf_counter()
                result = speculative_generate(target, tokenizer, text, params, draft, gamma)
                spec_s += time.perf_counter() - start
                kept, judged, proposed = kept + result.accepted, judged + result.judged, proposed + result.proposed
                beta_sum += sum(sum(r.acceptance_probs) for r in result.rounds)
                forwards, made = forwards + result.target_forwards, made + len(result.token_ids)
            alpha = beta_sum / judged
            spec_ms, plain_ms = spec_s * 1e3 / made, plain_s * 1e3 / plain_made
            rows.append({
                "draft": name, "gamma": gamma, "acceptance_rate": kept / judged, "alpha": alpha,
                "accepted_per_proposed": kept / proposed if proposed else 0.0,
                "drafts_per_round": proposed / forwards, "tokens_per_target_forward": made / forwards,
                "theory_tokens_per_target_forward": theory_tokens_per_forward(alpha, gamma), "tokens": made,
                "spec_ms_per_token": spec_ms, "plain_ms_per_token": plain_ms, "speedup": plain_ms / spec_ms,
            })
    return rows


def timed_engine(target, tokenizer, texts: list[str], params: list[SamplingParams],
                 speculative: SpeculativeConfig | None) -> tuple[float, int, Engine]:
    """Seconds to serve the whole batch on a fresh engine, the tokens it made, and the engine (for its stats)."""
    engine = Engine(target, tokenizer, speculative=speculative)
    start = time.perf_counter()
    outputs = engine.generate(texts, params)
    return time.perf_counter() - start, sum(len(o.token_ids) for o in outputs), engine


def measure_engine(target, tokenizer, drafts: dict, gammas, texts: list[str], tokens: int, temperatures,
                   repeats: int) -> list[dict]:
    """One row per (temperature, draft, gamma): the batch served by Engine with that speculation and without it,
    `repeats` times each, in turn so load changes hit both, the fastest run of each kept (the least disturbed by
    other jobs); acceptance, alpha and tokens per target forward from the engine's stats (the same every repeat)."""
    rows = []
    for temperature in temperatures:
        params = [SamplingParams(temperature=temperature, seed=seed, max_tokens=tokens) for seed in range(len(texts))]
        for name, draft in drafts.items():
            for gamma in gammas:
                plain_times, spec_times = [], []
                for _ in range(repeats):
                    seconds, plain_made, plain = timed_engine(target, tokenizer, texts, params, None)
                    plain_times.append(seconds)
                    seconds, made, engine = timed_engine(target, tokenizer, texts, params,
                                                         SpeculativeConfig(draft, gamma))
                    spec_times.append(seconds)
                plain_s, spec_s = min(plain_times), min(spec_times)
                stats = engine.stats.speculative
                alpha = stats.expected_acceptance
                rows.append({
                    "temperature": temperature, "draft": name, "gamma": gamma,
                    "acceptance_rate": stats.acceptance_rate, "alpha": alpha,
                    "drafts_per_round": stats.drafted / stats.rounds,
                    "tokens_per_target_forward": stats.tokens_per_target_forward,
                    "theory_tokens_per_target_forward": theory_tokens_per_forward(alpha, gamma),
                    "tokens": made, "plain_tokens": plain_made, "steps": engine.stats.steps,
                    "plain_steps": plain.stats.steps, "spec_tokens_per_s": made / spec_s,
                    "plain_tokens_per_s": plain_made / plain_s, "speedup": (made / spec_s) / (plain_made / plain_s),
                    "spec_seconds": spec_times, "plain_seconds": plain_times,
                })
    return rows


def print_engine_table(rows: list[dict], num_prompts: int, threads: int) -> None:
    print(f"Engine, {num_prompts} prompts in one batch: CPU figures, {threads} thread(s)")
    print("| T | draft | gamma | acceptance | alpha = E[1-TV] | drafts/round | tokens/target fwd | theory | "
          "engine steps (plain) | spec tok/s | plain tok/s | speed-up |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['temperature']:g} | {row['draft']} | {row['gamma']} | {row['acceptance_rate']:.3f} | "
              f"{row['alpha']:.3f} | {row['drafts_per_round']:.2f} | {row['tokens_per_target_forward']:.2f} | "
              f"{row['theory_tokens_per_target_forward']:.2f} | {row['steps']} ({row['plain_steps']}) | "
              f"{row['spec_tokens_per_s']:.0f} | {row['plain_tokens_per_s']:.0f} | {row['speedup']:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="3 prompts, 32 tokens, gamma in {1, 4} ({4} with --engine)")
    parser.add_argument("--engine", action="store_true", help="speculation inside Engine, 16 prompts in one batch")
    parser.add_argument("--tokens", type=int, default=128, help="max_tokens of each run (default 128)")
    parser.add_argument("--repeats", type=int, default=7, help="with --engine: timed runs per row, fastest kept "
                                                                  "(default 7)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--out", type=Path, help="where the JSON goes (default results/speculative.json, "
                                                 "results/speculative-engine.json with --engine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load_model("tiny-zh-doc", device="cpu")
    small = load_model("tiny-zh-doc-small", device="cpu")[0]
    tokens = 32 if args.quick else args.tokens
    cost_ratio = forward_ms(small) / forward_ms(target)
    if args.engine:
        main_engine(args, target, tokenizer, small, tokens, cost_ratio)
        return
    texts = prompts(3 if args.quick else 12)
    gammas = (1, 4) if args.quick else GAMMAS
    rows = measure(target, tokenizer, {"tiny-zh-doc-small": ModelDraft(small), "n-gram (max n 3)": NgramDraft()},
                   gammas, texts, tokens)
    print(f"CPU, {args.threads} thread(s); draft/target cost per decode forward c = {cost_ratio:.2f}")
    print("| draft | gamma | acceptance | alpha = E[1-TV] | drafts/round | tokens/target fwd | theory | "
          "spec ms/tok | plain ms/tok | speed-up |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['draft']} | {row['gamma']} | {row['acceptance_rate']:.3f} | {row['alpha']:.3f} | "
              f"{row['drafts_per_round']:.2f} | {row['tokens_per_target_forward']:.2f} | "
              f"{row['theory_tokens_per_target_forward']:.2f} | {row['spec_ms_per_token']:.2f} | "
              f"{row['plain_ms_per_token']:.2f} | {row['speedup']:.2f}x |")
    out = args.out or RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "target": "tiny-zh-doc (shipped)", "device": "cpu", "threads": args.threads, "quick": args.quick,
        "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
        "prompts": texts, "max_tokens": tokens, "temperature": 1.0, "draft_cost_ratio": cost_ratio, "rows": rows,
    }, ensure_ascii=False, indent=1))
    print(f"wrote {out}")


def main_engine(args, target, tokenizer, small, tokens: int, cost_ratio: float) -> None:
    texts = prompts(3 if args.quick else 16)
    gammas = (4,) if args.quick else ENGINE_GAMMAS
    repeats = 1 if args.quick else args.repeats
    rows = measure_engine(target, tokenizer, {"tiny-zh-doc-small": small, "n-gram (max n 3)": NgramDraft()}, gammas,
                          texts, tokens, ENGINE_TEMPERATURES, repeats)
    print(f"CPU, {args.threads} thread(s); draft/target cost per decode forward c = {cost_ratio:.2f}")
    print_engine_table(rows, len(texts), args.threads)
    out = args.out or ENGINE_RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "target": "tiny-zh-doc (shipped)", "mode": "engine", "device": "cpu", "threads": args.threads,
        "note": "CPU figures: wall-clock rates are the fastest of `repeats` runs on a CPU shared with other jobs; "
                "acceptance, alpha and tokens per target forward depend only on the seeds", "repeats": repeats,
        "quick": args.quick, "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
        "prompts": texts, "max_tokens": tokens, "temperatures": list(ENGINE_TEMPERATURES),
        "draft_cost_ratio": cost_ratio, "rows": rows,
    }, ensure_ascii=False, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
