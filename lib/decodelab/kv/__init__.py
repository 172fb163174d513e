"""Where K/V live: the paged cache's block pool and block tables (blocks), the first-fit slab that PagedAttention
replaced (slab, the engine's teaching baseline), and chapter 06's contiguous per-model cache (contiguous_cache)."""
from decodelab.kv.blocks import BlockPool, BlockTable
from decodelab.kv.contiguous_cache import ContiguousKVCache
from decodelab.kv.slab import FirstFitSlab, Reservation

__all__ = ["BlockPool", "BlockTable", "ContiguousKVCache", "FirstFitSlab", "Reservation"]
