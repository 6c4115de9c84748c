"""DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13): a length-dependent reward added to the task reward.

With L_max the generation cap and L_cache the soft buffer before it,

    R_len(|y|) = 0                                  if |y| <= L_max - L_cache
               = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
               = -1                                 if |y| > L_max

so the penalty falls linearly from 0 to -1 across the buffer. cache_len = 0 leaves only the two outer cases.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo.algo._checks import check_number, check_tensor, float_dtype

__all__ = ["overlong_penalty"]


def overlong_penalty(lengths: Tensor, *, max_len: int, cache_len: int) -> Tensor:
    """R_len for each completion length.

    lengths: (N,) (any shape) completion lengths in tokens.  max_len: L_max >= 1.  cache_len: 0 <= L_cache <= L_max.
    Returns a float tensor of lengths' shape with values in [-1, 0].
    """
    check_tensor("lengths", lengths)
    check_number("max_len", max_len, low=1, integer=True)
    check_number("cache_len", cache_len, low=0, high=max_len, integer=True)
    length = lengths.to(float_dtype(lengths))
    start = max_len - cache_len
    ramp = (start - length) / max(cache_len, 1)
    out = torch.where(length <= start, torch.zeros_like(length), ramp)
    return torch.where(length > max_len, torch.full_like(length, -1.0), out)
