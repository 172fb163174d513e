"""`inference`: run a function in `torch.inference_mode()`, entering it only when it is not on already. An engine's
step enters the mode once for everything it runs (its own tensor calls cost less there); the runner's methods and its
decode buffers, called inside it, skip a second context, and still run in the mode when called outside a step."""
from __future__ import annotations

import functools

import torch


def inference(fn):
    """`fn` wrapped so that it runs in `torch.inference_mode()`, entered only when the mode is off."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if torch.is_inference_mode_enabled():
            return fn(*args, **kwargs)
        with torch.inference_mode():
            return fn(*args, **kwargs)
    return wrapper


__all__ = ["inference"]
