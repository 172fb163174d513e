"""decodelab.book.paste.rounded: what the chapters glue for the pages is the same on every CPU kernel."""
import pytest

from decodelab.book.paste import rounded


def test_floats_that_differ_in_the_seventh_digit_paste_the_same():
    # the pairs chapter 02 and 07d glued under ATEN_CPU_CAPABILITY=avx512 and =default
    assert rounded(0.19036537408828735) == rounded(0.19036540389060974) == 0.1904
    assert rounded(16.503449519138883) == rounded(16.503448507760233) == 16.5
    assert rounded(-7.82536661164567, 6) == rounded(-7.825366850065166, 6) == -7.82537


def test_counts_and_strings_pass_through_and_digits_is_checked():
    assert rounded(3929) == 3929 and rounded(True) is True and rounded("x") == "x"
    with pytest.raises(ValueError, match="digits must be an int >= 1"):
        rounded(0.5, 0)
