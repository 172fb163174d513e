"""Checks for the exercises of chapter 02 (Temperature): softmax with temperature, and entropy in nats.

Taught in: chapters/02-temperature.ipynb, exercises/02-temperature.ipynb
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

from decodelab.book.checks import CheckFailed, call_student, close, expect_tensor, fail, passed

_LOGITS = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0],
                        [0.1, 3.0, -0.5, 1.2, 0.8],
                        [1.0, 1.0, 0.0, -2.0, 0.5]])  # [3, 5]
_LARGE = torch.tensor([[50.0, 49.0, 45.0, 10.0]])  # [1, 4]: divided by T = 0.05 these reach 1000
# the library's own answers to exercises 2.1 and 2.2: they raise while the student's function runs
TEMPERATURE_FORBIDDEN = ("decodelab.sampling.sampler.process_logits", "decodelab.sampling.sampler.sample")
ENTROPY_FORBIDDEN = ("decodelab.sampling.probs.entropy", "torch.distributions.Categorical.entropy")


def _reference(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits / temperature, dim=-1)


def check_temperature_softmax(fn: Callable[[torch.Tensor, float], torch.Tensor]) -> None:
    """Check `fn(logits [..., V], temperature) -> probs [..., V]`, i.e. softmax(logits / T) over the last dim."""
    what = "形状 [3, 5] 的 logits、T = 1"
    out = expect_tensor(call_student(fn, _LOGITS, 1.0, what=what, forbidden=TEMPERATURE_FORBIDDEN), (3, 5), what)
    if close(out, torch.softmax(_LOGITS, dim=0)):
        fail("T = 1 时每一列加起来是 1：你在 dim=0（batch 维）上做了 softmax，应该沿最后一维 dim=-1。")
    if not close(out, _reference(_LOGITS, 1.0)):
        fail("T = 1 时结果应该就是普通的 softmax(logits)。先确认 softmax 本身沿 dim=-1 计算正确。")
    what = "T = 0.5"
    out = expect_tensor(call_student(fn, _LOGITS, 0.5, what=what, forbidden=TEMPERATURE_FORBIDDEN), (3, 5), what)
    if close(out, _reference(_LOGITS, 2.0)):
        fail("T = 0.5 时你的分布反而变平了：你把 logits 乘以了 T。公式是 softmax(logits / T)："
             "T < 1 把 logits 放大，分布变尖；T > 1 把 logits 缩小，分布变平。")
    if close(out, _reference(_LOGITS, 1.0)):
        fail("T = 0.5 和 T = 1 的结果一样：temperature 没有起作用。用 logits / temperature 代替 logits。")
    if close(out, torch.softmax(_LOGITS, dim=-1) / 0.5) or not close(out.sum(dim=-1), torch.ones(3)):
        fail("T = 0.5 时每一行加起来不是 1：你把概率除以了 T。temperature 作用在 logits 上，"
             "在 softmax 之前：softmax(logits / T)，这样结果仍然是概率分布。")
    if not close(out, _reference(_LOGITS, 0.5)):
        fail("T = 0.5 时数值不对。应为 exp(z_i / T) / sum_j exp(z_j / T)。")
    what = "logits [50, 49, 45, 10]、T = 0.05"
    out = expect_tensor(call_student(fn, _LARGE, 0.05, what=what, forbidden=TEMPERATURE_FORBIDDEN), (1, 4), what)
    if not bool(torch.isfinite(out).all()):
        fail("logits [50, 49, 45, 10] 在 T = 0.05 时得到 nan：logits / T 达到 1000，exp 溢出。"
             "除以 T 之后要用数值稳定的 softmax（先减去每一行的最大值，或直接用 torch.softmax）。")
    if not close(out, _reference(_LARGE, 0.05)):
        fail(f"logits [50, 49, 45, 10] 在 T = 0.05 时结果不对：{out.tolist()}。")
    for bad in (0.0, -1.0):
        try:
            fn(_LOGITS.clone(), bad)
        except ValueError:
            continue
        except Exception as error:  # noqa: BLE001 - any other error means the input was not checked
            fail(f"temperature = {bad} 时应该抛出 ValueError（说明 T 必须 > 0），实际抛出了 {type(error).__name__}。")
        fail(f"temperature = {bad} 时应该抛出 ValueError：除以 0 得到 inf/nan，负的 T 会把排名倒过来。"
             "加一行 `if temperature <= 0: raise ValueError(f\"temperature must be > 0, got {temperature}\")`。")
    passed("softmax(logits / T) 正确：T < 1 变尖、T > 1 变平，每一行和为 1，T 很小也不溢出，T ≤ 0 会报错。")


def check_entropy(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Check `fn(probs [..., V]) -> entropy [...]` in nats, with 0 log 0 = 0, over the last dim."""
    uniform = torch.full((4,), 0.25)
    what = "均匀分布 [0.25, 0.25, 0.25, 0.25]"
    out = call_student(fn, uniform, what=what, forbidden=ENTROPY_FORBIDDEN)
    if not isinstance(out, torch.Tensor):
        fail(f"输入 {what} 时应返回 torch.Tensor，实际返回了 {type(out).__name__}。")
    value = float(out.reshape(-1)[0]) if out.numel() else float("nan")
    if math.isclose(value, 2.0, abs_tol=1e-4):
        fail("均匀分布在 4 个 token 上的熵你算成了 2：那是以 2 为底（bits）。本课程用自然对数（nats）：torch.log 就是自然对数，不要换底。")
    if math.isclose(value, -math.log(4), abs_tol=1e-4):
        fail("熵是负的：H(p) = -sum p log p，前面有一个负号。")
    expect_tensor(out, (), what)
    if not math.isclose(value, math.log(4), abs_tol=1e-4):
        fail(f"均匀分布在 4 个 token 上的熵不对，你的结果是 {value:.4f}。H(p) = -Σ p log p，沿最后一维求和，用自然对数。")
    what = "one-hot 分布 [1, 0, 0, 0]"
    out = expect_tensor(call_student(fn, torch.tensor([1.0, 0.0, 0.0, 0.0]), what=what, forbidden=ENTROPY_FORBIDDEN), (), what)
    if not bool(torch.isfinite(out).all()):
        fail("输入 [1, 0, 0, 0] 时得到了 nan：0 · log 0 在 PyTorch 里是 0 · (-inf) = nan。约定 0 log 0 = 0："
             "用 torch.xlogy(p, p)，或 torch.where(p > 0, p * p.log(), 0)。")
    if not math.isclose(float(out), 0.0, abs_tol=1e-5):
        fail(f"确定的分布 [1, 0, 0, 0] 熵不对，你的结果是 {float(out):.4f}：一个 token 概率为 1 时没有任何不确定性。")
    batch = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [1.0, 0.0, 0.0]])  # [3, 3]
    expected = -torch.xlogy(batch, batch).sum(dim=-1)  # [3]
    what = "形状 [3, 3] 的一批分布"
    out = call_student(fn, batch, what=what, forbidden=ENTROPY_FORBIDDEN)
    if isinstance(out, torch.Tensor) and out.numel() == 1 and close(out.reshape(()), expected.sum()):
        fail("输入一批 [3, 3] 分布时只返回了一个数：你把所有元素加在一起了。沿最后一维 sum(dim=-1)，每一行得到一个熵，形状 [3]。")
    out = expect_tensor(out, (3,), what)
    if close(out, -torch.xlogy(batch, batch).sum(dim=0)):
        fail("输入一批 [3, 3] 分布时你沿 dim=0 求和了：每一行是一个分布，应该沿最后一维 dim=-1 求和。")
    if not close(out, expected):
        fail(f"一批 [3, 3] 分布的熵不对，你的结果是 {[round(v, 4) for v in out.tolist()]}。每一行各算一个 -Σ p log p，0 log 0 按 0 计。")
    passed("熵正确：单位是 nats，0 log 0 按 0 计，[B, V] 输入得到每一行的熵 [B]。")


__all__ = ["CheckFailed", "ENTROPY_FORBIDDEN", "TEMPERATURE_FORBIDDEN", "check_entropy", "check_temperature_softmax"]


# ---- exercise 2.3 (predict, then measure): how much entropy T = 2 adds on the model's own contexts -----------------

ENTROPY_PROMPTS = ["小明在", "今天，", "小红喜欢吃", "我们一起去"]


def _last_logits() -> torch.Tensor:
    """tiny-zh's logits at the last position of each of ENTROPY_PROMPTS: [len(ENTROPY_PROMPTS), V]."""
    from decodelab.models.load import load_model

    model, tokenizer = load_model("tiny-zh", device="cpu")
    with torch.no_grad():
        rows = [model(input_ids=torch.tensor([tokenizer(p)["input_ids"]])).logits[0, -1] for p in ENTROPY_PROMPTS]
    return torch.stack(rows).float()  # [P, V]


def check_entropy_growth(prediction, probs_t1, probs_t2) -> None:
    """Check the student's measurement of tiny-zh's next-token entropy at T = 1 and T = 2 on ENTROPY_PROMPTS:
    `probs_t1` and `probs_t2` are the distributions [len(ENTROPY_PROMPTS), V] they computed (with their own
    temperature softmax) at the last position of each prompt. The check recomputes the model's logits, confirms the
    distributions are softmax(logits / T), computes the mean entropy at each T and sets the growth beside the
    student's `prediction` of it (nats).

    Taught in: exercises/02-temperature.ipynb
    """
    from decodelab.book.checks import as_prediction, compare_prediction

    guess = as_prediction(prediction, "PREDICTION", -20, 20)
    if probs_t1 is None or probs_t2 is None:
        fail("还没有量：probs_t1 和 probs_t2 还是 None。对每个提示跑一次模型，取最后一个位置的 logits，"
             "用你的 temperature_softmax 在 T = 1 和 T = 2 下各算一次分布。")
    logits = _last_logits()
    for name, probs, temperature in (("probs_t1", probs_t1, 1.0), ("probs_t2", probs_t2, 2.0)):
        if not isinstance(probs, torch.Tensor) or tuple(probs.shape) != tuple(logits.shape):
            fail(f"{name} 应是形状 [{len(ENTROPY_PROMPTS)}, V] 的张量（每个提示一行，V = {logits.shape[1]}），"
                 f"你给的是 {getattr(probs, 'shape', type(probs).__name__)}。")
        probs = probs.detach().to(torch.float64)
        if not torch.allclose(probs.sum(dim=-1), torch.ones(len(ENTROPY_PROMPTS), dtype=torch.float64), atol=1e-4):
            fail(f"{name} 的每一行加起来不是 1：它应是概率分布。")
        if temperature != 1 and close(probs, torch.softmax(logits * temperature, dim=-1), atol=1e-4):
            fail(f"{name} 比 T = 1 时更尖了：你把 logits 乘以了 T。公式是 softmax(logits / T)。")
        if close(probs, torch.softmax(logits, dim=-1), atol=1e-4) and temperature != 1:
            fail(f"{name} 和 T = 1 时一样：temperature 没有起作用。")
        if not close(probs, torch.softmax(logits / temperature, dim=-1), atol=1e-4):
            fail(f"{name} 不是模型在这几个提示最后一个位置的 softmax(logits / {temperature:g})：提示是不是 ENTROPY_PROMPTS、"
                 "模型是不是 tiny-zh、取的是不是 logits[0, -1]？")
    entropies = [-torch.xlogy(p, p).sum(dim=-1) for p in (torch.softmax(logits, -1), torch.softmax(logits / 2, -1))]
    h1, h2 = (float(h.mean()) for h in entropies)
    top1 = [float(torch.softmax(logits / t, -1).amax(-1).mean()) for t in (1.0, 2.0)]
    passed(f"熵的增长：{compare_prediction(guess, h2 - h1, '{:+.2f}')}（nats）。T = 1 时平均熵 {h1:.2f}，T = 2 时 {h2:.2f}；"
           f"最可能的 token 平均占 {top1[0]:.2f} → {top1[1]:.2f}。T 翻倍不会让熵翻倍：它把 logits 的差距减半，"
           "排在后面的 token 分到了更多质量；熵涨多少取决于尾巴里有多少 token、它们原来落后多远，而不是 T 本身。")
