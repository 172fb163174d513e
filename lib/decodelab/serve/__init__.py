"""The OpenAI-compatible server: app (FastAPI routes, `python -m decodelab.serve`), protocol (request and response
JSON), chat (chat templates and the shipped models' default), prometheus (`/metrics`), local_server (a server in a
child process for tests, benchmarks and chapter 9). Names are imported on first use, so `local_server` works where
fastapi is not installed."""
from decodelab._exports import lazy_exports

_EXPORTS = {"create_app": "decodelab.serve.app", "LocalServer": "decodelab.serve.local_server"}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
