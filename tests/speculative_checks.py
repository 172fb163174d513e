"""What the speculative tests share (tests/decoding/test_speculative.py, tests/engine/test_speculation.py): the
prompts, exact target probabilities of short continuations, and Pearson's chi-square against them."""
from collections import Counter

import torch

from decodelab.decoding.speculative import distributions
from decodelab.sampling.sampler import SamplingParams

INTRO = "这是小明在北京的一天。"
NAMED = INTRO + "小明"  # the name is in the prompt, so the n-gram draft has something to propose


def chi_square_p_value(counts: Counter, expected: dict, runs: int) -> float:
    """p-value of Pearson's chi-square; cells expecting fewer than 5 draws are pooled into one."""
    big = {cell for cell, prob in expected.items() if prob * runs >= 5}
    observed = [counts[cell] for cell in big] + [runs - sum(counts[cell] for cell in big)]
    wanted = [expected[cell] * runs for cell in big] + [runs * (1 - sum(expected[cell] for cell in big))]
    if wanted[-1] < 5:  # the pooled rest is too small to test on its own: fold it into the largest cell
        largest = max(range(len(big)), key=lambda j: wanted[j])
        observed[largest] += observed.pop()
        wanted[largest] += wanted.pop()
    stat = sum((o - w) ** 2 / w for o, w in zip(observed, wanted))
    return float(torch.special.gammaincc(torch.tensor((len(wanted) - 1) / 2), torch.tensor(stat / 2)))


@torch.no_grad()
def target_sequence_probs(models, prompt: str, params: SamplingParams, length: int) -> dict:
    """Exact probabilities of every `length`-token continuation under the target's processed distribution (only
    branches above 1e-4 are expanded; the rest is left to the pooled cell)."""
    ids = models["tokenizer"](prompt)["input_ids"]
    out = {(): 1.0}
    for _ in range(length):
        grown = {}
        for prefix, prob in out.items():
            logits = models["target"](torch.tensor([ids + list(prefix)])).logits[0, -1:]
            p = distributions(logits, params)[0]
            for token in (p * prob > 1e-4).nonzero().flatten().tolist():
                grown[prefix + (token,)] = prob * float(p[token])
        out = grown
    return out
