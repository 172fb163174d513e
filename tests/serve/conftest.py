"""What the server tests share: one server per test module on the shipped tiny-zh (a child process on 127.0.0.1),
the official client pointed at it, and an Engine on the same model to compare answers with."""
import openai
import pytest

from decodelab.engine.engine import Engine
from decodelab.serve.local_server import LocalServer

MODEL = "tiny-zh"


@pytest.fixture(scope="module")
def server():
    with LocalServer("--model", MODEL, "--max-num-seqs", "8") as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    # a generous timeout: a loaded 2-core machine can be slow, and no test reads the time it took
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def engine(tiny):
    model, tokenizer = tiny
    return Engine(model, tokenizer, max_num_seqs=8)
