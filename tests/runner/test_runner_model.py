"""The minimal Llama forward over the paged cache gives transformers' logits (chapter 7)."""
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from decodelab.runner.model import PagedLlama, StepBatch
from decodelab.kv.blocks import BlockPool, BlockTable

pytestmark = pytest.mark.usefixtures("one_thread")  # these models are tiny (tests/conftest.py)


def prefill_then_decode(hf_model, prompts, next_tokens, block_size=4):
    """Prefill all prompts in one step, then decode one token each; return (prefill logits, decode logits)."""
    runner = PagedLlama(hf_model)
    pool = BlockPool(64, block_size)
    kv = runner.allocate_kv_cache(64, block_size)
    tables = [BlockTable(block_size) for _ in prompts]
    sequences = []
    for prompt, table in zip(prompts, tables):
        slots, _ = table.append(pool, prompt)
        sequences.append((prompt, 0, slots, list(table.block_ids)))
    prefill = runner.forward(StepBatch.build(sequences), kv, all_logits=True)    # [T, V]
    sequences = []
    for prompt, table, token in zip(prompts, tables, next_tokens):
        slots, _ = table.append(pool, [token])
        sequences.append(([token], len(prompt), slots, list(table.block_ids)))
    decode = runner.forward(StepBatch.build(sequences), kv)                       # [B, V]
    return prefill, decode


def check_against_hf(hf_model, prompts, next_tokens, atol):
    prefill, decode = prefill_then_decode(hf_model, prompts, next_tokens)
    offset = 0
    with torch.no_grad():
        for b, (prompt, token) in enumerate(zip(prompts, next_tokens)):
            reference = hf_model(torch.tensor([prompt + [token]])).logits[0].float()   # [len + 1, V]
            torch.testing.assert_close(prefill[offset: offset + len(prompt)], reference[:-1], atol=atol, rtol=1e-4)
            torch.testing.assert_close(decode[b], reference[-1], atol=atol, rtol=1e-4)
            offset += len(prompt)


def test_llama_logits_equal_transformers(random_llama):
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 300, (n,), generator=gen).tolist() for n in (1, 4, 9, 30)]
    check_against_hf(random_llama, prompts, [5, 6, 7, 8], atol=1e-5)


def test_qwen2_with_biases_and_tied_embeddings():
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=200, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=128,
                         rope_theta=500.0, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = Qwen2ForCausalLM(config).eval()
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    check_against_hf(model, [[3, 4, 5, 6, 7], [9] * 11], [10, 11], atol=1e-5)


def test_shipped_model_logits_equal_transformers(tiny):
    model, tokenizer = tiny
    prompts = [tokenizer("从前有一只小猫").input_ids, tokenizer("今天").input_ids]
    check_against_hf(model, prompts, [prompts[0][-1], prompts[1][-1]], atol=1e-4)


def test_rejects_other_models():
    with pytest.raises(TypeError, match="hf_model must be"):
        PagedLlama(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="sequences must name at least one"):
        StepBatch.build([])
    with pytest.raises(ValueError, match="one slot per token"):
        StepBatch.build([([1, 2], 0, [0], [0])])


def test_a_step_batch_lays_out_prefill_and_decode_rows():
    """Two sequences, one feeding 3 prompt tokens and one a decode token: every index, its shape and dtype."""
    batch = StepBatch.build([([11, 12, 13], 0, [40, 41, 42], [10]), ([14], 5, [23], [4, 5])])
    expected = {"input_ids": [11, 12, 13, 14], "positions": [0, 1, 2, 5], "slot_mapping": [40, 41, 42, 23],
                "query_index": [[0, 1, 2], [3, 0, 0]], "query_valid": [[True] * 3, [True, False, False]],
                "query_positions": [[0, 1, 2], [5, 0, 0]], "block_tables": [[10, 0], [4, 5]],
                "context_lens": [3, 6], "last_index": [2, 3], "valid_rows": [0, 1, 2, 3]}
    for name, values in expected.items():
        tensor = getattr(batch, name)
        assert tensor.tolist() == values, name
        assert tensor.dtype == (torch.bool if name == "query_valid" else torch.long), name
    assert batch.query_index.is_contiguous() and batch.block_tables.is_contiguous()


def test_valid_rows_are_the_true_rows_of_query_valid_in_token_order():
    """The long index the forward uses instead of the boolean mask (no count to report to the host) picks the same
    rows in the same order, with padding between sequences."""
    batch = StepBatch.build([([1], 7, [3], [0, 1]), ([2, 3, 4], 0, [8, 9, 10], [2]), ([5, 6], 4, [20, 21], [5, 6])])
    assert batch.valid_rows.tolist() == [0, 3, 4, 5, 6, 7]
    assert batch.valid_rows.tolist() == batch.query_valid.flatten().nonzero().squeeze(1).tolist()
    padded = torch.arange(batch.query_valid.numel()).view(batch.query_valid.shape)
    assert padded.flatten()[batch.valid_rows].tolist() == padded[batch.query_valid].tolist()


def test_llama3_rope_scaling():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rope_parameters=rope, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    default = 1.0 / 500000.0 ** (torch.arange(0, 16, 2).float() / 16)
    assert not torch.allclose(PagedLlama(model).inv_freq, default)    # the scaling really changes the frequencies
    check_against_hf(model, [list(range(3, 60)), [7] * 40], [8, 9], atol=1e-5)
