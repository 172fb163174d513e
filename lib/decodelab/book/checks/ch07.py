"""Checks for the exercises of chapter 07 (PagedAttention): the slot mapping of a block table, releasing a
preempted or finished sequence's blocks without leaking shared ones, and the online-softmax update a paged attention
kernel applies block by block.

Taught in: chapters/07-paged-attention.ipynb, exercises/07-paged-attention.ipynb
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from decodelab.book.checks import CheckFailed, call_student, close, fail, passed

# (block_ids, block_size, start, num_tokens): a prefill from 0, a decode step, a run that crosses a block edge.
_SLOT_CASES = [
    ([7, 2, 9], 4, 0, 10),
    ([7, 2, 9], 4, 9, 1),
    ([3, 0, 5, 1], 16, 14, 5),
]


def _slots(block_ids: list[int], block_size: int, start: int, num_tokens: int) -> list[int]:
    return [block_ids[i // block_size] * block_size + i % block_size for i in range(start, start + num_tokens)]


def check_slot_mapping(fn: Callable[[list[int], int, int, int], list[int]]) -> None:
    """Check `fn(block_ids, block_size, start, num_tokens) -> slots` of positions start .. start+num_tokens-1."""
    for block_ids, block_size, start, num_tokens in _SLOT_CASES:
        what = f"block_ids={block_ids}, block_size={block_size}, start={start}, num_tokens={num_tokens}"
        result = call_student(fn, list(block_ids), block_size, start, num_tokens, what=what)
        try:
            result = [int(x) for x in result]
        except (TypeError, ValueError):
            fail(f"输入 {what} 时应返回一个整数列表，实际返回了 {result!r}。")
        expected = _slots(block_ids, block_size, start, num_tokens)
        if result == expected:
            continue
        positions = list(range(start, start + num_tokens))
        if len(result) != num_tokens:
            fail(f"输入 {what} 时应返回 {num_tokens} 个槽位（每个新 token 一个），你返回了 {len(result)} 个。")
        if result == positions:
            fail(f"输入 {what} 时你返回的是 token 的位置 {positions[:4]}…，没有查块表。第 i 个 token 在第 i // block_size "
                 "个逻辑块，它对应的物理块是 block_ids[i // block_size]。")
        if result == [block_ids[i // block_size] + i % block_size for i in positions]:
            fail(f"输入 {what} 时结果不对：{result}。物理块号要乘以 block_size 才是这一块第一个槽位的编号："
                 "slot = block_ids[i // block_size] × block_size + i % block_size。")
        if result == _slots(block_ids, block_size, 0, num_tokens) and start:
            fail(f"输入 {what} 时你从位置 0 开始算了。decode 一步只有一个新 token，它的位置是 start，"
                 "不是 0：要算的是位置 start … start + num_tokens − 1。")
        capacity = len(block_ids) * block_size
        if start + num_tokens < capacity and result == _slots(block_ids, block_size, start + 1, num_tokens):
            fail(f"输入 {what} 时位置错了一位：第一个新 token 的位置就是 start，不是 start + 1。")
        fail(f"输入 {what} 时槽位不对，你的结果是 {result}。"
             "slot = block_ids[i // block_size] × block_size + i % block_size，i 取 start … start + num_tokens − 1。")
    passed("slot mapping 正确：查块表得到物理块，乘以 block_size 再加块内偏移，decode 时从 start 开始。")


def check_release(fn: Callable[[list[int], list[int], list[int]], None]) -> None:
    """Check `fn(ref_counts, free_queue, block_ids)`: one holder of each block in `block_ids` lets go; a block whose
    count reaches 0 joins the end of `free_queue` (both lists are changed in place)."""
    # Sequence A holds blocks 0, 1, 2; its sibling B (a fork, n = 2) shares 0 and 1 and copied 2 to 3 on write.
    ref_counts = [2, 2, 1, 1, 0, 0]
    free_queue = [4, 5]
    a_blocks, b_blocks = [0, 1, 2], [0, 1, 3]
    what = "序列 A 的块 [0, 1, 2]（0、1 与它 fork 出的序列 B 共享，ref_counts = [2, 2, 1, 1, 0, 0]）"
    result = call_student(fn, ref_counts, free_queue, list(a_blocks), what=what)
    if result is not None and result is not free_queue and result is not ref_counts:
        fail("这个函数应原地修改 ref_counts 和 free_queue（像 BlockPool.release 那样），不需要返回值；"
             "你返回了新的对象，调用者手里的列表没有变。")
    if ref_counts[2] != 0 or 2 not in free_queue:
        if ref_counts[2] == 1 and 2 not in free_queue:
            fail(f"抢占 A 之后，只属于 A 的块 2 没有被释放（ref_counts = {ref_counts}，free_queue = {free_queue}）。"
                 "检查循环是不是漏了最后一块，或者根本没有把引用计数减 1。")
        fail(f"抢占 A 之后块 2 应该回到 free 队列、引用计数为 0；现在 ref_counts = {ref_counts}，free_queue = {free_queue}。")
    if 0 in free_queue or 1 in free_queue:
        fail(f"块 0 和 1 还被序列 B 用着（引用计数原来是 2），A 释放后它们不能进 free 队列，否则会被分给别的序列，"
             f"B 的 K/V 就被覆盖了。现在 free_queue = {free_queue}。只有引用计数减到 0 的块才放回去。")
    if ref_counts[0] != 1 or ref_counts[1] != 1:
        fail(f"A 释放后，共享块 0、1 的引用计数应从 2 减到 1（B 还在用），现在是 {ref_counts[:2]}。"
             "每个块都要先减 1，再看是不是变成了 0；只处理引用计数为 1 的块，共享块的计数就永远减不到 0，"
             "B 结束后它们也回不到 free 队列——块泄漏了。")
    if free_queue != [4, 5, 2]:
        fail(f"free 队列的顺序不对，现在是 {free_queue}：新释放的块要排在队尾（append），原有的块保持原来的顺序。")
    call_student(fn, ref_counts, free_queue, list(b_blocks), what="随后序列 B 的块 [0, 1, 3]")
    if ref_counts != [0] * 6:
        fail(f"A 和 B 都释放之后，所有引用计数都应为 0，现在是 {ref_counts}：有块泄漏了——它们再也回不到 free 队列，"
             "池子会越用越少，最后所有请求都被抢占。共享块（引用计数 > 1）也要减 1，等最后一个持有者释放时才回到队列。")
    if sorted(free_queue) != [0, 1, 2, 3, 4, 5]:
        if len(free_queue) > len(set(free_queue)):
            fail(f"同一个块在 free 队列里出现了两次：{free_queue}。它会被分配给两条序列。")
        fail(f"A 和 B 都释放之后，6 个块都应在 free 队列里，现在是 {free_queue}：有块泄漏了。")
    passed("释放正确：每个块引用计数减 1，减到 0 才回到 free 队列队尾；共享块不会提前释放，也不会泄漏。")


# One sequence's keys, block by block: (scores [n], values [n, 3]). In the first case the maximum rises in every
# block, so a state that is not rescaled shows; in the second it falls; the third's scores overflow exp() unless the
# running maximum is subtracted.
_ONLINE_CASES = [
    ("三个块，最大分数逐块变大", [([0.5, -1.0], [[1, 0, 0], [0, 1, 0]]), ([2.0, 0.0, 1.0], [[0, 0, 1], [1, 1, 0], [2, 0, 1]]),
                                  ([3.5], [[0, 2, 0]])]),
    ("两个块，最大分数在第一块", [([4.0, 1.0], [[1, 2, 3], [0, 1, 0]]), ([0.0, -2.0, 3.0], [[3, 0, 1], [1, 0, 0], [0, 0, 2]])]),
    ("分数很大（约 800）", [([800.0, 799.0], [[1, 0, 0], [0, 1, 0]]), ([805.0, 790.0], [[0, 0, 1], [1, 1, 1]])]),
]


def _online_step(m, l, acc, scores, values, rescale_acc=True, rescale_sum=True):
    """The right update, or (with a flag off) a mistake the check recognises: fold one block into (m, l, acc)."""
    new_max = max(m, float(scores.max()))
    weights = torch.exp(scores - new_max)                                      # [n]
    factor = math.exp(m - new_max)                                             # <= 1; 0 for the first block
    acc = (acc * factor if rescale_acc else acc) + weights @ values            # [D]
    l = (l * factor if rescale_sum else l) + float(weights.sum())
    return new_max, l, acc


def _run_blocks(fn, blocks, what: str):
    m, l, acc = -math.inf, 0.0, torch.zeros(3, dtype=torch.float64)
    for scores, values in blocks:
        scores = torch.tensor(scores, dtype=torch.float64)
        values = torch.tensor(values, dtype=torch.float64)
        try:
            result = call_student(fn, m, l, acc, scores, values, what=what)
        except CheckFailed as error:
            if isinstance(error.__context__, OverflowError):   # call_student turned the student's error into a hint
                fail(f"输入 {what} 时 exp 溢出了（{error}）。要先减去最大分数再取指数：权重是 exp(s_j − m')，"
                     "m' 是到目前为止的最大分数，所以权重都不超过 1；旧状态的系数是 exp(m − m')，也不超过 1。")
            raise
        if not isinstance(result, (tuple, list)) or len(result) != 3:
            fail(f"输入 {what} 时应返回三元组 (m, l, acc)：新的最大分数、新的指数和、新的加权和；你返回了 {result!r}。")
        m, l, acc = result
        m, l = float(m), float(l)
        if not isinstance(acc, torch.Tensor) or tuple(acc.shape) != (3,):
            fail(f"输入 {what} 时 acc 应是形状 [D] = [3] 的张量（按权重加起来的 V），你返回了 {acc!r}。")
        if not (math.isfinite(l) and bool(torch.isfinite(acc).all())):
            break                                   # inf or nan: the check names the cause
    return m, l, acc / l


def check_online_softmax(fn: Callable) -> None:
    """Check `fn(m, l, acc, scores, values) -> (m, l, acc)`: fold one block of scores [n] and values [n, D] into the
    running max m, the running sum l of exp(score - m) and the running weighted sum acc [D]; the check starts from
    (-inf, 0, zeros) and compares acc / l after the last block with softmax(all scores) @ all values."""
    for what, blocks in _ONLINE_CASES:
        scores = torch.tensor([s for block, _ in blocks for s in block], dtype=torch.float64)
        values = torch.tensor([v for _, block in blocks for v in block], dtype=torch.float64)
        expected = torch.softmax(scores, dim=0) @ values                       # [D]
        m, l, out = _run_blocks(fn, blocks, what)
        if close(out, expected):
            if m != float(scores.max()):
                fail(f"输入 {what} 时输出对了，但最后的 m = {m}，不是全部分数的最大值。"
                     "m 应是到目前为止见过的最大分数：m' = max(m, max_j s_j)。")
            continue
        variants = {key: _run_blocks(functools.partial(_online_step, **flags), blocks, what)[2]
                    for key, flags in [("acc", {"rescale_acc": False}), ("sum", {"rescale_sum": False}),
                                       ("both", {"rescale_acc": False, "rescale_sum": False})]}
        if not bool(torch.isfinite(out).all()):
            if "很大" in what:
                fail(f"输入 {what} 时结果是 {out.tolist()}：exp(800) 溢出成了 inf。要先减去最大分数再取指数："
                     "权重是 exp(s_j − m')，m' 是到目前为止的最大分数，所以权重都不超过 1。")
            fail(f"输入 {what} 时结果是 {out.tolist()}，出现了 inf 或 nan。第一块时 m = −inf：这一块的权重要用新的最大值算，"
                 "exp(s_j − m')，用旧的 m 算就是 exp(+inf)；旧状态要乘的系数是 exp(m − m')，第一块时等于 exp(−inf) = 0，"
                 "写成 exp(m' − m) 方向就反了。两处都不超过 1 才对。")
        if close(out, variants["both"]):
            fail(f"输入 {what} 时结果不对：最大分数变大以后，旧的 acc 和 l 都没有乘 exp(m − m')。它们是按旧的最大值 m "
                 "算的权重，换了新的最大值 m' 就要一起缩放，否则新旧两部分的权重不在同一个尺度上。")
        if close(out, variants["acc"]):
            fail(f"输入 {what} 时结果不对：旧的加权和 acc 没有乘 exp(m − m')，指数和 l 乘了。两者必须用同一个系数缩放。")
        if close(out, variants["sum"]):
            fail(f"输入 {what} 时结果不对：旧的指数和 l 没有乘 exp(m − m')，加权和 acc 乘了。两者必须用同一个系数缩放。")
        fail(f"输入 {what} 时 acc / l 不对，你的结果是 "
             f"{[round(x, 4) for x in out.tolist()]}。按顺序：m' = max(m, max s_j)；w_j = exp(s_j − m')；"
             "acc' = acc · exp(m − m') + Σ w_j v_j；l' = l · exp(m − m') + Σ w_j。")
    passed("online softmax 正确：每读一块就用 exp(m − m') 缩放旧状态，再加上这一块，读完后 acc / l 等于完整的 softmax 加权。")


# ---- exercise 7.4 (predict, then measure): sequences that fit in a KV budget with and without paging ---------------

POOL_BLOCKS = 64  # the KV pool: 64 blocks of 16 slots = 1024 token slots
BLOCK_SIZE = 16
MAX_MODEL_LEN = 256  # without paging, each sequence reserves this many contiguous slots up front
SEQUENCE_LENGTHS = [int(x) for x in torch.randint(20, 201, (40,), generator=torch.Generator().manual_seed(7))]


def check_paged_fit(prediction, blocks_needed, admitted) -> None:
    """Check the student's count of how many of SEQUENCE_LENGTHS (in order) fit at once in POOL_BLOCKS blocks of
    BLOCK_SIZE slots when each sequence holds only the blocks it needs: `blocks_needed[i]` is the student's block
    count for sequence i and `admitted` how many sequences, from the first, fit. The check recomputes both and sets
    the paged count beside the student's `prediction` and the contiguous count (each sequence reserving
    MAX_MODEL_LEN slots).

    Taught in: exercises/07-paged-attention.ipynb
    """
    from decodelab.book.checks import as_prediction, compare_prediction

    guess = as_prediction(prediction, "PREDICTION", 0, len(SEQUENCE_LENGTHS))
    if blocks_needed is None or admitted is None:
        fail("还没有量：blocks_needed 和 admitted 还是 None。先算每条序列要几个块，再从第一条起依次放进池子，数一数放得下几条。")
    try:
        blocks = [int(b) for b in blocks_needed]
    except (TypeError, ValueError):
        fail("blocks_needed 应是一个整数列表：SEQUENCE_LENGTHS 里每条序列要几个块。")
    if len(blocks) != len(SEQUENCE_LENGTHS):
        fail(f"blocks_needed 应有 {len(SEQUENCE_LENGTHS)} 项（每条序列一项），你给了 {len(blocks)} 项。")
    right = [-(-n // BLOCK_SIZE) for n in SEQUENCE_LENGTHS]
    for i, (mine, n) in enumerate(zip(blocks, SEQUENCE_LENGTHS)):
        if mine == right[i]:
            continue
        if mine == n // BLOCK_SIZE:
            fail(f"第 {i} 条序列有 {n} 个 token，你算成 {mine} 块：向下取整会丢掉最后不满的一块，要向上取整（-(-n // B)）。")
        fail(f"第 {i} 条序列有 {n} 个 token，你算成 {mine} 块。块数 = ⌈token 数 / 每块槽位数⌉。")
    if isinstance(admitted, bool) or not isinstance(admitted, int):
        fail(f"admitted 应是一个整数（放得下的序列条数），你给的是 {admitted!r}。")
    used, fit = 0, 0
    for b in right:
        if used + b > POOL_BLOCKS:
            break
        used, fit = used + b, fit + 1
    if admitted != fit:
        fail(f"按你算出的块数，从第一条起依次放，放得下的不是 {admitted} 条：把 blocks_needed 逐条加起来，"
             f"加到超过 {POOL_BLOCKS} 块之前停下（用你的代码数，不要猜）。")
    contiguous = POOL_BLOCKS * BLOCK_SIZE // MAX_MODEL_LEN
    waste = sum(b * BLOCK_SIZE - n for b, n in zip(right[:fit], SEQUENCE_LENGTHS[:fit]))
    passed(f"分页时放得下 {fit} 条：{compare_prediction(guess, fit, '{:g}')}。不分页、每条预留 {MAX_MODEL_LEN} 个槽位时只放得下 "
           f"{contiguous} 条。分页后每条序列只浪费最后一块里没用的槽位（这 {fit} 条一共 {waste} 个，"
           f"不到 {BLOCK_SIZE} 个一条）；预留整段最大长度则把每条没写满的部分都占着。"
           "预测偏低，多半是按最大长度而不是实际长度估的；偏高，多半是忘了每条都要向上取整到整块。")
