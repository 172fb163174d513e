"""Checks for the exercises of chapter 06 (Prefill、Decode 与 KV cache): the KV bytes of a transformers config, and
how many sequences fit next to the weights.

Taught in: chapters/06-prefill-decode-kv-cache.ipynb, exercises/06-prefill-decode-kv-cache.ipynb
"""
from __future__ import annotations

from collections.abc import Callable

from decodelab.book.checks import NO_PREDICTION, call_student, fail, passed

# the library's own KV arithmetic: it raises while the student's function runs
KV_FORBIDDEN = ("decodelab.kv.contiguous_cache.kv_cache_bytes", "decodelab.kv.contiguous_cache.kv_bytes_per_token")


def _configs():
    from transformers import LlamaConfig, Qwen2Config

    return [
        ("Llama-3-8B 的 config", LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                            num_attention_heads=32, num_key_value_heads=8, vocab_size=128256)),
        ("Qwen2.5-7B 的 config", Qwen2Config(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                            num_attention_heads=28, num_key_value_heads=4, vocab_size=152064)),
        ("一个单独给出 head_dim 的 config（hidden_size 3072，16 个 head，head_dim 256，像 Gemma-7B）",
         LlamaConfig(hidden_size=3072, intermediate_size=24576, num_hidden_layers=28, num_attention_heads=16,
                     num_key_value_heads=16, head_dim=256, vocab_size=256000)),
    ]


def _kv_bytes(config, num_tokens: int, batch_size: int, dtype_bytes: int) -> int:
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * num_tokens * batch_size * dtype_bytes


def check_kv_bytes(fn: Callable) -> None:
    """Check `fn(config, num_tokens, batch_size, dtype_bytes) -> int`, the bytes of a KV cache."""
    for label, config in _configs():
        for num_tokens, batch_size, dtype_bytes in ((8192, 1, 2), (4096, 16, 2), (1000, 3, 1)):
            what = f"{label}，{num_tokens} 个 token，batch {batch_size}，每个数 {dtype_bytes} 字节"
            result = call_student(fn, config, num_tokens, batch_size, dtype_bytes, what=what, forbidden=KV_FORBIDDEN)
            expected = _kv_bytes(config, num_tokens, batch_size, dtype_bytes)
            if isinstance(result, float) and result.is_integer():
                result = int(result)
            if not isinstance(result, int) or isinstance(result, bool):
                fail(f"输入 {what} 时应返回字节数（int），实际返回了 {type(result).__name__}：{result!r}。")
            if result == expected:
                continue
            ratio = result / expected if expected else float("inf")
            if ratio == 0.5:
                fail(f"输入 {what} 时结果正好少了一半：K 和 V 各存一份，公式前面有个 2。")
            if ratio == config.num_attention_heads / config.num_key_value_heads and ratio != 1:
                fail(f"输入 {what} 时结果大了 {ratio:g} 倍：你用了 num_attention_heads（query 的 head 数）。"
                     "GQA 模型里只有 num_key_value_heads 个 K/V head 要缓存，几个 query head 共用一组 K/V。")
            if ratio == 1 / batch_size or ratio == 1 / num_tokens:
                fail(f"输入 {what} 时结果小了 {1 / ratio:g} 倍：batch 里的每条序列、每个 token 都要各存一份 K/V。")
            if ratio == 8:
                fail(f"输入 {what} 时结果大了 8 倍：dtype_bytes 已经是字节数，不要再乘 8（那是比特）。")
            if getattr(config, "head_dim", None) and ratio == (config.hidden_size // config.num_attention_heads) / config.head_dim:
                fail(f"输入 {what} 时结果不对：这个 config 单独给出了 head_dim（{config.head_dim}），"
                     f"它不等于 hidden_size / num_attention_heads（{config.hidden_size // config.num_attention_heads}）。"
                     "先读 config.head_dim，没有时再用 hidden_size // num_attention_heads。")
            fail(f"输入 {what} 时字节数不对，你的结果是 {result:,}。"
                 "公式：2 × num_hidden_layers × num_key_value_heads × head_dim × token 数 × batch × dtype_bytes。")
    passed("KV 字节数正确：K 和 V 两份，每层、每个 KV head（GQA 只算 KV head）、每个 token、每条序列各一份。")


_FIT_CASES = [
    # (gpu_bytes, weight_bytes, kv_bytes_per_token, seq_len, what)
    (80 * 10**9, 16_060_522_496, 131072, 8192, "80 GB 显存放 Llama-3-8B（bf16 权重约 16.1 GB），每条序列 8192 个 token"),
    (80 * 10**9, 16_060_522_496, 131072, 131072, "同一张卡，每条序列 131072 个 token"),
    (24 * 10**9, 16_060_522_496, 131072, 32768, "24 GB 显存放 Llama-3-8B，每条序列 32768 个 token"),
    (80 * 10**9, 141_107_412_992, 327680, 4096, "80 GB 显存放 bf16 的 Llama-3-70B（权重约 141 GB）"),
]


def check_max_sequences(fn: Callable, prediction=NO_PREDICTION) -> None:
    """Check `fn(gpu_bytes, weight_bytes, kv_bytes_per_token, seq_len) -> int`, whole sequences that fit. Given a
    `prediction` of how many 131072-token Llama-3-8B sequences fit on 80 GB, the pass sets it beside the student's
    own count."""
    from decodelab.book.checks import as_prediction, compare_prediction

    guess = None if prediction is NO_PREDICTION else as_prediction(prediction, "PREDICTION", 0, 10_000)
    counts = []
    for gpu, weights, per_token, seq_len, what in _FIT_CASES:
        result = call_student(fn, gpu, weights, per_token, seq_len, what=what)
        expected = max(0, (gpu - weights) // (per_token * seq_len))
        if isinstance(result, bool) or not isinstance(result, int):
            if isinstance(result, float) and abs(result - (gpu - weights) / (per_token * seq_len)) < 1e-6:
                fail(f"输入 {what} 时你返回了 {result:.3f}：序列只能整条放下，要向下取整（用 //）。")
            fail(f"输入 {what} 时应返回 int，实际返回了 {type(result).__name__}：{result!r}。")
        if result == expected:
            counts.append(result)
            continue
        if result == gpu // (per_token * seq_len):
            fail(f"输入 {what} 时结果偏大：显存里先要放下模型权重，KV cache 只能用剩下的 gpu_bytes − weight_bytes。")
        if result < 0:
            fail(f"输入 {what} 时结果是负数 {result}：权重本身就放不下，能同时运行的序列数是 0，不能是负数。")
        if result == -(-(gpu - weights) // (per_token * seq_len)):
            fail(f"输入 {what} 时结果多了 1：向上取整会让最后一条序列放不下，要向下取整。")
        fail(f"输入 {what} 时条数不对，你的结果是 {result}。"
             "公式：(gpu_bytes − weight_bytes) // (kv_bytes_per_token × seq_len)，且不小于 0。")
    passed("正确：先扣掉权重，剩下的显存按整条序列向下取整；权重放不下时是 0。"
           + (f"\n80 GB 放 Llama-3-8B、每条 131072 个 token：{compare_prediction(guess, counts[1], '{:g}')}；"
              f"每条 8192 个 token 时是 {counts[0]} 条。一条 128K 的序列光 KV 就要 16 GiB，和权重差不多大："
              "上下文越长，同时能跑的序列越少：每一步 decode 读一遍权重，只服务这几条序列。" if guess is not None else ""))
