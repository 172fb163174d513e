"""The library's folders are layers: a module imports only from its own subpackage or from the layers below it, and
the subpackages import each other without a cycle. Read from the code's own import statements (also those inside
functions), so a new upward import fails here before it reaches a reader."""
import ast
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[2] / "lib" / "decodelab"

# bottom to top; a subpackage may import from any layer below its own, never from one above or beside it
LAYERS = [
    {"validation", "_exports"},
    {"toy", "kv"},
    {"models", "grammar", "runner"},
    {"sampling"},
    {"decoding"},
    {"engine"},
    {"serve", "measure"},
    {"book"},
]
LAYER = {name: level for level, names in enumerate(LAYERS) for name in names}


def part_of(module: str) -> str | None:
    """'decodelab.engine.scheduler' -> 'engine'; 'decodelab.validation' -> 'validation'; None for the top level."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "decodelab" else None


def imports_of(path: Path) -> set[str]:
    """Every decodelab module a file imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("decodelab.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("decodelab"):
            if node.module == "decodelab":
                found |= {f"decodelab.{alias.name}" for alias in node.names}
            else:
                found.add(node.module)
    return found


def edges() -> list[tuple[str, str, str]]:
    """(file, its subpackage, the subpackage it imports) for every import across subpackages."""
    out = []
    for path in sorted(LIB.rglob("*.py")):
        relative = path.relative_to(LIB)
        if len(relative.parts) == 1 and relative.name == "__init__.py":
            continue                                             # the public API re-exports from everywhere
        own = relative.parts[0].removesuffix(".py")
        for module in imports_of(path):
            other = part_of(module)
            if other is not None and other != own:
                out.append((str(relative), own, other))
    return out


def test_every_subpackage_has_a_layer():
    parts = {p.name.removesuffix(".py") for p in LIB.iterdir()
             if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")}
    assert parts == set(LAYER), f"add new subpackages to LAYERS: {sorted(parts ^ set(LAYER))}"


def test_no_module_imports_a_layer_above_or_beside_its_own():
    upward = [f"{file} imports decodelab.{other} ({other} is not below {own})"
              for file, own, other in edges() if LAYER[other] >= LAYER[own]]
    assert not upward, "\n".join(upward)


def test_the_engine_and_the_server_never_import_what_the_chapters_measure_or_show():
    wrong = [f"{file} imports decodelab.{other}" for file, own, other in edges()
             if own in {"engine", "serve", "kv", "runner", "sampling", "decoding"} and other in {"measure", "book"}]
    assert not wrong, "\n".join(wrong)


def test_no_cycle_between_subpackages():
    graph: dict[str, set[str]] = {}
    for _, own, other in edges():
        graph.setdefault(own, set()).add(other)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in graph.get(start, ()))

    cycles = sorted(p for p in graph if reaches(p, p, {p}))
    assert not cycles, f"subpackages on an import cycle: {cycles}"


def test_the_checker_sees_an_upward_import(tmp_path, monkeypatch):
    """A planted `from decodelab.measure...` in the engine is reported."""
    planted = tmp_path / "decodelab"
    for path in LIB.rglob("*.py"):
        target = planted / path.relative_to(LIB)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    scheduler = planted / "engine" / "scheduler.py"
    scheduler.write_text(scheduler.read_text(encoding="utf-8") + "\nfrom decodelab.measure.exposure import judge\n",
                         encoding="utf-8")
    monkeypatch.setattr(__import__(__name__), "LIB", planted)
    with pytest.raises(AssertionError, match="engine/scheduler.py imports decodelab.measure"):
        test_no_module_imports_a_layer_above_or_beside_its_own()
