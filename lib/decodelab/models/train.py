"""Train the course's shipped models on text sampled from the toy languages: `python -m decodelab.models.train --model NAME`.

- `tiny-zh`: single sentences of `ToyLanguage`, context 256.
- `tiny-zh-doc`: whole documents of `DocumentLanguage` (paragraphs of 150+ characters with a protagonist), context 512.

Each step draws a fresh batch `<s> text </s>` from the language (no text is seen twice on purpose), trains a
small `LlamaForCausalLM` with grouped-query attention, then measures held-out cross-entropy against the exact
entropy rate and the validity of greedy and sampled texts, and writes weights, tokenizer, config and a model
card with those measured numbers.

Taught in: chapters/00-intro.md (where the course's models come from)
"""
from __future__ import annotations

import argparse
import math
import os
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from decodelab.models.tokenizer import build_tokenizer
from decodelab.toy.sentences import ToyLanguage
from decodelab.toy.documents import DocumentLanguage

ASSETS = Path(__file__).parent / "assets"
HELDOUT_SEED = 1_000_000_007  # training batches use seeds seed * 1_000_000 + step, never this one
EVAL_PROMPTS = {"sentences": ("小明", "今天，", "因为", "床前", "祝"),
                "documents": ("这是小明在北京的一天。", "这是王奶奶在成都的一天。", "这是新来的同学在拉萨的一天。今天，")}


@dataclass(frozen=True)
class TrainParams:
    """Hyper-parameters of one training; `corpus` is "sentences" (ToyLanguage) or "documents"."""

    steps: int = 2000
    seed: int = 0
    batch_size: int = 64
    lr: float = 3e-3
    warmup: int = 100
    hidden: int = 128
    layers: int = 4
    corpus: str = "sentences"
    context: int = 256
    # Scheduled sampling: the probability, at the last step, that an input character is replaced by the model's own
    # sample (it rises linearly from 0); 0 trains on the data alone (teacher forcing).
    scheduled_sampling: float = 0.0

    def __post_init__(self) -> None:
        p = self.scheduled_sampling
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ValueError(f"scheduled_sampling must be a probability in [0, 1], got {p!r}")

    def replace_probability(self, step: int) -> float:
        """Scheduled sampling's replacement probability at `step` (0-based): scheduled_sampling * step / steps."""
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < self.steps:
            raise ValueError(f"step must be an int in [0, {self.steps}), got {step!r}")
        return self.scheduled_sampling * step / self.steps


# The shipped models and the runs that made them.
PRESETS: dict[str, TrainParams] = {
    "tiny-zh": TrainParams(),
    "tiny-zh-doc": TrainParams(steps=2400, batch_size=16, lr=3e-3, corpus="documents", context=512),
    # Fewer parameters (2 layers, hidden 64) and a quarter of the data: a model with real errors to study
    # (chapters/05-exposure-bias.ipynb); scripts/ch05_train_dagger.py trains its mitigated twin at equal compute.
    "tiny-zh-doc-small": TrainParams(steps=600, batch_size=16, lr=3e-3, hidden=64, layers=2, corpus="documents",
                                     context=512),
    # The same network on four times the data (tiny-zh-doc's 2,400 steps of 16 documents): coverage alone, without
    # tiny-zh-doc's 7x parameters (chapters/05-exposure-bias.ipynb, the controlled mitigations).
    "tiny-zh-doc-small-4xdata": TrainParams(steps=2400, batch_size=16, lr=3e-3, hidden=64, layers=2,
                                            corpus="documents", context=512),
    # The same network, data and steps as tiny-zh-doc-small, with scheduled sampling (Bengio et al., 2015): up to a
    # quarter of the input characters are the model's own samples by the last step (chapters/05-exposure-bias.ipynb).
    "tiny-zh-doc-small-scheduled": TrainParams(steps=600, batch_size=16, lr=3e-3, hidden=64, layers=2,
                                               corpus="documents", context=512, scheduled_sampling=0.25),
}


def language(params: TrainParams) -> ToyLanguage | DocumentLanguage:
    """The true language a training samples its corpus from."""
    if params.corpus not in ("sentences", "documents"):
        raise ValueError(f"corpus must be 'sentences' or 'documents', got {params.corpus!r}")
    return ToyLanguage() if params.corpus == "sentences" else DocumentLanguage()


def model_config(vocab_size: int, params: TrainParams) -> LlamaConfig:
    """The tiny Llama: 4 query heads share 2 KV heads (GQA), RoPE positions, tied embeddings."""
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=params.hidden, intermediate_size=3 * params.hidden,
        num_hidden_layers=params.layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=params.context, bos_token_id=1, eos_token_id=2, pad_token_id=0,
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
                   do_sample: bool, seed: int = 0, max_new_tokens: int = 48) -> list[str]:
    """`n` completions of `prompt` (prompt included), greedy or pure sampling at temperature 1."""
    torch.manual_seed(seed)
    enc = tokenizer([prompt] * n, return_tensors="pt")
    # top_k=0 switches off transformers' default top_k=50, so sampling is pure ancestral sampling at T=1
    sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if do_sample else {"do_sample": False}
    out = model.generate(**enc, **sampling, max_new_tokens=max_new_tokens)
    return [prompt + tokenizer.decode(row[enc["input_ids"].shape[1]:], skip_special_tokens=True) for row in out]


@torch.no_grad()
def scheduled_inputs(model: LlamaForCausalLM, ids: torch.Tensor, labels: torch.Tensor, probability: float,
                     special_ids: list[int], generator: torch.Generator) -> torch.Tensor:
    """Scheduled sampling's inputs: each character of `ids` [B, T] after `<s>` replaced, with `probability`, by a
    character the model samples (temperature 1, special tokens excluded) for that position. The labels stay the data's.

    The form for transformers (Mihaylova & Martins, 2019): one extra forward pass without gradients on the true
    prefix gives every position's sample at once, so a replaced character is drawn given the true characters before
    it, not the earlier replaced ones as in Bengio et al. (2015)'s sequential recipe.
    Taught in: chapters/05-exposure-bias.ipynb
    """
    if ids.shape != labels.shape or ids.dim() != 2:
        raise ValueError(f"ids and labels must be [B, T] of one shape, got {tuple(ids.shape)} and {tuple(labels.shape)}")
    if isinstance(probability, bool) or not isinstance(probability, (int, float)) or not 0.0 <= probability <= 1.0:
        raise ValueError(f"probability must be in [0, 1], got {probability!r}")
    if probability == 0.0:
        return ids
    logits = model(input_ids=ids, attention_mask=(labels != -100).long()).logits.float()[:, :-1]  # [B, T - 1, V]
    logits[..., special_ids] = float("-inf")
    probs = torch.softmax(logits, dim=-1)  # [B, T - 1, V]: the prediction for position t + 1
    drawn = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator).view(probs.shape[:2])
    character = (labels[:, 1:] != -100) & ~torch.isin(ids[:, 1:], torch.tensor(special_ids))  # [B, T - 1]
    replace = (torch.rand(drawn.shape, generator=generator) < probability) & character
    out = ids.clone()
    out[:, 1:] = torch.where(replace, drawn, ids[:, 1:])
    return out


def evaluate(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, params: TrainParams) -> dict:
    """Held-out cross-entropy vs the truth, and validity rates of greedy and sampled texts."""
    lang = language(params)
    documents = params.corpus == "documents"
    heldout, n_sampled, new_tokens = (400, 50, params.context - 64) if documents else (2000, 200, 48)
    texts = lang.sample(heldout, seed=HELDOUT_SEED)
    true_nll = -sum(lang.log_prob(t) for t in texts) / sum(len(t) + 1 for t in texts)
    metrics = {"heldout_texts": heldout, "model_ce": cross_entropy_per_char(model, tokenizer, texts, batch_size=32),
               "sample_true_ce": true_nll, "entropy_rate": lang.entropy_rate(), "sampled_per_prompt": n_sampled,
               "validity": {}}
    for prompt in ("",) + EVAL_PROMPTS[params.corpus]:
        greedy = generate_texts(model, tokenizer, prompt, 1, do_sample=False, max_new_tokens=new_tokens)[0]
        sampled = generate_texts(model, tokenizer, prompt, n_sampled, do_sample=True, seed=1,
                                 max_new_tokens=new_tokens)
        metrics["validity"][prompt] = {"greedy_text": greedy, "greedy_valid": lang.is_valid(greedy),
                                       "sampled_valid_rate": sum(map(lang.is_valid, sampled)) / len(sampled)}
    return metrics


def model_card(name: str, params: TrainParams, n_params: int, seconds: float, m: dict) -> str:
    """The README.md of the assets, written from measured numbers."""
    gap = m["model_ce"] - m["entropy_rate"]
    rows = "\n".join(
        f"| {p or '(empty)'} | {_shorten(v['greedy_text'])} | {'yes' if v['greedy_valid'] else 'no'} | "
        f"{v['sampled_valid_rate']:.1%} |" for p, v in m["validity"].items())
    documents = params.corpus == "documents"
    source = ("documents of the course's toy language (`decodelab.toy.documents.DocumentLanguage`: paragraphs of "
              "150+ characters whose sentences share a protagonist)" if documents else
              "the course's toy language (`decodelab.toy.sentences.ToyLanguage`)")
    unit = "documents" if documents else "sentences"
    return f"""# {name}

A tiny character-level `LlamaForCausalLM` trained on {source},
whose exact next-character distribution is known, so every decoding experiment can be compared with the truth.
Written by `python -m decodelab.models.train --model {name}`; all numbers below are measured by that script.

## Model
- {n_params:,} parameters; {params.layers} layers, hidden size {params.hidden}, 4 query heads sharing 2 KV heads
  (grouped-query attention), RoPE, tied input/output embeddings, context {params.context} tokens; vocabulary of one
  token per character plus `<pad>`=0, `<s>`=1, `</s>`=2, `<unk>`=3.
- Input format `<s> text </s>`; the tokenizer prepends `<s>` and adds no `</s>`.

## Data and training
- {params.steps} steps of {params.batch_size} {unit} freshly sampled from the toy language
  ({params.steps * params.batch_size:,} {unit}), AdamW, peak learning rate {params.lr}, cosine decay.
- Training time: {seconds / 60:.1f} min on {torch.get_num_threads()} CPU thread(s) of a {os.cpu_count()}-core machine
  shared with other jobs.
{_scheduled_line(params)}
## Quality (held-out sample of {m['heldout_texts']} {unit}, seed {HELDOUT_SEED})
| measure | nats per character |
|---|---|
| model cross-entropy | {m['model_ce']:.4f} |
| true entropy rate of the language | {m['entropy_rate']:.4f} |
| gap (model − entropy rate) | {gap:.4f} |
| true −log P per character on the same sample | {m['sample_true_ce']:.4f} |

Validity of generated texts under the grammar (greedy: one text; sampled: {m['sampled_per_prompt']} texts at
temperature 1, no top-k/top-p; a text cut off by the length limit counts as invalid):

| prompt | greedy text | greedy valid | sampled valid |
|---|---|---|---|
{rows}

## Use
```python
from decodelab.models.load import load_model
model, tokenizer = load_model("{name}")
```
`generation_config.json` sets only the special tokens, so `model.generate(do_sample=True)` applies transformers'
default `top_k=50`; pass `top_k=0` for pure sampling.
"""


def _scheduled_line(params: TrainParams) -> str:
    """The model card's line on scheduled sampling (empty without it)."""
    if not params.scheduled_sampling:
        return ""
    return (f"- Scheduled sampling (Bengio et al., 2015, in the two-pass form for transformers, `scheduled_inputs`): "
            f"each input character\n  after `<s>` is the model's own sample (temperature 1) with a probability that "
            f"rises linearly from 0 to\n  {params.scheduled_sampling} over the steps; the targets stay the documents' "
            f"characters. One extra forward pass per step.\n")


def _shorten(text: str, limit: int = 80) -> str:
    """`text` cut to `limit` characters with the count of the rest, for the model card's table."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def length_buckets(lang: ToyLanguage | DocumentLanguage, params: TrainParams, step: int, group: int = 8) -> list[list[str]]:
    """`group` fresh batches of texts of similar length (less padding), in a seeded random order."""
    texts = sorted(lang.sample(group * params.batch_size, seed=params.seed * 1_000_000 + step), key=len)
    batches = [texts[i:i + params.batch_size] for i in range(0, len(texts), params.batch_size)]
    random.Random(step).shuffle(batches)
    return batches


@dataclass
class TrainingState:
    """What one training holds: language, tokenizer, model, optimiser and schedule, made the same way for every
    recipe (`train` here, `decodelab.measure.dagger`)."""

    lang: ToyLanguage | DocumentLanguage
    tokenizer: PreTrainedTokenizerBase
    model: LlamaForCausalLM
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LambdaLR

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def update(self, loss: torch.Tensor) -> None:
        """One optimiser step on `loss`: gradients clipped to norm 1, then the learning-rate schedule."""
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.schedule.step()

    def save(self, out: Path, card: str) -> None:
        """Weights, tokenizer, config and the model card `card` into `out`."""
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        (out / "README.md").write_text(card, encoding="utf-8")


def start_training(params: TrainParams) -> TrainingState:
    """Seed, then the language, tokenizer, a fresh model, AdamW and the warm-up + cosine schedule of `params`."""
    if params.steps < 1:
        raise ValueError(f"steps must be >= 1, got {params.steps}")
    torch.manual_seed(params.seed)
    lang = language(params)
    tokenizer = build_tokenizer(lang.alphabet, model_max_length=params.context)
    model = LlamaForCausalLM(model_config(len(tokenizer), params))
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0, do_sample=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=params.lr, weight_decay=0.01, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / params.warmup) * (
        0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / params.steps)))))
    return TrainingState(lang, tokenizer, model, optimizer, schedule)


def train(name: str, params: TrainParams, out: Path) -> dict:
    """Train, evaluate and save the model `name` to `out`; returns the metrics."""
    training = start_training(params)
    start = time.time()
    training.model.train()
    bar = tqdm(range(params.steps), desc=f"train {name}", mininterval=5)
    batches: list[list[str]] = []
    generator = torch.Generator().manual_seed(params.seed * 1_000_000 + 700_000)  # scheduled sampling's draws
    for step in bar:
        if not batches:
            batches = length_buckets(training.lang, params, step)
        ids, labels = encode_batch(training.tokenizer, batches.pop())
        if params.scheduled_sampling:
            ids = scheduled_inputs(training.model, ids, labels, params.replace_probability(step),
                                   training.tokenizer.all_special_ids, generator)
        loss = training.model(input_ids=ids, attention_mask=(labels != -100).long(), labels=labels).loss
        training.update(loss)
        if step % 50 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    seconds = time.time() - start
    training.model.eval()
    metrics = evaluate(training.model, training.tokenizer, params)
    training.save(out, model_card(name, params, training.num_parameters, seconds, metrics))
    return metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(PRESETS), default="tiny-zh", help="which shipped model to train")
    parser.add_argument("--steps", type=int, help="override the preset's number of steps")
    parser.add_argument("--seed", type=int, help="override the preset's seed")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads; 1 degrades least when the cores are shared")
    parser.add_argument("--out", type=Path, help="output folder (default: the shipped assets of --model)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    overrides = {k: v for k, v in (("steps", args.steps), ("seed", args.seed)) if v is not None}
    params = replace(PRESETS[args.model], **overrides)
    metrics = train(args.model, params, args.out or ASSETS / args.model)
    print(f"held-out CE {metrics['model_ce']:.4f} nats/char, entropy rate {metrics['entropy_rate']:.4f}, "
          f"gap {metrics['model_ce'] - metrics['entropy_rate']:.4f}")


if __name__ == "__main__":
    main()
