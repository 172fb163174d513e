"""The exercise checks of chapters 05-07 accept a right answer and name the mistake in a wrong one."""
import pytest

from decodelab.book.checks import CheckFailed
from decodelab.book.checks.ch07 import check_release, check_slot_mapping


# ---- chapter 07: slot mapping ---------------------------------------------------------------------------------

def slots_right(block_ids, block_size, start, num_tokens):
    return [block_ids[i // block_size] * block_size + i % block_size for i in range(start, start + num_tokens)]


def slots_positions(block_ids, block_size, start, num_tokens):
    return list(range(start, start + num_tokens))


def slots_no_multiply(block_ids, block_size, start, num_tokens):
    return [block_ids[i // block_size] + i % block_size for i in range(start, start + num_tokens)]


def slots_from_zero(block_ids, block_size, start, num_tokens):
    return [block_ids[i // block_size] * block_size + i % block_size for i in range(num_tokens)]


def slots_off_by_one(block_ids, block_size, start, num_tokens):
    return [block_ids[i // block_size] * block_size + i % block_size for i in range(start + 1, start + num_tokens + 1)]


def test_slot_mapping_accepts_the_right_answer(capsys):
    check_slot_mapping(slots_right)
    assert "通过" in capsys.readouterr().out


@pytest.mark.parametrize("fn, hint", [
    (slots_positions, "没有查块表"),
    (slots_no_multiply, "要乘以 block_size"),
    (slots_from_zero, "从位置 0 开始算了"),
    (slots_off_by_one, "错了一位"),
    (lambda *args: None, "整数列表"),
])
def test_slot_mapping_names_the_mistake(fn, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_slot_mapping(fn)


# ---- chapter 07: releasing blocks -----------------------------------------------------------------------------

def release_right(ref_counts, free_queue, block_ids):
    for block_id in block_ids:
        ref_counts[block_id] -= 1
        if ref_counts[block_id] == 0:
            free_queue.append(block_id)


def release_leaks_shared(ref_counts, free_queue, block_ids):  # the exercise's buggy starter
    for block_id in block_ids:
        if ref_counts[block_id] == 1:
            ref_counts[block_id] = 0
            free_queue.append(block_id)


def release_frees_shared(ref_counts, free_queue, block_ids):
    for block_id in block_ids:
        ref_counts[block_id] = max(0, ref_counts[block_id] - 1)
        free_queue.append(block_id)


def release_skips_last(ref_counts, free_queue, block_ids):
    release_right(ref_counts, free_queue, block_ids[:-1])


def release_returns_copy(ref_counts, free_queue, block_ids):
    counts = list(ref_counts)
    return [b for b in block_ids if counts[b] == 1]


def test_release_accepts_the_right_answer(capsys):
    check_release(release_right)
    assert "通过" in capsys.readouterr().out


@pytest.mark.parametrize("fn, hint", [
    (release_leaks_shared, "泄漏"),
    (release_frees_shared, "还被序列 B 用着"),
    (release_skips_last, "漏了最后一块"),
    (release_returns_copy, "原地修改"),
])
def test_release_names_the_mistake(fn, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_release(fn)


# ---- chapter 06: KV bytes and sequences that fit -------------------------------------------------------------

from decodelab.book.checks.ch06 import check_kv_bytes, check_max_sequences  # noqa: E402


def kv_right(config, num_tokens, batch_size, dtype_bytes):
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * num_tokens * batch_size * dtype_bytes


def kv_no_two(config, num_tokens, batch_size, dtype_bytes):
    return kv_right(config, num_tokens, batch_size, dtype_bytes) // 2


def kv_query_heads(config, num_tokens, batch_size, dtype_bytes):
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_attention_heads * head_dim * num_tokens * batch_size * dtype_bytes


def kv_hidden_over_heads(config, num_tokens, batch_size, dtype_bytes):
    head_dim = config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * num_tokens * batch_size * dtype_bytes


def kv_bits(config, num_tokens, batch_size, dtype_bytes):
    return 8 * kv_right(config, num_tokens, batch_size, dtype_bytes)


def kv_no_batch(config, num_tokens, batch_size, dtype_bytes):
    return kv_right(config, num_tokens, 1, dtype_bytes)


def test_kv_bytes_accepts_the_right_answer(capsys):
    check_kv_bytes(kv_right)
    assert "通过" in capsys.readouterr().out


def test_kv_bytes_refuses_the_library_formula():
    from decodelab.kv.contiguous_cache import kv_cache_bytes, model_kv_shape
    with pytest.raises(CheckFailed, match="库里现成的 `decodelab.kv.contiguous_cache.kv_cache_bytes`"):
        check_kv_bytes(lambda c, n, b, d: kv_cache_bytes(*model_kv_shape(c), n * b, d))


@pytest.mark.parametrize("fn, hint", [
    (kv_no_two, "少了一半"),
    (kv_query_heads, "num_key_value_heads"),
    (kv_hidden_over_heads, "单独给出了 head_dim"),
    (kv_bits, "比特"),
    (kv_no_batch, "每条序列"),
])
def test_kv_bytes_names_the_mistake(fn, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_kv_bytes(fn)


def fit_right(gpu_bytes, weight_bytes, kv_bytes_per_token, seq_len):
    return max(0, (gpu_bytes - weight_bytes) // (kv_bytes_per_token * seq_len))


@pytest.mark.parametrize("fn, hint", [
    (lambda g, w, k, n: g // (k * n), "先要放下模型权重"),
    (lambda g, w, k, n: (g - w) / (k * n), "向下取整"),
    (lambda g, w, k, n: (g - w) // (k * n), "负数"),
    (lambda g, w, k, n: max(0, -(-(g - w) // (k * n))), "多了 1"),
])
def test_max_sequences_names_the_mistake(fn, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_max_sequences(fn)


def test_max_sequences_accepts_the_right_answer(capsys):
    check_max_sequences(fit_right)
    assert "通过" in capsys.readouterr().out


# ---- chapter 05: compounding errors and invalid mass --------------------------------------------------------

import math  # noqa: E402

from decodelab.book.checks.ch05 import check_invalid_mass, check_survival  # noqa: E402


def survival_right(rates):
    out, alive = [], 1.0
    for rate in rates:
        alive *= 1 - rate
        out.append(alive)
    return out


def test_survival_accepts_the_right_answer(capsys):
    check_survival(survival_right)
    check_survival(lambda rates: [math.prod(1 - r for r in rates[:t + 1]) for t in range(len(rates))])
    assert "通过" in capsys.readouterr().out


@pytest.mark.parametrize("fn, hint", [
    (lambda rates: [1 - sum(rates[:t + 1]) for t in range(len(rates))], "近似"),
    (lambda rates: [1.0] + survival_right(rates)[:-1], "错了一位"),
    (lambda rates: [1.0] + survival_right(rates), "多放了一个 1.0"),
    (lambda rates: [math.prod(rates[:t + 1]) for t in range(len(rates))], "每一步都出错"),
    (lambda rates: 0.5, "列表"),
])
def test_survival_names_the_mistake(fn, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_survival(fn)


def invalid_right(model_probs, true_probs):
    return sum(p for token, p in model_probs.items() if true_probs.get(token, 0.0) == 0.0)


def test_invalid_mass_accepts_the_right_answer(capsys):
    check_invalid_mass(invalid_right)
    assert "通过" in capsys.readouterr().out


@pytest.mark.parametrize("fn, hint", [
    (lambda m, t: sum(p for k, p in m.items() if t.get(k, 0.0) > 0), "合法"),
    (lambda m, t: 0.5 * sum(abs(m.get(k, 0.0) - t.get(k, 0.0)) for k in {*m, *t}), "total variation"),
    (lambda m, t: sum(p for k, p in m.items() if t.get(k, 0.0) < 0.01), "概率很小|结果不对"),
    (lambda m, t: sum(p for k, p in m.items() if k not in t and k != "</s>"), "</s>"),
])
def test_invalid_mass_names_the_mistake(fn, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_invalid_mass(fn)


# ---- chapter 07: the online-softmax update ---------------------------------------------------------------------

import math  # noqa: E402

import torch  # noqa: E402

from decodelab.book.checks.ch07 import check_online_softmax  # noqa: E402


def online_right(m, l, acc, scores, values):
    new_max = max(m, float(scores.max()))
    weights = torch.exp(scores - new_max)
    factor = math.exp(m - new_max)
    return new_max, l * factor + float(weights.sum()), acc * factor + weights @ values


def online_no_rescale(m, l, acc, scores, values):
    new_max = max(m, float(scores.max()))
    weights = torch.exp(scores - new_max)
    return new_max, l + float(weights.sum()), acc + weights @ values


def online_no_rescale_acc(m, l, acc, scores, values):
    new_max = max(m, float(scores.max()))
    weights = torch.exp(scores - new_max)
    return new_max, l * math.exp(m - new_max) + float(weights.sum()), acc + weights @ values


def online_no_rescale_sum(m, l, acc, scores, values):
    new_max = max(m, float(scores.max()))
    weights = torch.exp(scores - new_max)
    return new_max, l + float(weights.sum()), acc * math.exp(m - new_max) + weights @ values


def online_no_max(m, l, acc, scores, values):  # plain exp: right on small scores, overflows on large ones
    weights = torch.exp(scores)
    return max(m, float(scores.max())), l + float(weights.sum()), acc + weights @ values


def online_inverted(m, l, acc, scores, values):  # exp(m' - m): the first block's m = -inf makes it overflow
    new_max = max(m, float(scores.max()))
    weights = torch.exp(scores - new_max)
    factor = torch.exp(torch.tensor(new_max - m, dtype=torch.float64))
    return new_max, l * factor + float(weights.sum()), acc * factor + weights @ values


def online_old_max(m, l, acc, scores, values):  # weights against the old max: exp(+inf) in the first block
    new_max = max(m, float(scores.max()))
    weights = torch.exp(scores - m)
    factor = math.exp(m - new_max)
    return new_max, l * factor + float(weights.sum()), acc * factor + weights @ values


def online_math_exp(m, l, acc, scores, values):  # math.exp of raw scores raises OverflowError at 800
    weights = torch.tensor([math.exp(float(s)) for s in scores], dtype=scores.dtype)
    return max(m, float(scores.max())), l + float(weights.sum()), acc + weights @ values


def online_list_and_tensors(m, l, acc, scores, values):  # right, returned as a list with 0-d tensors
    new_max = torch.maximum(torch.tensor(m, dtype=scores.dtype), scores.max())
    weights = torch.exp(scores - new_max)
    factor = torch.exp(torch.tensor(m, dtype=scores.dtype) - new_max)
    return [new_max, l * factor + weights.sum(), acc * factor + weights @ values]


def online_unimplemented(m, l, acc, scores, values):
    raise NotImplementedError


@pytest.mark.parametrize("fn", [online_right, online_list_and_tensors])
def test_online_softmax_accepts_the_right_answer(fn, capsys):
    check_online_softmax(fn)
    assert "通过" in capsys.readouterr().out


@pytest.mark.parametrize("fn, hint", [
    (online_no_rescale, "acc 和 l 都没有乘"),
    (online_no_rescale_acc, "acc 没有乘"),
    (online_no_rescale_sum, "指数和 l 没有乘"),
    (online_no_max, "溢出"),
    (online_inverted, "方向就反了"),
    (online_old_max, "用旧的 m 算就是"),
    (online_math_exp, "exp 溢出了"),
    (online_unimplemented, "还没有实现"),
    (lambda m, l, acc, scores, values: acc, "三元组"),
])
def test_online_softmax_names_the_mistake(fn, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_online_softmax(fn)


# ---- exercise 5.3: the hazard gap, checked against the stored run of scripts/ch05_exposure.py ---------------------
import json  # noqa: E402
from pathlib import Path  # noqa: E402

from decodelab.book.checks.ch05 import HAZARD_REFERENCE, check_hazard_gap  # noqa: E402


def test_hazard_reference_equals_the_stored_run():
    data = json.loads((Path(__file__).resolve().parents[2] / "chapters/data/05-exposure.json").read_text(encoding="utf-8"))
    small = next(m for m in data["models"] if m["name"] == "tiny-zh-doc-small")
    for temperature, ref in small["exercise"].items():
        stored = HAZARD_REFERENCE[float(temperature)]
        assert (stored["data"], stored["own_clean"]) == (ref["data"], ref["own_clean"])
        assert [stored["gap_low"], stored["gap_high"]] == ref["gap_interval"]


@pytest.fixture(scope="module")
def hazard_runs():
    """A student's raw records of exercise 5.3 at T = 1.3: per document, hazards(...) on the document and on the
    model's own continuation (seed 0 and seed 1000), each after the first sentence."""
    from decodelab.measure.dagger import first_sentence
    from decodelab.measure.exposure import continue_texts, hazards
    from decodelab.models import load_model
    from decodelab.models.train import ASSETS
    from decodelab.toy import DocumentLanguage

    torch.set_num_threads(1)
    model, tokenizer = load_model(str(ASSETS / "tiny-zh-doc-small"), device="cpu")
    lang, docs = DocumentLanguage(), DocumentLanguage().sample(40, seed=505_000_005)
    prompts = [first_sentence(d) for d in docs]
    runs = {"data": [hazards(model, tokenizer, lang, d, len(p), 1.3) for d, p in zip(docs, prompts)],
            "from 0": [hazards(model, tokenizer, lang, d, 0, 1.3) for d in docs]}
    for seed in (0, 1000):
        own = continue_texts(model, tokenizer, prompts, seed=seed, max_tokens=400, temperature=1.3)
        runs[f"own {seed}"] = [hazards(model, tokenizer, lang, t, len(p), 1.3) for (t, _), p in zip(own, prompts)]
    return runs


@pytest.mark.parametrize("seed", [0, 1000])
def test_hazard_gap_recomputes_the_means_from_the_records(hazard_runs, seed, capsys):
    check_hazard_gap(1.3, hazard_runs["data"], hazard_runs[f"own {seed}"])
    out = capsys.readouterr().out
    data = [h for doc in hazard_runs["data"] for _, _, h in doc]
    assert "通过" in out and f"真实前缀上 {sum(data) / len(data):.4f}" in out


def test_hazard_gap_refuses_the_data_given_as_the_models_own(hazard_runs):
    for temperature in (0.7, 1.0, 1.3):
        with pytest.raises(CheckFailed, match="你把真实文档上的 hazard 当成了模型自己的"):
            check_hazard_gap(temperature, hazard_runs["data"], hazard_runs["data"])


@pytest.mark.parametrize("args, hint", [
    ((0.9, [], []), "temperature 应是"),
    ((1.3, 0.049, 0.048), "不是一个数：检查要你的原始记录"),
    ((1.3, None, None), "还没有量"),
    ((1.3, [[(12, "clean", 1.5)]] * 40, [[(12, "clean", 0.1)]] * 40), "不是 0 到 1 之间的概率"),
    ((1.3, [[]] * 3, [[]] * 3), "应是 40 篇"),
])
def test_hazard_gap_names_the_mistake(args, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_hazard_gap(*args)


def test_hazard_gap_names_a_record_that_starts_at_the_prompt_and_a_wrong_temperature(hazard_runs):
    with pytest.raises(CheckFailed, match="从位置 0 就开始了"):
        check_hazard_gap(1.3, hazard_runs["from 0"], hazard_runs["own 0"])
    with pytest.raises(CheckFailed, match="data_records 算出的平均 hazard 是 .*偏高") as error:
        check_hazard_gap(1.0, hazard_runs["data"], hazard_runs["own 0"])  # measured at 1.3, reported as 1.0
    assert f"{HAZARD_REFERENCE[1.0]['data']:.4f}" not in str(error.value)
