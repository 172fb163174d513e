"""What the speculative tests share (tests/decoding/test_speculative.py, tests/engine/test_speculation.py): the
prompts, exact target probabilities of short continuations, and Pearson's chi-square against them (from
`decodelab.measure.stats`)."""
from collections import Counter

import torch

from decodelab.decoding.speculative import distributions
from decodelab.measure.stats import chi_square_p_value  # noqa: F401  (the tests import it from here)
from decodelab.sampling.sampler import SamplingParams

INTRO = "这是小明在北京的一天。"
NAMED = INTRO + "小明"  # the name is in the prompt, so the n-gram draft has something to propose


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
