"""The shipped tiny-zh model: quiet loading, tokenizer round trip, and the quality gate against the true language."""
import re
import warnings

import pytest
import torch

from decodelab.models.load import TINY_ZH, load_model, resolve_device, resolve_dtype
from decodelab.toy.sentences import ToyLanguage
from decodelab.models.train import HELDOUT_SEED, cross_entropy_per_char, encode_batch, generate_texts


@pytest.fixture(scope="module")
def lang():
    return ToyLanguage()


def test_loading_is_quiet(capfd):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, tokenizer = load_model("tiny-zh", device="cpu")
    out, err = capfd.readouterr()
    assert (out, err, [str(w.message) for w in caught]) == ("", "", [])
    assert not model.training and model.dtype == torch.float32 and model.device.type == "cpu"


def test_config_is_a_gqa_llama(tiny):
    model, tokenizer = tiny
    cfg = model.config
    assert type(model).__name__ == "LlamaForCausalLM"
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (4, 2)
    assert (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) == (0, 1, 2)
    gen = model.generation_config
    assert (gen.pad_token_id, gen.bos_token_id, gen.eos_token_id) == (0, 1, 2)
    assert cfg.vocab_size == len(tokenizer)


def test_tokenizer_round_trip(tiny, lang):
    _, tokenizer = tiny
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 3]) == ["<pad>", "<s>", "</s>", "<unk>"]
    assert tokenizer.convert_ids_to_tokens(list(range(4, len(tokenizer)))) == lang.alphabet
    for text in lang.sample(50, seed=5):
        ids = tokenizer(text)["input_ids"]
        assert ids[0] == 1 and len(ids) == len(text) + 1 and 2 not in ids
        assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_card_and_asset_size(tiny):
    model, _ = tiny
    total = sum(f.stat().st_size for f in TINY_ZH.rglob("*") if f.is_file())
    assert total <= 20 * 2**20
    card = (TINY_ZH / "README.md").read_text(encoding="utf-8")
    assert f"{model.num_parameters():,} parameters" in card
    assert re.search(r"gap \(model − entropy rate\) \| 0\.0\d{3}", card)


def test_quality_gate_cross_entropy(tiny, lang):
    """Held-out cross-entropy is within 0.10 nats/char of the exact entropy rate."""
    model, tokenizer = tiny
    texts = lang.sample(300, seed=HELDOUT_SEED + 1)
    ce = cross_entropy_per_char(model, tokenizer, texts)
    assert ce - lang.entropy_rate() <= 0.10, (ce, lang.entropy_rate())
    true_ce = -sum(lang.log_prob(t) for t in texts) / sum(len(t) + 1 for t in texts)
    assert ce >= true_ce - 0.05  # a model cannot beat the truth by more than sampling noise


def test_greedy_output_is_valid(tiny, lang):
    model, tokenizer = tiny
    for prompt in ["", "小明", "今天，"]:
        text = generate_texts(model, tokenizer, prompt, 1, do_sample=False)[0]
        assert lang.is_valid(text), (prompt, text)


def test_encode_batch_masks_padding(tiny):
    _, tokenizer = tiny
    ids, labels = encode_batch(tokenizer, ["祝你", "小明在家里看书。"])
    assert ids.shape == labels.shape == (2, 10)
    assert ids[0].tolist()[:4] == [1, tokenizer.convert_tokens_to_ids("祝"), tokenizer.convert_tokens_to_ids("你"), 2]
    assert labels[0, 4:].eq(-100).all() and ids[0, 4:].eq(0).all() and labels[1].ne(-100).all()


def test_local_path_loads(tiny):
    model, tokenizer = load_model(str(TINY_ZH), device="cpu")
    ids = torch.tensor([tokenizer("小明")["input_ids"]])
    torch.testing.assert_close(model(ids).logits, tiny[0](ids).logits)


def test_offline_missing_model_fails_at_once(monkeypatch):
    """No connection is attempted (online, the hub client retries for about 25 s before it gives up)."""
    import socket

    connections = []
    real_connect = socket.socket.connect
    monkeypatch.setattr(socket.socket, "connect", lambda self, address: (connections.append(address),
                                                                          real_connect(self, address))[1])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError) as info:
        load_model("decodelab-tests/no-such-model", device="cpu")
    assert connections == []
    message = str(info.value)
    for part in ["'decodelab-tests/no-such-model'", "HF_HUB_OFFLINE=1", "huggingface-cli download", "tiny-zh"]:
        assert part in message


def test_bad_arguments():
    with pytest.raises(ValueError, match="device must be"):
        load_model("tiny-zh", device="gpu0")
    with pytest.raises(ValueError, match="dtype must be"):
        load_model("tiny-zh", device="cpu", dtype="float8")
    with pytest.raises(ValueError, match="name must be"):
        load_model("", device="cpu")
    with pytest.raises(TypeError, match="device must be"):
        resolve_device(3)
    with pytest.raises(FileNotFoundError, match="'./no-such-dir' is not a directory"):
        load_model("./no-such-dir", device="cpu")


def test_device_and_dtype_defaults():
    assert resolve_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_dtype(None, torch.device("cpu")) == torch.float32
    assert resolve_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    assert resolve_dtype(torch.float16, torch.device("cpu")) == torch.float16
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda.is_available"):
            resolve_device("cuda")


@pytest.mark.cuda
def test_cuda_default_is_bfloat16():
    model, _ = load_model("tiny-zh")
    assert model.device.type == "cuda" and model.dtype == torch.bfloat16


def test_build_tokenizer_checks_alphabet():
    from decodelab.models.tokenizer import build_tokenizer

    tok = build_tokenizer(["好", "你"])
    assert tok("你好")["input_ids"] == [1, 4, 5] and tok.decode([1, 4, 5, 2], skip_special_tokens=True) == "你好"
    assert tok("你x")["input_ids"] == [1, 4, 3]
    with pytest.raises(ValueError, match="non-empty list"):
        build_tokenizer([])
    with pytest.raises(ValueError, match="single non-space characters"):
        build_tokenizer(["你好"])
    with pytest.raises(ValueError, match="duplicates"):
        build_tokenizer(["你", "你"])


# ---- tiny-zh-doc: the document model ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def doc_model():
    return load_model("tiny-zh-doc", device="cpu")


@pytest.mark.slow
def test_doc_model_quality_gate(doc_model):
    """Held-out cross-entropy on 120 unseen documents is within 0.05 nats/char of the exact entropy rate."""
    from decodelab.toy.documents import DocumentLanguage

    model, tokenizer = doc_model
    docs = DocumentLanguage()
    texts = docs.sample(120, seed=HELDOUT_SEED + 1)
    ce = cross_entropy_per_char(model, tokenizer, texts, batch_size=40)
    assert ce - docs.entropy_rate() <= 0.05, (ce, docs.entropy_rate())
    true_ce = -sum(docs.log_prob(t) for t in texts) / sum(len(t) + 1 for t in texts)
    assert ce >= true_ce - 0.05


def test_doc_model_config_and_card(doc_model, tiny):
    model, tokenizer = doc_model
    assert model.config.max_position_embeddings >= 512 and tokenizer.model_max_length >= 512
    assert tokenizer.get_vocab() == tiny[1].get_vocab()  # one vocabulary for both shipped models
    card = (TINY_ZH.parent / "tiny-zh-doc" / "README.md").read_text(encoding="utf-8")
    assert f"{model.num_parameters():,} parameters" in card and "python -m decodelab.models.train --model tiny-zh-doc" in card
    minutes = float(re.search(r"Training time: ([\d.]+) min", card).group(1))
    assert minutes <= 15


def test_doc_model_knows_the_protagonist(doc_model):
    """After the intro names 陈阿姨, the model expects her at the start of the next sentence, as the truth does."""
    model, tokenizer = doc_model
    prefix = "这是陈阿姨在北京的一天。"
    probs = torch.softmax(model(torch.tensor([tokenizer(prefix)["input_ids"]])).logits[0, -1], -1)
    assert probs[tokenizer.convert_tokens_to_ids("陈")] > 0.2
