"""Start `python -m decodelab.serve` as a child process on 127.0.0.1, wait until it answers, stop it afterwards.

For the tests, the load benchmark and the serving chapter, which all talk to a real server over loopback:

    with LocalServer("--model", "tiny-zh", "--max-num-seqs", "8") as server:
        client = OpenAI(base_url=server.base_url, api_key="unused")

    server = LocalServer("--model", "tiny-zh").start()     # across notebook cells; server.stop() at the end

Taught in: chapters/07c-serving.ipynb
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

import httpx

HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


class LocalServer:
    """A decodelab server in a child process, bound to 127.0.0.1 only; `args` are `decodelab.serve.app`'s options."""

    def __init__(self, *args: str, startup_timeout: float = 120.0) -> None:
        if any(a == "--host" for a in args):
            raise ValueError("LocalServer binds 127.0.0.1 only; do not pass --host")
        self.args = [str(a) for a in args]
        self.port = free_port()
        self.base_url = f"http://{HOST}:{self.port}/v1"
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen | None = None
        self.log = None                                      # the server's stderr, a temporary file (never a pipe
                                                             # that could fill and block it)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> LocalServer:
        """Start the server and wait until /health answers (also what `with LocalServer(...)` does)."""
        if self.process is not None:
            raise RuntimeError("this LocalServer was started already")
        env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
        self.log = tempfile.TemporaryFile(mode="w+", encoding="utf-8")
        self.process = subprocess.Popen([sys.executable, "-m", "decodelab.serve", *self.args, "--host", HOST,
                                         "--port", str(self.port)], env=env, stdout=subprocess.DEVNULL,
                                        stderr=self.log, text=True)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = self.stderr()
                self.stop()
                raise RuntimeError(f"the server exited with code {self.process.returncode}:\n{log[-3000:]}")
            try:
                if httpx.get(f"http://{HOST}:{self.port}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"the server did not answer /health within {self.startup_timeout} s")

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s); calling it twice is harmless."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.log is not None:
            self.log.close()
            self.log = None

    def stderr(self) -> str:
        """What the server has written to stderr so far."""
        if self.log is None:
            return ""
        self.log.seek(0)
        return self.log.read()

    def get(self, path: str) -> httpx.Response:
        """GET a route of the server (`/metrics`, `/health`)."""
        return httpx.get(f"http://{HOST}:{self.port}{path}", timeout=10.0)

    def metric(self, name: str) -> float:
        """One sample's value from /metrics, e.g. `decodelab:num_requests_running` (labels included in `name`)."""
        for line in self.get("/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        raise KeyError(f"{name!r} is not in /metrics")
