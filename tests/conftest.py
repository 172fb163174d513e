"""Shared fixtures and the skip policy of the suite.

Under CI=true a skipped test fails, except those marked `cuda` (no GPU in CI). Outside CI the run ends by naming the
browser tests that skipped and the system packages they need.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# tests/ mirrors lib/decodelab's subpackages; the shared helpers (browser.py, lab.py) stay at the top.
sys.path.insert(0, str(Path(__file__).resolve().parent))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    # Triton's interpreter runs decodelab's Triton kernel on CPU tensors; it must be set before the kernel's module is
    # imported (triton.jit reads it when it decorates). With a GPU the kernel is compiled and run for real.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False on this machine")
    for item in items:
        if "cuda" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_cuda)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") == "true" and report.skipped and "cuda" not in item.keywords:
        if hasattr(report, "wasxfail"):
            return
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which allows only CUDA skips: {report.longrepr}"


BROWSER_PACKAGES = "scripts/install-system-deps.sh"


def pytest_unconfigure(config):
    """Outside CI, the last lines of a run: which browser tests skipped, why, and what to install (README, quick start).

    Runs after pytest's own summary, so `make test` ends with it; it never changes the exit status."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or os.environ.get("CI") == "true":
        return
    # Skips at collection (a CollectReport) carry no keywords: only test reports can be browser tests.
    skipped = [report for report in reporter.stats.get("skipped", []) if "browser" in getattr(report, "keywords", {})]
    if not skipped:
        return
    reasons = sorted({report.longrepr[2] for report in skipped if isinstance(report.longrepr, tuple)})
    files = sorted({report.nodeid.split("::")[0] for report in skipped})
    reporter.write_sep("-", f"{len(skipped)} browser tests skipped", yellow=True)
    for reason in reasons:
        reporter.write_line(reason)
    reporter.write_line(f"in {', '.join(files)}")
    reporter.write_line(f"To run them on Debian/Ubuntu: {BROWSER_PACKAGES}, then make test again.")


@pytest.fixture(scope="session")
def random_llama():
    """A small randomly initialised LlamaForCausalLM with grouped-query attention (fast, CPU)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tiny():
    """The shipped tiny-zh model and tokenizer, as `decodelab.models.load.load_model` returns them."""
    from decodelab.models.load import load_model

    return load_model("tiny-zh", device="cpu")


ROOT = Path(__file__).resolve().parent.parent
BUILD_TIMEOUT_S = 900


@pytest.fixture(scope="session")
def built_book() -> Path:
    """Fetch the offline JavaScript and build the whole book once; fail with the log's tail on a non-zero exit."""
    fetch = subprocess.run(["bash", str(ROOT / "scripts" / "fetch_offline_assets.sh")], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert fetch.returncode == 0, f"fetch_offline_assets.sh failed:\n{fetch.stdout}\n{fetch.stderr}"
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    # --all: an incremental build does not re-emit the warnings of unchanged pages, so -W would pass after a failure.
    command = [str(jupyter_book), "build", ".", "-W", "-n", "--keep-going", "--all"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    log = (result.stdout + result.stderr).splitlines()
    assert result.returncode == 0, f"{' '.join(command)} exited with {result.returncode}:\n" + "\n".join(log[-60:])
    return ROOT / "_build" / "html"


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium driven by Playwright, one per test module (tests/browser.py says how it is launched)."""
    from browser import chromium_browser

    with chromium_browser() as chromium:
        yield chromium


@pytest.fixture(scope="module")
def one_thread():
    """Torch on one thread for a module of tiny models (`pytestmark = pytest.mark.usefixtures("one_thread")`):
    one thread is faster there, and on a shared CPU extra threads spin-wait."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
