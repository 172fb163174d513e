"""Train on the model's own prefixes, labelled by the true language (DAgger), against its twin trained on data only.

`python -m decodelab.measure.dagger --model tiny-zh-doc-small-dagger` trains the same network as the preset
`tiny-zh-doc-small` (`decodelab.models.train.PRESETS`: same size, steps, batch of 16 texts, learning-rate schedule and
initial weights), so the two cost the same number of gradient steps. Four recipes (`RECIPES`), each one change away
from the one before it:

- `soft`: data documents only, but each position is trained on the truth's whole next-character distribution
  (soft targets) instead of the one character the document has: the control, which isolates the labels;
- `dagger-fulldata`: for the first quarter of the steps as `soft`; after that each batch of 16 data documents gets 8
  more rows, the model's own continuations (temperature 1) of the first sentence of a fresh true document, redrawn
  every `REFRESH` steps with the current weights. Every position is labelled by the expert,
  `decodelab.measure.exposure.expert_probs`: the truth after the text with its broken sentences dropped, and "end the
  sentence now" (。) inside a broken one. Against `soft`: the rollouts added, the data kept;
- `dagger-fulldata-noend`: as `dagger-fulldata`, but the positions inside a broken sentence are not trained at all
  (no 。 label): the "end it now" labels removed;
- `dagger`: the own rows take half of the batch of 16 instead of coming on top of it (half the data documents after
  the first quarter), with the 。 labels: against `dagger-fulldata`, the data budget halved.

The rollouts are extra forward passes that the data-only recipes do not pay; the model card gives the wall time.

Taught in: chapters/05-exposure-bias.ipynb
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import LlamaForCausalLM

from decodelab.measure.exposure import continue_texts, expert_probs, judge, token_ids
from decodelab.toy.documents import DocumentLanguage
from decodelab.models.train import ASSETS, PRESETS, TrainParams, evaluate, start_training

BASE = "tiny-zh-doc-small"
REFRESH = 25            # steps between two draws of rollouts
ROLLOUT_TOKENS = 300    # characters a rollout may add to its first sentence


@dataclass(frozen=True)
class Recipe:
    """How a DAgger-style training mixes its batch: `rollouts` trains on the model's own continuations after the
    first quarter of the steps; `replace_data` makes them half of the batch (else they come on top of the full batch of
    data documents); `restart_labels` labels the positions inside a broken sentence with 。 (else they are not
    trained)."""

    rollouts: bool
    replace_data: bool = False
    restart_labels: bool = True

    def __post_init__(self) -> None:
        for field in ("rollouts", "replace_data", "restart_labels"):
            if not isinstance(getattr(self, field), bool):
                raise TypeError(f"{field} must be a bool, got {getattr(self, field)!r}")
        if not self.rollouts and (self.replace_data or not self.restart_labels):
            raise ValueError(f"replace_data and restart_labels only apply with rollouts, got {self}")

    def own_rows(self, params: TrainParams, step: int) -> int:
        """Rollout rows in the batch at `step`: none in the first quarter, else half the batch size."""
        return params.batch_size // 2 if self.rollouts and step >= params.steps // 4 else 0

    def data_rows(self, params: TrainParams, step: int) -> int:
        """Data documents in the batch at `step`: the batch size, less the own rows when they replace data."""
        return params.batch_size - (self.own_rows(params, step) if self.replace_data else 0)


RECIPES = {"tiny-zh-doc-small-soft": Recipe(rollouts=False),
           "tiny-zh-doc-small-dagger": Recipe(rollouts=True, replace_data=True),
           "tiny-zh-doc-small-dagger-fulldata": Recipe(rollouts=True),
           "tiny-zh-doc-small-dagger-fulldata-noend": Recipe(rollouts=True, restart_labels=False)}


@dataclass(frozen=True)
class Batch:
    input_ids: torch.Tensor  # [B, T] `<s> text`, right-padded
    targets: torch.Tensor    # [B, T, V] the expert's distribution over the next token (zeros on padding)


def soft_batch(tokenizer, lang: DocumentLanguage, texts: list[str], restart_labels: bool = True) -> Batch:
    """`<s> text` rows and, at each position t = 0..len(text), the expert's distribution over token t + 1; without
    `restart_labels` the positions inside a broken sentence get no target (zeros: not trained)."""
    if not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError(f"texts must be a non-empty list of str, got {texts!r:.80}")
    width = max(len(t) for t in texts) + 1
    ids = torch.full((len(texts), width), tokenizer.pad_token_id, dtype=torch.long)  # [B, T]
    vocab = dict(zip(lang.alphabet + [lang.EOS], token_ids(tokenizer, lang, lang.alphabet + [lang.EOS])))
    where: list[tuple[int, int, int]] = []
    values: list[float] = []
    for row, text in enumerate(texts):
        ids[row, :len(text) + 1] = torch.tensor(tokenizer(text)["input_ids"])
        for t, step in enumerate(judge(lang, text)):
            if step.status == "broken" and not restart_labels:
                continue
            for token, p in expert_probs(lang, step, t).items():
                where.append((row, t, vocab[token]))
                values.append(p)
    targets = torch.zeros((len(texts), width, len(tokenizer)))  # [B, T, V]
    targets[tuple(torch.tensor(where).T)] = torch.tensor(values)
    return Batch(ids, targets)


def soft_loss(model: LlamaForCausalLM, batch: Batch) -> torch.Tensor:
    """Cross-entropy against the expert's distributions, nats per labelled position."""
    mask = batch.targets.sum(-1) > 0  # [B, T]
    logits = model(input_ids=batch.input_ids, attention_mask=(batch.input_ids != 0).long()).logits  # [B, T, V]
    nll = -(batch.targets * torch.log_softmax(logits.float(), dim=-1)).sum(-1)  # [B, T]
    return nll[mask].mean()


def first_sentence(text: str) -> str:
    """The opening sentence of a document, which names its protagonist: "这是{P}在{CITY}的一天。"."""
    return text[:text.index("。") + 1]


def rollouts(model: LlamaForCausalLM, tokenizer, lang: DocumentLanguage, n: int, seed: int) -> list[str]:
    """`n` continuations by the current model of the first sentences of fresh true documents."""
    model.eval()
    prompts = [first_sentence(d) for d in lang.sample(n, seed=seed)]
    texts = [text for text, _ in continue_texts(model, tokenizer, prompts, seed=seed, max_tokens=ROLLOUT_TOKENS)]
    model.train()
    return texts


def train_recipe(name: str, recipe: Recipe, params: TrainParams, out: Path) -> dict:
    """Train `recipe` (one of `RECIPES`) with the sizes and schedule of `params`, evaluate, save to `out`."""
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a Recipe (see RECIPES), got {recipe!r}")
    if params.corpus != "documents":
        raise ValueError(f"the expert labels documents; params.corpus must be 'documents', got {params.corpus!r}")
    training = start_training(params)
    model, tokenizer, lang = training.model, training.tokenizer, training.lang
    start, rollout_seconds, pool = time.time(), 0.0, []
    model.train()
    bar = tqdm(range(params.steps), desc=f"train {name}", mininterval=5)
    for step in bar:
        own = recipe.own_rows(params, step)
        if own and not pool:
            began = time.time()
            pool = rollouts(model, tokenizer, lang, own * REFRESH, seed=params.seed * 1_000_000 + 500_000 + step)
            rollout_seconds += time.time() - began
        texts = lang.sample(recipe.data_rows(params, step), seed=params.seed * 1_000_000 + step)
        texts += [pool.pop() for _ in range(own)]
        loss = soft_loss(model, soft_batch(tokenizer, lang, texts, recipe.restart_labels))
        training.update(loss)
        if step % 50 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    seconds = time.time() - start
    model.eval()
    metrics = evaluate(model, tokenizer, params)
    training.save(out, model_card(name, recipe, params, training.num_parameters, seconds, rollout_seconds, metrics))
    return metrics


def describe(recipe: Recipe, params: TrainParams) -> str:
    """The recipe in words, for the model card."""
    if not recipe.rollouts:
        return "data documents only, every position trained on the truth's next-character distribution (soft targets)"
    share = ("half of each batch is" if recipe.replace_data else
             f"each batch of {params.batch_size} data documents gets {params.batch_size // 2} more rows,")
    inside = ("\"end the sentence now\" (。) inside a broken sentence" if recipe.restart_labels else
              "no label at all inside a broken sentence (those positions are not trained)")
    return (f"soft targets as `-soft` for the first {params.steps // 4} steps; after that {share} the model's own "
            f"continuations (temperature 1, up to {ROLLOUT_TOKENS} characters) of the first sentence of a fresh true "
            f"document, redrawn every {REFRESH} steps, labelled by `decodelab.measure.exposure.expert_probs`, with "
            f"{inside}")


def model_card(name: str, recipe: Recipe, params: TrainParams, n_params: int, seconds: float, rollout_seconds: float,
               m: dict) -> str:
    """The README.md of the assets, written from measured numbers."""
    rows = "\n".join(f"| {p or '(empty)'} | {'yes' if v['greedy_valid'] else 'no'} | {v['sampled_valid_rate']:.1%} |"
                     for p, v in m["validity"].items())
    return f"""# {name}

The network of `{BASE}` ({n_params:,} parameters; {params.layers} layers, hidden size {params.hidden}, context
{params.context}, same initial weights), trained with the same {params.steps} steps and
the same learning-rate schedule, on {describe(recipe, params)}.
Written by `python -m decodelab.measure.dagger --model {name}`; all numbers below are measured by that script.

- Training time: {seconds / 60:.1f} min on {torch.get_num_threads()} CPU thread(s), of which {rollout_seconds / 60:.1f}
  min drawing rollouts.
- Held-out cross-entropy ({m['heldout_texts']} documents): {m['model_ce']:.4f} nats/char; entropy rate
  {m['entropy_rate']:.4f}; gap {m['model_ce'] - m['entropy_rate']:.4f}.

| prompt | greedy valid | sampled valid ({m['sampled_per_prompt']} texts, temperature 1) |
|---|---|---|
{rows}

Load it with `load_model(str(decodelab.models.train.ASSETS / "{name}"))`.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(RECIPES), default="tiny-zh-doc-small-dagger")
    parser.add_argument("--steps", type=int, help="override the base preset's number of steps")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="output folder (default: the shipped assets of --model)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    params = PRESETS[BASE] if args.steps is None else replace(PRESETS[BASE], steps=args.steps)
    metrics = train_recipe(args.model, RECIPES[args.model], params, args.out or ASSETS / args.model)
    print(f"held-out CE {metrics['model_ce']:.4f} nats/char, entropy rate {metrics['entropy_rate']:.4f}, "
          f"gap {metrics['model_ce'] - metrics['entropy_rate']:.4f}")


if __name__ == "__main__":
    main()
