"""The contiguous KV cache and its memory formula (chapter 6)."""
import pytest
import torch
from transformers import LlamaConfig

from decodelab.kv.contiguous_cache import ContiguousKVCache, kv_bytes_per_token, kv_cache_bytes


def test_formula_matches_llama3_8b():
    # 32 layers × 8 KV heads × head_dim 128 × 2 (K, V) × 2 bytes = 128 KiB per token
    assert kv_cache_bytes(32, 8, 128, 1, 2) == 128 * 1024
    assert kv_cache_bytes(32, 8, 128, 1000, 2) == 1000 * 128 * 1024
    assert kv_cache_bytes(2, 2, 16, 0, 4) == 0


def test_bytes_per_token_from_config(random_llama):
    # random_llama: 2 layers, 2 KV heads, head_dim 64 / 4 = 16, float32
    assert kv_bytes_per_token(random_llama.config) == 2 * 2 * 2 * 16 * 4
    config = LlamaConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, num_hidden_layers=32)
    assert kv_bytes_per_token(config, torch.bfloat16) == 128 * 1024


def test_cache_matches_its_own_nbytes():
    cache = ContiguousKVCache(num_layers=2, batch_size=3, max_len=10, num_kv_heads=2, head_dim=4)
    assert cache.nbytes == kv_cache_bytes(2, 2, 4, 3 * 10, 4)


def test_update_writes_and_returns_the_prefix():
    torch.manual_seed(0)
    cache = ContiguousKVCache(num_layers=2, batch_size=2, max_len=8, num_kv_heads=2, head_dim=4)
    k1, v1 = torch.randn(2, 3, 2, 4), torch.randn(2, 3, 2, 4)
    k2, v2 = torch.randn(2, 1, 2, 4), torch.randn(2, 1, 2, 4)
    cache.update(0, k1, v1, start=0)
    cache.update(1, k1, v1, start=0)
    k_all, v_all = cache.update(0, k2, v2, start=3)
    assert k_all.shape == (2, 4, 2, 4)
    assert torch.equal(k_all, torch.cat([k1, k2], dim=1)) and torch.equal(v_all, torch.cat([v1, v2], dim=1))
    assert cache.length == 3  # only the last layer's write advances the length


def test_bad_input():
    with pytest.raises(ValueError, match="num_layers must be >= 1, got 0"):
        kv_cache_bytes(0, 8, 128, 1, 2)
    with pytest.raises(ValueError, match="num_tokens must be >= 0, got -1"):
        kv_cache_bytes(1, 8, 128, -1, 2)
    with pytest.raises(TypeError, match="head_dim must be an int"):
        kv_cache_bytes(1, 8, 1.5, 1, 2)
    with pytest.raises(TypeError, match="config must be"):
        kv_bytes_per_token(object())
    with pytest.raises(ValueError, match="dtype must be one of"):
        kv_bytes_per_token(LlamaConfig(), torch.int32)
    cache = ContiguousKVCache(num_layers=1, batch_size=1, max_len=4, num_kv_heads=2, head_dim=4)
    with pytest.raises(ValueError, match="must lie in"):
        cache.update(0, torch.zeros(1, 2, 2, 4), torch.zeros(1, 2, 2, 4), start=3)
    with pytest.raises(ValueError, match="k and v must both have shape"):
        cache.update(0, torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), start=0)
    with pytest.raises(ValueError, match="layer must be in"):
        cache.update(1, torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), start=0)
