"""Performance code: the routes by which `method="fast"` reaches the reference processors' distribution with fewer
passes over a large vocabulary. Nothing here changes what is sampled, only how much of the row is read.

- **Top-k rows** are cut to their k best candidates first, found in one pass over the row (`decodelab.sampling.ops.topk`), and the
  processors then run on k columns instead of V. Choosing the candidates before the temperature is exact, since
  dividing by a positive number keeps the order.
- **Rows with top-p alone** (no top-k, min-p or typical) are drawn, when sampling, by rejection with a rising pivot
  (`decodelab.sampling.ops.rejection`) straight from their tempered logits, without finding the nucleus; rows the rejection
  rounds leave undecided (rare) go back to the processors.
- Every other random row, and every row with `method="sort"`, is one dense group run through the processors.

The reference (`method="sort"`) is what the tests compare this with: tests/sampling/test_sampler.py, tests/sampling/test_rejection.py
and tests/sampling/test_topk.py. Measured in benchmarks/sampling.py.

Not taught in a chapter: performance code behind `decodelab.sampling.sampler`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from decodelab.sampling.processors import RowGroup, Temperature
from decodelab.sampling.ops.rejection import top_p_rejection
from decodelab.sampling.batch import SamplingBatch
from decodelab.sampling.ops.topk import topk
from decodelab.sampling.truncation import NEG_INF, take_rows

METHODS = ("fast", "sort")


@dataclass(frozen=True)
class Routes:
    """Which random rows take which route, fixed by the rows' parameters (computed once per `SamplingBatch`)."""

    top_k: tuple[int, ...]  # cut to their k best candidates first
    rejection: tuple[int, ...]  # top-p alone, drawn by rejection
    dense: tuple[int, ...]  # the whole row through the processors


def routes(batch: SamplingBatch, method: str, sampling: bool) -> Routes:
    """The routes of `batch`'s random rows; `sampling` is False when the kept set itself is wanted
    (`process_logits`), which rejection does not give."""
    def make() -> Routes:
        if method == "sort" or batch.plain:   # a plain batch: every row dense, whatever the method
            return Routes((), (), batch.random_rows)
        top_k, top_p = batch.values("top_k"), batch.values("top_p")
        min_p, typical = batch.values("min_p"), batch.values("typical_p")
        first, rejection, dense = [], [], []
        for i in batch.random_rows:
            if top_k[i] > 0:
                first.append(i)
            elif sampling and top_p[i] < 1.0 and min_p[i] == 0.0 and typical[i] == 1.0:
                rejection.append(i)
            else:
                dense.append(i)
        return Routes(tuple(first), tuple(rejection), tuple(dense))

    return batch.memo(("routes", method, sampling), make)


def densify(routes: Routes, rows: list[int]) -> Routes:
    """`routes` with `rows` (rejection rows) moved to the dense group: rows whose stream is counter-based draw one
    uniform by the inverse CDF, which needs their nucleus, not rejection rounds."""
    moved = set(rows)
    return Routes(routes.top_k, tuple(i for i in routes.rejection if i not in moved), routes.dense + tuple(rows))


def top_k_candidates(x: torch.Tensor, rows: list[int], batch: SamplingBatch,
                     chunk_max: torch.Tensor | None) -> RowGroup:
    """The k best logits of each of `rows` of `x` `[B, V]` (k per row, from `batch`), descending, as one group of
    candidate columns `[n, max k]`; a row's columns past its own k are -inf. `chunk_max` (`decodelab.sampling.ops.topk.chunk_maxima`
    of x, or None) lets the top-k read only the best chunks of each row."""
    k = [min(batch.values("top_k")[i], x.shape[1]) for i in rows]
    vals, ids = topk(take_rows(x, rows), max(k), None if chunk_max is None else take_rows(chunk_max, rows))  # [n, K]
    columns = torch.arange(vals.shape[1], device=x.device)
    width = torch.tensor(k, device=x.device).unsqueeze(1)  # [n, 1]
    return RowGroup(list(rows), vals.masked_fill(columns.unsqueeze(0) >= width, NEG_INF), ids, k)


def draw_by_rejection(x: torch.Tensor, rows: list[int], batch: SamplingBatch,
                      generators: list[torch.Generator | None],
                      chunk_max: torch.Tensor | None = None) -> tuple[torch.Tensor, list[int]]:
    """One token for each of `rows` of `x` `[B, V]` (rows with top-p alone), drawn from the nucleus of the tempered
    logits by rejection; returns the tokens `[n]` and the rows left undecided (their tokens are meaningless).
    `chunk_max` (`decodelab.sampling.ops.topk.chunk_maxima` of x, or None) gives each row's maximum without another pass."""
    rows = list(rows)
    row_max = None if chunk_max is None else take_rows(chunk_max, rows).amax(dim=1, keepdim=True)  # [n, 1]
    group = RowGroup.dense(rows, take_rows(x, rows), row_max)
    if batch.uses("temperature", rows):
        Temperature()(group, batch)
    # a tensor made here (tempered, or a subset of the rows) can serve the rejection as scratch space
    drawn, pending = top_p_rejection(group.logits, [batch.values("top_p")[i] for i in rows],
                                     [generators[i] for i in rows], overwrite=group.logits is not x,
                                     row_max=group.row_max)
    return drawn, [rows[j] for j in pending]
