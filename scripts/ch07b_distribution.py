"""Does speculative sampling leave the target's distribution unchanged? Chapter 07b's test with the power to tell.

At several judged positions (three prompts; the first and the second draft position of a round, the second
after the likeliest first token whose next character is still uncertain), with the real target
p (`tiny-zh-doc`) and three drafts q (`tiny-zh-doc-small`, `tiny-zh` trained on single sentences, the n-gram draft's
point mass), temperature 1:

1. exact: the distribution the acceptance rule emits there (`decodelab.decoding.speculative.judged_distribution`,
   built from the same `residual` that `verify` draws from), and its TV from p (0 up to float64 rounding);
2. sampled: 20,000 draws through `verify` itself (x ~ q, then the rule with its own generator), with Pearson's
   chi-square p-value against p, the TV of the empirical distribution, and the 95% quantile of that TV when the
   20,000 draws come from p itself (what sampling noise alone gives);
3. a negative control: the same with a planted bug, the residual drawn from p instead of max(0, p - q)
   (`verify`'s `residual` swapped for the run), exact and sampled. It moves mass only where drafts are rejected, so it is
   visible where acceptance 1 - TV(p, q) is well inside (0, 1) and invisible where it is near 1 (the small model,
   acceptance about 0.96) or 0 (a draft whose tokens the target never wants: the residual is then p anyway).

    .venv/bin/python scripts/ch07b_distribution.py        # writes chapters/data/07b-distribution.json (about 1 min)

Taught in: chapters/07b-speculative-decoding.ipynb
"""
from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from pathlib import Path

import torch

from decodelab.decoding import speculative
from decodelab.decoding.speculative import NgramDraft, distributions, judged_distribution, verify
from decodelab.measure.stats import chi_square_p_value, total_variation, tv_null_quantile
from decodelab.models import load_model
from decodelab.sampling import SamplingParams
from provenance import stamp

OUT = Path(__file__).resolve().parent.parent / "chapters" / "data" / "07b-distribution.json"
PROMPTS = ["这是小明在北京的一天。", "这是小明在北京的一天。小明", "这是老王在成都的一天。"]
DRAWS = 20_000


def from_p(p: torch.Tensor, q: torch.Tensor | None, token: int) -> torch.Tensor:
    """The planted bug: after a rejection, draw from p itself instead of max(0, p - q)."""
    return p


@contextlib.contextmanager
def residual_rule(rule):
    """Run `verify` with `rule` in place of its residual (the negative control), then put it back."""
    saved = speculative.residual
    speculative.residual = rule
    try:
        yield
    finally:
        speculative.residual = saved


@torch.no_grad()
def probs(model, ids: list[int], params: SamplingParams) -> torch.Tensor:
    return distributions(model(torch.tensor([ids])).logits[0, -1:], params)[0]


def sampled(p: torch.Tensor, q: torch.Tensor | None, token: int | None, draws: int, seed: int) -> Counter:
    """`draws` emitted tokens of one judged position through `verify` (gamma 1: the drafted token, or the residual's)."""
    generator = torch.Generator().manual_seed(seed)
    rows = torch.stack([p, p])                              # [2, V]: the judged position, then the unused bonus row
    counts: Counter = Counter()
    for _ in range(draws):
        x = token if q is None else int(torch.multinomial(q, 1, generator=generator))
        kept, after, _ = verify([x], None if q is None else q[None], rows, generator)
        counts[x if kept else after] += 1
    return counts


def case(name: str, p: torch.Tensor, q: torch.Tensor | None, token: int | None, null_tv: float, seed: int) -> dict:
    acceptance = float(p[token]) if q is None else float(torch.minimum(p, q).sum())
    row = {"draft": name, "acceptance": acceptance, "draft_token": token}
    for label, rule in (("rule", speculative.residual), ("planted_bug", from_p)):
        exact = judged_distribution(p, q, token, residual_rule=rule)
        with residual_rule(rule):
            counts = sampled(p, q, token, DRAWS, seed)
        row[label] = {"exact_tv": 0.5 * float((exact - p).abs().sum()),
                      "sampled_tv": total_variation(counts, p, DRAWS),
                      "chi_square_p": chi_square_p_value(counts, dict(enumerate(p.tolist())), DRAWS)}
    row["null_tv_95"] = null_tv
    return row


def main() -> None:
    torch.set_num_threads(1)
    target, tokenizer = load_model("tiny-zh-doc", device="cpu", dtype="float32")
    drafts = {"tiny-zh-doc-small": load_model("tiny-zh-doc-small", device="cpu", dtype="float32")[0],
              "tiny-zh（单句）": load_model("tiny-zh", device="cpu", dtype="float32")[0]}
    params = SamplingParams(temperature=1.0)
    begin, positions, seed = time.time(), [], 0
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        p = probs(target, ids, params)
        # the second position of a round: after the likeliest first token whose next character is still uncertain
        # (the target's top probability under 0.9; where it is all but certain there is nothing to test)
        first = next((t for t in p.topk(10).indices.tolist() if float(probs(target, ids + [t], params).max()) < 0.9),
                     None)
        for offset, context in ((1, ids), (2, ids + [first])) if first is not None else ((1, ids),):
            p_here = p if offset == 1 else probs(target, context, params)
            null_tv = tv_null_quantile(p_here, DRAWS, repeats=1000, seed=seed)
            rows = []
            for name, model in drafts.items():
                seed += 1
                rows.append(case(name, p_here, probs(model, context, params), None, null_tv, seed))
            proposal, _ = NgramDraft().propose(context, 1, params, None)
            if proposal:                                    # prompt lookup found a match: q is a point mass
                seed += 1
                rows.append(case("n-gram", p_here, None, proposal[0], null_tv, seed))
            positions.append({"prompt": prompt, "position": offset,
                              "context_tail": tokenizer.decode(context[-6:]), "support": int((p_here > 0).sum()),
                              "rows": rows})
            print(f"{prompt!r} position {offset}: null TV 95% {null_tv:.4f}; "
                  + "; ".join(f"{r['draft']} accept {r['acceptance']:.2f} rule TV {r['rule']['sampled_tv']:.4f} "
                              f"(p {r['rule']['chi_square_p']:.2f}) bug TV {r['planted_bug']['sampled_tv']:.4f} "
                              f"(exact {r['planted_bug']['exact_tv']:.4f})" for r in rows))
    result = stamp({"target": "tiny-zh-doc", "temperature": 1.0, "draws": DRAWS, "null_repeats": 1000,
                    "seconds": round(time.time() - begin, 1), "positions": positions},
                   "python scripts/ch07b_distribution.py")
    OUT.write_text(json.dumps(result, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
