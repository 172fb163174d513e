"""scripts/ch05_mitigations.py: its comparisons name shipped models, each a one-change pair, and it refuses a bad
argument (the measurement itself runs in the script, never in tests)."""
import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from decodelab.measure.dagger import RECIPES
from decodelab.models.train import ASSETS, PRESETS

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture(scope="module")
def script():
    sys.path.insert(0, str(SCRIPTS))  # it imports provenance and ch05_exposure from its own folder
    try:
        spec = importlib.util.spec_from_file_location("ch05_mitigations", SCRIPTS / "ch05_mitigations.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(SCRIPTS))


def test_every_compared_model_is_shipped_with_the_command_that_trained_it(script):
    for model, reference, _ in script.COMPARISONS:
        for name in (model, reference):
            card = (ASSETS / name / "README.md").read_text(encoding="utf-8")
            command = ("python -m decodelab.measure.dagger" if name in RECIPES else "python -m decodelab.models.train")
            assert f"Written by `{command} --model {name}`" in card, name
            assert name in RECIPES or name in PRESETS, name
    pairs = {(m, r) for m, r, _ in script.COMPARISONS}
    assert len(pairs) == len(script.COMPARISONS) and script.POST_HOC <= pairs


def test_an_interval_without_finite_draws_is_null_not_an_error(script):
    assert all(math.isnan(x) for x in script.interval(np.array([np.nan, np.nan])))
    assert script.interval(np.arange(101.0)) == [2.5, 97.5]


@pytest.mark.slow  # a subprocess importing torch
def test_the_script_refuses_too_few_documents():
    done = subprocess.run([sys.executable, str(SCRIPTS / "ch05_mitigations.py"), "--documents", "5"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--documents must be at least 10, got 5" in done.stderr, done.stderr[-2000:]
