"""book/cjk_text.py: which line breaks of Chinese Markdown vanish, and how inline math keeps its punctuation."""
import sys
from pathlib import Path

import pytest
from docutils import nodes

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "book"))
from cjk_text import NOWRAP_CLASS, is_prose, joins, keep_math_with_punctuation, remove_cjk_line_breaks  # noqa: E402


@pytest.mark.parametrize("before, after, expected", [
    ("字", "字", True),       # two Han characters
    ("。", "本", True),       # full-width punctuation, then Han
    ("。", "L", True),        # full-width punctuation has its own white space, even before Latin
    ("g", "（", True),
    ("\x00", "，", True),     # math or code, then a full-width comma
    ("字", "“", True),        # a quote shared with English, next to Han
    ("”", "字", True),
    ("字", "a", False),       # Han and Latin: the space stays
    ("a", "字", False),
    ("字", "\x00", False),    # Han and inline code or math: the space stays
    ("—", "b", False),        # shared punctuation next to Latin: English rules
    ("a", "b", False),
])
def test_joins(before, after, expected):
    assert joins(before, after) is expected


def paragraph(*children) -> nodes.paragraph:
    return nodes.paragraph("", "", *children)


def test_breaks_between_chinese_go_and_equal_text_nodes_are_told_apart():
    # MyST emits each soft line break as its own Text("\n"): two equal nodes in one paragraph
    block = paragraph(nodes.Text("变平。"), nodes.Text("\n"), nodes.Text("本章用 "), nodes.literal("", "tiny-zh"),
                      nodes.Text(" 和"), nodes.Text("\n"), nodes.strong("", "真分布"), nodes.Text("\nand English"))
    assert remove_cjk_line_breaks(block) == 2
    assert block.astext() == "变平。本章用 tiny-zh 和真分布\nand English"


def test_code_and_math_are_never_changed():
    block = paragraph(nodes.Text("见"), nodes.literal("", "a\nb"), nodes.math("", "x\n=1"), nodes.Text("字"))
    assert remove_cjk_line_breaks(block) == 0
    assert block.astext() == "见a\nbx\n=1字"


def test_math_is_wrapped_with_its_punctuation():
    math = nodes.math("", "T")
    block = paragraph(nodes.Text("除以（"), math, nodes.Text("）。之后"))
    assert keep_math_with_punctuation(math)
    span = block[1]
    assert NOWRAP_CLASS in span["classes"] and span.astext() == "（T）"
    assert block.astext() == "除以（T）。之后"
    alone = nodes.math("", "x")
    paragraph(nodes.Text("设 "), alone, nodes.Text(" 为"))
    assert not keep_math_with_punctuation(alone)


def test_a_figure_caption_inside_a_cell_output_is_prose_and_the_rest_of_the_output_is_not():
    # myst-nb puts the figure drawn by a cell, caption included, inside that cell's output
    math = nodes.math("", "T")
    caption = nodes.caption("", "", nodes.Text("温度 "), math, nodes.Text("。"))
    printed = nodes.math("", "x")
    output = nodes.container("", nodes.figure("", caption), nodes.paragraph("", "", printed), classes=["cell_output"])
    nodes.container("", output, classes=["cell"])
    assert is_prose(caption, (nodes.FixedTextElement,)) and is_prose(math, (nodes.FixedTextElement,))
    assert not is_prose(printed, (nodes.FixedTextElement,))
