"""The logits processors after the penalties, in the order they run: temperature, top-k, top-p, min-p, typical.

Each is a small object with one job, as transformers' `LogitsProcessorList` holds them, but batched: it reads its
per-row values from a `SamplingBatch` and changes the logits of a `RowGroup`, a set of rows that share one layout of
columns. A group is either dense (column j is token j) or, on the fast path, the k best candidates of top-k rows
(`decodelab.sampling.ops.fast_paths`); each processor handles both. Temperature happens here and nowhere else.

    >>> from decodelab.sampling import SamplingBatch, SamplingParams
    >>> from decodelab.sampling.processors import RowGroup, apply_processors
    >>> batch = SamplingBatch([SamplingParams(temperature=0.5, top_k=2)])
    >>> group = RowGroup.dense([0], torch.tensor([[1.0, 3.0, 2.0]]))
    >>> apply_processors(group, batch).logits
    tensor([[-inf, 6., 4.]])

Taught in: chapters/03-strategies.ipynb
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from decodelab.sampling.batch import SamplingBatch
from decodelab.sampling.truncation import (NEG_INF, min_p_filter, take_rows, top_k_filter, top_p_descending, top_p_filter,
                                  typical_filter)


@dataclass
class RowGroup:
    """Rows of a batch that share one layout of columns (not KV blocks)."""

    rows: list[int]  # batch rows held by this group, in order
    logits: torch.Tensor  # [n, K]; removed tokens are -inf
    token_ids: torch.Tensor | None = None  # [n, K] vocabulary id of each column, descending; None: column j is token j
    widths: list[int] = field(default_factory=list)  # per row, how many leading columns can hold kept tokens
    # [n, 1] each row's maximum logit when known exactly (the fast path gets it from its chunk maxima); Temperature
    # keeps it exact, since dividing by a positive number keeps the order and rounds the maximum as it rounds the row
    row_max: torch.Tensor | None = None

    @classmethod
    def dense(cls, rows: list[int], logits: torch.Tensor, row_max: torch.Tensor | None = None) -> RowGroup:
        return cls(rows, logits, None, [logits.shape[1]] * len(rows), row_max)

    @property
    def top_k_candidates(self) -> bool:
        """Whether the columns are the k best tokens of each row (top-k already applied), not the vocabulary."""
        return self.token_ids is not None

    def column(self, batch: SamplingBatch, name: str) -> torch.Tensor:
        """Parameter `name` for this group's rows, `[n, 1]`."""
        return take_rows(batch.column(name, self.logits.dtype), self.rows)

    def to_vocabulary(self, vocab_size: int) -> torch.Tensor:
        """The group's logits laid out over the whole vocabulary, `[n, V]`."""
        if self.token_ids is None:
            return self.logits
        out = torch.full((len(self.rows), vocab_size), NEG_INF, dtype=self.logits.dtype, device=self.logits.device)
        return out.scatter(1, self.token_ids, self.logits)


class Temperature:
    """Divide each row's logits by its temperature (argmax rows never get here), and the group's row maxima with
    them when it knows them.

    A row whose maximum overflows when divided (a logit of 3e38 at T = 0.01 becomes inf, and its softmax NaN) is
    shifted by its maximum first, as softmax itself is: the same distribution, every value finite. Only such rows:
    shifting an ordinary row would change the rounding of its values, and with it seeded draws.
    """

    param = "temperature"

    def __call__(self, group: RowGroup, batch: SamplingBatch) -> None:
        temperature = group.column(batch, "temperature")  # [n, 1]
        logits = group.logits / temperature  # [n, K]
        top = logits.amax(dim=1, keepdim=True) if group.row_max is None else group.row_max / temperature  # [n, 1]
        if not bool(torch.isfinite(top).all()):
            row_max = group.logits.amax(dim=1, keepdim=True) if group.row_max is None else group.row_max  # [n, 1]
            # 0 for ordinary rows (x - 0 is x, bit for bit) and for rows with no finite logit
            shift = torch.where(torch.isfinite(top) | ~torch.isfinite(row_max), 0.0, row_max)  # [n, 1]
            logits = (group.logits - shift) / temperature
            top = (row_max - shift) / temperature
        group.logits = logits
        if group.row_max is not None:
            group.row_max = top


class TopK:
    """Keep each row's k most likely tokens. A group of top-k candidates already holds exactly those."""

    param = "top_k"

    def __call__(self, group: RowGroup, batch: SamplingBatch) -> None:
        if not group.top_k_candidates:
            group.logits = top_k_filter(group.logits, take_rows(batch.column("top_k", torch.long), group.rows))


class TopP:
    """Keep each row's nucleus: the most likely tokens whose probabilities sum to at least top_p."""

    param = "top_p"

    def __call__(self, group: RowGroup, batch: SamplingBatch) -> None:
        one_minus_p = group.column(batch, "one_minus_top_p")
        rule = top_p_descending if group.top_k_candidates else top_p_filter
        group.logits = rule(group.logits, one_minus_p)


class MinP:
    """Remove tokens less likely than min_p times the row's most likely token."""

    param = "min_p"

    def __call__(self, group: RowGroup, batch: SamplingBatch) -> None:
        group.logits = min_p_filter(group.logits, group.column(batch, "min_p"))


class Typical:
    """Locally typical sampling; a sort, so only over the rows that ask for it."""

    param = "typical_p"

    def __call__(self, group: RowGroup, batch: SamplingBatch) -> None:
        values = batch.values("typical_p")
        wanted = [j for j, i in enumerate(group.rows) if values[i] < 1.0]
        index = torch.tensor(wanted, device=group.logits.device)
        filtered = typical_filter(group.logits.index_select(0, index), take_rows(group.column(batch, "typical_p"),
                                                                                  wanted))
        group.logits = group.logits.index_copy(0, index, filtered)
        group.row_max = None  # typical sampling can remove a row's most likely token


PROCESSORS = (Temperature(), TopK(), TopP(), MinP(), Typical())


def used_processors(batch: SamplingBatch) -> tuple:
    """The processors some row of `batch` asks for, in order (made once per batch): what a group of every row runs."""
    if batch.plain:   # no truncation in any row: the temperature or nothing
        return PROCESSORS[:1] if batch.tempered else ()
    return batch.memo("used_processors", lambda: tuple(p for p in PROCESSORS if batch.uses(p.param)))


def apply_processors(group: RowGroup, batch: SamplingBatch) -> RowGroup:
    """Run every processor that some row of `group` asks for, in order; returns the group."""
    for processor in PROCESSORS:
        if batch.uses(processor.param, group.rows):
            processor(group, batch)
    return group
