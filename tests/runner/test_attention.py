"""Paged attention equals dense causal attention (chapter 7)."""
import math

import pytest
import torch

from decodelab.runner.attention import paged_attention, write_kv


def dense_causal_attention(q, k, v):
    """q [T, H, D], k/v [T, KVH, D] of one sequence; plain softmax(QK^T / sqrt(D)) V with a causal mask."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    mask = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def scattered_batch(lengths, block_size, num_blocks, heads, kv_heads, dim, device, seed=0):
    """Sequences whose K/V live in shuffled blocks of a pool, plus the dense tensors they came from."""
    gen = torch.Generator().manual_seed(seed)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    key_cache = torch.zeros(num_blocks, block_size, kv_heads, dim, device=device)
    value_cache = torch.zeros_like(key_cache)
    dense, tables = [], []
    for length in lengths:
        q = torch.randn(length, heads, dim, generator=gen).to(device)
        k = torch.randn(length, kv_heads, dim, generator=gen).to(device)
        v = torch.randn(length, kv_heads, dim, generator=gen).to(device)
        blocks = [free.pop() for _ in range(-(-length // block_size))]
        slots = torch.tensor([blocks[i // block_size] * block_size + i % block_size for i in range(length)],
                             device=device)
        write_kv(key_cache, value_cache, slots, k, v)
        dense.append((q, k, v))
        tables.append(blocks)
    return key_cache, value_cache, dense, tables


def check_paged_equals_dense(device, lengths=(1, 7, 16, 23), block_size=4, heads=4, kv_heads=2, dim=8):
    key_cache, value_cache, dense, tables = scattered_batch(lengths, block_size, 40, heads, kv_heads, dim, device)
    max_len, max_blocks = max(lengths), max(map(len, tables))
    query = torch.zeros(len(lengths), max_len, heads, dim, device=device)
    positions = torch.zeros(len(lengths), max_len, dtype=torch.long, device=device)
    for b, (q, _, _) in enumerate(dense):
        query[b, : len(q)] = q
        positions[b, : len(q)] = torch.arange(len(q))
    block_tables = torch.tensor([t + [0] * (max_blocks - len(t)) for t in tables], device=device)
    out = paged_attention(query, key_cache, value_cache, block_tables, torch.tensor(lengths, device=device), positions)
    for b, (q, k, v) in enumerate(dense):
        torch.testing.assert_close(out[b, : len(q)], dense_causal_attention(q, k, v), atol=1e-5, rtol=1e-5)
    # Decode: only each sequence's last token queries, and it sees every key of its own sequence.
    last = torch.stack([q[-1:] for q, _, _ in dense])                          # [B, 1, H, D]
    lens = torch.tensor(lengths, device=device)
    out = paged_attention(last, key_cache, value_cache, block_tables, lens, (lens - 1)[:, None])
    for b, (q, k, v) in enumerate(dense):
        torch.testing.assert_close(out[b, 0], dense_causal_attention(q, k, v)[-1], atol=1e-5, rtol=1e-5)


def test_paged_equals_dense_cpu():
    check_paged_equals_dense("cpu")


def test_paged_equals_dense_without_gqa_and_block_size_one():
    check_paged_equals_dense("cpu", lengths=(3, 5), block_size=1, heads=2, kv_heads=2)


@pytest.mark.cuda
def test_paged_equals_dense_cuda():
    check_paged_equals_dense("cuda")


def test_write_kv_puts_tokens_at_their_slots():
    key_cache = torch.zeros(3, 2, 1, 1)
    value_cache = torch.zeros(3, 2, 1, 1)
    write_kv(key_cache, value_cache, torch.tensor([5, 0]), torch.tensor([[[1.0]], [[2.0]]]),
             torch.tensor([[[3.0]], [[4.0]]]))
    assert key_cache[2, 1, 0, 0] == 1.0 and key_cache[0, 0, 0, 0] == 2.0  # slot 5 = block 2, offset 1
    assert value_cache[2, 1, 0, 0] == 3.0 and value_cache.sum() == 7.0


def test_bad_shapes():
    cache = torch.zeros(4, 2, 2, 8)
    with pytest.raises(ValueError, match="key and value must have shape"):
        write_kv(cache, cache.clone(), torch.tensor([0]), torch.zeros(1, 3, 8), torch.zeros(1, 3, 8))
    with pytest.raises(ValueError, match="slot_mapping must have shape"):
        write_kv(cache, cache.clone(), torch.tensor([0, 1]), torch.zeros(1, 2, 8), torch.zeros(1, 2, 8))
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        paged_attention(torch.zeros(1, 1, 3, 8), cache, cache.clone(), torch.zeros(1, 1, dtype=torch.long),
                        torch.ones(1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="context_lens"):
        paged_attention(torch.zeros(1, 1, 4, 8), cache, cache.clone(), torch.zeros(1, 1, dtype=torch.long),
                        torch.ones(2, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long))
