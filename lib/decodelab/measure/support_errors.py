"""What a truncation keeps against the truth: truly possible tokens it drops, truly impossible tokens it admits.

Top-k and top-p cut the model's distribution; the toy language says which next tokens are really possible. Comparing
the two shows why a fixed k fails on flat and peaked contexts alike while top-p adapts (the flat-versus-peaked
comparison).

Taught in: chapters/03-strategies.ipynb
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SupportErrors:
    """A truncated distribution against the truth: what it wrongly drops and what it wrongly admits."""

    kept: int                # tokens the truncation keeps
    possible: int            # tokens the truth allows (true probability > 0)
    dropped_possible: int    # truly possible tokens the truncation removes
    dropped_true_mass: float  # their total true probability
    admitted_impossible: int  # truly impossible tokens the truncation keeps
    admitted_mass: float     # the probability sampling gives them (renormalised over the kept tokens)


def truncation_errors(kept: torch.Tensor, model_probs: torch.Tensor, true_probs: torch.Tensor) -> dict[str, torch.Tensor]:
    """Row by row, what truncations `kept` (bool `[N, V]`) of `model_probs` `[N, V]` get wrong against `true_probs`
    `[N, V]`: a dict of `[N]` tensors named as the fields of `SupportErrors`.

    Taught in: chapters/03-strategies.ipynb
    """
    for name, t in (("kept", kept), ("model_probs", model_probs), ("true_probs", true_probs)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"{name} must be a 2-D tensor [N, V], got {t!r:.60}")
    if kept.dtype != torch.bool:
        raise TypeError(f"kept must be a bool tensor, got {kept.dtype}")
    if not (kept.shape == model_probs.shape == true_probs.shape):
        raise ValueError(f"kept, model_probs and true_probs must have one shape [N, V], got {tuple(kept.shape)}, "
                         f"{tuple(model_probs.shape)} and {tuple(true_probs.shape)}")
    if not bool(kept.any(dim=-1).all()):
        raise ValueError("kept must keep at least one token in every row, got a row with none")
    possible = true_probs > 0  # [N, V]
    renormalised = torch.where(kept, model_probs.double(), 0.0)
    renormalised = renormalised / renormalised.sum(dim=-1, keepdim=True)
    dropped, admitted = possible & ~kept, ~possible & kept
    return {
        "kept": kept.sum(dim=-1),
        "possible": possible.sum(dim=-1),
        "dropped_possible": dropped.sum(dim=-1),
        "dropped_true_mass": torch.where(dropped, true_probs.double(), 0.0).sum(dim=-1),
        "admitted_impossible": admitted.sum(dim=-1),
        "admitted_mass": torch.where(admitted, renormalised, 0.0).sum(dim=-1),
    }


def support_errors(kept: torch.Tensor, model_probs: torch.Tensor, true_probs: torch.Tensor) -> SupportErrors:
    """Compare one truncation (`kept` bool `[V]`) of `model_probs` `[V]` with the true next-token `true_probs` `[V]`.

    >>> support_errors(torch.tensor([True, True, False]), torch.tensor([.5, .3, .2]), torch.tensor([.6, 0., .4]))
    SupportErrors(kept=2, possible=2, dropped_possible=1, dropped_true_mass=0.4, admitted_impossible=1, admitted_mass=0.375)

    Taught in: chapters/03-strategies.ipynb
    """
    for name, t in (("kept", kept), ("model_probs", model_probs), ("true_probs", true_probs)):
        if not isinstance(t, torch.Tensor) or t.dim() != 1:
            raise ValueError(f"{name} must be a 1-D tensor [V], got {t!r:.60}")
    if not (kept.shape == model_probs.shape == true_probs.shape):
        raise ValueError(f"kept, model_probs and true_probs must have one shape [V], got {tuple(kept.shape)}, "
                         f"{tuple(model_probs.shape)} and {tuple(true_probs.shape)}")
    rows = truncation_errors(kept.unsqueeze(0), model_probs.unsqueeze(0), true_probs.unsqueeze(0))
    return SupportErrors(**{name: (round(float(v[0]), 6) if v.is_floating_point() else int(v[0]))
                            for name, v in rows.items()})
