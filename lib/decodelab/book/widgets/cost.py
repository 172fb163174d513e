"""The prefill/decode cost explorer: memory of weights and KV cache, and a roofline bound on the time of one decode
step, for a model config, a GPU, a batch size and a context length.

`model_spec` reads the sizes from a transformers config (parameters counted on the meta device, no weights);
`cost_state` is the arithmetic; the ESM (`cost.js` after the shared prelude) repeats it line for line, so the
explorer works live in JupyterLab and in the static HTML book.

Taught in: chapters/06-prefill-decode-kv-cache.ipynb
"""
from __future__ import annotations

import pathlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import anywidget
import traitlets

from decodelab.kv.contiguous_cache import kv_cache_bytes, model_kv_shape
from decodelab.validation import as_scalar, check_int
from decodelab.book.widgets.esm import ESM_PRELUDE

_HERE = pathlib.Path(__file__).parent


@dataclass(frozen=True)
class ModelSpec:
    """The sizes that set a decoder's memory and FLOPs."""

    name: str
    num_params: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return kv_cache_bytes(self.num_layers, self.num_kv_heads, self.head_dim, 1, dtype_bytes)


@dataclass(frozen=True)
class GpuSpec:
    """Published peak numbers of one accelerator: memory (GB = 1e9 bytes), bandwidth (TB/s), dense BF16 TFLOP/s."""

    name: str
    memory_gb: float
    bandwidth_tb_s: float
    bf16_tflops: float


# Vendors' data sheets (dense BF16 Tensor Core throughput, no sparsity).
GPUS = (
    GpuSpec("RTX 4090 (24 GB)", 24.0, 1.008, 165.2),
    GpuSpec("A100 SXM (80 GB)", 80.0, 2.039, 312.0),
    GpuSpec("H100 SXM (80 GB)", 80.0, 3.35, 989.0),
    GpuSpec("H200 (141 GB)", 141.0, 4.8, 989.0),
)


def model_spec(name: str, config) -> ModelSpec:
    """A ModelSpec from a transformers config; parameters are counted on the meta device (no memory, no weights).

    >>> from transformers import LlamaConfig
    >>> model_spec("Llama-3-8B", LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    ...     num_attention_heads=32, num_key_value_heads=8, vocab_size=128256)).num_params
    8030261248
    """
    import torch
    from transformers import AutoModelForCausalLM

    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str, got {name!r}")
    num_layers, num_kv_heads, head_dim = model_kv_shape(config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    num_params = sum(p.numel() for p in model.parameters())  # tied embeddings are counted once
    return ModelSpec(name, num_params, num_layers, config.num_attention_heads, num_kv_heads, head_dim)


@dataclass(frozen=True)
class CostState:
    """What the explorer shows. Bytes and FLOPs are per decode step of the whole batch."""

    weight_bytes: float
    kv_bytes: float               # batch × context tokens
    fits: bool                    # weights + KV <= GPU memory
    max_batch: int                # sequences of this context that fit next to the weights
    step_flops: float             # 2 × params × batch (matmuls) + 4 × layers × heads × head_dim × context × batch
    step_bytes: float             # every step reads all weights and every sequence's KV once
    intensity: float              # FLOPs per byte of one decode step
    ridge: float                  # the GPU's FLOPs per byte at which compute and bandwidth take equal time
    memory_ms: float              # step_bytes / bandwidth
    compute_ms: float             # step_flops / peak FLOP/s
    step_ms: float                # max of the two: a lower bound on one decode step
    tokens_per_s: float           # batch / step time: an upper bound on decode throughput
    prefill_ms: float             # compute bound of prefilling one prompt of `context` tokens


def cost_state(model: ModelSpec, gpu: GpuSpec, batch_size: int, context_len: int, dtype_bytes: int = 2) -> CostState:
    """Memory and a roofline bound for decoding `batch_size` sequences of `context_len` tokens each.

    Taught in: chapters/06-prefill-decode-kv-cache.ipynb
    """
    if not isinstance(model, ModelSpec) or not isinstance(gpu, GpuSpec):
        raise TypeError(f"model must be a ModelSpec and gpu a GpuSpec, got {type(model).__name__}, {type(gpu).__name__}")
    for name, value in (("batch_size", batch_size), ("context_len", context_len), ("dtype_bytes", dtype_bytes)):
        check_int(value, name)
    weight_bytes = float(model.num_params * dtype_bytes)
    kv_per_sequence = float(model.kv_bytes_per_token(dtype_bytes) * context_len)
    kv_bytes = kv_per_sequence * batch_size
    memory = gpu.memory_gb * 1e9
    max_batch = max(0, int((memory - weight_bytes) // kv_per_sequence))
    step_flops = 2.0 * model.num_params * batch_size \
        + 4.0 * model.num_layers * model.num_heads * model.head_dim * context_len * batch_size
    step_bytes = weight_bytes + kv_bytes
    memory_ms = 1e3 * step_bytes / (gpu.bandwidth_tb_s * 1e12)
    compute_ms = 1e3 * step_flops / (gpu.bf16_tflops * 1e12)
    step_ms = max(memory_ms, compute_ms)
    prefill_flops = 2.0 * model.num_params * context_len \
        + 2.0 * model.num_layers * model.num_heads * model.head_dim * context_len * context_len
    return CostState(weight_bytes, kv_bytes, weight_bytes + kv_bytes <= memory, max_batch, step_flops, step_bytes,
                     step_flops / step_bytes, gpu.bf16_tflops / gpu.bandwidth_tb_s, memory_ms, compute_ms, step_ms,
                     1e3 * batch_size / step_ms, 1e3 * prefill_flops / (gpu.bf16_tflops * 1e12))


BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
CONTEXT_LENS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)

# A blank line between the shared prelude and this widget's own view (cost.js).
_ESM = ESM_PRELUDE + "\n" + (_HERE / "cost.js").read_text(encoding="utf-8")


class CostExplorer(anywidget.AnyWidget):
    """Pick a model, a GPU, a batch and a context length; see memory, arithmetic intensity and decode speed bounds.

    >>> from transformers import LlamaConfig
    >>> from decodelab.book.widgets.cost import CostExplorer, model_spec
    >>> spec = model_spec("Llama-3-8B", LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    ...     num_attention_heads=32, num_key_value_heads=8, vocab_size=128256))
    >>> CostExplorer([spec], batch_size=8, context_len=8192)
    CostExplorer(models=['Llama-3-8B'], gpu='H100 SXM (80 GB)', batch_size=8, context_len=8192, lecture=False)

    Taught in: chapters/06-prefill-decode-kv-cache.ipynb
    """

    _esm = _ESM

    models = traitlets.List(traitlets.Dict()).tag(sync=True)
    gpus = traitlets.List(traitlets.Dict()).tag(sync=True)
    batch_sizes = traitlets.List(traitlets.Int()).tag(sync=True)
    context_lens = traitlets.List(traitlets.Int()).tag(sync=True)
    model_index = traitlets.Int(0).tag(sync=True)
    gpu_index = traitlets.Int(0).tag(sync=True)
    batch_index = traitlets.Int(0).tag(sync=True)
    context_index = traitlets.Int(0).tag(sync=True)
    lecture = traitlets.Bool(False).tag(sync=True)

    def __init__(self, models: Sequence[ModelSpec], gpus: Sequence[GpuSpec] = GPUS, *, gpu: str = "H100 SXM (80 GB)",
                 batch_size: int = 8, context_len: int = 8192, lecture: bool = False) -> None:
        if not isinstance(models, Sequence) or not models or not all(isinstance(m, ModelSpec) for m in models):
            raise ValueError(f"models must be a non-empty list of ModelSpec (see model_spec), got {models!r}")
        if not isinstance(gpus, Sequence) or not gpus or not all(isinstance(g, GpuSpec) for g in gpus):
            raise ValueError(f"gpus must be a non-empty list of GpuSpec, got {gpus!r}")
        names = [g.name for g in gpus]
        if gpu not in names:
            raise ValueError(f"gpu must be one of {names}, got {gpu!r}")
        batch_size, context_len = as_scalar(batch_size), as_scalar(context_len)
        if isinstance(batch_size, bool) or batch_size not in BATCH_SIZES:
            raise ValueError(f"batch_size must be one of {BATCH_SIZES}, got {batch_size!r}")
        if isinstance(context_len, bool) or context_len not in CONTEXT_LENS:
            raise ValueError(f"context_len must be one of {CONTEXT_LENS}, got {context_len!r}")
        super().__init__(models=[asdict(m) for m in models], gpus=[asdict(g) for g in gpus],
                         batch_sizes=list(BATCH_SIZES), context_lens=list(CONTEXT_LENS), model_index=0,
                         gpu_index=names.index(gpu), batch_index=BATCH_SIZES.index(batch_size),
                         context_index=CONTEXT_LENS.index(context_len), lecture=bool(lecture))

    def state(self) -> CostState:
        """What the browser shows now, computed in Python."""
        model = ModelSpec(**self.models[self.model_index])
        return cost_state(model, GpuSpec(**self.gpus[self.gpu_index]), self.batch_sizes[self.batch_index],
                          self.context_lens[self.context_index])

    def __repr__(self) -> str:
        return (f"CostExplorer(models={[m['name'] for m in self.models]!r}, gpu={self.gpus[self.gpu_index]['name']!r}, "
                f"batch_size={self.batch_sizes[self.batch_index]}, context_len={self.context_lens[self.context_index]}, "
                f"lecture={self.lecture})")
