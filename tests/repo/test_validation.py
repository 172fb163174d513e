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
