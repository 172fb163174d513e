"""Computed tables: aligned by display width as text, escaped as HTML, bad shapes named."""
import pytest

from decodelab.book.tables import Table, display_width


def test_text_columns_align_by_display_width():
    table = Table(["策略", "loop rate"], [["greedy", 0.93], ["纯采样", "0.01"]], caption="表 3.1")
    lines = repr(table).splitlines()
    assert lines[0] == "表 3.1"
    starts = [display_width(line[:line.index(cell)]) for line, cell in zip(lines[1:], ["loop", "", "0.93", "0.01"])
              if cell]
    assert starts == [8, 8, 8]  # the second column starts at the same screen column on every line
    assert display_width("纯采样") == 6 and display_width("abc") == 3


def test_html_escapes_and_wraps():
    html = Table(["a<b"], [["x&y"]])._repr_html_()
    assert "<th>a&lt;b</th>" in html and "<td>x&amp;y</td>" in html and 'class="dl-table-wrap"' in html


def test_bad_shapes():
    with pytest.raises(ValueError, match="headers must be a non-empty list"):
        Table([], [])
    with pytest.raises(ValueError, match=r"rows\[1\] must have 2 cells"):
        Table(["a", "b"], [["1", "2"], ["3"]])
    with pytest.raises(TypeError, match="caption must be a str"):
        Table(["a"], [["1"]], caption=3)
