"""Masked reductions: mean, variance and whitening over the positions where `mask` is set.

A mask is a bool tensor or a tensor of 0/1 numbers with the same shape as the data (no broadcasting). Masked-out
positions never enter a sum, so NaN or inf sitting at padding does not leak into the result. A reduction over
no present element returns 0 instead of 0/0 = NaN, and the unbiased variance of fewer than two elements is 0.

    masked_mean  = sum(x * m) / max(sum(m), 1)
    masked_var   = sum((x - mean)^2 * m) / max(sum(m) - 1, 1)   (unbiased=True, Bessel; verl's choice)
                 = sum((x - mean)^2 * m) / max(sum(m), 1)       (unbiased=False, population; OpenRLHF's)
    masked_whiten = (x - mean) / sqrt(var + eps), 0 at masked positions; shift_mean=False adds the mean back.

masked_whiten is verl's `masked_whiten` (REINFORCE++ and PPO advantage whitening), except that masked positions
are set to 0 instead of being left holding their raw values.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo.algo._checks import as_bool_mask, check_number, check_same_shape, check_tensor, float_dtype

__all__ = ["masked_sum", "masked_mean", "masked_var", "masked_whiten", "high_entropy_mask"]


def _dims(dim: int | tuple[int, ...] | None, ndim: int) -> tuple[int, ...]:
    if dim is None:
        return tuple(range(ndim))
    return (dim,) if isinstance(dim, int) else tuple(dim)


def masked_sum(x: Tensor, mask: Tensor, dim: int | tuple[int, ...] | None = None, *, keepdim: bool = False) -> Tensor:
    """Sum of x over positions where mask is set.  x, mask: same shape; dim None reduces everything to 0-d."""
    check_tensor("x", x)
    check_same_shape("x", x, mask=mask)
    return x.where(as_bool_mask(mask), 0).sum(dim=_dims(dim, x.ndim), keepdim=keepdim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | tuple[int, ...] | None = None, *, keepdim: bool = False) -> Tensor:
    """Mean of x over positions where mask is set; 0 where nothing is set.

    x, mask: same shape, e.g. (N, T).  dim=None -> 0-d tensor; dim=-1 -> (N,) (or (N, 1) with keepdim).
    """
    total = masked_sum(x, mask, dim, keepdim=keepdim)
    count = as_bool_mask(mask).to(float_dtype(x)).sum(dim=_dims(dim, x.ndim), keepdim=keepdim)
    return total / count.clamp(min=1)


def masked_var(
    x: Tensor, mask: Tensor, unbiased: bool = True, *, dim: int | tuple[int, ...] | None = None,
    keepdim: bool = False,
) -> Tensor:
    """Variance of x over positions where mask is set.

    unbiased=True divides by (count - 1) (Bessel; verl), False by count (population; OpenRLHF).
    Fewer than two present elements (one, for unbiased=False) give 0.  x, mask: same shape.
    """
    m = as_bool_mask(mask)
    dims = _dims(dim, x.ndim)
    mean = masked_mean(x, m, dim=dims, keepdim=True)
    sq = masked_sum((x - mean).square(), m, dim=dims, keepdim=keepdim)
    count = masked_sum(m.to(sq.dtype), m, dim=dims, keepdim=keepdim)
    var = sq / (count - 1 if unbiased else count).clamp(min=1)
    return var if not unbiased else var.where(count > 1, 0)


def masked_whiten(
    x: Tensor,
    mask: Tensor,
    shift_mean: bool = True,
    eps: float = 1e-8,
    *,
    unbiased: bool = True,
    stats: tuple[Tensor | float, Tensor | float] | None = None,
) -> Tensor:
    """Batch whitening: (x - mean) / sqrt(var + eps) over the present positions of the whole tensor.

    x, mask: same shape, e.g. advantages (N, T).  Returns x's shape, 0 at masked positions.
    shift_mean=False adds the mean back (only the scale changes).  eps > 0 keeps a constant input finite.
    unbiased picks the variance (Bessel by default, as verl).
    stats: (mean, var) to use instead of x's own, e.g. those of a batch split over several processes.
    """
    check_number("eps", eps, low=0.0, low_open=True)
    m = as_bool_mask(mask)
    mean, var = stats if stats is not None else (masked_mean(x, m), masked_var(x, m, unbiased))
    var = torch.as_tensor(var, dtype=x.dtype, device=x.device)
    out = (x - mean) * (var + eps).rsqrt()
    if not shift_mean:
        out = out + mean
    return out.where(m, 0)


def high_entropy_mask(entropy: Tensor, mask: Tensor, top_fraction: float) -> Tensor:
    """The present tokens whose entropy is in the top `top_fraction` of all present tokens ("Beyond the 80/20 rule",
    Wang et al. 2025; TRL's top_entropy_quantile): entropy >= the (1 - top_fraction) quantile (linear
    interpolation, as torch.quantile) of the entropies at present positions.

    entropy, mask: (N, T).  Returns a bool (N, T) mask, False at masked positions; top_fraction = 1 keeps every
    present token.
    """
    check_number("top_fraction", top_fraction, low=0.0, high=1.0, low_open=True)
    m = as_bool_mask(mask)
    present = entropy[m]
    if present.numel() == 0:
        return m.clone()
    threshold = torch.quantile(present.float(), 1.0 - top_fraction)
    return m & (entropy >= threshold.to(entropy.dtype))
