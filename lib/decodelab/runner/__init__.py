"""The forward over the paged KV cache: a Llama-family model (model) and its attention, the torch reference
(attention) and a Triton decode kernel (triton_attention)."""
from decodelab.runner.model import PagedLlama, StepBatch

__all__ = ["PagedLlama", "StepBatch"]
