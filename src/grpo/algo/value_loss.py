"""Clipped value (critic) loss for the PPO baseline, per token.

    V_clip = V_old + clip(V - V_old, -clip, +clip)
    L_t    = 0.5 * max((V - R)^2, (V_clip - R)^2)

as in verl's `compute_value_loss` and OpenRLHF's `ValueLoss` (ALGORITHMS.md §1). The 0.5 factor is included: the
test vectors of ALGORITHMS.md §9 (V_old=0.5, R=1, clip=0.2: V=0.6 -> 0.08, V=0.9 -> 0.045, V=0.2 -> 0.32) are the
values with it. clip=None gives the unclipped 0.5 * (V - R)^2. Masked positions are 0; averaging is
`grpo.algo.aggregate`'s job (PPO uses token_mean).
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo.algo._checks import as_bool_mask, check_number, check_same_shape, check_tensor

__all__ = ["clipped_value_loss"]


def clipped_value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, *, clip: float | None
) -> Tensor:
    """Per-token clipped value loss.

    values: (N, T) critic predictions (with gradient).  old_values: (N, T) predictions at rollout time.
    returns: (N, T) targets (e.g. from `gae`).  mask: (N, T) bool or 0/1.  clip: eps_v > 0, or None for no clip.
    Returns (N, T), 0 at masked positions.
    """
    check_tensor("values", values, ndim=2)
    check_same_shape("values", values, old_values=old_values, returns=returns, mask=mask)
    loss = (values - returns).square()
    if clip is not None:
        check_number("clip", clip, low=0.0, low_open=True)
        clipped = old_values + (values - old_values).clamp(-clip, clip)
        loss = torch.maximum(loss, (clipped - returns).square())
    return (0.5 * loss).where(as_bool_mask(mask), 0)
