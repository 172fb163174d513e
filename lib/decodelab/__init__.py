"""decodelab: the library behind the course "生成与解码基础".

The public API, importable from the top (each name is imported on first use):

    from decodelab import SamplingParams, sample, generate, beam_search, Engine, load_model

The subpackages, from the bottom up; a module imports only what sits below it, and nothing under `engine/` or
`serve/` imports `measure/` or `book/`:

    toy/        the known-truth world: sentences, documents, their templates and automaton, questions on it
    models/     load_model, the character tokenizer, training the shipped models
    sampling/   params -> batch -> penalties -> processors -> draw;  ops/  the fast routes
    grammar/    what a grammar is to the sampler (a token mask per step) and its back ends
    decoding/   one model over transformers' cache: generate, beam search, speculative, constrained
    kv/         block pool and block table, the first-fit slab (the engine's "slab" layout), chapter 06's contiguous cache
    runner/     the paged forward and its attention (torch reference, Triton)
    engine/     the continuous-batching engine: scheduler, speculation, the asyncio loop
    serve/      the OpenAI-compatible server, its protocol, its Prometheus metrics
    measure/    what the chapters measure (exposure bias, scoring, repetition, best-of-n, ...)
    book/       plotting, tables, widgets/, checks/ (the exercises' checks)
"""
from decodelab._exports import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "SamplingParams": "decodelab.sampling.params",
    "SamplingBatch": "decodelab.sampling.batch",
    "sample": "decodelab.sampling.sampler",
    "process_logits": "decodelab.sampling.sampler",
    "generate": "decodelab.decoding.generate",
    "beam_search": "decodelab.decoding.beam",
    "speculative_generate": "decodelab.decoding.speculative",
    "constrained_generate": "decodelab.decoding.constrained",
    "Completion": "decodelab.decoding.request",
    "Engine": "decodelab.engine.engine",
    "AsyncEngine": "decodelab.engine.async_engine",
    "load_model": "decodelab.models.load",
    "ToyLanguage": "decodelab.toy.sentences",
    "DocumentLanguage": "decodelab.toy.documents",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
