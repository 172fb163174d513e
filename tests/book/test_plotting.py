"""Chinese labels render with the bundled font: matplotlib's missing-glyph warning is an error here."""
import io
import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from decodelab.book import plotting  # noqa: E402


def test_font_is_registered_first_and_idempotent():
    assert plotting.use_cjk_font() == "Noto Sans SC"
    plotting.use_cjk_font()
    families = matplotlib.rcParams["font.sans-serif"]
    assert families[0] == "Noto Sans SC" and families.count("Noto Sans SC") == 1
    names = [f.name for f in matplotlib.font_manager.fontManager.ttflist]
    assert names.count("Noto Sans SC") == 1


def test_chinese_bar_chart_has_every_glyph():
    fig, ax = plt.subplots()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any "Glyph ... missing from font" UserWarning fails the test
        plotting.bar_probs(ax, ["公园", "学校", "图书馆", "−1"], [0.5, 0.3, 0.2, 0.0], title="下一个字的概率")
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
    plt.close(fig)
    assert buf.getvalue().startswith(b"\x89PNG")


def test_missing_glyph_would_be_caught():
    """Without the CJK font, DejaVu Sans lacks Chinese glyphs and the same chart raises."""
    fig, ax = plt.subplots()
    ax.set_title("概率", family="DejaVu Sans")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="missing from font"):
            fig.savefig(io.BytesIO(), format="png")
    plt.close(fig)


def test_bar_probs_checks_input():
    fig, ax = plt.subplots()
    with pytest.raises(ValueError, match="same length"):
        plotting.bar_probs(ax, ["a"], [0.5, 0.5])
    with pytest.raises(ValueError, match="non-negative"):
        plotting.bar_probs(ax, ["a"], [-0.5])
    plt.close(fig)
