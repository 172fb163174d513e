"""The namespace every docstring example in decodelab runs in (`pytest --doctest-modules lib/decodelab`).

It holds only what many examples share and is cheap: `torch`, `math`, and the course's tiny-zh `model` and
`tokenizer` on the CPU, loaded once per session. Anything else an example needs it imports or builds itself, so a
reader can copy it.
"""
import math
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The examples' models are tiny: one thread runs them fastest, and on a shared machine several threads contend (a
# few times slower). No example's output depends on the thread count.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_zh():
    from decodelab.models import load_model

    return load_model("tiny-zh", device="cpu")


@pytest.fixture(autouse=True)
def _doctest_namespace(doctest_namespace, tiny_zh):
    model, tokenizer = tiny_zh
    doctest_namespace.update(torch=torch, math=math, model=model, tokenizer=tokenizer)
