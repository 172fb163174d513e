"""Batched sampling with per-request parameters, in the order the data flows:

params (SamplingParams, checked once) -> batch (SamplingBatch, one batch's parameters as tensors) -> penalties
(logit bias, repetition, n-gram bans) -> processors (temperature, top-k, top-p, min-p, typical; truncation holds
the row-wise filters) -> sampler (the draw). ops/ holds the fast routes, each tested against the reference;
probs holds softmax, entropy and KL, the arithmetic chapter 01 teaches.
"""
from decodelab.sampling.batch import SamplingBatch
from decodelab.sampling.params import SamplingParams
from decodelab.sampling.sampler import make_generator, process_logits, sample, sample_seed

__all__ = ["SamplingBatch", "SamplingParams", "make_generator", "process_logits", "sample", "sample_seed"]
