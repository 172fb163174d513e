"""The PagedAttention stepper: step through recorded engine states (block tables, free queue, ref counts).

`record_frames` drives a real `decodelab.engine.engine.Engine` one step at a time, adding requests when their arrival
step comes, and stores after every step what the chapter draws: each running sequence's block table, every
block's ref count and tokens, the free queue in eviction order, the prefix-cache blocks and what happened
(arrivals, preemptions, copy-on-write, finished requests). `PagedStepper` shows those frames with Prev/Next
buttons; its ESM (`paged_stepper.js` after the shared prelude) only draws stored frames, so it works in the
static HTML book with no kernel.

Taught in: chapters/07-paged-attention.ipynb
"""
from __future__ import annotations

import pathlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import anywidget
import traitlets

from decodelab.sampling.sampler import SamplingParams
from decodelab.validation import check_index, check_int, check_records
from decodelab.book.widgets.esm import ESM_PRELUDE

_HERE = pathlib.Path(__file__).parent


@dataclass(frozen=True)
class Arrival:
    """A request that joins the engine just before step `step` (0 = before the first step)."""

    step: int
    prompt: str | tuple[int, ...]
    params: SamplingParams

    def __post_init__(self) -> None:
        check_int(self.step, "step", low=0)
        if not isinstance(self.params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(self.params).__name__}")


def _pool_frame(engine, step: int, kind: str, events: list[str], token_text: Callable[[int], str]) -> dict:
    pool = engine.pool
    views = engine.sequences()
    running = sorted((v for v in views if v.status == "running"), key=lambda v: v.seq_id)
    return {
        "step": step,
        "kind": kind,
        "events": events,
        "sequences": [{"seq": v.seq_id, "request": v.request_id, "sample": v.sample_index,
                       "blocks": list(v.block_ids), "num_tokens": v.num_tokens} for v in running],
        "ref_counts": pool.ref_counts,
        "blocks": [[token_text(t) for t in tokens] for tokens in pool.block_tokens],
        "fill": [len(tokens) for tokens in pool.block_tokens],
        "free": pool.free_block_ids,
        "cached": pool.cached_block_ids,
        "waiting": sorted({v.request_id for v in views if v.status == "waiting"}),
        "live_tokens": pool.filled_slots(),
        "allocated_slots": pool.num_used_blocks * pool.block_size,
    }


def record_frames(engine, arrivals: Sequence[Arrival], max_steps: int = 200,
                  token_text: Callable[[int], str] | None = None) -> list[dict]:
    """Run `engine` step by step until every request is done; return one frame before the first step and one
    after each step (JSON-ready dicts, see `_pool_frame`; a step's frame also lists the requests it finished as
    `finished`: [request id, text] pairs). `token_text` turns a token id into the text shown in a block (default:
    the engine's tokenizer, else the id).

    Example:
        frames = record_frames(Engine(model, tok, block_size=4, num_blocks=12),
                               [Arrival(0, "小明", SamplingParams(temperature=0, max_tokens=6))])
    Taught in: chapters/07-paged-attention.ipynb
    """
    if not arrivals or not all(isinstance(a, Arrival) for a in arrivals):
        raise ValueError(f"arrivals must be a non-empty list of Arrival, got {arrivals!r}")
    check_int(max_steps, "max_steps")
    if engine.has_unfinished() or engine.pool.num_used_blocks:
        raise ValueError("engine must be idle with an empty pool; create a fresh Engine for the recording")
    if token_text is None:
        tokenizer = engine.tokenizer
        token_text = (lambda t: tokenizer.convert_ids_to_tokens(t)) if tokenizer is not None else str
    pending = sorted(arrivals, key=lambda a: a.step)
    frames = [_pool_frame(engine, 0, "start", [], token_text)]
    step = 0
    while pending or engine.has_unfinished():
        if step >= max_steps:
            raise RuntimeError(f"requests still running after max_steps={max_steps} steps")
        events = []
        while pending and pending[0].step <= step:
            arrival = pending.pop(0)
            request_id = engine.add_request(list(arrival.prompt) if isinstance(arrival.prompt, tuple)
                                            else arrival.prompt, arrival.params)
            extra = f"，n = {arrival.params.n}" if arrival.params.n > 1 else ""
            events.append(f"请求 {request_id} 到达（max_tokens = {arrival.params.max_tokens}{extra}）")
        output = engine.step()
        step += 1
        events += _step_events(output)
        for done in output.finished:
            events.append(f"请求 {done.request_id} 完成（{done.finish_reason}），它的块回到 free 队列")
        frames.append(_pool_frame(engine, step, output.kind, events, token_text))
        frames[-1]["finished"] = [[done.request_id, done.text] for done in output.finished]
    return frames


def _step_events(output) -> list[str]:
    """What a step did, in words, read from its plan (`StepOutput.plan`) and the block tables after it: by sequence
    id, each prefill (with its prefix-cache hits; a recompute after preemption), each forked sample, each
    copy-on-write."""
    plan, tables = output.plan, output.block_tables
    events = [f"块不够：序列 {seq_id} 被抢占（preemption），它的块全部释放，稍后重算" for seq_id in output.preempted]
    prefills = {sched.seq.seq_id: sched for sched in plan.scheduled} if plan.kind == "prefill" else {}
    forks = {child.seq_id: child for child in plan.forks}
    copies = {dst: src for src, dst in plan.copies}
    first_sample = {sched.seq.request_id: sched.seq.seq_id for sched in plan.scheduled if sched.seq.sample_index == 0}
    for seq_id in sorted(tables):                        # the sequences still running after the step
        blocks = tables[seq_id]
        if seq_id in prefills:
            sched = prefills[seq_id]
            again = "（抢占后重算）" if sched.start + len(sched.token_ids) > sched.seq.num_prompt_tokens else ""
            cached = f"，前 {sched.num_cached} 个来自 prefix cache，不再重算" if sched.num_cached else ""
            events.append(f"prefill 序列 {seq_id}（请求 {sched.seq.request_id}）{again}：{sched.start + len(sched.token_ids)} "
                          f"个 token 的 K/V 写进块 {blocks}{cached}")
        elif seq_id in forks:
            child = forks[seq_id]
            events.append(f"序列 {seq_id} 是请求 {child.request_id} 的第 {child.sample_index} 个样本："
                          f"与序列 {first_sample.get(child.request_id)} 共享 prompt 的全部块（ref count + 1）")
        elif blocks and blocks[-1] in copies:
            events.append(f"写时复制（copy-on-write）：序列 {seq_id} 要写共享的块 {copies[blocks[-1]]}，"
                          f"先把它复制到块 {blocks[-1]}")
    return events


# A blank line between the shared prelude and this widget's own view (paged_stepper.js).
_ESM = ESM_PRELUDE + "\n" + (_HERE / "paged_stepper.js").read_text(encoding="utf-8")


class PagedStepper(anywidget.AnyWidget):
    """Prev/Next through frames recorded by `record_frames`: the block pool, block tables and free queue.

    >>> from decodelab.book.widgets.paged_stepper import Arrival, PagedStepper, record_frames
    >>> from decodelab.engine import Engine
    >>> from decodelab.sampling import SamplingParams
    >>> frames = record_frames(Engine(model, tokenizer, block_size=4, num_blocks=12),
    ...                        [Arrival(0, "小明", SamplingParams(temperature=0, max_tokens=6))])
    >>> PagedStepper(frames, block_size=4, index=3)
    PagedStepper(frames=7, index=3, block_size=4, lecture=False)

    Taught in: chapters/07-paged-attention.ipynb
    """

    _esm = _ESM

    frames = traitlets.List(traitlets.Dict()).tag(sync=True)
    index = traitlets.Int(0).tag(sync=True)
    block_size = traitlets.Int(4).tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)
    lecture = traitlets.Bool(False).tag(sync=True)

    def __init__(self, frames: Sequence[Mapping], *, block_size: int, index: int = 0, title: str = "",
                 lecture: bool = False) -> None:
        frames = check_records(frames, "frames", "record_frames")
        if not frames:
            raise ValueError("frames must hold at least one frame (see record_frames), got none")
        block_size = check_int(block_size, "block_size")
        index = check_index(index, "index", len(frames))
        missing = {"step", "sequences", "ref_counts", "free", "fill", "blocks"} - set(frames[0])
        if missing:
            raise ValueError(f"frames must come from record_frames; the first frame lacks {sorted(missing)}")
        super().__init__(frames=[dict(f) for f in frames], block_size=block_size, index=index, title=title,
                         lecture=bool(lecture))

    def frame(self) -> dict:
        """The frame shown now."""
        return self.frames[self.index]

    def __repr__(self) -> str:
        return (f"PagedStepper(frames={len(self.frames)}, index={self.index}, block_size={self.block_size}, "
                f"lecture={self.lecture})")


def draw_block_tables(frame: Mapping, block_size: int, ax=None):
    """Draw one frame as the PagedAttention paper's Figure 4: each sequence's logical blocks on the left,
    the physical block pool on the right, a line from every logical block to the physical block it maps to.

    Returns the matplotlib Axes. Taught in: chapters/07-paged-attention.ipynb
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from decodelab.book.plotting import use_cjk_font

    use_cjk_font()
    if "sequences" not in frame or "ref_counts" not in frame:
        raise ValueError("frame must come from record_frames (keys 'sequences' and 'ref_counts')")
    sequences, num_blocks = frame["sequences"], len(frame["ref_counts"])
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.55 * max(num_blocks, 2 * len(sequences) + 1) + 0.8))
    owner: dict[int, int] = {}
    for seq in sequences:
        for block_id in seq["blocks"]:
            owner.setdefault(block_id, seq["request"])

    def box(x: float, y: float, tokens: list[str], color: str, label: str, label_right: bool = False) -> None:
        if label_right:
            ax.text(x + block_size + 0.15, y + 0.4, label, ha="left", va="center", fontsize=9)
        else:
            ax.text(x - 0.15, y + 0.4, label, ha="right", va="center", fontsize=9)
        for i in range(block_size):
            ax.add_patch(Rectangle((x + i, y), 1, 0.8, facecolor=color if i < len(tokens) else "white",
                                   edgecolor="0.4"))
            if i < len(tokens):
                ax.text(x + i + 0.5, y + 0.4, tokens[i], ha="center", va="center", fontsize=8)

    right = block_size + 5
    for b in range(num_blocks):
        y = num_blocks - 1 - b
        ref = frame["ref_counts"][b]
        color = f"C{owner[b] % 10}" if ref else "0.92"
        tokens = frame["blocks"][b] if ref else []
        box(right, y, tokens, color, f"#{b}" + (f" ×{ref}" if ref > 1 else "") + ("" if ref else " free"), True)
    row = num_blocks - 1
    for seq in sequences:
        tokens = [t for b in seq["blocks"] for t in frame["blocks"][b]][: seq["num_tokens"]]
        ax.text(-0.2, row + 0.4, f"序列 {seq['seq']}", ha="right", va="center", fontsize=9)
        for k, block_id in enumerate(seq["blocks"]):
            y = row - k
            chunk = tokens[k * block_size:(k + 1) * block_size]
            box(1.6, y, chunk, f"C{seq['request'] % 10}", f"逻辑块 {k}")
            ax.annotate("", xy=(right - 0.1, num_blocks - 1 - block_id + 0.4), xytext=(1.6 + block_size + 0.1, y + 0.4),
                        arrowprops={"arrowstyle": "->", "color": f"C{seq['request'] % 10}", "lw": 1.0})
        row -= len(seq["blocks"]) + 1
    ax.set_xlim(-2.5, right + block_size + 3)
    ax.set_ylim(min(row, 0) - 0.5, num_blocks + 0.3)
    ax.text(1.6 + block_size / 2, num_blocks + 0.1, "block table：逻辑块", ha="center", fontsize=10)
    ax.text(right + block_size / 2, num_blocks + 0.1, "物理块（KV block 池）", ha="center", fontsize=10)
    ax.axis("off")
    return ax
