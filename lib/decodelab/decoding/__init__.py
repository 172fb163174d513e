"""Decoding one model over transformers' own KV cache: `generate` (the autoregressive loop), `beam_search`,
`speculative_generate` and `constrained_generate`. request holds what they share with the engine (prompt ids, the
finish rule, `Completion`); detokenize turns token ids into text while a request runs."""
from decodelab.decoding.beam import BeamResult, beam_search
from decodelab.decoding.constrained import constrained_generate
from decodelab.decoding.generate import generate
from decodelab.decoding.request import Completion, TokenLogprob
from decodelab.decoding.speculative import speculative_generate

__all__ = ["BeamResult", "Completion", "TokenLogprob", "beam_search", "constrained_generate", "generate",
           "speculative_generate"]
