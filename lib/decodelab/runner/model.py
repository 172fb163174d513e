"""A minimal Llama-family forward (RMSNorm, RoPE, grouped-query attention, SwiGLU) over the paged KV cache.

It reads the weights of a transformers `LlamaForCausalLM` or `Qwen2ForCausalLM` (Qwen2 adds q/k/v biases)
and runs any mix of prefill and decode tokens in one call: the tokens of all sequences are laid out flat ([T]),
each with its position and its slot in the pool.

Taught in: chapters/07-paged-attention.ipynb
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from decodelab.kv.contiguous_cache import model_kv_shape
from decodelab.runner import triton_attention
from decodelab.runner.inference import inference
from decodelab.runner.attention import paged_attention, visible_keys, write_kv
from decodelab.runner.step_batch import DecodeBuffers, StepBatch

ATTENTION_BACKENDS = ("torch", "triton")


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _fused(*layers) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for several linear layers that read the same input: one matmul instead of several."""
    weight = torch.cat([layer.weight.detach() for layer in layers])                 # [sum of outputs, in]
    if all(layer.bias is None for layer in layers):
        return weight, None
    return weight, torch.cat([layer.bias.detach() if layer.bias is not None
                              else weight.new_zeros(layer.weight.shape[0]) for layer in layers])


@dataclass(frozen=True)
class _Layer:
    input_norm: torch.Tensor       # [hidden]
    qkv: tuple                     # weight [(H + 2 KVH) * D, hidden], bias or None (Qwen2 has biases)
    out: tuple                     # weight [hidden, H * D], bias or None
    post_norm: torch.Tensor        # [hidden]
    gate_up: tuple                 # weight [2 * intermediate, hidden], bias or None
    down: tuple                    # weight [hidden, intermediate], bias or None


class PagedLlama:
    """Llama/Qwen2 forward over a paged KV cache, built from the weights of a transformers model.

    Norms, output projections and embeddings are shared with the transformers model; q/k/v and gate/up are
    concatenated once into fused copies (one matmul each), so later changes to the transformers weights are not seen.
    attention="torch" gathers blocks and calls the torch reference; "triton" runs decode steps with the Triton
    kernel of `decodelab.runner.triton_attention`, which reads the blocks in place (prefill steps keep the reference).

    Example:
        runner = PagedLlama(hf_model)
        kv = runner.allocate_kv_cache(num_blocks=64, block_size=16)  # [layers, 2, 64, 16, kv_heads, head_dim]
        logits = runner.forward(StepBatch.build([(prompt_ids, 0, slots, block_ids)]), kv)  # [1, V]
    Taught in: chapters/07-paged-attention.ipynb
    """

    def __init__(self, hf_model, attention: str = "torch") -> None:
        config = getattr(hf_model, "config", None)
        if config is None or not hasattr(hf_model, "model") or not hasattr(hf_model.model, "layers"):
            raise TypeError(f"hf_model must be a transformers LlamaForCausalLM-like model, got {type(hf_model).__name__}")
        if getattr(config, "model_type", "") not in ("llama", "qwen2"):
            raise ValueError(f"hf_model's model_type must be llama or qwen2, got {config.model_type!r}")
        if getattr(config, "use_sliding_window", False):
            raise ValueError("hf_model uses sliding-window attention, which this forward does not implement")
        self.config = config
        self.num_layers, self.num_kv_heads, self.head_dim = model_kv_shape(config)
        self.num_heads = config.num_attention_heads
        self.eps = config.rms_norm_eps
        self.max_model_len = config.max_position_embeddings
        self.vocab_size = config.vocab_size
        self.embed = hf_model.model.embed_tokens.weight      # [V, hidden]
        self.layers = [_Layer(layer.input_layernorm.weight, _fused(attn.q_proj, attn.k_proj, attn.v_proj),
                              (attn.o_proj.weight, attn.o_proj.bias), layer.post_attention_layernorm.weight,
                              _fused(layer.mlp.gate_proj, layer.mlp.up_proj),
                              (layer.mlp.down_proj.weight, layer.mlp.down_proj.bias))
                       for layer in hf_model.model.layers for attn in [layer.self_attn]]
        self.final_norm = hf_model.model.norm.weight         # [hidden]
        self.lm_head = hf_model.get_output_embeddings()
        self.device = self.embed.device
        self.dtype = self.embed.dtype
        self.inv_freq, self.rope_scale = self._rope_frequencies(hf_model)
        if attention not in ATTENTION_BACKENDS:
            raise ValueError(f"attention must be one of {ATTENTION_BACKENDS}, got {attention!r}")
        reason = triton_attention.unavailable_reason(self.device) if attention == "triton" else None
        if reason is not None:
            raise ValueError(f"attention='triton' cannot run here: {reason}")
        self.attention = attention
        self._decode_buffers = DecodeBuffers(self.device)      # a decode step's inputs, written in place

    def _rope_frequencies(self, hf_model) -> tuple[torch.Tensor, float]:
        rope = getattr(self.config, "rope_parameters", None) or {}
        rope_type = rope.get("rope_type", "default")
        if rope_type == "default":
            theta = rope.get("rope_theta", getattr(self.config, "rope_theta", 10000.0))
            exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=self.device) / self.head_dim
            return 1.0 / (theta ** exponents), 1.0  # [head_dim / 2]
        # Scaled variants (Llama-3 "llama3", "yarn", ...) reuse the frequencies transformers computed.
        rotary = hf_model.model.rotary_emb
        return rotary.inv_freq.float(), float(rotary.attention_scaling)

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> torch.Tensor:
        """Zeros of shape [num_layers, 2 (K, V), num_blocks, block_size, kv_heads, head_dim]."""
        return torch.zeros(self.num_layers, 2, num_blocks, block_size, self.num_kv_heads, self.head_dim,
                           dtype=self.dtype, device=self.device)

    @inference
    def execute(self, plan, kv_cache: torch.Tensor, drafts: Sequence[Sequence[int]] | None = None) -> torch.Tensor:
        """One engine step's model work for a `decodelab.engine.scheduler.Schedule`: the plan's copy-on-write block copies,
        then one forward over its scheduled sequences. Returns float32 logits `[len(plan.scheduled), V]`, one row per
        sequence.

        With `drafts` (a speculative decode step: one list per scheduled sequence, at most its `num_lookahead`
        tokens), each one feeds its token and then its drafts, into the draft slots its table holds, and the logits of every fed token
        come back, sequence after sequence: `[sum(1 + len(d) for d in drafts), V]`."""
        for src, dst in plan.copies:
            kv_cache[:, :, dst] = kv_cache[:, :, src]
        scheduled = plan.scheduled
        if drafts is None and plan.kind == "decode":
            return self.forward(self.decode_batch(scheduled), kv_cache)
        if drafts is None:
            sequences = [(sched.token_ids, sched.start, sched.slots, sched.seq.table.block_ids) for sched in scheduled]
            return self.forward(StepBatch.build(sequences, self.device), kv_cache)
        sequences = []
        for sched, extra in zip(scheduled, drafts, strict=True):
            first = sched.start + len(sched.token_ids)            # position of the first draft
            slots = sched.slots + [sched.seq.table.slot(first + i) for i in range(len(extra))]
            sequences.append((sched.token_ids + list(extra), sched.start, slots, sched.seq.table.block_ids))
        return self.forward(StepBatch.build(sequences, self.device), kv_cache, all_logits=True)

    def decode_batch(self, scheduled: Sequence) -> StepBatch:
        """The `StepBatch` of a decode step of `scheduled` (`ScheduledSeq`s, one new token and one slot each), in
        the runner's `DecodeBuffers`: written in place, the tables padded anew every step, no tensor made (valid
        until the next decode step). Keeping the padded tables from step to step as well (vLLM's persistent
        `InputBatch`) was measured beside it in the engine (`benchmarks/step_batch.py`) and did not pay here: the
        rows to move when sequences finish and join cost as much as the padding they save."""
        token_ids = [token for sched in scheduled for token in sched.token_ids]
        slots = [slot for sched in scheduled for slot in sched.slots]
        if len(token_ids) != len(scheduled) or len(slots) != len(scheduled):
            raise ValueError(f"a decode step feeds one token into one slot per sequence, got {len(scheduled)} "
                             f"sequences, {len(token_ids)} tokens and {len(slots)} slots")
        return self._decode_buffers.batch(token_ids, [sched.start for sched in scheduled], slots,
                                          [sched.seq.table.block_ids for sched in scheduled])

    @inference
    def execute_with_prompt_logits(self, plan, kv_cache: torch.Tensor,
                                   wanted: Sequence[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """`execute` of a prefill plan (no drafts) that also returns, from the same one forward, the logits of every
        token fed by the scheduled sequences `wanted` (indices into `plan.scheduled`): `([len(plan.scheduled), V],
        [[len(token_ids), V] per wanted sequence])`. Row j of a sequence's block predicts its token j + 1, which is
        what a request's prompt log-probabilities (vLLM's `prompt_logprobs`, OpenAI's `echo`) read."""
        for src, dst in plan.copies:
            kv_cache[:, :, dst] = kv_cache[:, :, src]
        sequences = [(sched.token_ids, sched.start, sched.slots, sched.seq.table.block_ids) for sched in plan.scheduled]
        batch = StepBatch.build(sequences, self.device)
        firsts = list(itertools.accumulate((len(sched.token_ids) for sched in plan.scheduled), initial=0))
        spans = [range(firsts[i], firsts[i + 1]) for i in wanted]
        rows = torch.cat([batch.last_index] + [torch.arange(s.start, s.stop, device=self.device) for s in spans])
        logits = self.forward(batch, kv_cache, rows=rows)                       # [B + sum(len), V]
        num_seqs = len(plan.scheduled)
        prompt, offset = [], num_seqs
        for span in spans:
            prompt.append(logits[offset:offset + len(span)])
            offset += len(span)
        return logits[:num_seqs], prompt

    @inference
    def forward(self, batch: StepBatch, kv_cache: torch.Tensor, all_logits: bool = False,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """Run the step's tokens, writing their K/V; return float32 logits of each sequence's last token [B, V]
        (or of every token [T, V] when `all_logits`, or of the flat token indices `rows` [len(rows), V])."""
        freqs = batch.positions[:, None].float() * self.inv_freq[None, :]        # [T, head_dim / 2]
        angles = torch.cat((freqs, freqs), dim=-1)                                 # [T, head_dim]
        cos = (angles.cos() * self.rope_scale).to(self.dtype)[:, None, :]          # [T, 1, head_dim]
        sin = (angles.sin() * self.rope_scale).to(self.dtype)[:, None, :]
        hidden = F.embedding(batch.input_ids, self.embed)                          # [T, hidden]
        num_tokens = hidden.shape[0]
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        kernel_decode = self.attention == "triton" and batch.query_index.shape[1] == 1  # one new token per sequence
        if not kernel_decode:
            visible = visible_keys(batch.context_lens, batch.query_positions,
                                   batch.block_tables.shape[1] * kv_cache.shape[3])  # [B, Q, K], same in every layer
            # as an additive mask (0 or -inf) once, so attention does not convert the boolean mask in every layer
            visible = torch.zeros(visible.shape, dtype=self.dtype, device=self.device).masked_fill_(~visible, -torch.inf)
        for index, layer in enumerate(self.layers):
            x = _rms_norm(hidden, layer.input_norm, self.eps)
            q, k, v = F.linear(x, *layer.qkv).split([q_size, kv_size, kv_size], dim=-1)
            q = q.view(num_tokens, self.num_heads, self.head_dim)                  # [T, H, D]
            k = k.view(num_tokens, self.num_kv_heads, self.head_dim)               # [T, KVH, D]
            v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            key_cache, value_cache = kv_cache[index, 0], kv_cache[index, 1]        # [num_blocks, block_size, KVH, D]
            write_kv(key_cache, value_cache, batch.slot_mapping, k, v)
            if kernel_decode:                                                      # T = B: token b is sequence b's
                out = triton_attention.paged_decode_attention(q, key_cache, value_cache, batch.block_tables,
                                                              batch.context_lens, check_lengths=False)  # [B, H, D]
            else:
                out = paged_attention(q[batch.query_index], key_cache, value_cache, batch.block_tables,
                                      batch.context_lens, batch.query_positions, visible=visible)  # [B, Q, H, D]
                out = out.flatten(0, 1)[batch.valid_rows]                          # [T, H, D]
            out = out.reshape(num_tokens, q_size)                                  # [T, H * D]
            hidden = hidden + F.linear(out, *layer.out)
            x = _rms_norm(hidden, layer.post_norm, self.eps)
            gate, up = F.linear(x, *layer.gate_up).chunk(2, dim=-1)                # [T, intermediate] each
            hidden = hidden + F.linear(F.silu(gate) * up, *layer.down)
        if rows is not None:
            hidden = hidden[rows]                                                  # [len(rows), hidden]
        elif not all_logits:
            hidden = hidden[batch.last_index]                                      # [B, hidden]
        hidden = _rms_norm(hidden, self.final_norm, self.eps)
        return self.lm_head(hidden).float()                                        # [B, V] or [T, V]
