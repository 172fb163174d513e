"""Paged decode attention as a Triton kernel: read K/V straight from the pool's blocks, no gather.

The torch reference (`decodelab.runner.attention.paged_attention`) first copies every block a sequence's table names into
one contiguous tensor, then attends. This kernel reads each block where it sits, as vLLM's PagedAttention kernels do, and
folds it into a running softmax (the online softmax of FlashAttention and FlashDecoding), so nothing but the output is
written back. One program serves one sequence, one K/V head and one partition of the context: it loads each tile of
keys and values once and uses it for all the query heads that share that K/V head (grouped-query attention). A step
takes TILE_TOKENS tokens, several blocks, and does its two products with tl.dot (tensor cores on a GPU): walking one
block of 16 per step with elementwise products, an earlier version spent about 3 us a step waiting on an H200.

Split-K (FlashDecoding, vLLM's paged_attention_v2): a decode step has only batch x kv_heads (sequence, K/V head)
pairs, 64 at batch 8 on Llama-3-8B, fewer than the 132 SMs of an H100/H200, and one program walking 2,048 tokens
serially leaves most of the GPU idle. So a long context is cut into `num_splits` partitions of whole blocks; each
program attends over its partition alone and writes its unnormalised output with its running max and sum of exp,
and a second small kernel combines the partitions with the log-sum-exp rescaling:

    m = max_s m_s      out = sum_s exp(m_s - m) * acc_s / sum_s exp(m_s - m) * l_s

A partition past a sequence's end (a short sequence next to a long one) is empty: m_s = -inf, l_s = 0, acc_s = 0, and
it weighs nothing. With one partition (short contexts, or a batch that already fills the GPU) the kernel normalises
and stores the output itself: no partials, no second launch. `choose_num_splits` picks the count.

It serves decode steps (one new token per sequence). Prefill keeps the torch reference. It runs compiled on a CUDA
GPU, and on CPU tensors under Triton's interpreter (`TRITON_INTERPRET=1`, set before triton is imported), which is how
the tests check it on a machine without a GPU.

Taught in: chapters/07-paged-attention.ipynb
"""
from __future__ import annotations

import functools
import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the module still imports; `unavailable_reason` says why the kernel cannot run
    triton = None

TILE_TOKENS = 128         # keys and values one loop step loads (8 blocks of 16): enough loads in flight per program
MIN_DOT = 16              # tl.dot needs each side >= 16: the query heads of a group and head_dim are padded to it
PROGRAMS_PER_SM = 2       # a split batch aims at about this many programs per SM (the best count on an H200)
MIN_SPLIT_TOKENS = 512    # a shorter partition saves less serial walking than its partial writes and extra launch cost
MAX_SPLITS = 32           # the combining kernel holds [num_splits, head_dim] partials of one head in registers


def unavailable_reason(device: torch.device | str) -> str | None:
    """Why the kernel cannot run on `device` here, or None when it can."""
    if triton is None:
        return "triton is not installed (pip install triton; CUDA GPUs get it with torch)"
    if torch.device(device).type == "cuda":
        return None
    if os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return (f"the Triton kernel runs on a CUDA GPU, or on CPU under TRITON_INTERPRET=1 (set before importing "
            f"triton); got device {torch.device(device)}")


def choose_num_splits(batch: int, num_kv_heads: int, max_context: int, num_sms: int) -> int:
    """How many partitions each (sequence, K/V head) gets. One while the batch x kv_heads pairs are at least the SMs:
    each SM has a program, whose TILE_TOKENS-token steps keep enough loads in flight, and splitting would only add the
    partials' traffic and a launch (on an H200, 32 x 8 pairs at 2,048 tokens: 0.073 ms in one pass, 0.078-0.091 ms
    split). Fewer pairs: enough partitions for about PROGRAMS_PER_SM programs per SM, none shorter than
    MIN_SPLIT_TOKENS (contexts under 2 x MIN_SPLIT_TOKENS keep the single pass), at most MAX_SPLITS.

    max_context: the longest context the block tables can hold (max_blocks x block_size), known without a host sync.

    >>> choose_num_splits(batch=8, num_kv_heads=8, max_context=2048, num_sms=132)    # 64 pairs on an H200: split
    4
    >>> choose_num_splits(batch=8, num_kv_heads=8, max_context=512, num_sms=132)     # short: one pass
    1
    >>> choose_num_splits(batch=32, num_kv_heads=8, max_context=2048, num_sms=132)   # 256 pairs fill it already
    1
    """
    pairs = batch * num_kv_heads
    if pairs >= num_sms:
        return 1
    wanted = -(-PROGRAMS_PER_SM * num_sms // pairs)
    return max(1, min(wanted, max_context // MIN_SPLIT_TOKENS, MAX_SPLITS))


if triton is not None:
    @triton.jit
    def _paged_decode_kernel(out_ptr, partial_out_ptr, partial_max_ptr, partial_sum_ptr,
                             query_ptr, key_cache_ptr, value_cache_ptr, block_tables_ptr, context_lens_ptr,
                             scale, tokens_per_split, num_splits,
                             stride_qb, stride_qh, stride_cb, stride_cs, stride_ch, stride_tb, stride_ob, stride_oh,
                             GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                             GROUP_P2: tl.constexpr, DIM_P2: tl.constexpr, TILE: tl.constexpr,
                             SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr):
        """Program (seq, kv_head, split): attention of the GROUP query heads that read `kv_head` over the tokens
        [split * tokens_per_split, (split + 1) * tokens_per_split) of `seq`'s context, TILE tokens per step.

        Each step looks up every token's block in the table (token // BLOCK_SIZE) and its slot in it, so a tile may
        span several blocks and BLOCK_SIZE need not be a power of two. SPLIT False: the partition is the whole context;
        store the normalised output [G, D]. SPLIT True: store the unnormalised sum, running max and sum of exp for
        `_combine_splits_kernel` (out_ptr unused then; the partials unused otherwise)."""
        seq = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        group = tl.arange(0, GROUP_P2)
        heads = kv_head * GROUP + group                   # the query heads reading this K/V head, padded for tl.dot
        head_ok = group < GROUP
        dims = tl.arange(0, DIM_P2)
        dim_ok = dims < HEAD_DIM
        query = tl.load(query_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :],
                        mask=head_ok[:, None] & dim_ok[None, :], other=0.0)                   # [G, D]
        query = query.to(key_cache_ptr.dtype.element_ty)  # tl.dot wants both sides in the cache's dtype
        context_len = tl.load(context_lens_ptr + seq)
        first = split * tokens_per_split
        last = tl.minimum(first + tokens_per_split, context_len)    # first >= last: an empty partition
        running_max = tl.full([GROUP_P2], -float("inf"), dtype=tl.float32)                   # [G]
        running_sum = tl.zeros([GROUP_P2], dtype=tl.float32)                                # [G]
        acc = tl.zeros([GROUP_P2, DIM_P2], dtype=tl.float32)   # [G, D] unnormalised weighted sum of values
        for start in range(first, last, TILE):
            tokens = start + tl.arange(0, TILE)
            token_ok = tokens < last
            block_id = tl.load(block_tables_ptr + seq * stride_tb + tokens // BLOCK_SIZE, mask=token_ok,
                               other=0).to(tl.int64)                                         # [T]; big pools: 64-bit
            slot = block_id * stride_cb + (tokens % BLOCK_SIZE) * stride_cs + kv_head * stride_ch             # [T]
            keys = tl.load(key_cache_ptr + slot[None, :] + dims[:, None],
                           mask=dim_ok[:, None] & token_ok[None, :], other=0.0)                # [D, T], transposed
            scores = tl.dot(query, keys, input_precision=DOT_PRECISION) * scale                              # [G, T]
            scores = tl.where(token_ok[None, :], scores, -float("inf"))
            new_max = tl.maximum(running_max, tl.max(scores, axis=1))   # finite: every tile holds a token
            rescale = tl.exp(running_max - new_max)          # earlier tiles were weighted against the old max
            weights = tl.exp(scores - new_max[:, None])                                                      # [G, T]
            values = tl.load(value_cache_ptr + slot[:, None] + dims[None, :],
                             mask=token_ok[:, None] & dim_ok[None, :], other=0.0)                           # [T, D]
            acc = acc * rescale[:, None] + tl.dot(weights.to(values.dtype), values, input_precision=DOT_PRECISION)
            running_sum = running_sum * rescale + tl.sum(weights, axis=1)
            running_max = new_max
        if SPLIT:   # partials [B, H, num_splits, (D)], contiguous: row (seq, head, split)
            rows = (seq * tl.num_programs(1) * GROUP + heads) * num_splits + split                           # [G]
            tl.store(partial_out_ptr + rows[:, None] * HEAD_DIM + dims[None, :], acc,
                     mask=head_ok[:, None] & dim_ok[None, :])
            tl.store(partial_max_ptr + rows, running_max, mask=head_ok)
            tl.store(partial_sum_ptr + rows, running_sum, mask=head_ok)
        else:
            out = acc / running_sum[:, None]                                                                 # [G, D]
            tl.store(out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :],
                     out.to(out_ptr.dtype.element_ty), mask=head_ok[:, None] & dim_ok[None, :])

    @triton.jit
    def _combine_splits_kernel(out_ptr, partial_out_ptr, partial_max_ptr, partial_sum_ptr, num_splits,
                               stride_ob, stride_oh,
                               HEAD_DIM: tl.constexpr, DIM_P2: tl.constexpr, SPLITS_P2: tl.constexpr):
        """Program (seq, head): out = sum_s exp(m_s - m) acc_s / sum_s exp(m_s - m) l_s with m = max_s m_s, the
        softmax over the whole context rebuilt from the partitions' own. Partition 0 always holds a token, so m is
        finite, and an empty partition (m_s = -inf) gets weight 0."""
        seq = tl.program_id(0)
        head = tl.program_id(1)
        splits = tl.arange(0, SPLITS_P2)
        split_ok = splits < num_splits
        dims = tl.arange(0, DIM_P2)
        dim_ok = dims < HEAD_DIM
        rows = (seq * tl.num_programs(1) + head) * num_splits + splits                                      # [S]
        partial_max = tl.load(partial_max_ptr + rows, mask=split_ok, other=-float("inf"))                    # [S]
        partial_sum = tl.load(partial_sum_ptr + rows, mask=split_ok, other=0.0)                              # [S]
        partial_out = tl.load(partial_out_ptr + rows[:, None] * HEAD_DIM + dims[None, :],
                              mask=split_ok[:, None] & dim_ok[None, :], other=0.0)                          # [S, D]
        weights = tl.exp(partial_max - tl.max(partial_max, axis=0))                                          # [S]
        out = tl.sum(weights[:, None] * partial_out, axis=0) / tl.sum(weights * partial_sum, axis=0)       # [D]
        tl.store(out_ptr + seq * stride_ob + head * stride_oh + dims, out.to(out_ptr.dtype.element_ty), mask=dim_ok)


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    """The SMs to fill: the GPU's count; 1 on CPU (the interpreter runs programs one after another anyway). Cached:
    the engine asks in every layer of every decode step, and a device's count never changes."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def paged_decode_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           scale: float | None = None, check_lengths: bool = True,
                           num_splits: int | None = None) -> torch.Tensor:
    """Attention of one new token per sequence over its K/V blocks, computed by the Triton kernel.

    query:           [B, heads, head_dim]   (the token at position context_lens - 1, its K/V already written)
    key/value_cache: [num_blocks, block_size, kv_heads, head_dim]
    block_tables:    [B, max_blocks] integer block ids; context_lens: [B], each >= 1
    check_lengths:   check context_lens against the tables (a host sync); the engine's model, which built them
                     itself, passes False so a decode step costs no sync per layer
    num_splits:      partitions per context (split-K), 1 to MAX_SPLITS; None lets `choose_num_splits` pick from
                     B x kv_heads, max_blocks x block_size and the GPU's SM count (1 for short contexts)
    returns          [B, heads, head_dim], equal to `paged_attention` with Q = 1 up to float rounding

    Example:
        out = paged_decode_attention(q, key_cache, value_cache, tables, lens)   # on CUDA tensors
    Taught in: chapters/07-paged-attention.ipynb
    """
    reason = unavailable_reason(query.device)
    if reason is not None:
        raise RuntimeError(reason)
    if query.dim() != 3 or key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError(f"query must be [B, H, D] and the caches equal [num_blocks, block_size, KVH, D], got "
                         f"{tuple(query.shape)}, {tuple(key_cache.shape)}, {tuple(value_cache.shape)}")
    batch, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, cache_dim = key_cache.shape
    if num_heads % num_kv_heads != 0 or head_dim != cache_dim:
        raise ValueError(f"heads ({num_heads}) must be a multiple of kv_heads ({num_kv_heads}) and head_dim "
                         f"must match the cache ({cache_dim}), got {head_dim}")
    if block_tables.dim() != 2 or block_tables.shape[0] != batch or context_lens.shape != (batch,):
        raise ValueError(f"block_tables [{batch}, max_blocks] and context_lens [{batch}] expected, got "
                         f"{tuple(block_tables.shape)} and {tuple(context_lens.shape)}")
    if batch == 0:
        raise ValueError("query must hold at least one sequence, got B = 0")
    if block_tables.is_floating_point() or context_lens.is_floating_point():
        raise ValueError(f"block_tables and context_lens must be integer tensors, got {block_tables.dtype} and "
                         f"{context_lens.dtype}")
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int)
                                   or not 1 <= num_splits <= MAX_SPLITS):
        raise ValueError(f"num_splits must be None (chosen from the batch and context) or an integer in "
                         f"[1, {MAX_SPLITS}], got {num_splits!r}")
    max_blocks = block_tables.shape[1]
    if check_lengths:   # reads two numbers back from the GPU: a caller that built the lengths itself skips it
        shortest, longest = int(context_lens.min()), int(context_lens.max())
        if shortest < 1 or longest > max_blocks * block_size:
            raise ValueError(f"context_lens must be in [1, {max_blocks * block_size}] (max_blocks x "
                             f"block_size), got {shortest}..{longest}")
    if key_cache.stride(3) != 1 or query.stride(2) != 1 or key_cache.stride() != value_cache.stride():
        raise ValueError(f"the kernel reads head_dim contiguously and both caches with one set of strides, got "
                         f"query strides {query.stride()}, key cache {key_cache.stride()}, value cache "
                         f"{value_cache.stride()}")
    if num_splits is None:
        num_splits = choose_num_splits(batch, num_kv_heads, max_blocks * block_size, _num_sms(query.device))
    scale = head_dim ** -0.5 if scale is None else scale
    block_tables = block_tables.contiguous()
    context_lens = context_lens.contiguous()
    out = torch.empty_like(query)                                                # [B, H, D]
    group = num_heads // num_kv_heads
    tokens_per_split = -(-max_blocks // num_splits) * block_size     # whole blocks; the last partitions may be empty
    if num_splits == 1:
        partial_out = partial_max = partial_sum = out                # not read or written by the single pass
    else:
        partial_out = torch.empty(batch, num_heads, num_splits, head_dim, device=query.device)   # [B, H, S, D] fp32
        partial_max = torch.empty(batch, num_heads, num_splits, device=query.device)             # [B, H, S]
        partial_sum = torch.empty_like(partial_max)                                                # [B, H, S]
    dim_p2 = max(MIN_DOT, triton.next_power_of_2(head_dim))
    _paged_decode_kernel[(batch, num_kv_heads, num_splits)](
        out, partial_out, partial_max, partial_sum, query, key_cache, value_cache, block_tables, context_lens, scale,
        tokens_per_split, num_splits,
        query.stride(0), query.stride(1), key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=group, BLOCK_SIZE=block_size, HEAD_DIM=head_dim, GROUP_P2=max(MIN_DOT, triton.next_power_of_2(group)),
        DIM_P2=dim_p2, TILE=TILE_TOKENS, SPLIT=num_splits > 1,
        DOT_PRECISION="ieee" if key_cache.dtype == torch.float32 else "tf32")   # fp32 caches: no TF32 rounding
    if num_splits > 1:
        _combine_splits_kernel[(batch, num_heads)](
            out, partial_out, partial_max, partial_sum, num_splits, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, DIM_P2=dim_p2, SPLITS_P2=triton.next_power_of_2(num_splits))
    return out
