"""decodelab.decoding.beam: the same best sequence as transformers' beam search."""
import pytest
import torch

from decodelab.decoding.beam import BeamResult, beam_search

SETTINGS = [  # num_beams, length_penalty, early_stopping, number of prompts
    (4, 1.0, False, 10), (3, 0.5, True, 10), (5, 2.0, "never", 4), (2, 0.0, False, 4), (4, -1.0, True, 4),
]


def prompts_and_eos(model, count: int, seed: int):
    """Random prompts, each with an EOS id the model is likely to produce (its third greedy token)."""
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    cases = []
    for _ in range(count):
        prompt = torch.randint(3, vocab, (1, int(torch.randint(1, 8, (1,), generator=gen))), generator=gen)
        greedy = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=3,
                                pad_token_id=0)
        cases.append((prompt, int(greedy[0, -1])))
    return cases


def transformers_beam(model, prompt, num_beams, max_tokens, length_penalty, early_stopping, eos):
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), num_beams=num_beams, do_sample=False,
                         max_new_tokens=max_tokens, length_penalty=length_penalty, early_stopping=early_stopping,
                         eos_token_id=eos, pad_token_id=0)
    return out[0, prompt.shape[1]:].tolist()


@pytest.mark.parametrize("num_beams, length_penalty, early_stopping, count", SETTINGS)
def test_beam_search_equals_transformers_on_random_llama(random_llama, num_beams, length_penalty, early_stopping,
                                                         count):
    finished_early = 0
    for prompt, eos in prompts_and_eos(random_llama, count, seed=num_beams):
        expected = transformers_beam(random_llama, prompt, num_beams, 8, length_penalty, early_stopping, eos)
        result = beam_search(random_llama, prompt, num_beams, 8, length_penalty, early_stopping, eos)
        assert result.token_ids == expected, (prompt.tolist(), eos)
        finished_early += len(expected) < 8
    if length_penalty <= 1.0:  # a strong length penalty favours long hypotheses, so none may end early
        assert finished_early > 0, "no hypothesis ended on EOS: the test would not exercise the finished list"


def test_beam_search_without_eos_runs_to_max_tokens_and_beats_greedy(random_llama):
    prompt = [5, 17, 99]
    result = beam_search(random_llama, prompt, num_beams=4, max_tokens=6)
    assert isinstance(result, BeamResult) and len(result.token_ids) == 6
    assert result.token_ids == transformers_beam(random_llama, torch.tensor([prompt]), 4, 6, 1.0, False, None)

    def log_prob(tokens):
        ids = torch.tensor([prompt + tokens])
        with torch.no_grad():
            logp = torch.log_softmax(random_llama(ids).logits[0, len(prompt) - 1:-1].float(), dim=-1)
        return float(logp.gather(1, torch.tensor(tokens).unsqueeze(1)).sum())

    greedy = random_llama.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=6, pad_token_id=0)
    assert log_prob(result.token_ids) >= log_prob(greedy[0, 3:].tolist()) - 1e-4
    assert abs(result.score - log_prob(result.token_ids) / 6) < 1e-3


def test_one_beam_is_greedy(random_llama):
    prompt = torch.tensor([[7, 8, 9]])
    greedy = random_llama.generate(prompt, do_sample=False, max_new_tokens=8, pad_token_id=0)
    assert beam_search(random_llama, prompt, 1, 8).token_ids == greedy[0, 3:].tolist()


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(num_beams=0), ValueError, "num_beams"), (dict(num_beams=2.0), ValueError, "num_beams"),
    (dict(max_tokens=0), ValueError, "max_tokens"), (dict(length_penalty="1"), ValueError, "length_penalty"),
    (dict(early_stopping="sometimes"), ValueError, "early_stopping"), (dict(eos_token_id=-1), ValueError, "eos"),
    (dict(input_ids=[]), ValueError, "input_ids"), (dict(input_ids=torch.zeros(2, 3, dtype=torch.long)), ValueError,
                                                    "input_ids"),
    (dict(input_ids="hello"), TypeError, "input_ids"),
])
def test_beam_search_rejects_bad_input(random_llama, kwargs, error, pattern):
    args = dict(input_ids=[4, 5], num_beams=2, max_tokens=3)
    args.update(kwargs)
    with pytest.raises(error, match=pattern):
        beam_search(random_llama, **args)


@pytest.mark.parametrize("num_beams, length_penalty, early_stopping, count", [(4, 1.0, False, 10), (3, 0.6, True, 4)])
def test_beam_search_equals_transformers_on_the_shipped_model(tiny, num_beams, length_penalty, early_stopping, count):
    model, tokenizer = tiny
    prompts = ["小明", "今天", "我们", "他", "你", "天气", "小红", "明天", "老师", "我"][:count]
    for text in prompts:
        prompt = tokenizer(text, return_tensors="pt")["input_ids"]
        expected = transformers_beam(model, prompt, num_beams, 12, length_penalty, early_stopping,
                                     tokenizer.eos_token_id)
        result = beam_search(model, prompt, num_beams, 12, length_penalty, early_stopping, tokenizer.eos_token_id)
        assert result.token_ids == expected, text
