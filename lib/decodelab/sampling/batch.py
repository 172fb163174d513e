"""One batch's sampling parameters as tensors, built once when the batch changes and read by every processor.

`sample(logits, [SamplingParams, ...])` builds a `SamplingBatch` per call. An engine whose batch changes only when a
request joins or leaves builds one then (`SamplingBatch(params, device)`) and passes it at every step, so the rows'
parameters are not turned into tensors again at each token (vLLM's `SamplingMetadata`, rebuilt on a batch change).

    >>> batch = SamplingBatch([SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_k=50)])
    >>> batch.argmax_rows, batch.random_rows, batch.column("temperature", torch.float32).flatten().tolist()
    ((0,), (1,), [1.0, 0.800000011920929])

Taught in: chapters/03-strategies.ipynb
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from decodelab.sampling.params import SamplingParams, batch_row

# the per-row values a processor reads as a column `[B, 1]`, and each one's "off" value
COLUMNS = {"temperature": 1.0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "repetition_penalty": 1.0,
           "frequency_penalty": 0.0, "presence_penalty": 0.0}


class SamplingBatch:
    """The `SamplingParams` of each row of a batch, with what every step needs from them computed once.

    `argmax_rows` are the rows that take the argmax (temperature 0, or top_k = 1: one token kept, the lowest id among
    tied maxima); `random_rows` draw. `column(name, dtype)` is a parameter as a `[B, 1]` tensor on the batch's device
    (argmax rows hold temperature 1, which never divides anything). `uses(name, rows)` says whether any of `rows` has
    that parameter switched on, so a processor that nobody asks for costs nothing.
    """

    def __init__(self, params: Sequence[SamplingParams], device: torch.device | str = "cpu") -> None:
        if isinstance(params, (str, bytes)) or not isinstance(params, Sequence) or len(params) == 0:
            raise TypeError(f"params must be a non-empty sequence of SamplingParams, got {params!r:.100}")
        self.params = tuple(params)
        if not all(type(row) is SamplingParams for row in self.params):   # (one pass; a subclass is checked below)
            for i, row in enumerate(self.params):
                if not isinstance(row, SamplingParams):
                    raise TypeError(f"params[{i}] must be a SamplingParams, got {type(row).__name__}")
        self.rows = tuple(range(len(self.params)))                            # every row, in order
        self.device = torch.device(device)
        # each row's flags, made once per params object (`batch_row`), transposed into columns; each summary below
        # is one C-level pass over a column
        (argmax, top_k, ngram_sizes, penalties, constraints, outputs, bad_strings, plain, tempered, grammar,
         logprobs, biased) = zip(*map(batch_row, self.params))
        if any(argmax):
            self.argmax_rows = tuple(i for i, only in enumerate(argmax) if only)
            self.random_rows = tuple(i for i, only in enumerate(argmax) if not only)
        else:
            self.argmax_rows, self.random_rows = (), self.rows
        self.top_k = top_k                                                     # per row, 0 = off
        self.ngram_sizes = ngram_sizes
        self.has_penalties = any(penalties)
        self.has_constraints = any(constraints)                                # decodelab.sampling.constraints
        self.needs_output_tokens = any(outputs)
        self.has_bad_word_strings = any(bad_strings)                           # not yet tokenized: an error here
        self.has_grammar = any(grammar)                                        # masks before the draw (an engine's)
        self.has_logprobs = any(logprobs)                                      # logprobs after it
        # every row random, with no truncation: one dense group whose only processor can be the temperature
        self.plain = all(plain)
        self.tempered = any(tempered)                                          # some random row's temperature != 1
        self._argmax = argmax
        self._values: dict[str, tuple] = {}   # a parameter's per-row values, made when first asked (`values`)
        # (row, token id, bias) of every logit_bias entry, added to the logits before anything else
        self.logit_bias = (tuple((i, token, bias) for i, p in enumerate(self.params) for token, bias in p.logit_bias)
                           if any(biased) else ())
        # no row changes the logits before the processors: no logit_bias, penalty, mask or bad word
        self.untouched = not (self.logit_bias or self.has_penalties or self.has_constraints or self.has_bad_word_strings)
        # (streams, device, their checked list, whether all are CounterRNG on that device, whether all draw by one
        # uniform there) once the sampler checked a tuple of streams with this batch: an engine passes the same tuple
        # at every step of a batch, and it is not checked again (`decodelab.sampling.sampler._generators`)
        self.checked_streams: tuple | None = None
        self._columns: dict[tuple[str, torch.dtype], torch.Tensor] = {}
        self._memo: dict = {}

    def __len__(self) -> int:
        return len(self.params)

    def __repr__(self) -> str:
        return f"SamplingBatch({len(self)} rows, {len(self.argmax_rows)} argmax, device={self.device})"

    def values(self, name: str) -> tuple:
        """Parameter `name` of every row, as Python numbers (argmax rows hold the off value, except for the
        penalties, which apply to them too); made once per batch, when first asked (an engine rebuilds the batch
        whenever a sequence joins or leaves, and a plain batch reads few of them)."""
        if name == "top_k":
            return self.top_k
        found = self._values.get(name)
        if found is None:
            if name == "one_minus_top_p":
                # 1 - top_p in double precision, cast only when it becomes a column: transformers compares with the
                # Python float 1 - top_p, and > 0 exactly when top_p < 1
                found = tuple(1.0 - p for p in self.values("top_p"))
            elif name in _PENALTIES:
                found = tuple(getattr(p, name) for p in self.params)
            elif name in COLUMNS:
                off = COLUMNS[name]
                found = tuple(off if only else getattr(p, name) for p, only in zip(self.params, self._argmax))
            else:
                raise KeyError(name)
            self._values[name] = found
        return found

    def uses(self, name: str, rows: Sequence[int] | None = None) -> bool:
        """Whether any of `rows` (default: all) sets `name` away from its off value."""
        key = ("uses", name, None if rows is None else tuple(rows))   # asked by every processor at every step
        if key not in self._memo:
            values = self.values(name)
            off = 0 if name == "top_k" else COLUMNS[name]
            self._memo[key] = any(values[i] != off for i in (range(len(self)) if rows is None else key[2]))
        return self._memo[key]

    def column(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        """Parameter `name` as a `[B, 1]` tensor of `dtype` on the batch's device, made once per dtype."""
        key = (name, dtype)
        if key not in self._columns:
            self._columns[key] = torch.tensor(self.values(name), dtype=dtype, device=self.device).unsqueeze(1)
        return self._columns[key]

    def memo(self, key, make):
        """`make()`, computed once per batch under `key`: what depends only on the rows' parameters (routes)."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]


_PENALTIES = ("repetition_penalty", "frequency_penalty", "presence_penalty")  # they apply to argmax rows too


def as_batch(params: SamplingParams | Sequence[SamplingParams] | SamplingBatch, batch: int,
             device: torch.device) -> SamplingBatch:
    """`params` for `batch` rows: one `SamplingParams` for every row, one per row, or a ready `SamplingBatch`."""
    if isinstance(params, SamplingBatch):
        if len(params) != batch:
            raise ValueError(f"the SamplingBatch holds {len(params)} rows, the logits {batch}")
        if params.device != device and params.device.type != device.type:   # (equal devices: one C++ compare)
            raise ValueError(f"the SamplingBatch is on {params.device}, the logits on {device}")
        return params
    if isinstance(params, SamplingParams):
        return SamplingBatch([params] * batch, device)
    if isinstance(params, (str, bytes)) or not isinstance(params, Sequence):
        raise TypeError(f"params must be a SamplingParams or a sequence of {batch}, got {type(params).__name__}")
    if len(params) != batch:
        raise ValueError(f"params must hold one SamplingParams per row: {batch} rows, got {len(params)}")
    return SamplingBatch(params, device)
