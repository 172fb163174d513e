"""Lazy re-exports for a package whose names live in modules that are slow or optional to import.

    __getattr__, __dir__ = lazy_exports(__name__, {"Engine": "decodelab.engine.engine"})

`from decodelab import Engine` then imports `decodelab.engine.engine` on first use only, so `import decodelab.toy`
stays light and a package whose modules need an optional dependency (fastapi for the server) imports without it.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module-level `__getattr__` and `__dir__` (PEP 562) that serve `exports`: name -> module holding it."""
    def __getattr__(name: str) -> object:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        globals_of_package = importlib.import_module(package).__dict__
        globals_of_package[name] = value                      # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(set(importlib.import_module(package).__dict__) | set(exports))

    return __getattr__, __dir__
