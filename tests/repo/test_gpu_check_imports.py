"""scripts/gpu_check.sh runs on a GPU image that has torch, transformers, triton, pytest, numpy, safetensors, httpx and
prometheus-client, and none of the course's other packages. These tests hide those packages from a child Python (as
if they were not installed: no module, no distribution, so no pytest plugin either) and check that what the script
runs still imports there: the test files that hold `cuda` marks collect, every benchmark it runs prints its --help,
and the library below serve/ and book/ imports. A third test checks that the script's list of files misses no `cuda`
test."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each starts a Python that imports torch and transformers

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
BENCHMARKS = ["sampling.py", "noise.py", "attention.py", "serving.py", "roofline.py", "profile_step.py"]  # the ones gpu_check.sh runs
ON_THE_IMAGE = ["toy", "models", "sampling", "grammar", "decoding", "kv", "runner", "engine", "measure"]

# What the GPU image lacks: modules, and the distributions (pip names) that hold them.
HIDDEN_MODULES = ["fastapi", "uvicorn", "pydantic", "pydantic_core", "openai", "llguidance", "ipywidgets",
                  "anywidget", "jieba", "nbval", "hypothesis", "matplotlib", "xdist"]
HIDDEN_DISTRIBUTIONS = ["fastapi", "uvicorn", "pydantic", "pydantic-core", "openai", "llguidance", "ipywidgets",
                        "anywidget", "jieba", "nbval", "hypothesis", "matplotlib", "pytest-xdist"]

# Run first in the child: every finder on sys.meta_path is wrapped so that it finds neither a hidden module nor a
# hidden distribution (importlib.metadata asks the same finders; pytest loads its plugins through it).
HIDE = f"""
import importlib.util, re, sys
MODULES, DISTRIBUTIONS = {set(HIDDEN_MODULES)!r}, {set(HIDDEN_DISTRIBUTIONS)!r}

class Hiding:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        find = getattr(self.finder, "find_spec", None)
        return None if name.partition(".")[0] in MODULES or find is None else find(name, path, target)

    def find_distributions(self, *args, **kwargs):
        find = getattr(self.finder, "find_distributions", None)
        for dist in find(*args, **kwargs) if find else ():
            if re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower() not in DISTRIBUTIONS:
                yield dist

    def invalidate_caches(self):
        getattr(self.finder, "invalidate_caches", lambda: None)()

sys.meta_path[:] = [Hiding(finder) for finder in sys.meta_path]
for name in MODULES:
    assert name not in sys.modules and importlib.util.find_spec(name) is None, name
"""


def run_python(code: str, *args: str, hide: bool = True) -> subprocess.CompletedProcess:
    """`python -c code args` from the repository root with lib/ on the path, the image's missing packages hidden."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib"), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", (HIDE if hide else "") + code, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def cuda_test_files() -> list[str]:
    listed = subprocess.run(["bash", str(SCRIPT), "--list-cuda-tests"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    return listed.stdout.split()


COLLECT = """
import sys
import pytest
sys.exit(pytest.main(["-m", "cuda", "--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
"""


def test_the_cuda_test_files_collect_without_the_missing_packages():
    files = cuda_test_files()
    assert files and all((ROOT / name).is_file() for name in files)
    done = run_python(COLLECT, *files)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    collected = re.search(r"(\d+)/\d+ tests collected", done.stdout)
    assert collected and int(collected.group(1)) > 0, done.stdout[-2000:]


def test_no_cuda_test_lives_outside_the_listed_files():
    done = run_python(COLLECT, "tests", hide=False)  # with every package: the whole suite collects here
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    marked = {line.split("::")[0] for line in done.stdout.splitlines() if "::" in line}
    assert marked and marked <= set(cuda_test_files())


def test_the_benchmarks_and_the_library_import_without_the_missing_packages():
    code = f"""
import importlib, pkgutil, runpy, sys
import decodelab
for package in {ON_THE_IMAGE!r}:
    module = importlib.import_module("decodelab." + package)
    for info in pkgutil.walk_packages(module.__path__, module.__name__ + "."):
        importlib.import_module(info.name)
for name in {BENCHMARKS!r}:
    sys.argv = ["benchmarks/" + name, "--help"]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as stop:
        assert stop.code in (None, 0), (name, stop.code)
    print("imported", name)
"""
    done = run_python(code)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert [line for line in done.stdout.splitlines() if line.startswith("imported ")] == \
        [f"imported {name}" for name in BENCHMARKS]
