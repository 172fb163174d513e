"""The namespace every docstring example in decodelab runs in (`pytest --doctest-modules lib/decodelab`).

It holds only what many examples share and is cheap: `torch`, `math`, and the course's tiny-zh `model` and
`tokenizer` on the CPU, loaded once per session. Anything else an example needs it imports or builds itself, so a
reader can copy it. It sits at the repository's root (not in lib/) so that one run can collect tests/ and the
library's examples together; tests/conftest.py holds the test suite's own fixtures.
"""
import math
import os

import pytest
import torch
from _pytest.doctest import DoctestItem

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def _doctest_namespace(request):
    """For docstring examples only: the shared names, and one torch thread while the example runs (the examples'
    models are tiny, one thread runs them fastest, and no example's output depends on the thread count)."""
    if not isinstance(request.node, DoctestItem):
        yield
        return
    from decodelab.models import load_model

    cache = request.config.stash.setdefault(_TINY_ZH, [])
    if not cache:
        cache.append(load_model("tiny-zh", device="cpu"))
    model, tokenizer = cache[0]
    request.getfixturevalue("doctest_namespace").update(torch=torch, math=math, model=model, tokenizer=tokenizer)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


_TINY_ZH = pytest.StashKey[list]()
