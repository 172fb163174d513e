"""Each chapters/data/*.json says where it came from, and a warning says when the code behind it has changed since.

A data file records "command" (how to write it again) and "library_commit" (the commit of decodelab it ran on;
scripts/provenance.py stamps both). DEPENDS names the code each file's figures come from. When any of it changed in a
commit after library_commit, the file may be stale: the test warns (a pytest warning, not a failure), naming the file,
the command to re-run and the commits since. Files written before provenance was recorded carry the commit that last
wrote them (`git log -1 --format=%H -- file`).
"""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "chapters" / "data"
LIB = "lib/decodelab"

# The library code each data file's figures depend on, and the benchmark that measures them where one does (the
# scripts in scripts/ only run the library and write the file; editing them does not by itself change a figure).
DEPENDS: dict[str, list[str]] = {
    "03-long-form.json": [f"{LIB}/sampling", f"{LIB}/decoding", f"{LIB}/measure", f"{LIB}/toy",
                          f"{LIB}/models"],
    "03-beam-baseline.json": [f"{LIB}/decoding", f"{LIB}/sampling", f"{LIB}/toy/sentences.py", f"{LIB}/measure/scoring.py",
                              f"{LIB}/measure/snowball.py", f"{LIB}/measure/best_of_n.py", f"{LIB}/models"],
    "04-snowball.json": [f"{LIB}/measure/forced_token.py", f"{LIB}/decoding",
                         f"{LIB}/sampling", f"{LIB}/toy", f"{LIB}/models"],
    "04-snowball-channel.json": [f"{LIB}/measure/snowball.py", f"{LIB}/measure/forced_token.py", f"{LIB}/decoding",
                                 f"{LIB}/sampling", f"{LIB}/toy", f"{LIB}/models"],
    "05-drift.json": [f"{LIB}/book/widgets/drift.py", f"{LIB}/decoding", f"{LIB}/sampling",
                      f"{LIB}/toy", f"{LIB}/models"],
    "05-exposure.json": [f"{LIB}/measure/exposure.py", f"{LIB}/measure/dagger.py",
                         f"{LIB}/toy", f"{LIB}/models"],
    "05-capability.json": [f"{LIB}/measure/exposure.py", f"{LIB}/measure/repetition.py", f"{LIB}/toy",
                           f"{LIB}/models/assets", f"{LIB}/decoding", f"{LIB}/sampling", "scripts/ch05_capability.py"],
    "05-mitigations.json": [f"{LIB}/measure/exposure.py", f"{LIB}/measure/dagger.py", f"{LIB}/toy", f"{LIB}/models",
                            "scripts/ch05_exposure.py"],
    "05-temperature.json": [f"{LIB}/measure/exposure.py", f"{LIB}/measure/snowball.py", f"{LIB}/toy",
                            f"{LIB}/models"],
    "06-roofline.json": ["benchmarks/roofline.py"],
    "06-timing.json": [f"{LIB}/decoding/generate.py"],
    "07-batching.json": [f"{LIB}/engine", f"{LIB}/kv", f"{LIB}/runner"],
    "07-sharing.json": [f"{LIB}/engine", f"{LIB}/kv"],
    "07-slab.json": [f"{LIB}/engine", f"{LIB}/kv"],
    "07b-speculative.json": ["benchmarks/speculative.py",
                             f"{LIB}/decoding/speculative.py"],
    "07b-distribution.json": [f"{LIB}/decoding/speculative.py", f"{LIB}/measure/stats.py"],
    "07b-speculative-engine.json": ["benchmarks/speculative.py", f"{LIB}/engine"],
    "07b-speed-ab.json": ["benchmarks/speculative.py", f"{LIB}/decoding/speculative.py",
                          f"{LIB}/decoding/generate.py"],
    "07c-serving-load.json": ["benchmarks/load.py", f"{LIB}/serve", f"{LIB}/engine"],
    "07d-constrained.json": ["benchmarks/constrained.py",
                             f"{LIB}/decoding/constrained.py", f"{LIB}/grammar", f"{LIB}/measure/constrained.py"],
    "07d-overhead-ab.json": ["benchmarks/constrained.py", f"{LIB}/grammar", f"{LIB}/decoding/generate.py", f"{LIB}/models"],
    "07e-best-of-n.json": ["benchmarks/best_of_n.py", f"{LIB}/measure/best_of_n.py",
                           f"{LIB}/engine", f"{LIB}/toy/questions.py"],
}

COMMIT = re.compile(r"^[0-9a-f]{40}(-dirty)?$")
DATA_FILES = sorted(DATA.glob("*.json"))


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def has_history() -> bool:
    return shutil.which("git") is not None and (ROOT / ".git").exists() and \
        subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode == 0


def changed_since(commit: str, paths: list[str]) -> list[str]:
    """The commits after `commit` that touched any of `paths` (oldest last), as "sha subject"."""
    existing = [p for p in paths if (ROOT / p).exists()]
    if not existing:
        return []
    return [line for line in git("log", "--format=%h %s", f"{commit.removesuffix('-dirty')}..HEAD", "--",
                                 *existing).splitlines() if line]


@pytest.mark.parametrize("path", DATA_FILES, ids=[p.name for p in DATA_FILES])
def test_data_file_records_its_command_and_library_commit(path):
    data = json.loads(path.read_text(encoding="utf-8"))
    assert path.name in DEPENDS, f"add {path.name} to DEPENDS: which code do its figures come from?"
    assert isinstance(data.get("command"), str) and data["command"].startswith("python "), \
        f"{path.name}: 'command' must be the command that writes it, got {data.get('command')!r}"
    assert COMMIT.match(str(data.get("library_commit", ""))), \
        f"{path.name}: 'library_commit' must be a 40-hex commit, got {data.get('library_commit')!r}"


@pytest.mark.parametrize("path", DATA_FILES, ids=[p.name for p in DATA_FILES])
def test_warn_when_the_code_behind_a_data_file_changed(path):
    """A warning, not a failure: a change to the library need not change the figures, but someone should look."""
    if not has_history():
        pytest.skip("no git history here (a source archive): cannot tell what changed since the data was written")
    data = json.loads(path.read_text(encoding="utf-8"))
    commit = data.get("library_commit")
    assert commit is not None, f"{path.name} records no library_commit"
    if subprocess.run(["git", "cat-file", "-e", f"{commit.removesuffix('-dirty')}^{{commit}}"], cwd=ROOT,
                      capture_output=True).returncode != 0:
        warnings.warn(f"{path.name}: library_commit {commit[:12]} is not in this clone's history (shallow clone?)",
                      stacklevel=1)
        return
    since = changed_since(commit, DEPENDS.get(path.name, []))
    if since:
        warnings.warn(f"{path.name} may be stale: {len(since)} commit(s) since {commit[:12]} changed the code it "
                      f"depends on ({', '.join(DEPENDS[path.name])}); re-run `{data.get('command')}`. "
                      f"Latest: {since[0]}", stacklevel=1)


def test_every_dependency_is_a_data_file_and_a_path():
    assert sorted(DEPENDS) == [p.name for p in DATA_FILES], "DEPENDS and chapters/data/ name different files"
    missing = [f"{name}: {path}" for name, paths in DEPENDS.items() for path in paths if not (ROOT / path).exists()]
    assert not missing, "DEPENDS names code that does not exist:\n" + "\n".join(missing)


def test_a_change_after_the_data_was_written_is_found():
    """The last commit that touched the engine is found as a change since its parent, and not since itself."""
    if not has_history():
        pytest.skip("no git history here")
    last = git("log", "-1", "--format=%H", "--", f"{LIB}/engine")
    parent = git("rev-parse", f"{last}^")
    assert any(line.startswith(last[:7]) for line in changed_since(parent, [f"{LIB}/engine"]))
    assert changed_since(last, [f"{LIB}/engine"]) == []


def load_provenance():
    spec = importlib.util.spec_from_file_location("provenance", ROOT / "scripts" / "provenance.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stamp_puts_the_command_and_commit_first_and_keeps_the_rest(tmp_path):
    provenance = load_provenance()
    stamped = provenance.stamp({"rows": [1, 2], "command": "old"}, "python scripts/x.py")
    assert list(stamped)[:2] == ["command", "library_commit"] and stamped["rows"] == [1, 2]
    assert stamped["command"] == "python scripts/x.py" and COMMIT.match(stamped["library_commit"])
    path = tmp_path / "x.json"
    path.write_text('{\n  "a": 1,\n  "b": [2, 3]\n}\n', encoding="utf-8")
    provenance.stamp_file(path, "python benchmarks/x.py --out x.json")
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[1].startswith('  "command"') and json.loads("\n".join(lines))["b"] == [2, 3]


def test_write_stamps_and_writes_the_result_and_refuses_nan(tmp_path):
    provenance = load_provenance()
    out = tmp_path / "new" / "x.json"
    provenance.write(out, {"rows": [1]}, "python scripts/x.py")
    data = json.loads(out.read_text(encoding="utf-8"))
    assert list(data)[:2] == ["command", "library_commit"] and data["rows"] == [1]
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        provenance.write(out, {"rows": [float("nan")]}, "python scripts/x.py")


@pytest.mark.parametrize("result, command, error", [
    ([1], "python x.py", "result must be a dict"),
    ({}, "x.py", "command must be the shell command"),
    ({}, None, "command must be the shell command"),
])
def test_stamp_names_a_bad_argument(result, command, error):
    with pytest.raises((TypeError, ValueError), match=error):
        load_provenance().stamp(result, command)
