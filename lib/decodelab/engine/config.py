"""An engine's configuration, checked once: `EngineConfig` is what `Engine(model, tokenizer, block_size=...,
num_blocks=..., ...)` builds from its keywords and the model's facts (its context, the K/V bytes of a token, the
memory the device has), with the defaults filled in.

    config = EngineConfig(max_model_len=256, kv_bytes_per_token=8192, kv_memory_limit=None, block_size=4)
    config.num_blocks, config.max_num_batched_tokens        # 2048 (32 sequences of 256 tokens), 2048

Taught in: chapters/07-paged-attention.ipynb
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from decodelab.engine.speculation import SpeculativeConfig
from decodelab.kv.layout import KV_LAYOUTS, RESERVATIONS
from decodelab.sampling.counter_rng import DEFAULT_RNG, check_rng
from decodelab.validation import check_int

DEFAULT_KV_BYTES = 1 << 30  # the default pool holds at most 1 GiB of K/V


def kv_memory_limit(device: torch.device) -> int | None:
    """Bytes the K/V cache may take on `device`: free GPU memory, or the machine's available RAM (Linux)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """What an `Engine` runs with. The model's facts come first: `max_model_len` (its context), `kv_bytes_per_token`
    (the target's K/V per token slot, plus the draft model's with speculation) and `kv_memory_limit` (bytes the
    device can give the cache; None: unknown). The rest are `Engine`'s keywords; see its docstring.

    `num_blocks=None` becomes what max_num_seqs sequences of full context need, capped at 1 GiB of K/V;
    `max_num_batched_tokens=None` becomes max(2048, max_model_len). Bad values raise ValueError or TypeError
    naming the field."""
    max_model_len: int
    kv_bytes_per_token: int
    kv_memory_limit: int | None
    block_size: int = 16
    num_blocks: int | None = None
    max_num_seqs: int = 32
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = True
    kv_layout: str = "paged"
    reserve: str = "max_tokens"
    speculative: SpeculativeConfig | None = None
    rng: str = DEFAULT_RNG

    def __post_init__(self) -> None:
        block_size = check_int(self.block_size, "block_size")
        if block_size > self.max_model_len:
            raise ValueError(f"block_size must be at most the model's context ({self.max_model_len}), got {block_size}")
        max_num_seqs = check_int(self.max_num_seqs, "max_num_seqs")
        if not isinstance(self.enable_prefix_caching, bool):
            raise TypeError(f"enable_prefix_caching must be True or False, got {self.enable_prefix_caching!r}")
        bytes_per_block = self.kv_bytes_per_token * block_size
        num_blocks = self.num_blocks
        if num_blocks is None:
            affordable = DEFAULT_KV_BYTES // bytes_per_block
            num_blocks = max(1, min(-(-max_num_seqs * self.max_model_len // block_size), affordable))
        num_blocks = check_int(num_blocks, "num_blocks")
        limit = self.kv_memory_limit
        if limit is not None and num_blocks * bytes_per_block > limit:
            raise ValueError(f"num_blocks={num_blocks} needs {num_blocks * bytes_per_block / 2**30:.1f} GiB of K/V, "
                             f"more than this device can hold ({limit / 2**30:.1f} GiB free); pass fewer blocks")
        max_num_batched_tokens = self.max_num_batched_tokens
        if max_num_batched_tokens is None:
            max_num_batched_tokens = max(2048, self.max_model_len)
        max_num_batched_tokens = check_int(max_num_batched_tokens, "max_num_batched_tokens")
        if max_num_batched_tokens < self.max_model_len:  # no chunked prefill: the longest prompt is one step
            raise ValueError(f"max_num_batched_tokens must be at least the model's context ({self.max_model_len}), "
                             f"got {max_num_batched_tokens}")
        if self.kv_layout not in KV_LAYOUTS or self.reserve not in RESERVATIONS:
            raise ValueError(f"kv_layout must be one of {KV_LAYOUTS} and reserve one of {RESERVATIONS}, "
                             f"got {self.kv_layout!r} and {self.reserve!r}")
        check_rng(self.rng)
        if self.speculative is not None and self.kv_layout != "paged":
            raise ValueError(f"speculative decoding needs kv_layout='paged' (rejected drafts give back blocks), "
                             f"got {self.kv_layout!r}")
        for name, value in (("block_size", block_size), ("max_num_seqs", max_num_seqs), ("num_blocks", num_blocks),
                            ("max_num_batched_tokens", max_num_batched_tokens)):
            object.__setattr__(self, name, value)
