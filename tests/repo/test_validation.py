"""decodelab.validation.check_int: the one integer-argument check the library uses."""
import re

import pytest

from decodelab.validation import check_int


@pytest.mark.parametrize("value, low", [(1, 1), (0, 0), (5, 5), (7, 2)])
def test_accepts_ints_at_or_above_low(value, low):
    assert check_int(value, "n", low) == value


@pytest.mark.parametrize("value, low, shown", [
    (True, 1, "True"), (2.5, 1, "2.5"), ("3", 1, "'3'"), (0, 1, "0"), (-1, 0, "-1"),
])
def test_rejects_with_exact_message(value, low, shown):
    with pytest.raises(ValueError, match=f"^{re.escape(f'n must be an int >= {low}, got {shown}')}$"):
        check_int(value, "n", low)


def test_scalars_from_numpy_and_torch_are_ints_but_bools_are_not():
    import numpy as np
    import torch

    assert check_int(np.int64(3), "n") == 3 and check_int(torch.tensor(3), "n") == 3
    with pytest.raises(ValueError, match="^n must be an int >= 1, got True$"):
        check_int(np.True_, "n")


def test_as_int_list_takes_sequences_and_1d_integer_arrays_only():
    import numpy as np
    import torch

    from decodelab.validation import as_int_list

    assert as_int_list(np.array([1, 2])) == [1, 2] and as_int_list(torch.tensor([3])) == [3]
    assert as_int_list((np.int8(4), torch.tensor(5))) == [4, 5] and as_int_list([]) == []
    for bad in ("12", b"12", [1.0], [True], np.array([[1]]), torch.tensor(1), None, 3):
        assert as_int_list(bad) is None, bad


def test_check_model_names_none_and_a_tokenizer_in_its_place():
    from decodelab.validation import ParamError, check_model

    class Tokenizer:
        def encode(self, text): ...

        def decode(self, ids): ...

    with pytest.raises(ParamError, match="^model must be a transformers causal LM, got NoneType$"):
        check_model(None, "f(model)")
    with pytest.raises(ParamError, match=re.escape("got a tokenizer where the target goes: call f(target)")):
        check_model(Tokenizer(), "f(target)", "target")


def test_check_index_and_check_records():
    import numpy as np

    from decodelab.validation import check_index, check_records

    assert check_index(np.int64(2), "index", 3) == 2
    with pytest.raises(ValueError, match=re.escape("index must be an int in [0, 3) (the steps), got 3")):
        check_index(3, "index", 3, " (the steps)")
    assert check_records(({"a": 1},), "runs", "f") == [{"a": 1}]
    with pytest.raises(ValueError, match="^runs must be a list of the dicts f returns, got 'ab'$"):
        check_records("ab", "runs", "f")
