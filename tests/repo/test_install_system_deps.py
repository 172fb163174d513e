"""scripts/install-system-deps.sh on machines it cannot see from here: the tools it looks for are stubs on a PATH of
our making (npm, node, dpkg-query, apt-get, sudo, id), so each case is decided by what is present, not by this
machine. apt-get and sudo are stubs that record their arguments, so nothing is installed."""
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install-system-deps.sh"
REAL_TOOLS = ["bash", "grep", "sed", "cat", "env", "dirname", "chmod"]


def stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/bash\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def machine(tmp_path):
    """A PATH with the real shell tools and nothing else; the test adds stubs; returns (bin folder, run)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in REAL_TOOLS:
        os.symlink(shutil.which(tool), folder / tool)
    stub(folder, "python3", "exit 0")                          # a Python whose venv module imports
    stub(folder, "fc-list", "echo '/usr/share/fonts/wqy-microhei.ttc: WenQuanYi Micro Hei'")
    stub(folder, "id", "echo 0")
    log = tmp_path / "calls.log"
    chromium = tmp_path / "chromium"
    stub(folder, "apt-get", f"echo \"apt-get $*\" >> {log}\n"            # installing chromium puts it in place
                            f"case \"$*\" in *chromium*) echo exit > {chromium}; chmod +x {chromium};; esac")

    def run(*args: str, chromium_present: bool = True) -> tuple[int, str, list[str]]:
        if chromium_present:
            stub(tmp_path, "chromium", "exit 0")
        elif chromium.exists():
            chromium.unlink()
        env = {"PATH": str(folder), "CHROMIUM_PATH": str(chromium), "HOME": str(tmp_path)}
        done = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)
        calls = log.read_text().splitlines() if log.exists() else []
        return done.returncode, done.stdout + done.stderr, calls

    return folder, run


def test_a_complete_machine_installs_nothing(machine):
    folder, run = machine
    stub(folder, "npm", "exit 0")
    code, out, calls = run()
    assert code == 0 and "nothing to install" in out and calls == []


def test_nodesource_node_with_its_own_npm_is_accepted(machine):
    """NodeSource's nodejs ships npm and conflicts with Debian's npm: asking apt for nodejs npm would fail."""
    folder, run = machine
    stub(folder, "npm", "exit 0")
    stub(folder, "node", "exit 0")
    code, out, calls = run(chromium_present=False)
    assert code == 0, out
    assert "will install chromium" in out and "npm" not in out.split("will install")[1].splitlines()[0]
    assert calls == ["apt-get update -qq", "apt-get install -y -qq chromium"]


def test_it_says_what_it_will_install_before_installing(machine):
    folder, run = machine
    code, out, calls = run("--check", chromium_present=False)
    assert code == 1 and calls == []
    assert "will install nodejs npm chromium" in out and "the browser tests drive" in out


def test_nodesource_node_without_npm_is_not_repaired_with_debians_npm(machine):
    folder, run = machine
    stub(folder, "node", "exit 0")
    stub(folder, "dpkg-query", "echo 20.20.2-1nodesource1")
    code, out, calls = run()
    assert code == 1 and calls == [] and "reinstall it" in out and "conflicts" in out


def test_a_user_with_sudo_uses_it_and_one_without_is_told_to_be_root(machine, tmp_path):
    folder, run = machine
    stub(folder, "npm", "exit 0")
    stub(folder, "id", "echo 1000")
    code, out, calls = run(chromium_present=False)
    assert code == 1 and calls == [] and "not root and no sudo" in out
    stub(folder, "sudo", f"echo sudo >> {tmp_path / 'calls.log'}; \"$@\"")
    code, out, calls = run(chromium_present=False)
    assert code == 0, out
    assert calls == ["sudo", "apt-get update -qq", "sudo", "apt-get install -y -qq chromium"]


def test_an_apt_chromium_that_is_not_where_the_tests_look_is_reported(machine):
    """Ubuntu's chromium package installs a snap: apt succeeds, /usr/bin/chromium does not appear."""
    folder, run = machine
    stub(folder, "npm", "exit 0")
    stub(folder, "apt-get", "exit 0")
    code, out, _ = run(chromium_present=False)
    assert code == 1 and "is still missing" in out and "snap" in out


def test_no_apt_says_what_to_install_instead(machine):
    folder, run = machine
    (folder / "apt-get").unlink()
    code, out, calls = run(chromium_present=False)
    assert code == 1 and "apt-get is not here" in out and "Chromium at" in out


def test_unknown_option_is_named(machine):
    _, run = machine
    code, out, _ = run("--yes")
    assert code == 2 and "unknown option '--yes'" in out and "--check" in out
