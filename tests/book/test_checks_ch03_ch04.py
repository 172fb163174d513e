"""The exercise checks of chapters 03 and 04 accept a right answer and name the mistake in a wrong one."""
import re

import pytest
import torch

from decodelab.book.checks import CheckFailed
from decodelab.book.checks.ch03 import check_top_k, check_top_p
from decodelab.sampling.sampler import SamplingParams, process_logits

NEG_INF = float("-inf")


def _raises_hint(check, fn, hint, capsys):
    with pytest.raises(CheckFailed, match=re.escape(hint)):
        check(fn)
    assert "通过" not in capsys.readouterr().out


# ---- chapter 03: top-p -----------------------------------------------------------------------------------------

def _nucleus(logits, top_p, mass_rule, descending=True, scatter_back=True):
    probs = logits.softmax(-1)
    sorted_probs, index = probs.sort(-1, descending=descending)
    keep_sorted = mass_rule(sorted_probs) < top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, index, keep_sorted) if scatter_back else keep_sorted
    return logits.masked_fill(~keep, NEG_INF)


def top_p_right(logits, top_p):
    return _nucleus(logits, top_p, lambda s: s.cumsum(-1) - s)


def top_p_drops_crossing(logits, top_p):
    return _nucleus(logits, top_p, lambda s: s.cumsum(-1))


def top_p_ascending(logits, top_p):
    return _nucleus(logits, top_p, lambda s: s.cumsum(-1) - s, descending=False)


def top_p_no_scatter(logits, top_p):
    return _nucleus(logits, top_p, lambda s: s.cumsum(-1) - s, scatter_back=False)


def top_p_unsorted(logits, top_p):
    probs = logits.softmax(-1)
    return logits.masked_fill(probs.cumsum(-1) - probs >= top_p, NEG_INF)


def top_p_returns_probs(logits, top_p):
    filtered = top_p_right(logits, top_p).softmax(-1)
    return filtered


@pytest.mark.parametrize("fn", [
    top_p_right,
    lambda x, p: torch.log_softmax(top_p_right(x, p), dim=-1),  # a constant shift per row is the same distribution
])
def test_top_p_accepts_right_answers(fn, capsys):
    check_top_p(fn)
    assert "通过" in capsys.readouterr().out


@pytest.mark.parametrize(("fn", "hint"), [
    (top_p_drops_crossing, "越过 p 的那个 token 被你删掉了"),
    (top_p_ascending, "你保留的是最不可能的那些 token"),
    (top_p_no_scatter, "你把排好序的结果直接返回了"),
    (top_p_unsorted, "你在词表原来的顺序上做了 cumsum"),
    (top_p_returns_probs, "你返回的像是概率"),
])
def test_top_p_names_the_mistake(fn, hint, capsys):
    _raises_hint(check_top_p, fn, hint, capsys)


# ---- chapter 03: top-k -----------------------------------------------------------------------------------------

def top_k_right(logits, k):
    kth = logits.topk(k, dim=-1).values[:, -1:]  # [B, 1]
    return logits.masked_fill(logits < kth, NEG_INF)


def top_k_no_keepdim(logits, k):  # LLMs-from-scratch's bug: fine for one row, wrong for a batch
    kth = logits.topk(k, dim=-1).values[:, -1]  # [B]
    return torch.where(logits < kth, NEG_INF, logits)


def top_k_off_by_one(logits, k):
    kth = logits.sort(-1, descending=True).values[:, min(k, logits.shape[-1] - 1)].unsqueeze(-1)
    return logits.masked_fill(logits < kth, NEG_INF)


def top_k_strict(logits, k):
    kth = logits.topk(k, dim=-1).values[:, -1:]
    return logits.masked_fill(logits <= kth, NEG_INF)


def top_k_smallest(logits, k):
    kth = logits.topk(k, dim=-1, largest=False).values[:, -1:]
    return logits.masked_fill(logits > kth, NEG_INF)


def top_k_global(logits, k):
    return logits.masked_fill(logits < logits.flatten().topk(k).values[-1], NEG_INF)


def top_k_zeros(logits, k):
    kth = logits.topk(k, dim=-1).values[:, -1:]
    return logits.masked_fill(logits < kth, 0.0)


@pytest.mark.parametrize("fn", [top_k_right])
def test_top_k_accepts_right_answers(fn, capsys):
    check_top_k(fn)
    assert "通过" in capsys.readouterr().out


@pytest.mark.parametrize(("check", "fn", "name"), [
    (check_top_p, lambda x, p: process_logits(x, SamplingParams(top_p=p)), "process_logits"),
    (check_top_k, lambda x, k: process_logits(x, SamplingParams(top_k=k)), "process_logits"),
])
def test_the_library_filters_are_refused(check, fn, name):
    with pytest.raises(CheckFailed, match=f"库里现成的 `decodelab.sampling.sampler.{name}`"):
        check(fn)


@pytest.mark.parametrize(("fn", "hint"), [
    (top_k_no_keepdim, "keepdim=True"),  # [3, 7] vs [3]: the shape error, turned into a hint by call_student
    (top_k_off_by_one, "保留了 k+1"),
    (top_k_strict, "只保留了 k-1"),
    (top_k_smallest, "你保留的是 logits 最小的 k 个 token"),
    (top_k_global, "你用了整个 batch 的第 k 大值"),
    (top_k_zeros, "要设为 -inf（不是 0）"),
])
def test_top_k_names_the_mistake(fn, hint, capsys):
    _raises_hint(check_top_k, fn, hint, capsys)


def top_k_no_keepdim_broadcasts(logits, k):
    """Without keepdim, but with `torch.where` so that [B] broadcasts: only a square batch reveals it."""
    if logits.shape[0] != logits.shape[1]:
        return top_k_right(logits, k)
    return top_k_no_keepdim(logits, k)


def test_top_k_without_keepdim_on_a_square_batch_is_named(capsys):
    _raises_hint(check_top_k, top_k_no_keepdim_broadcasts, "B == V 时不会报错却用错了行", capsys)


# ---- chapter 04: sequence log-probability ----------------------------------------------------------------------

from decodelab.book.checks.ch04 import check_greedy_with_cache, check_sequence_log_prob  # noqa: E402
from decodelab.decoding.generate import model_step  # noqa: E402


def seq_right(logits, ids):
    log_probs = torch.log_softmax(logits[:, :-1], dim=-1)  # [B, L - 1, V]
    return log_probs.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1).sum(-1)


def seq_product(logits, ids):
    probs = torch.softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return probs.prod(-1).log()


def seq_no_shift(logits, ids):
    return torch.log_softmax(logits, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1).sum(-1)


def seq_mean(logits, ids):
    return seq_right(logits, ids) / (ids.shape[1] - 1)


def seq_raw_logits(logits, ids):
    return logits[:, :-1].gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1).sum(-1)


def seq_wrong_dim(logits, ids):
    return torch.log_softmax(logits, dim=1)[:, :-1].gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1).sum(-1)


def seq_keepdim(logits, ids):
    return seq_right(logits, ids).unsqueeze(-1)


def test_sequence_log_prob_accepts_the_right_answer(capsys):
    check_sequence_log_prob(seq_right)
    assert "通过" in capsys.readouterr().out


@pytest.mark.parametrize(("fn", "hint"), [
    (seq_product, "在 log 空间里求和"),
    (seq_no_shift, "错位了"),
    (seq_mean, "你求的是平均每个 token 的 log 概率"),
    (seq_raw_logits, "你直接把 logits 加起来了"),
    (seq_wrong_dim, "log_softmax 的维度不对"),
    (lambda x, i: -seq_right(x, i), "符号反了"),
    (seq_keepdim, "输出形状应为 [2]"),
])
def test_sequence_log_prob_names_the_mistake(fn, hint, capsys):
    _raises_hint(check_sequence_log_prob, fn, hint, capsys)


# ---- chapter 04: the greedy loop over a KV cache ---------------------------------------------------------------

def greedy_right(model, input_ids, max_new_tokens):
    logits, cache = model_step(model, input_ids)  # prefill
    ids = input_ids
    for step in range(max_new_tokens):
        next_token = logits[:, -1, :].argmax(dim=-1, keepdim=True)  # [B, 1]
        ids = torch.cat([ids, next_token], dim=1)
        if step + 1 < max_new_tokens:
            logits, cache = model_step(model, next_token, cache)
    return ids


def greedy_no_cache(model, input_ids, max_new_tokens):
    ids = input_ids
    for _ in range(max_new_tokens):
        logits, _ = model_step(model, ids)
        ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


def greedy_refeeds_everything(model, input_ids, max_new_tokens):
    logits, cache = model_step(model, input_ids)
    ids = input_ids
    for _ in range(max_new_tokens):
        ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        logits, cache = model_step(model, ids, cache)
    return ids


def greedy_first_position(model, input_ids, max_new_tokens):
    logits, cache = model_step(model, input_ids)
    ids = input_ids
    for _ in range(max_new_tokens):
        next_token = logits[:, 0].argmax(-1, keepdim=True)
        ids = torch.cat([ids, next_token], dim=1)
        logits, cache = model_step(model, next_token, cache)
    return ids


def greedy_feeds_stale_token(model, input_ids, max_new_tokens):
    logits, cache = model_step(model, input_ids)
    ids, fed = input_ids, input_ids[:, -1:]
    for _ in range(max_new_tokens):
        next_token = logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, next_token], dim=1)
        logits, cache = model_step(model, fed, cache)  # keeps feeding the prompt's last token
    return ids


def greedy_no_keepdim(model, input_ids, max_new_tokens):
    logits, cache = model_step(model, input_ids)
    ids = input_ids
    for _ in range(max_new_tokens):
        next_token = logits[:, -1].argmax(-1)  # [B]
        ids = torch.cat([ids, next_token], dim=1)
        logits, cache = model_step(model, next_token, cache)
    return ids


def greedy_new_only(model, input_ids, max_new_tokens):
    return greedy_right(model, input_ids, max_new_tokens)[:, input_ids.shape[1]:]


PROMPTS = torch.tensor([[1, 17, 42, 99, 5], [1, 250, 3, 64, 128]])  # [2, 5] for random_llama (vocab 300)


def test_greedy_with_cache_accepts_the_right_answer(random_llama, capsys):
    check_greedy_with_cache(greedy_right, random_llama, PROMPTS)
    assert "1 次 prefill（5 个 token）" in capsys.readouterr().out


@pytest.mark.parametrize(("fn", "hint"), [
    (greedy_no_cache, "没有用 KV cache"),
    (greedy_refeeds_everything, "每一步只送入刚选出的那一个 token"),
    (greedy_first_position, "取最后一个位置的 logits"),
    (greedy_feeds_stale_token, "第一个新 token 对了，后面的不对"),
    (greedy_no_keepdim, "keepdim=True"),
    (greedy_new_only, "你只返回了新生成的"),
])
def test_greedy_with_cache_names_the_mistake(random_llama, fn, hint, capsys):
    with pytest.raises(CheckFailed, match=re.escape(hint)):
        check_greedy_with_cache(fn, random_llama, PROMPTS)
    assert "通过" not in capsys.readouterr().out


def test_greedy_with_cache_on_the_shipped_model(capsys):
    check_greedy_with_cache(greedy_right)
    assert "通过" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="没有用 KV cache"):
        check_greedy_with_cache(greedy_no_cache)


def test_greedy_check_needs_prompts_with_a_model(random_llama):
    with pytest.raises(ValueError, match="input_ids must be given with a model of your own, got None"):
        check_greedy_with_cache(greedy_right, random_llama)


# ---- chapter 03: the loop rate of top-k, measured ----------------------------------------------------------------

import numpy as np  # noqa: E402

from decodelab.book.checks.ch03 import check_loop_rate, loop_prompts  # noqa: E402
from decodelab.decoding.generate import generate  # noqa: E402
from decodelab.models.load import load_model  # noqa: E402
from decodelab.measure.repetition import ending_loop  # noqa: E402
from decodelab.toy.documents import DocumentLanguage  # noqa: E402

LOOP_PROMPTS = 10  # a quick reference run: 10 continuations of at most 256 tokens


@pytest.fixture(scope="module")
def tiny_zh_doc():
    torch.set_num_threads(1)
    return load_model("tiny-zh-doc", device="cpu")


def test_loop_prompts_are_the_first_two_sentences_of_documents():
    docs = DocumentLanguage()
    prompts = loop_prompts(4)
    assert prompts == loop_prompts(6)[:4]
    for prompt in prompts:
        assert prompt.startswith("这是") and docs.prefix_is_viable(prompt)
        assert len(docs.split_sentences(prompt)) == 2


def _continuations(tiny_zh_doc, top_k: int, n: int = LOOP_PROMPTS, seed: int = 0, temperature: float = 1.0) -> list:
    model, tokenizer = tiny_zh_doc
    params = [SamplingParams(top_k=top_k, max_tokens=256, seed=seed + i, temperature=temperature) for i in range(n)]
    return generate(model, tokenizer, loop_prompts(n), params)


@pytest.fixture(scope="module")
def loop_runs(tiny_zh_doc):
    """A student's continuations of the first LOOP_PROMPTS prompts: top-2 (also at T = 0.2), greedy, pure."""
    return {"k=2": _continuations(tiny_zh_doc, 2), "k=2 T=0.2": _continuations(tiny_zh_doc, 2, temperature=0.2),
            "greedy": _continuations(tiny_zh_doc, 1), "pure": _continuations(tiny_zh_doc, 0)}


def test_loop_rate_check_recomputes_the_rate_from_the_texts(loop_runs, capsys):
    from decodelab.measure.repetition import loop_rate

    texts = [c.text for c in loop_runs["k=2"]]
    check_loop_rate(np.int64(2), texts)
    out = capsys.readouterr().out
    assert "通过" in out and f"循环率 {loop_rate(texts):.2f}" in out and "参考循环率" in out


def test_loop_rate_check_takes_no_bare_number_and_no_completions(loop_runs):
    with pytest.raises(CheckFailed, match="不是一个数：它会从你的续写里自己数出循环率"):
        check_loop_rate(2, 0.17)
    with pytest.raises(CheckFailed, match=r"Completion 对象.*\[c\.text for c in completions\]"):
        check_loop_rate(2, loop_runs["k=2"])
    with pytest.raises(CheckFailed, match="还没有结果"):
        check_loop_rate(2, None)
    with pytest.raises(CheckFailed, match=f"检查等的是 {LOOP_PROMPTS + 1} 条"):
        check_loop_rate(2, [c.text for c in loop_runs["k=2"]], num_prompts=LOOP_PROMPTS + 1)


def test_the_exercise_loop_rate_answers_completions_with_a_hint(loop_runs):
    from decodelab.book.checks.ch03 import loop_rate

    with pytest.raises(CheckFailed, match=r"generate\(\.\.\.\) 返回的是一个 Completion 列表"):
        loop_rate(loop_runs["k=2"])
    assert loop_rate(["小明在公园。小明在公园。", "小明在公园。"]) == 0.5


def test_loop_rate_check_notices_texts_not_written_by_top_k(loop_runs):
    with pytest.raises(CheckFailed, match="那是 greedy"):
        check_loop_rate(2, [c.text for c in loop_runs["greedy"]])
    with pytest.raises(CheckFailed, match="不在模型当时最可能的 2 个里"):
        check_loop_rate(2, [c.text for c in loop_runs["pure"]])
    with pytest.raises(CheckFailed, match="像是用更小的 k 采样的"):
        check_loop_rate(3, [c.text for c in loop_runs["k=2"]])
    with pytest.raises(CheckFailed, match="max_tokens=256"):
        check_loop_rate(2, [c.text[:10] for c in loop_runs["k=2"]])
    with pytest.raises(CheckFailed, match="不在模型当时最可能的 2 个里"):  # the prompt pasted in front of each text
        check_loop_rate(2, [p + c.text for p, c in zip(loop_prompts(LOOP_PROMPTS), loop_runs["k=2"])])


def test_loop_rate_check_says_which_way_a_rate_from_texts_is_off(loop_runs):
    from decodelab.measure.repetition import loop_rate

    # top-2 at T = 0.2: near greedy, so more loops (6 of the 10 here, against 1 at T = 1). At T = 0.5 the margin
    # hung on the streams: 3 against 1 here passed the check's tolerance by 0.01, and counter streams gave 2 against 2.
    texts = [c.text for c in loop_runs["k=2 T=0.2"]]
    assert loop_rate(texts) > loop_rate([c.text for c in loop_runs["k=2"]])
    with pytest.raises(CheckFailed, match="偏高.*temperature 是不是默认的 1") as error:
        check_loop_rate(2, texts)
    assert "参考" not in str(error.value)


@pytest.mark.parametrize(("k", "error", "message"), [
    (2.0, TypeError, "k must be an int in [1, 100] (the top_k you measured with), got 2.0 of type float"),
    (True, TypeError, "k must be an int in [1, 100]"),
    ("2", TypeError, "got '2' of type str"),
    (0, ValueError, "k must be an int in [1, 100] (the top_k you measured with), got 0"),
    (101, ValueError, "got 101"),
])
def test_loop_rate_check_rejects_bad_inputs(k, error, message):
    with pytest.raises(error, match=re.escape(message)):
        check_loop_rate(k, ["小明在公园。"])


# ---- chapter 04: the error rate after a forced wrong token (exercise 4.3) --------------------------------------

from decodelab.book.checks.ch04 import check_later_error_rate  # noqa: E402
from decodelab.measure.forced_token import DOCUMENT_SEED, continue_and_judge, forced_inputs  # noqa: E402
from decodelab.models.load import load_model  # noqa: E402
from decodelab.toy.sentences import ToyLanguage  # noqa: E402
from decodelab.toy.documents import DocumentLanguage  # noqa: E402


@pytest.fixture(scope="module")
def snowball():
    """A student's runs of exercise 4.3 as the exercise asks (100 documents, 50 tokens), at T = 1.5 and T = 1,
    and at T = 1.5 with another seed."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, tokenizer = load_model("tiny-zh-doc", device="cpu")
        inputs = forced_inputs(model, tokenizer, DocumentLanguage(), n=100, seed=DOCUMENT_SEED)
        run = lambda forced, temperature, seed=0: continue_and_judge(  # noqa: E731
            model, tokenizer, ToyLanguage(), inputs.prefixes, forced, temperature, max_tokens=50, seed=seed)
        return {"T=1.5": {"clean": run(None, 1.5), "wrong": run(inputs.wrong, 1.5)},
                "T=1": {"clean": run(None, 1.0), "wrong": run(inputs.wrong, 1.0)},
                "other seed": {"clean": run(None, 1.5, seed=1000), "wrong": run(inputs.wrong, 1.5, seed=1000)}}
    finally:
        torch.set_num_threads(threads)


def _count(judged, *verdicts):
    return sum(j.statuses.count(v) for j in judged for v in verdicts)


def later_error_rate(judged):
    return _count(judged, "error") / _count(judged, "error", "ok")


def rate_over_all_positions(judged):
    return _count(judged, "error") / _count(judged, "error", "ok", "skip")


def rate_skip_as_error(judged):
    return _count(judged, "error", "skip") / _count(judged, "error", "ok", "skip")


def share_of_texts_with_an_error(judged):
    return sum("error" in j.statuses for j in judged) / len(judged)


def mean_of_per_text_rates(judged):
    return sum(j.statuses.count("error") / max(1, j.statuses.count("error") + j.statuses.count("ok"))
               for j in judged) / len(judged)


@pytest.mark.slow
@pytest.mark.parametrize("run", ["T=1.5", "other seed"])
def test_later_error_rate_accepts_a_measurement_with_any_seed(snowball, run, capsys):
    check_later_error_rate(1.5, snowball[run]["clean"], snowball[run]["wrong"], later_error_rate)
    out = capsys.readouterr().out
    assert "通过" in out and "T = 1.5" in out and "错字 − 对照的 95% 区间" in out
    assert f"对照 {later_error_rate(snowball[run]['clean']):.2%}" in out  # recomputed from the student's records


@pytest.mark.parametrize(("measure", "hint"), [
    (lambda judged: 100 * later_error_rate(judged), "像是百分数"),
    (rate_over_all_positions, "你把 \"skip\" 的位置也算进了分母"),
    (rate_skip_as_error, "你把 \"skip\" 当成了错误"),
    (share_of_texts_with_an_error, "你算的是“有错的续写占多少”"),
    (mean_of_per_text_rates, "你先算了每段续写自己的错误率，再取平均"),
    (lambda judged: later_error_rate(judged) + 0.001, "可从同一份记录数出来的比例不是这个数"),
])
def test_later_error_rate_names_the_mistake(snowball, measure, hint, capsys):
    with pytest.raises(CheckFailed, match=re.escape(hint)):
        check_later_error_rate(1.5, snowball["T=1.5"]["clean"], snowball["T=1.5"]["wrong"], measure)
    assert "通过" not in capsys.readouterr().out


def test_later_error_rate_notices_the_temperature_was_not_passed(snowball):
    with pytest.raises(CheckFailed, match="正好像 T = 1 时的结果"):
        check_later_error_rate(1.5, snowball["T=1"]["clean"], snowball["T=1"]["wrong"], later_error_rate)


def test_later_error_rate_refuses_one_condition_given_twice_or_swapped(snowball):
    run = snowball["T=1.5"]
    with pytest.raises(CheckFailed, match="是同一份续写"):
        check_later_error_rate(1.5, run["clean"], run["clean"])
    with pytest.raises(CheckFailed, match="两组记录放反了"):
        check_later_error_rate(1.5, run["wrong"], run["clean"])


@pytest.mark.parametrize(("args", "hint"), [
    ((1.5, None, None), "还没有量"),
    ((5, [], []), "TEMPERATURE 应是 0（greedy）到 3 之间的一个数"),
    ((1.5, 0.02, 0.02), "不是一个数：检查要你的原始记录"),
    ((1.5, "0.02", []), "应是 continue_and_judge(...) 返回的 Judged 列表"),
    ((1.5, [], []), "应是 100 篇"),
])
def test_later_error_rate_rejects_what_is_not_a_measurement(args, hint):
    with pytest.raises(CheckFailed, match=re.escape(hint)):
        check_later_error_rate(*args)
