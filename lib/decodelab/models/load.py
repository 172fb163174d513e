"""Load the course's model: a shipped one (tiny-zh, tiny-zh-doc), any Hugging Face hub id in the local cache, or a path.

Defaults: device "cuda" when `torch.cuda.is_available()`, else "cpu"; dtype float32 on CPU and bfloat16 on CUDA.
Loading is quiet (no progress bars, no warnings), so notebook outputs stay stable.

Taught in: chapters/00-intro.md
"""
from __future__ import annotations

import contextlib
import os
import socket
import warnings
from pathlib import Path
from urllib.parse import urlparse

import torch

ASSETS = Path(__file__).parent / "assets"
TINY_ZH = ASSETS / "tiny-zh"
# The course's own models, one folder of assets/ each: tiny-zh knows single sentences (context 256), tiny-zh-doc
# whole documents (context 512); chapter 05's small twins are trained to fall short of the truth (plain, soft
# targets, DAgger), and its controlled mitigations change one thing each (4x the data, scheduled sampling, DAgger on
# the full data with and without the 。 labels). tests/serve/test_chat_template.py checks this list against the folders.
SHIPPED = ("tiny-zh", "tiny-zh-doc", "tiny-zh-doc-small", "tiny-zh-doc-small-soft", "tiny-zh-doc-small-dagger",
           "tiny-zh-doc-small-4xdata", "tiny-zh-doc-small-scheduled", "tiny-zh-doc-small-dagger-fulldata",
           "tiny-zh-doc-small-dagger-fulldata-noend")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")
_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


def resolve_device(device: str | torch.device | None) -> torch.device:
    """`None` → cuda when available, else cpu; strings like "cpu", "cuda", "cuda:1" are checked."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be None, a str or a torch.device, got {type(device).__name__}")
    try:
        resolved = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"device must be like 'cpu', 'cuda' or 'cuda:0', got {device!r}") from err
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device is {device!r} but torch.cuda.is_available() is False; use device='cpu'")
    return resolved


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """`None` → float32 on CPU, bfloat16 on CUDA; strings "float32", "bfloat16", "float16" (or fp32/bf16/fp16)."""
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype}")
        return dtype
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in _DTYPES:
        return _DTYPES[dtype.removeprefix("torch.")]
    raise ValueError(f"dtype must be None, a torch.dtype or one of {sorted(_DTYPES)}, got {dtype!r}")


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def _hub_reachable(timeout: float = 2.0) -> bool:
    from huggingface_hub import constants

    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def _check_model_folder(folder: Path) -> None:
    """A local model folder must hold what `save_pretrained` writes: refused here, not by a tokenizer error."""
    missing = [what for what, patterns in (
        ("config.json", ("config.json",)),
        ("weights (*.safetensors or pytorch_model*.bin)", ("*.safetensors", "pytorch_model*.bin")),
        ("tokenizer files (tokenizer.json, tokenizer_config.json, ...)", TOKENIZER_FILES),
    ) if not any(any(folder.glob(pattern)) for pattern in patterns)]
    if missing:
        raise FileNotFoundError(f"model folder {str(folder)!r} has no {' and no '.join(missing)}; a model folder holds "
                                "config.json, the weights (model.safetensors or pytorch_model.bin, or their shards) "
                                "and the tokenizer's files, as model.save_pretrained and tokenizer.save_pretrained "
                                "write them")


def _locate(name: str) -> str:
    """A local directory for `name`: the assets, a local path, or the snapshot in the HF cache (else the id)."""
    if name in SHIPPED:
        folder = ASSETS / name
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"the {name} assets are missing from {folder}; "
                                    f"run `python -m decodelab.models.train --model {name}` to train them")
        return str(folder)
    if Path(name).expanduser().is_dir():
        folder = Path(name).expanduser()
        _check_model_folder(folder)
        return str(folder)
    if name.startswith(("/", ".", "~")) or os.sep + os.sep in name:
        raise FileNotFoundError(f"model path {name!r} is not a directory; pass an existing local path, "
                                "a hub id like 'Qwen/Qwen2.5-0.5B-Instruct', or 'tiny-zh'")
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(name, local_files_only=True)
    except Exception:  # not cached (or not a valid repo id): decide below whether the network can help
        pass
    reason = "HF_HUB_OFFLINE=1" if _hub_offline() else (None if _hub_reachable() else "the hub is not reachable")
    if reason:
        raise OSError(
            f"model {name!r} is not in the local Hugging Face cache and {reason}; download it on a machine with "
            f"network (huggingface-cli download {name}) and copy the cache, or pass a local path, or use 'tiny-zh'")
    return name


@contextlib.contextmanager
def _quiet():
    """Silence transformers' logging, progress bars and Python warnings for the duration of a load."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as hf_logging

    verbosity, bars_off = hf_logging.get_verbosity(), are_progress_bars_disabled()
    hf_bars_on = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    disable_progress_bars()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if hf_bars_on:
            hf_logging.enable_progress_bar()
        if not bars_off:
            enable_progress_bars()


def load_model(name: str = "tiny-zh", device: str | torch.device | None = None,
               dtype: str | torch.dtype | None = None):
    """(model, tokenizer) in eval mode on `device` with `dtype`; `name` is "tiny-zh", "tiny-zh-doc", a hub id or a
    local path.

    >>> model, tokenizer = load_model("tiny-zh", device="cpu")
    >>> tokenizer("小明")["input_ids"][0] == tokenizer.bos_token_id
    True
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name must be one of {SHIPPED}, a hub id or a local path, got {name!r}")
    resolved_device = resolve_device(device)
    resolved_dtype = resolve_dtype(dtype, resolved_device)
    source = _locate(name)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _quiet():
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=resolved_dtype)
    model.to(resolved_device).eval()
    return model, tokenizer
