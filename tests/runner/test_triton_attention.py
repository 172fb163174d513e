"""The Triton paged decode kernel equals the torch reference (chapter 7).

On a machine without a GPU the kernel runs under Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1), and a
subprocess compiles it for real GPUs (sm_80, sm_90) to show it also passes Triton's compiler; `cuda` tests run it.
"""
import copy
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from decodelab.runner.attention import paged_attention
from decodelab.engine.engine import Engine
from decodelab.sampling.sampler import SamplingParams
from decodelab.runner import triton_attention
from decodelab.runner.triton_attention import MAX_SPLITS, choose_num_splits, paged_decode_attention, unavailable_reason

pytestmark = pytest.mark.usefixtures("one_thread")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (batch, heads, kv_heads, head_dim, block_size): GQA groups of 1, 2 and 3; head_dim and block size not powers of two
SHAPES = [(3, 4, 2, 32, 4), (2, 8, 8, 24, 5), (4, 6, 2, 16, 16), (1, 2, 1, 8, 1)]


def random_case(batch, heads, kv_heads, head_dim, block_size, dtype, seed, max_blocks=5, lens=None):
    gen = torch.Generator().manual_seed(seed)
    num_blocks = max(24, batch * max_blocks)
    caches = [torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(DEVICE, dtype) for _ in "kv"]
    # each sequence's blocks are scattered over the pool, in no order; context lengths from 1 to the table's end
    tables = torch.stack([torch.randperm(num_blocks, generator=gen)[:max_blocks] for _ in range(batch)]).to(DEVICE)
    if lens is None:
        lens = torch.randint(1, max_blocks * block_size + 1, (batch,), generator=gen)
        lens[0] = max_blocks * block_size
    lens = torch.as_tensor(lens)
    query = torch.randn(batch, heads, head_dim, generator=gen).to(DEVICE, dtype)
    return query, *caches, tables, lens.to(DEVICE)


def reference(query, key_cache, value_cache, tables, lens):
    return paged_attention(query[:, None], key_cache, value_cache, tables, lens, (lens - 1)[:, None])[:, 0]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kernel_equals_reference(shape, dtype):
    case = random_case(*shape, dtype, seed=sum(shape))
    got = paged_decode_attention(*case)
    want = reference(*[t.float() if t.is_floating_point() else t for t in case])
    assert got.shape == case[0].shape and got.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(got.float(), want, atol=tolerance, rtol=tolerance)


# split-K: (shape, max_blocks, context lengths). Short sequences next to a long one leave their last partitions empty;
# lengths 1 and lengths that end inside a block; a tile (TILE_TOKENS = 128) that spans several blocks and partitions
# that end inside a tile; more partitions than blocks (the trailing ones empty for every sequence).
SPLIT_CASES = [((4, 8, 2, 32, 16), 12, [192, 1, 37, 100]),
               ((3, 6, 2, 16, 5), 9, [45, 13, 1]),
               ((2, 8, 8, 24, 4), 20, [79, 2]),
               ((2, 3, 1, 8, 1), 70, [70, 64])]


@pytest.mark.parametrize("num_splits", [2, 3, 7, MAX_SPLITS])
@pytest.mark.parametrize("shape, max_blocks, lens", SPLIT_CASES)
def test_split_equals_reference_and_single_pass(shape, max_blocks, lens, num_splits):
    case = random_case(*shape, torch.float32, seed=num_splits, max_blocks=max_blocks, lens=lens)
    got = paged_decode_attention(*case, num_splits=num_splits)
    torch.testing.assert_close(got, reference(*case), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, paged_decode_attention(*case, num_splits=1), atol=1e-5, rtol=1e-5)


def test_split_in_half_precision():
    case = random_case(4, 8, 2, 32, 16, torch.float16, seed=5, max_blocks=12, lens=[192, 1, 37, 100])
    got = paged_decode_attention(*case, num_splits=5)
    assert got.dtype == torch.float16
    want = reference(*[t.float() if t.is_floating_point() else t for t in case])
    torch.testing.assert_close(got.float(), want, atol=2e-3, rtol=2e-3)


def test_split_count_follows_the_batch_and_context():
    h200 = 132
    assert choose_num_splits(8, 8, max_context=16, num_sms=h200) == 1          # short contexts: one pass
    assert choose_num_splits(1, 1, max_context=1023, num_sms=h200) == 1        # under 2 x MIN_SPLIT_TOKENS
    assert choose_num_splits(8, 8, max_context=1024, num_sms=h200) == 2
    assert choose_num_splits(8, 8, max_context=2048, num_sms=h200) == 4        # partitions of 512 tokens
    assert choose_num_splits(16, 8, max_context=2048, num_sms=h200) == 3       # 128 pairs -> 384 programs
    assert choose_num_splits(32, 8, max_context=2048, num_sms=h200) == 1       # 256 pairs: every SM has one
    assert choose_num_splits(128, 8, max_context=8192, num_sms=h200) == 1      # 1,024 pairs fill 132 SMs
    assert choose_num_splits(1, 1, max_context=1 << 20, num_sms=h200) == MAX_SPLITS
    assert choose_num_splits(2, 2, max_context=4096, num_sms=1) == 1           # CPU: one "SM"
    assert choose_num_splits(1, 1, max_context=4096, num_sms=1) == 1


def test_automatic_split_uses_the_sm_count(monkeypatch):
    chosen = []

    def recording(*args):
        chosen.append(choose_num_splits(*args))
        return chosen[-1]

    monkeypatch.setattr(triton_attention, "choose_num_splits", recording)
    monkeypatch.setattr(triton_attention, "_num_sms", lambda device: 132)
    case = random_case(2, 4, 2, 16, 16, torch.float32, seed=4, max_blocks=64, lens=[1024, 300])
    torch.testing.assert_close(paged_decode_attention(*case), reference(*case), atol=1e-5, rtol=1e-5)
    short = random_case(2, 4, 2, 16, 16, torch.float32, seed=4, max_blocks=40, lens=[640, 3])
    torch.testing.assert_close(paged_decode_attention(*short), reference(*short), atol=1e-5, rtol=1e-5)
    assert chosen == [2, 1]      # 1,024 tokens: two partitions of 512; 640 tokens: the single pass


def test_int32_tables_and_strided_query():
    query, key_cache, value_cache, tables, lens = random_case(3, 8, 2, 32, 4, torch.float32, seed=3)
    wide = torch.randn(3, 8, 64, device=DEVICE)[:, :, :32]          # head_dim contiguous, rows strided
    wide.copy_(query)
    got = paged_decode_attention(wide, key_cache, value_cache, tables.int(), lens.int())
    torch.testing.assert_close(got, reference(query, key_cache, value_cache, tables, lens), atol=1e-5, rtol=1e-5)


def test_kernel_sees_only_its_own_blocks():
    query, key_cache, value_cache, tables, lens = random_case(2, 4, 2, 16, 4, torch.float32, seed=1)
    before = paged_decode_attention(query, key_cache, value_cache, tables, lens)
    unused = sorted(set(range(key_cache.shape[0])) - set(tables.flatten().tolist()))
    key_cache[unused] = 1e4                                  # poison every block no table names
    value_cache[unused] = float("nan")
    torch.testing.assert_close(paged_decode_attention(query, key_cache, value_cache, tables, lens), before)


def test_engine_with_the_kernel_equals_transformers(tiny):
    model, tokenizer = tiny
    model = copy.deepcopy(model).to(DEVICE) if DEVICE == "cuda" else model
    prompts = ["小明在", "床前明月光，", "今天，小明在公园"]
    params = SamplingParams(temperature=0.0, max_tokens=10)
    kernel = Engine(model, tokenizer, block_size=4, max_num_seqs=3, attention="triton").generate(prompts, params)
    for prompt, out in zip(prompts, kernel):
        ids = tokenizer(prompt, return_tensors="pt").input_ids.to(DEVICE)
        expected = model.generate(ids, do_sample=False, max_new_tokens=10, pad_token_id=model.config.pad_token_id)
        assert out.token_ids == expected[0, ids.shape[1]:].tolist()


def test_bad_input_names_the_value():
    query, key_cache, value_cache, tables, lens = random_case(2, 4, 2, 16, 4, torch.float32, seed=2)
    with pytest.raises(ValueError, match=r"heads \(3\) must be a multiple of kv_heads \(2\)"):
        paged_decode_attention(query[:, :3], key_cache, value_cache, tables, lens)
    with pytest.raises(ValueError, match=r"context_lens must be in \[1, 20\].*got 0\.\.20"):
        paged_decode_attention(query, key_cache, value_cache, tables, torch.tensor([20, 0], device=DEVICE))
    with pytest.raises(ValueError, match=r"context_lens must be in \[1, 20\].*got 20\.\.21"):
        paged_decode_attention(query, key_cache, value_cache, tables, torch.tensor([20, 21], device=DEVICE))
    with pytest.raises(ValueError, match=r"block_tables \[2, max_blocks\] and context_lens \[2\] expected"):
        paged_decode_attention(query, key_cache, value_cache, tables[:1], lens)
    with pytest.raises(ValueError, match="must be integer tensors, got torch.float32"):
        paged_decode_attention(query, key_cache, value_cache, tables.float(), lens)
    with pytest.raises(ValueError, match="at least one sequence, got B = 0"):
        paged_decode_attention(query[:0], key_cache, value_cache, tables[:0], lens[:0])
    with pytest.raises(ValueError, match="stride 1 in head_dim|one set of strides"):
        paged_decode_attention(query, key_cache.transpose(2, 3).contiguous().transpose(2, 3), value_cache, tables, lens)
    for bad in (0, MAX_SPLITS + 1, 2.0, True, "2"):
        with pytest.raises(ValueError, match=rf"num_splits must be None .* or an integer in \[1, {MAX_SPLITS}\], got "
                                             + re.escape(repr(bad))):
            paged_decode_attention(query, key_cache, value_cache, tables, lens, num_splits=bad)
    with pytest.raises(ValueError, match=r"attention must be one of \('torch', 'triton'\), got 'flash'"):
        _engine_with("flash")


def _engine_with(attention):
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    return Engine(LlamaForCausalLM(config), attention=attention)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_triton_on_cpu_without_the_interpreter_is_refused(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    assert "runs on a CUDA GPU, or on CPU under TRITON_INTERPRET=1" in unavailable_reason("cpu")
    with pytest.raises(ValueError, match="attention='triton' cannot run here: the Triton kernel runs on a CUDA GPU"):
        _engine_with("triton")


COMPILE = """
import json, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from decodelab.runner.triton_attention import _combine_splits_kernel, _paged_decode_kernel


def compile_for(kernel, constants, dtype, arch):
    signature = {name: ("constexpr" if name in constants else "*fp32" if name.startswith("partial_") else
                        f"*{dtype}" if name.endswith("cache_ptr") or name in ("out_ptr", "query_ptr") else
                        "*i64" if name.endswith("_ptr") else "fp32" if name == "scale" else "i32")
                 for name in kernel.arg_names}
    source = ASTSource(fn=kernel, signature=signature,
                       constexprs={(kernel.arg_names.index(n),): v for n, v in constants.items()})
    return len(triton.compile(source, target=GPUTarget("cuda", arch, 32)).asm["cubin"])


built = []
for dtype in ("fp32", "bf16", "fp16"):
    for arch in (80, 90):
        for split in (False, True):
            constants = {"GROUP": 4, "BLOCK_SIZE": 16, "HEAD_DIM": 128, "GROUP_P2": 16, "DIM_P2": 128, "TILE": 128,
                         "SPLIT": split, "DOT_PRECISION": "ieee" if dtype == "fp32" else "tf32"}
            built.append([dtype, arch, split, compile_for(_paged_decode_kernel, constants, dtype, arch)])
        constants = {"HEAD_DIM": 128, "DIM_P2": 128, "SPLITS_P2": 8}
        built.append([dtype, arch, "combine", compile_for(_combine_splits_kernel, constants, dtype, arch)])
print(json.dumps(built))
"""


@pytest.mark.slow
def test_kernel_compiles_for_real_gpus():
    """Triton's full compiler (no GPU needed): both kernels, single pass and split, type-check and lower to machine
    code for A100 and H100."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    done = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    built = json.loads(done.stdout.strip().splitlines()[-1])
    assert [(d, a, k) for d, a, k, _ in built] == [(d, a, k) for d in ("fp32", "bf16", "fp16") for a in (80, 90)
                                                   for k in (False, True, "combine")]
    assert all(size > 1000 for *_, size in built)


@pytest.mark.cuda
@pytest.mark.parametrize("num_splits", [None, 1, 5, MAX_SPLITS])
def test_kernel_equals_reference_on_cuda_llama_shapes(num_splits):
    # Llama-3-8B's attention: 32 query heads, 8 KV heads, head_dim 128, block size 16, contexts up to 2,048; None
    # picks 4 partitions on an H100/H200 (64 pairs), 1 is the single pass, 5 and MAX_SPLITS leave some partitions empty
    gen = torch.Generator().manual_seed(0)
    key_cache, value_cache = (torch.randn(1024, 16, 8, 128, generator=gen).to("cuda", torch.bfloat16) for _ in "kv")
    tables = torch.stack([torch.randperm(1024, generator=gen)[:128] for _ in range(8)]).cuda()
    lens = torch.randint(1, 2049, (8,), generator=gen).cuda()
    query = torch.randn(8, 32, 128, generator=gen).to("cuda", torch.bfloat16)
    lens[0] = 7                                          # a short sequence next to long ones
    got = paged_decode_attention(query, key_cache, value_cache, tables, lens, num_splits=num_splits).float()
    want = reference(query.float(), key_cache.float(), value_cache.float(), tables, lens)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
