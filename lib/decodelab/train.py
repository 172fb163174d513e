"""Train the shipped tiny-zh model on sentences sampled from the toy language: `python -m decodelab.train`.

Each step draws a fresh batch `<s> text </s>` from `ToyLanguage` (no sentence is seen twice on purpose), trains a
small `LlamaForCausalLM` with grouped-query attention, then measures held-out cross-entropy against the exact
entropy rate and the validity of greedy and sampled texts, and writes weights, tokenizer, config and a model
card with those measured numbers.

Taught in: chapters/00-intro.md (where the course's model comes from)
"""
from __future__ import annotations

import argparse
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from decodelab.tokenizer import build_tokenizer
from decodelab.toylang import ToyLanguage

ASSETS = Path(__file__).parent / "assets" / "tiny-zh"
HELDOUT_SEED = 1_000_000_007  # training batches use seeds seed * 1_000_000 + step, never this one
EVAL_PROMPTS = ("小明", "今天，", "因为", "床前", "祝")


@dataclass(frozen=True)
class TrainParams:
    """Hyper-parameters of one training run."""

    steps: int = 2000
    seed: int = 0
    batch_size: int = 64
    lr: float = 3e-3
    warmup: int = 100
    hidden: int = 128
    layers: int = 4


def model_config(vocab_size: int, params: TrainParams) -> LlamaConfig:
    """The tiny Llama: 4 query heads share 2 KV heads (GQA), RoPE positions, tied embeddings."""
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=params.hidden, intermediate_size=3 * params.hidden,
        num_hidden_layers=params.layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        tie_word_embeddings=True, attn_implementation="sdpa")


def encode_batch(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """`<s> text </s>` rows, right-padded: input ids [B, T] and labels [B, T] (-100 on padding)."""
    rows = [tokenizer(t)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)  # [B, T]
    labels = torch.full((len(rows), width), -100, dtype=torch.long)  # [B, T]
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        labels[i, :len(r)] = torch.tensor(r)
    return ids, labels


@torch.no_grad()
def cross_entropy_per_char(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, texts: list[str],
                           batch_size: int = 128) -> float:
    """Model cross-entropy in nats per predicted token (every character and the end), summed over `texts`."""
    total, count = 0.0, 0
    for i in range(0, len(texts), batch_size):
        ids, labels = encode_batch(tokenizer, texts[i:i + batch_size])
        logits = model(input_ids=ids, attention_mask=(labels != -100).long()).logits.float()  # [B, T, V]
        nll = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), reduction="sum")
        total += nll.item()
        count += int((labels[:, 1:] != -100).sum())
    return total / count


@torch.no_grad()
def generate_texts(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, prompt: str, n: int,
                   do_sample: bool, seed: int = 0) -> list[str]:
    """`n` completions of `prompt` (prompt included), greedy or pure sampling at temperature 1."""
    torch.manual_seed(seed)
    enc = tokenizer([prompt] * n, return_tensors="pt")
    # top_k=0 switches off transformers' default top_k=50, so sampling is pure ancestral sampling at T=1
    sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if do_sample else {"do_sample": False}
    out = model.generate(**enc, **sampling, max_new_tokens=48)
    return [prompt + tokenizer.decode(row[enc["input_ids"].shape[1]:], skip_special_tokens=True) for row in out]


def evaluate(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, lang: ToyLanguage,
             heldout: int = 2000) -> dict:
    """Held-out cross-entropy vs the truth, and validity rates of greedy and sampled texts."""
    texts = lang.sample(heldout, seed=HELDOUT_SEED)
    true_nll = -sum(lang.log_prob(t) for t in texts) / sum(len(t) + 1 for t in texts)
    metrics = {"heldout_sentences": heldout, "model_ce": cross_entropy_per_char(model, tokenizer, texts),
               "sample_true_ce": true_nll, "entropy_rate": lang.entropy_rate(), "validity": {}}
    for prompt in ("",) + EVAL_PROMPTS:
        greedy = generate_texts(model, tokenizer, prompt, 1, do_sample=False)[0]
        sampled = generate_texts(model, tokenizer, prompt, 200, do_sample=True, seed=1)
        metrics["validity"][prompt] = {"greedy_text": greedy, "greedy_valid": lang.is_valid(greedy),
                                       "sampled_valid_rate": sum(map(lang.is_valid, sampled)) / len(sampled)}
    return metrics


def model_card(params: TrainParams, n_params: int, seconds: float, m: dict) -> str:
    """The README.md of the assets, written from measured numbers."""
    gap = m["model_ce"] - m["entropy_rate"]
    rows = "\n".join(
        f"| {p or '(empty)'} | {v['greedy_text']} | {'yes' if v['greedy_valid'] else 'no'} | "
        f"{v['sampled_valid_rate']:.1%} |" for p, v in m["validity"].items())
    return f"""# tiny-zh

A tiny character-level `LlamaForCausalLM` trained on the course's toy language (`decodelab.toylang.ToyLanguage`),
whose exact next-character distribution is known, so every decoding experiment can be compared with the truth.
Written by `python -m decodelab.train --steps {params.steps} --seed {params.seed}`; all numbers below are measured by
that script.

## Model
- {n_params:,} parameters; {params.layers} layers, hidden size {params.hidden}, 4 query heads sharing 2 KV heads
  (grouped-query attention), RoPE, tied input/output embeddings; vocabulary of one token per character plus
  `<pad>`=0, `<s>`=1, `</s>`=2, `<unk>`=3.
- Input format `<s> text </s>`; the tokenizer prepends `<s>` and adds no `</s>`.

## Data and training
- {params.steps} steps of {params.batch_size} sentences freshly sampled from the toy language
  ({params.steps * params.batch_size:,} sentences), AdamW, peak learning rate {params.lr}, cosine decay.
- Training time: {seconds / 60:.1f} min on {torch.get_num_threads()} CPU thread(s) of a {os.cpu_count()}-core machine
  shared with other jobs.

## Quality (held-out sample of {m['heldout_sentences']} sentences, seed {HELDOUT_SEED})
| measure | nats per character |
|---|---|
| model cross-entropy | {m['model_ce']:.4f} |
| true entropy rate of the language | {m['entropy_rate']:.4f} |
| gap (model − entropy rate) | {gap:.4f} |
| true −log P per character on the same sample | {m['sample_true_ce']:.4f} |

Validity of generated texts under the grammar (greedy: one text; sampled: 200 texts at temperature 1, no top-k/top-p):

| prompt | greedy text | greedy valid | sampled valid |
|---|---|---|---|
{rows}

## Use
```python
from decodelab.models import load_model
model, tokenizer = load_model("tiny-zh")
```
`generation_config.json` sets only the special tokens, so `model.generate(do_sample=True)` applies transformers'
default `top_k=50`; pass `top_k=0` for pure sampling.
"""


def length_buckets(lang: ToyLanguage, params: TrainParams, step: int, group: int = 8) -> list[list[str]]:
    """`group` fresh batches of sentences of similar length (less padding), in a seeded random order."""
    texts = sorted(lang.sample(group * params.batch_size, seed=params.seed * 1_000_000 + step), key=len)
    batches = [texts[i:i + params.batch_size] for i in range(0, len(texts), params.batch_size)]
    random.Random(step).shuffle(batches)
    return batches


def train(params: TrainParams, out: Path) -> dict:
    """Train, evaluate and save to `out`; returns the metrics."""
    if params.steps < 1:
        raise ValueError(f"steps must be >= 1, got {params.steps}")
    torch.manual_seed(params.seed)
    lang = ToyLanguage()
    tokenizer = build_tokenizer(lang.alphabet)
    model = LlamaForCausalLM(model_config(len(tokenizer), params))
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0, do_sample=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=params.lr, weight_decay=0.01, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / params.warmup) * (
        0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / params.steps)))))
    start = time.time()
    model.train()
    bar = tqdm(range(params.steps), desc="train tiny-zh", mininterval=5)
    batches: list[list[str]] = []
    for step in bar:
        if not batches:
            batches = length_buckets(lang, params, step)
        ids, labels = encode_batch(tokenizer, batches.pop())
        loss = model(input_ids=ids, attention_mask=(labels != -100).long(), labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 50 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    seconds = time.time() - start
    model.eval()
    metrics = evaluate(model, tokenizer, lang)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    n_params = sum(p.numel() for p in model.parameters())
    (out / "README.md").write_text(model_card(params, n_params, seconds, metrics), encoding="utf-8")
    return metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=TrainParams.steps)
    parser.add_argument("--seed", type=int, default=TrainParams.seed)
    parser.add_argument("--batch-size", type=int, default=TrainParams.batch_size)
    parser.add_argument("--lr", type=float, default=TrainParams.lr)
    parser.add_argument("--hidden", type=int, default=TrainParams.hidden)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads; 1 degrades least when the cores are shared")
    parser.add_argument("--out", type=Path, default=ASSETS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    params = TrainParams(steps=args.steps, seed=args.seed, batch_size=args.batch_size, lr=args.lr, hidden=args.hidden)
    metrics = train(params, args.out)
    print(f"held-out CE {metrics['model_ce']:.4f} nats/char, entropy rate {metrics['entropy_rate']:.4f}, "
          f"gap {metrics['model_ce'] - metrics['entropy_rate']:.4f}")


if __name__ == "__main__":
    main()
