"""A student works an investigative ("predict, then measure") exercise under `make lab`, in Debian's Chromium.

Exercise 7.4 (exercises/07-paged-attention.ipynb): how many of 40 sequences fit in a 64-block KV pool once it is
paged. The student opens JupyterLab where `make lab` opens it (the Makefile's `LAB_FLAGS`: the repository root
served, the file browser on exercises/), opens the starter from the file browser, runs the cell that prints the
lengths, writes a prediction, measures with the common mistake (block counts rounded down), runs the check and sees
the Chinese hint for that mistake alone (no traceback, no file path), fixes the measurement, runs the check again
and sees the reply that sets the prediction beside the measured count.

The server runs on a temporary folder laid out like the repository (exercises/, chapters/ with data/), holding
copies, so the committed starter is never modified. Every step waits for an event (the cell's `[n]` prompt changing
to a new number, the status bar's kernel "Idle"), never for a fixed time. Screenshots at 1366 px:
_build/screenshots/lab-exercise-7.4-*.png.
"""
from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import time
from pathlib import Path

import pytest

from browser import watch
from lab import cells, execution_count, output_text, running_lab, screenshot, set_cell_source, shutdown_kernels
from lab import makefile_variable, wait_kernel_idle

ROOT = Path(__file__).resolve().parents[2]
EXERCISE = ROOT / "exercises" / "07-paged-attention.ipynb"
CHAPTER = ROOT / "chapters" / "07-paged-attention.ipynb"
TIMEOUT_MS = 120_000  # a safety net only: every wait below ends on an event

pytestmark = pytest.mark.browser

# exercises/07-paged-attention.ipynb, exercise 7.4: the code cells the student runs, found by their starter text
# (the cell that prints the lengths, the prediction cell, the measurement cell, the check cell).
STARTER_TEXT = {
    "lengths": "print(\"前 10 条的长度：\", SEQUENCE_LENGTHS[:10])",
    "prediction": "PREDICTION = None",
    "measure": "blocks_needed = None",
    "check": "check_paged_fit(PREDICTION, blocks_needed, admitted)",
}
PREDICTION = 9  # the student's guess, before measuring (the right count is 7)
# The common mistake: n // BLOCK_SIZE drops the last, partly filled block.
WRONG_MEASUREMENT = '''blocks_needed = [n // BLOCK_SIZE for n in SEQUENCE_LENGTHS]
used = admitted = 0
for blocks in blocks_needed:
    if used + blocks > POOL_BLOCKS:
        break
    used, admitted = used + blocks, admitted + 1
print(f"放得下 {admitted} 条，用了 {used} / {POOL_BLOCKS} 块")
'''
WRONG_HINT = "向下取整会丢掉最后不满的一块，要向上取整"
RIGHT_MEASUREMENT = WRONG_MEASUREMENT.replace("n // BLOCK_SIZE", "-(-n // BLOCK_SIZE)")
PASSED = "通过 ✔ 分页时放得下 7 条"
REPLY = f"你预测 {PREDICTION}，量到 7（差 -2）"
# A traceback or a frame of the checks would show one of these.
INTERNALS = re.compile(r"Traceback|File \"|\.py\b|site-packages|decodelab/|/work/|/tmp/|line \d+")


def exercise_cells(notebook: Path) -> dict[str, int]:
    """The index of the code cell holding each text of STARTER_TEXT in `notebook` (the DOM shows every cell: tests/lab.py turns windowing
    off, so a notebook cell's index is its index in the page)."""
    sources = ["".join(cell["source"]) if cell["cell_type"] == "code" else ""
               for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]]
    found = {}
    for name, text in STARTER_TEXT.items():
        hits = [i for i, source in enumerate(sources) if text in source]
        assert len(hits) == 1, f"{notebook.name}: {len(hits)} cells hold {text!r} (the test expects one)"
        found[name] = hits[0]
    assert found["lengths"] < found["prediction"] < found["measure"] < found["check"], found
    return found


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Path:
    """A folder laid out like the repository root (what `make lab` serves), holding copies."""
    root = tmp_path_factory.mktemp("lab-student-root")
    for notebook in (EXERCISE, CHAPTER):
        (root / notebook.parent.name).mkdir(exist_ok=True)
        shutil.copyfile(notebook, root / notebook.parent.name / notebook.name)
    if (ROOT / "chapters" / "data").is_dir():
        shutil.copytree(ROOT / "chapters" / "data", root / "chapters" / "data")
    return root


def _run_cell(page, index: int, timeout_ms: int = TIMEOUT_MS) -> str:
    """Select cell `index`, press Shift+Enter, and wait until its prompt shows a new execution count and the kernel
    is idle again; returns the text of its outputs."""
    before = execution_count(page, index)
    cell = cells(page).nth(index)
    cell.scroll_into_view_if_needed()
    cell.locator(".jp-InputPrompt").click()  # selects the cell, command mode
    page.keyboard.press("Shift+Enter")
    deadline = time.monotonic() + timeout_ms / 1000
    while time.monotonic() < deadline:
        now = execution_count(page, index)
        if now is not None and now != before:
            wait_kernel_idle(page, timeout_ms)
            return output_text(page, index)
        page.wait_for_timeout(100)  # polling interval of the event wait, not a wait for the kernel
    raise TimeoutError(f"cell {index} did not run in {timeout_ms / 1000:.0f} s (prompt count stayed {before})")


def _show(page, index: int, name: str) -> Path:
    """Scroll so the cell `index` and its output are in view, and screenshot the window."""
    cells(page).nth(index).locator(".jp-OutputArea").scroll_into_view_if_needed()
    return screenshot(page, name)


def test_student_predicts_measures_wrong_sees_hint_then_passes(browser, served):
    committed = _sha256(EXERCISE)
    at = exercise_cells(served / "exercises" / EXERCISE.name)
    lengths_cell, prediction_cell, measure_cell, check_cell = (at[name] for name in STARTER_TEXT)
    flags = [flag for flag in shlex.split(makefile_variable("LAB_FLAGS")) if not flag.startswith("--ServerApp.root_dir")]
    assert "--LabApp.default_url=/lab/tree/exercises" in flags, flags
    with running_lab(served, extra_args=tuple(flags)) as lab:
        context = browser.new_context(viewport={"width": 1366, "height": 768}, locale="zh-CN")
        context.set_default_timeout(TIMEOUT_MS)
        problems = watch(context)
        page = context.new_page()
        try:
            page.goto(f"{lab.url}?token={lab.token}")  # the server's default URL: where `make lab` opens
            page.wait_for_url(re.compile(r"/lab/tree/exercises"), timeout=TIMEOUT_MS)
            item = page.locator(".jp-DirListing-item", has_text=EXERCISE.name).first
            item.wait_for(timeout=TIMEOUT_MS)
            item.dblclick()
            cells(page).nth(check_cell).wait_for(timeout=TIMEOUT_MS)
            wait_kernel_idle(page, TIMEOUT_MS)
            for name, index in at.items():  # the page shows the cells where the notebook has them
                shown = cells(page).nth(index).locator(".jp-InputArea").inner_text()
                assert STARTER_TEXT[name] in shown, (name, index, shown)

            lengths = _run_cell(page, lengths_cell)
            assert "前 10 条的长度" in lengths, lengths
            set_cell_source(page, prediction_cell, f"PREDICTION = {PREDICTION}  # 我的预测（还没有量）")
            _run_cell(page, prediction_cell)

            set_cell_source(page, measure_cell, WRONG_MEASUREMENT)
            measured_wrong = _run_cell(page, measure_cell)
            assert "放得下" in measured_wrong, measured_wrong
            hint = _run_cell(page, check_cell)
            hint_png = _show(page, check_cell, "exercise-7.4-hint")
            assert WRONG_HINT in hint, hint
            assert "检查没有通过" in hint, hint
            assert not INTERNALS.search(hint), f"the hint shows internals:\n{hint}"
            assert "通过 ✔" not in hint and "你预测" not in hint, hint

            set_cell_source(page, measure_cell, RIGHT_MEASUREMENT)
            measured_right = _run_cell(page, measure_cell)
            assert "放得下 7 条" in measured_right, measured_right
            reply = _run_cell(page, check_cell)
            reply_png = _show(page, check_cell, "exercise-7.4-reply")
            assert PASSED in reply, reply
            assert REPLY in reply, reply  # the prediction beside the measured count
            assert WRONG_HINT not in reply and "检查没有通过" not in reply, reply
        finally:
            context.close()
            shutdown_kernels(lab)
        log = lab.log_tail()
    assert hint_png.is_file() and reply_png.is_file()
    serious = problems.page_errors + problems.failed_requests + problems.external_requests
    assert not serious, f"{problems.summary()}\n--- server log ---\n{log}"
    assert _sha256(EXERCISE) == committed, "the committed starter was modified"
