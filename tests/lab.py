"""A JupyterLab server for browser tests, isolated from the user's own Jupyter setup, and helpers that drive it.

`running_lab(root)` starts `.venv/bin/jupyter lab` on `root` with its own config, data, runtime, settings and
workspace folders under a temporary directory (so no user extension, setting or saved layout leaks in), the news
popup off, a fixed token and a free local port; it waits until the server answers and stops it afterwards with
`POST /api/shutdown`, killing it if it does not exit. The kernel is the venv's `python3` kernelspec.

The helpers drive the page the way a student does: the Run menu, the status bar, the cell editor and the keyboard;
and the way an instructor lectures: jupyterlab-deck's toolbar button presents the notebook as slides in place.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent  # the tests run in the venv whose JupyterLab and kernel we test
JUPYTER = VENV_BIN / "jupyter"
SCREENSHOTS = ROOT / "_build" / "screenshots"
START_TIMEOUT_S = 90.0
KERNEL_IDLE = "Python 3 (ipykernel) | Idle"
NOTIFICATION_SETTINGS = "@jupyterlab/apputils-extension/notification.jupyterlab-settings"
NOTEBOOK_SETTINGS = "@jupyterlab/notebook-extension/tracker.jupyterlab-settings"


@dataclass(frozen=True)
class Lab:
    """A running JupyterLab: its base URL (ending in '/'), token, served folder and log file."""

    url: str
    token: str
    root: Path
    log: Path

    def tree_url(self, relative: str) -> str:
        """The URL that opens `relative` (a path under `root`) in JupyterLab, in a fresh layout (`reset`): no tab
        of an earlier test is restored."""
        return f"{self.url}lab/tree/{quote(relative)}?reset&token={self.token}"

    def api(self, path: str, method: str = "GET") -> object:
        """Call the REST API at `path` (e.g. 'api/kernelspecs'); returns the decoded JSON (None when empty)."""
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the server's log, for assertion messages."""
        return self.log.read_text(encoding="utf-8", errors="replace")[-chars:]


def shutdown_kernels(lab: Lab) -> None:
    """Shut down every kernel the server runs (the next test starts its own; CPU is scarce)."""
    for session in lab.api("api/sessions") or []:
        lab.api(f"api/sessions/{session['id']}", method="DELETE")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _isolated_env(home: Path) -> dict[str, str]:
    """Environment with Jupyter's per-user folders under `home`; the venv's share/jupyter is still found."""
    env = dict(os.environ)
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        env[name] = str(home / name.lower())
    env.pop("JUPYTER_PATH", None)
    env.pop("JUPYTER_CONFIG_PATH", None)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def _wait_until_up(url: str, token: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with code {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            request = urllib.request.Request(f"{url}api/status", headers={"Authorization": f"token {token}"})
            with urllib.request.urlopen(request, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.25)
    raise RuntimeError(f"jupyter lab did not answer within {START_TIMEOUT_S:.0f} s:\n{log.read_text()[-4000:]}")


def _stop(lab: Lab, process: subprocess.Popen) -> None:
    try:
        lab.api(f"api/shutdown?token={lab.token}", method="POST")
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        pass
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the server and the kernels it started
        process.wait(timeout=10)


@contextmanager
def running_lab(root: Path, extra_args: tuple[str, ...] = ()) -> Iterator[Lab]:
    """Run JupyterLab on `root` (an existing folder) until the block ends; yields a `Lab`. `extra_args` are added to
    the command line (e.g. the Makefile's `--LabApp.default_url=...`)."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"root must be an existing directory, got {root!s}")
    if not JUPYTER.is_file():
        raise RuntimeError(f"{JUPYTER} not found: the tests must run with the venv's python (make test)")
    with tempfile.TemporaryDirectory(prefix="lab-home-") as home_dir:
        home = Path(home_dir)
        settings = home / "user-settings"
        notification = settings / NOTIFICATION_SETTINGS
        notification.parent.mkdir(parents=True)
        notification.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}), encoding="utf-8")
        # Every cell in the DOM (no windowing), so the test sees all cells and their prompts at once.
        (settings / NOTEBOOK_SETTINGS).parent.mkdir(parents=True)
        (settings / NOTEBOOK_SETTINGS).write_text(json.dumps({"windowingMode": "none"}), encoding="utf-8")
        (home / "workspaces").mkdir()
        token = secrets.token_hex(16)
        port = _free_port()
        command = [
            str(JUPYTER), "lab", "--no-browser",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
            f"--ServerApp.root_dir={root}", f"--IdentityProvider.token={token}",
            f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={home / 'workspaces'}",
            "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate",
        ]
        if os.geteuid() == 0:
            command.append("--allow-root")
        command.extend(extra_args)
        log = home / "lab.log"
        with open(log, "w", encoding="utf-8") as log_file:
            process = subprocess.Popen(command, cwd=root, env=_isolated_env(home), stdout=log_file,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        lab = Lab(url=f"http://127.0.0.1:{port}/", token=token, root=root, log=log)
        try:
            _wait_until_up(lab.url, token, process, log)
            yield lab
        finally:
            _stop(lab, process)


# --- Driving the page ---------------------------------------------------------------------------------------

def screenshot(page, name: str) -> Path:
    """Save a full-window screenshot as _build/screenshots/lab-<name>.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"lab-{name}.png"
    page.screenshot(path=str(path))
    return path


def open_notebook(page, lab: Lab, relative: str, timeout_ms: int = 90_000) -> None:
    """Open a notebook and wait until its kernel is started and idle (the status bar, not the early indicator)."""
    page.goto(lab.tree_url(relative))
    cells(page).first.wait_for(timeout=timeout_ms)
    wait_kernel_idle(page, timeout_ms)


def wait_kernel_idle(page, timeout_ms: int = 90_000) -> None:
    page.locator(".jp-StatusBar-Widget", has_text=KERNEL_IDLE).first.wait_for(timeout=timeout_ms)


def cells(page):
    """Locator of the cells of the notebook in the current tab."""
    return page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell")


def execution_count(page, index: int) -> int | None:
    """The number in the cell's `[n]:` prompt; None while not run or while running (`[*]`)."""
    text = cells(page).nth(index).locator(".jp-InputPrompt").inner_text()
    match = re.search(r"\[(\d+)\]", text)
    return int(match.group(1)) if match else None


def run_all(page, timeout_ms: int = 120_000) -> None:
    """Run menu → Run All Cells, then wait until the last code cell has run and no cell is queued (`[*]`).

    Run All queues every code cell at once (`[*]`), so the last cell showing `[*]` and then a number means the run
    is over; a cell tagged `raises-exception` does not stop it. Stored counts from a committed run are no sign of
    completion, which is why the `[*]` is watched (or a changed count, for a run too quick to catch the `[*]`).
    """
    code = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-CodeCell")
    last = code.nth(code.count() - 1)
    before = _count_of(last)
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()
    seen_queued = False
    deadline = time.monotonic() + timeout_ms / 1000
    while time.monotonic() < deadline:
        prompts = code.locator(".jp-InputPrompt").all_inner_texts()
        queued = any("[*]" in prompt for prompt in prompts)
        seen_queued = seen_queued or "[*]" in prompts[-1]
        now = _count_of(last)
        if not queued and now is not None and (seen_queued or now != before):
            wait_kernel_idle(page, timeout_ms)
            return
        if not queued and seen_queued and now is None:  # the run stopped early: an untagged error, or a dead kernel
            # ... or the prompt is between "[*]" and its number for a moment: look again once the kernel is idle.
            wait_kernel_idle(page, timeout_ms)
            time.sleep(0.5)
            if _count_of(last) is not None:
                return
            prompts = code.locator(".jp-InputPrompt").all_inner_texts()
            errors = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output[data-mime-type="
                                  "'application/vnd.jupyter.stderr']").all_inner_texts()
            raise AssertionError(f"Run All stopped before the last cell; prompts {prompts}; errors:\n"
                                 + "\n".join(text[-1500:] for text in errors))
        time.sleep(0.1)
    raise TimeoutError(f"Run All did not finish in {timeout_ms / 1000:.0f} s; prompts: {prompts}")


def _count_of(cell) -> int | None:
    match = re.search(r"\[(\d+)\]", cell.locator(".jp-InputPrompt").inner_text())
    return int(match.group(1)) if match else None


def output_text(page, index: int) -> str:
    """All text in the outputs of cell `index` (stdout, results, and tracebacks)."""
    return cells(page).nth(index).locator(".jp-OutputArea").inner_text()


def set_cell_source(page, index: int, source: str) -> None:
    """Replace the text of cell `index` as a student does: click into its editor, select all, type the new text.

    The text goes in as one keyboard text input, so CodeMirror neither auto-indents nor auto-closes brackets
    on top of what is typed."""
    editor = cells(page).nth(index).locator(".cm-content")
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.press("Delete")
    page.keyboard.insert_text(source)
    page.keyboard.press("Escape")  # back to command mode
    typed = editor.inner_text()
    if typed.strip() != source.strip():
        raise AssertionError(f"the editor of cell {index} holds {typed!r}, not the text typed ({source!r})")


# --- Lecture mode: jupyterlab-deck presents the notebook in place, so its widgets stay live ----------------------

DECK_TOGGLE = "deck:toggle"  # jupyterlab-deck's command; its button sits in the notebook toolbar
DECK_PRESENTING = "body[data-jp-deck-mode='presenting']"


def start_deck(page, timeout_ms: int = 30_000, cell_index: int = 0) -> None:
    """Select the cell `cell_index`, the first by default (the deck opens on the slide holding the active cell), then
    press the toolbar's deck button and wait until the page is presenting."""
    cells(page).nth(cell_index).locator(".jp-InputPrompt").click()
    page.keyboard.press("Escape")  # command mode: the deck's arrow keys need it
    page.locator(f'.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Toolbar [data-command="{DECK_TOGGLE}"]').click()
    page.locator(DECK_PRESENTING).wait_for(state="attached", timeout=timeout_ms)  # <body> counts as hidden here


def stop_deck(page, timeout_ms: int = 30_000) -> None:
    """Press the exit button of the deck's remote and wait until the notebook is back."""
    page.locator(".jp-Deck-Remote .jp-deck-mod-stop").click()
    page.locator(DECK_PRESENTING).wait_for(state="detached", timeout=timeout_ms)


def slide_cells(page):
    """Locator of the cells on the slide now shown (jupyterlab-deck marks them on-screen)."""
    return page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell.jp-deck-mod-onscreen")


def makefile_variable(name: str) -> str:
    """The value of a variable of the repository's Makefile, as make expands it (the lab tests start JupyterLab with
    the same LAB_FLAGS that `make lab` uses)."""
    result = subprocess.run(["make", "-s", "--no-print-directory", "-p", "-n", "help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    for line in result.stdout.splitlines():
        if line.startswith(f"{name} := ") or line.startswith(f"{name} = "):
            return line.split("=", 1)[1].strip()
    raise AssertionError(f"the Makefile has no variable {name}")
