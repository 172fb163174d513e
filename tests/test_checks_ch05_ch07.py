"""The exercise checks of chapters 05-07 accept a right answer and name the mistake in a wrong one."""
import pytest

from decodelab.checks import CheckFailed
from decodelab.checks.ch07 import check_release, check_slot_mapping


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
