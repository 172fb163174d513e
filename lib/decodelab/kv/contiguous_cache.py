"""The contiguous KV cache: one preallocated slab per layer, written at the current position.

During prefill the model writes the keys and values of every prompt token; during decode it writes one new
position per step and attends over everything written so far. The slab is reserved for `max_len` tokens per
sequence up front, which is simple and fast but wastes the slots a short sequence never fills (chapter 7 fixes
that with a paged cache, see `decodelab.kv.blocks`).

Taught in: chapters/06-prefill-decode-kv-cache.ipynb
"""
from __future__ import annotations

import math

import torch

from decodelab.validation import as_scalar

_DTYPE_BYTES = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2, torch.float64: 8, torch.float8_e4m3fn: 1}


def _check_int(name: str, value: object, low: int = 1) -> int:
    """`value` as an int >= `low` (numpy and 0-d torch integers too): TypeError for a non-int, ValueError below."""
    value = as_scalar(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return value


def kv_cache_bytes(num_layers: int, num_kv_heads: int, head_dim: int, num_tokens: int, dtype_bytes: int) -> int:
    """Bytes a KV cache needs: 2 (K and V) × layers × KV heads × head_dim × tokens × bytes per number.

    Example: Llama-3-8B (32 layers, 8 KV heads, head_dim 128) in bf16 needs
    `kv_cache_bytes(32, 8, 128, 1, 2) == 131072` bytes, i.e. 128 KiB per token.
    Taught in: chapters/06-prefill-decode-kv-cache.ipynb
    """
    sizes = [_check_int(name, value) for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                                                          ("head_dim", head_dim), ("dtype_bytes", dtype_bytes))]
    return 2 * math.prod(sizes) * _check_int("num_tokens", num_tokens, low=0)


def model_kv_shape(config) -> tuple[int, int, int]:
    """(num_layers, num_kv_heads, head_dim) read from a transformers config (Llama, Qwen2, Mistral, ...)."""
    for name in ("num_hidden_layers", "num_attention_heads", "hidden_size"):
        if not hasattr(config, name):
            raise TypeError(f"config must be a transformers decoder config with {name}, got {type(config).__name__}")
    num_kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers, num_kv_heads, head_dim


def kv_bytes_per_token(config, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of KV cache one token costs for a transformers config, e.g. 128 KiB for Llama-3-8B in bf16.

    Taught in: chapters/06-prefill-decode-kv-cache.ipynb
    """
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(map(str, _DTYPE_BYTES))}, got {dtype}")
    num_layers, num_kv_heads, head_dim = model_kv_shape(config)
    return kv_cache_bytes(num_layers, num_kv_heads, head_dim, 1, _DTYPE_BYTES[dtype])


class ContiguousKVCache:
    """A preallocated cache of shape [num_layers, 2, batch, max_len, kv_heads, head_dim].

    `update(layer, k, v, start)` writes new keys/values for positions start..start+T-1 of every sequence in the
    batch and returns the keys/values of positions 0..start+T-1 for attention.

    Example:
        cache = ContiguousKVCache(num_layers=2, batch_size=1, max_len=8, num_kv_heads=2, head_dim=4)
        k_all, v_all = cache.update(0, k, v, start=0)   # k, v: [1, T, 2, 4] -> k_all: [1, T, 2, 4]
    Taught in: chapters/06-prefill-decode-kv-cache.ipynb
    """

    def __init__(self, num_layers: int, batch_size: int, max_len: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        shape = [_check_int(name, value) for name, value in (
            ("num_layers", num_layers), ("batch_size", batch_size), ("max_len", max_len),
            ("num_kv_heads", num_kv_heads), ("head_dim", head_dim))]
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating torch.dtype (K and V are real numbers; an integer cache would "
                             f"truncate them), got {dtype!r}")
        self.max_len = shape[2]
        # [num_layers, 2 (K, V), batch, max_len, kv_heads, head_dim]
        self.data = torch.zeros(shape[0], 2, *shape[1:], dtype=dtype, device=device)
        self.length = 0  # positions written so far (the same for every sequence in the batch)

    @property
    def nbytes(self) -> int:
        """Bytes reserved by the cache, used or not."""
        return self.data.numel() * self.data.element_size()

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v ([B, T, kv_heads, head_dim], in the cache's dtype: nothing is cast silently) at positions
        start.., return all keys/values [B, start+T, ...]."""
        layer, start = as_scalar(layer), as_scalar(start)
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.data.shape[0]:
            raise ValueError(f"layer must be in [0, {self.data.shape[0]}), got {layer!r}")
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= self.max_len:
            raise ValueError(f"start must be an int in [0, max_len={self.max_len}], got {start!r}")
        if not (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
            raise TypeError(f"k and v must be tensors, got {type(k).__name__} and {type(v).__name__}")
        if k.shape != v.shape or k.dim() != 4 or k.shape[0] != self.data.shape[2] or k.shape[2:] != self.data.shape[4:]:
            raise ValueError(f"k and v must both have shape [B={self.data.shape[2]}, T, {self.data.shape[4]}, "
                             f"{self.data.shape[5]}], got {tuple(k.shape)} and {tuple(v.shape)}")
        if k.dtype != self.data.dtype or v.dtype != self.data.dtype:
            raise ValueError(f"k and v must have the cache's dtype {self.data.dtype} (cast them first, or build the "
                             f"cache with their dtype), got {k.dtype} and {v.dtype}")
        end = start + k.shape[1]
        if start < 0 or end > self.max_len:
            raise ValueError(f"positions {start}..{end - 1} must lie in [0, max_len={self.max_len})")
        self.data[layer, 0, :, start:end] = k
        self.data[layer, 1, :, start:end] = v
        if layer == self.data.shape[0] - 1:
            self.length = end
        return self.data[layer, 0, :, :end], self.data[layer, 1, :, :end]
