"""The scripts that write chapter 03's beam baseline and the 07b / 07d A/B figures: their prompts and their argument
checks (the measurements themselves run in the scripts, never in tests)."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from decodelab.toy import ToyLanguage

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str):
    sys.path.insert(0, str(SCRIPTS))  # the scripts import provenance and each other from their own folder
    try:
        spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(SCRIPTS))


def test_beam_baseline_prompts_are_distinct_short_viable_and_fixed():
    baseline = load_script("ch03_beam_baseline")
    lang = ToyLanguage()
    prompts = baseline.short_prompts(lang, 400)
    assert len(prompts) == len(set(prompts)) == 400
    assert all(1 <= len(p) <= 6 and lang.prefix_is_viable(p) and not lang.is_valid(p) for p in prompts)
    assert prompts == baseline.short_prompts(lang, 400), "the same prompts on every run"
    with pytest.raises(ValueError, match="distinct prompts in 4000 sentences, asked for 100000"):
        baseline.short_prompts(lang, 100_000)


@pytest.mark.slow  # a subprocess per case, each importing torch
@pytest.mark.parametrize("script, args, message", [
    ("ch03_beam_baseline.py", ["--prompts", "299"], "--prompts must be at least 300, got 299"),
    ("ch07b_engine_ab.py", ["--repeats", "1"], "--repeats must be at least 2, got 1"),
    ("ch07b_engine_ab.py", ["--tokens", "0"], "--tokens must be at least 1, got 0"),
    ("ch07d_overhead_ab.py", ["--repeats", "1"], "--repeats must be at least 2, got 1"),
    ("ch07d_overhead_ab.py", ["--sentences", "0"], "--sentences must be at least 1, got 0"),
])
def test_scripts_refuse_bad_arguments(script, args, message):
    done = subprocess.run([sys.executable, str(SCRIPTS / script), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]
