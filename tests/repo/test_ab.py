"""benchmarks/ab.py: the A/B driver runs each side's own benchmark from its own commit, in alternation, and keeps
every run's figures with the paired ratios. Tested on a throwaway repository whose benchmark prints fixed numbers, so
nothing here depends on the machine's speed."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import ab  # noqa: E402  (benchmarks/ab.py)

RUNS = [{"rows": [{"name": "a, b", "B": 1, "ms": 2.0}, {"name": "a, b", "B": 64, "ms": 8.0}], "x": {"y": 3}}]


def test_pick_walks_keys_and_matching_list_elements():
    assert ab.pick(RUNS[0], "x/y") == 3.0
    assert ab.pick(RUNS[0], "rows[name=a, b;B=64]/ms") == 8.0


@pytest.mark.parametrize("path, message", [
    ("x/z", "no key 'z'"),
    ("rows[name=a, b]/ms", "2 elements of 'rows' match"),
    ("rows[B=2]/ms", "0 elements of 'rows' match"),
    ("x", "is not a number"),
])
def test_pick_names_the_step_that_fails(path, message):
    with pytest.raises(KeyError, match=message):
        ab.pick(RUNS[0], path)


def test_median_interval_holds_the_median_and_needs_two_values():
    median, low, high = ab.median_interval([1.0, 2.0, 3.0, 4.0, 100.0])
    assert median == 3.0 and 1.0 <= low <= median <= high <= 100.0
    assert ab.median_interval([2.0, 2.0, 2.0]) == (2.0, 2.0, 2.0)
    with pytest.raises(ValueError, match="at least 2 repeats, got 1"):
        ab.median_interval([1.0])


def test_summarize_pairs_runs_of_the_same_repeat():
    before = [{"t": 2.0}, {"t": 4.0}, {"t": 2.0}]
    after = [{"t": 1.0}, {"t": 4.0}, {"t": 3.0}]
    m = ab.summarize(before, after, [("time", "t")])["time"]
    assert m["ratio_after_over_before"] == [0.5, 1.0, 1.5]
    assert m["median_ratio"] == 1.0 and m["median_before"] == 2.0 and m["median_after"] == 3.0


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True)
    return done.stdout.strip()


BENCH = textwrap.dedent("""\
    import argparse, json, os
    from pathlib import Path
    import thing  # from the side's own lib/, which ab.py puts on PYTHONPATH
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    args.out.write_text(json.dumps({"rows": [{"B": 64, "speed": thing.SPEED}]}))
    print("wrote", args.out)
""")


@pytest.fixture
def two_commits(tmp_path):
    repo = tmp_path / "repo"
    (repo / "lib").mkdir(parents=True)
    (repo / "benchmarks").mkdir()
    (repo / "benchmarks" / "bench.py").write_text(BENCH)
    git(repo, "init", "-q")
    commits = []
    for speed in (2.0, 3.0):
        (repo / "lib" / "thing.py").write_text(f"SPEED = {speed}\n")
        git(repo, "add", ".")
        git(repo, "commit", "-q", "-m", f"speed {speed}")
        commits.append(git(repo, "rev-parse", "HEAD"))
    return repo, commits


def run_ab(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCHMARKS / "ab.py"), "--repo", str(repo), *args],
                          capture_output=True, text=True, timeout=300)


def test_each_side_runs_its_own_commit_in_alternation(two_commits):
    repo, (old, new) = two_commits
    done = run_ab(repo, "--before", old, "--after", new, "--repeats", "3", "--name", "toy",
                  "--metric", "speed=rows[B=64]/speed", "--", "benchmarks/bench.py")
    assert done.returncode == 0, done.stderr
    result = json.loads((repo / "benchmarks" / "results" / "toy.json").read_text())
    assert (result["before"], result["after"]) == (old, new)
    metric = result["metrics"]["speed"]
    assert metric["before"] == [2.0] * 3 and metric["after"] == [3.0] * 3
    assert metric["median_ratio"] == 1.5 and metric["interval_95"] == [1.5, 1.5]
    order = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("[")]
    assert order == ["before", "after"] * 3
    assert result["command"].startswith("python benchmarks/ab.py --before ")
    assert len(result["machine"]["load_average_1min_before_each_run"]["after"]) == 3


@pytest.mark.parametrize("args, message", [
    (["--before", "nosuchref", "--repeats", "2"], "not a commit of this repository: 'nosuchref'"),
    (["--before", "HEAD", "--repeats", "2"], "--before and --after name the same commit"),
    (["--before", "HEAD~1", "--repeats", "1"], "--repeats must be at least 2"),
    (["--before", "HEAD~1", "--repeats", "2", "--metric", "nolabel"], "--metric must be LABEL=PATH"),
])
def test_bad_arguments_are_named(two_commits, args, message):
    repo, _ = two_commits
    if "--metric" not in args:
        args = [*args, "--metric", "s=rows[B=64]/speed"]
    done = run_ab(repo, *args, "--name", "toy", "--", "benchmarks/bench.py")
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_the_benchmark_must_follow_the_separator(two_commits):
    repo, _ = two_commits
    done = run_ab(repo, "--before", "HEAD~1", "--name", "toy", "--metric", "s=x")
    assert done.returncode == 2 and "give the benchmark after --" in done.stderr
