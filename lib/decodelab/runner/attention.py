"""Paged attention: write K/V into pool slots, then attend by gathering each sequence's blocks.

The torch reference below is what chapter 7 reads: gather the blocks a sequence's block table names into one
contiguous [keys, kv_heads, head_dim] tensor, then do ordinary causal scaled dot-product attention with
grouped-query heads. It runs on CPU and CUDA.

Taught in: chapters/07-paged-attention.ipynb
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def write_kv(key_cache: torch.Tensor, value_cache: torch.Tensor, slot_mapping: torch.Tensor,
             key: torch.Tensor, value: torch.Tensor) -> None:
    """Store key/value [T, kv_heads, head_dim] of T new tokens at their slots (block_id × block_size + offset).

    key_cache, value_cache: [num_blocks, block_size, kv_heads, head_dim]; slot_mapping: [T] long.
    """
    if key.shape != value.shape or key.dim() != 3 or key.shape[1:] != key_cache.shape[2:]:
        raise ValueError(f"key and value must have shape [T, {key_cache.shape[2]}, {key_cache.shape[3]}], "
                         f"got {tuple(key.shape)} and {tuple(value.shape)}")
    if slot_mapping.shape != (key.shape[0],):
        raise ValueError(f"slot_mapping must have shape [{key.shape[0]}], got {tuple(slot_mapping.shape)}")
    num_kv_heads, head_dim = key_cache.shape[2:]
    key_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key)      # [slots, kv_heads, head_dim]
    value_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value)


def visible_keys(context_lens: torch.Tensor, query_positions: torch.Tensor, num_keys: int) -> torch.Tensor:
    """Causal mask [B, Q, num_keys]: query (b, q) sees key j when j <= its position and j < context_lens[b]."""
    key_positions = torch.arange(num_keys, device=query_positions.device)           # [K]
    return (key_positions[None, None, :] <= query_positions[:, :, None]) \
        & (key_positions[None, None, :] < context_lens[:, None, None])              # [B, Q, K]


def paged_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    block_tables: torch.Tensor, context_lens: torch.Tensor, query_positions: torch.Tensor,
                    scale: float | None = None, visible: torch.Tensor | None = None) -> torch.Tensor:
    """Causal grouped-query attention of padded queries over K/V reached through block tables.

    query:           [B, Q, heads, head_dim]  (Q = longest query in the batch; shorter ones are padded)
    key/value_cache: [num_blocks, block_size, kv_heads, head_dim]
    block_tables:    [B, max_blocks] long, padded with any valid block id
    context_lens:    [B] long, keys each sequence has written (its past plus this step's tokens)
    query_positions: [B, Q] long, absolute position of each query; a query sees keys 0..position
    visible:         optional [B, Q, max_blocks * block_size] mask from `visible_keys`, boolean or additive
                     (0 / -inf); a model computes it once per step and reuses it in every layer
    returns          [B, Q, heads, head_dim]; rows of padded queries hold garbage and must be dropped

    Example (decode, one new token per sequence): Q = 1 and query_positions = context_lens - 1.
    Taught in: chapters/07-paged-attention.ipynb
    """
    if query.dim() != 4 or key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError(f"query must be [B, Q, H, D] and the caches equal [num_blocks, block_size, KVH, D], got "
                         f"{tuple(query.shape)}, {tuple(key_cache.shape)}, {tuple(value_cache.shape)}")
    batch, num_queries, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    if num_heads % num_kv_heads != 0 or head_dim != key_cache.shape[3]:
        raise ValueError(f"heads ({num_heads}) must be a multiple of kv_heads ({num_kv_heads}) and head_dim "
                         f"must match the cache ({key_cache.shape[3]}), got {head_dim}")
    if block_tables.shape[0] != batch or context_lens.shape != (batch,) or query_positions.shape != (batch, num_queries):
        raise ValueError(f"block_tables [B={batch}, max_blocks], context_lens [{batch}] and query_positions "
                         f"[{batch}, {num_queries}] expected, got {tuple(block_tables.shape)}, "
                         f"{tuple(context_lens.shape)}, {tuple(query_positions.shape)}")
    num_keys = block_tables.shape[1] * block_size
    keys = key_cache[block_tables].reshape(batch, num_keys, num_kv_heads, head_dim)      # [B, K, KVH, D]
    values = value_cache[block_tables].reshape(batch, num_keys, num_kv_heads, head_dim)  # [B, K, KVH, D]
    if visible is None:
        visible = visible_keys(context_lens, query_positions, num_keys)
    # enable_gqa lets query head h read kv head h // (heads / kv_heads) without copying K/V per query head
    out = F.scaled_dot_product_attention(query.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                         attn_mask=visible[:, None], scale=scale, enable_gqa=True)  # [B, H, Q, D]
    return out.transpose(1, 2)
