"""Paged decode attention as a Triton kernel: read K/V straight from the pool's blocks, no gather.

The torch reference (`decodelab.runner.attention.paged_attention`) first copies every block a sequence's table names into
one contiguous tensor, then attends. This kernel reads each block where it sits, as vLLM's PagedAttention kernels do, and
folds it into a running softmax (the online softmax of FlashAttention and FlashDecoding), so nothing but the output is
written back. One program serves one sequence and one K/V head: it loads each block of keys and values once and uses
it for all the query heads that share that K/V head (grouped-query attention), walking the block table from start to
end. (FlashDecoding and vLLM's v2 kernel also split a long context over several programs; this one does not.)

It serves decode steps (one new token per sequence). Prefill keeps the torch reference. It runs compiled on a CUDA
GPU, and on CPU tensors under Triton's interpreter (`TRITON_INTERPRET=1`, set before triton is imported), which is how
the tests check it on a machine without a GPU.

Taught in: chapters/07-paged-attention.ipynb
"""
from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the module still imports; `unavailable_reason` says why the kernel cannot run
    triton = None


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


if triton is not None:
    @triton.jit
    def _paged_decode_kernel(out_ptr, query_ptr, key_cache_ptr, value_cache_ptr, block_tables_ptr, context_lens_ptr,
                             scale, stride_qb, stride_qh, stride_cb, stride_cs, stride_ch, stride_tb,
                             stride_ob, stride_oh,
                             GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                             GROUP_P2: tl.constexpr, BLOCK_P2: tl.constexpr, DIM_P2: tl.constexpr):
        seq = tl.program_id(0)
        kv_head = tl.program_id(1)
        heads = kv_head * GROUP + tl.arange(0, GROUP_P2)     # the query heads reading this K/V head; tl.arange
        head_ok = tl.arange(0, GROUP_P2) < GROUP             # needs a power of two, so mask the padding
        dims = tl.arange(0, DIM_P2)
        dim_ok = dims < HEAD_DIM
        offsets = tl.arange(0, BLOCK_P2)
        query = tl.load(query_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :],
                        mask=head_ok[:, None] & dim_ok[None, :], other=0.0).to(tl.float32)     # [G, D]
        context_len = tl.load(context_lens_ptr + seq)
        running_max = tl.full([GROUP_P2], -float("inf"), dtype=tl.float32)                     # [G]
        running_sum = tl.zeros([GROUP_P2], dtype=tl.float32)                                  # [G]
        acc = tl.zeros([GROUP_P2, DIM_P2], dtype=tl.float32)   # [G, D] unnormalised weighted sum of values
        for logical_block in range(0, tl.cdiv(context_len, BLOCK_SIZE)):
            block_id = tl.load(block_tables_ptr + seq * stride_tb + logical_block).to(tl.int64)  # big pools: 64-bit
            key_ok = (offsets < BLOCK_SIZE) & (logical_block * BLOCK_SIZE + offsets < context_len)
            slot = block_id * stride_cb + kv_head * stride_ch + offsets[:, None] * stride_cs + dims[None, :]
            both_ok = key_ok[:, None] & dim_ok[None, :]
            keys = tl.load(key_cache_ptr + slot, mask=both_ok, other=0.0).to(tl.float32)        # [block, D]
            scores = tl.sum(query[:, None, :] * keys[None, :, :], axis=2) * scale                # [G, block]
            scores = tl.where(key_ok[None, :], scores, -float("inf"))
            new_max = tl.maximum(running_max, tl.max(scores, axis=1))                             # [G]
            rescale = tl.exp(running_max - new_max)          # earlier blocks were weighted against the old max
            weights = tl.exp(scores - new_max[:, None])                                           # [G, block]
            values = tl.load(value_cache_ptr + slot, mask=both_ok, other=0.0).to(tl.float32)    # [block, D]
            acc = acc * rescale[:, None] + tl.sum(weights[:, :, None] * values[None, :, :], axis=1)
            running_sum = running_sum * rescale + tl.sum(weights, axis=1)
            running_max = new_max
        out = acc / running_sum[:, None]                                                          # [G, D]
        tl.store(out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=head_ok[:, None] & dim_ok[None, :])


def paged_decode_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           scale: float | None = None, check_lengths: bool = True) -> torch.Tensor:
    """Attention of one new token per sequence over its K/V blocks, computed by the Triton kernel.

    query:           [B, heads, head_dim]   (the token at position context_lens - 1, its K/V already written)
    key/value_cache: [num_blocks, block_size, kv_heads, head_dim]
    block_tables:    [B, max_blocks] integer block ids; context_lens: [B], each >= 1
    check_lengths:   check context_lens against the tables (a host sync); the engine's model, which built them
                     itself, passes False so a decode step costs no sync per layer
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
    if check_lengths:   # reads two numbers back from the GPU: a caller that built the lengths itself skips it
        shortest, longest = int(context_lens.min()), int(context_lens.max())
        if shortest < 1 or longest > block_tables.shape[1] * block_size:
            raise ValueError(f"context_lens must be in [1, {block_tables.shape[1] * block_size}] (max_blocks x "
                             f"block_size), got {shortest}..{longest}")
    if key_cache.stride(3) != 1 or query.stride(2) != 1 or key_cache.stride() != value_cache.stride():
        raise ValueError(f"the kernel reads head_dim contiguously and both caches with one set of strides, got "
                         f"query strides {query.stride()}, key cache {key_cache.stride()}, value cache "
                         f"{value_cache.stride()}")
    scale = head_dim ** -0.5 if scale is None else scale
    block_tables = block_tables.contiguous()
    context_lens = context_lens.contiguous()
    out = torch.empty_like(query)                                                # [B, H, D]
    group = num_heads // num_kv_heads
    _paged_decode_kernel[(batch, num_kv_heads)](
        out, query, key_cache, value_cache, block_tables, context_lens, scale,
        query.stride(0), query.stride(1), key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=group, BLOCK_SIZE=block_size, HEAD_DIM=head_dim, GROUP_P2=triton.next_power_of_2(group),
        BLOCK_P2=triton.next_power_of_2(block_size), DIM_P2=triton.next_power_of_2(head_dim))
    return out
