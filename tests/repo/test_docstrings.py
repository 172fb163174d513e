"""The library names the chapter that teaches each piece: those names must point at real pages."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TAUGHT_IN = re.compile(r"Taught in:(.*)")
PAGE = re.compile(r"(?:chapters|exercises)/[\w.*-]+\.(?:ipynb|md)")


def test_every_taught_in_reference_exists():
    missing = []
    for source in sorted((ROOT / "lib" / "decodelab").rglob("*.py")):
        for line_number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
            match = TAUGHT_IN.search(line)
            if not match:
                continue
            for page in PAGE.findall(match.group(1)):
                if not list(ROOT.glob(page)):
                    missing.append(f"{source.relative_to(ROOT)}:{line_number}: {page}")
    assert not missing, "docstrings name pages that do not exist:\n" + "\n".join(missing)


def imports_from_package(text: str, module: str, source: str) -> bool:
    """The page imports, from the module's package (which re-exports it), a name the module defines."""
    package = module.rsplit(".", 1)[0]
    for names in re.findall(r"from " + re.escape(package) + r" import ([\w, ]+)", text):
        for name in names.split(","):
            if re.search(rf"^(?:def|class) {re.escape(name.strip())}\b", source, re.MULTILINE):
                return True
    return False


def test_every_taught_in_page_mentions_its_module():
    """A "Taught in" tag is true only if the page it names mentions the module (by dotted or short name, or by
    importing one of its names from the package that re-exports them)."""
    silent = []
    for source in sorted((ROOT / "lib" / "decodelab").rglob("*.py")):
        module = ".".join(source.relative_to(ROOT / "lib").with_suffix("").parts).removesuffix(".__init__")
        short = module.rsplit(".", 1)[-1]
        code = source.read_text(encoding="utf-8")
        for line in code.splitlines():
            match = TAUGHT_IN.search(line)
            if not match:
                continue
            for page in PAGE.findall(match.group(1)):
                for path in ROOT.glob(page):
                    text = path.read_text(encoding="utf-8")
                    if module not in text and short not in text and not imports_from_package(text, module, code):
                        silent.append(f"{module}: {path.relative_to(ROOT)}")
    assert not silent, "pages that never mention the module they are said to teach:\n" + "\n".join(sorted(set(silent)))
