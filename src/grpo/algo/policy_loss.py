"""The clipped surrogate policy loss of PPO / GRPO / DAPO / GSPO, per token, with detached diagnostics.

With ratio w = pi_theta / pi_old (computed as exp(logp - old_logp)) and advantage A, the objective per token is

    J_t = min(w * A, clip(w, 1 - clip_low, 1 + clip_high) * A)

and the returned loss is -J_t at unmasked positions, 0 elsewhere; how tokens are averaged is `grpo.algo.aggregate`'s
job. clip_high > clip_low is DAPO's clip-higher (arXiv 2503.14476: 0.2 / 0.28).

level="token" uses one ratio per token (PPO, GRPO, DAPO). level="sequence" is GSPO (arXiv 2507.18071, eq. 7): every
token of completion i uses s_i = exp(masked mean over t of (logp - old_logp)), the length-normalised sequence ratio
(the length is clamped to 1, so an empty row is defined). Its gradient gives every token of o_i the same weight
(TRL's `importance_sampling_level="sequence"`; the value and gradient equal verl's GSPO-token form with one A per row).

Dual clip (Ye et al. 2019; verl `clip_ratio_c`): with c = dual_clip > 1, tokens with A < 0 use max(J_t, c * A), so a
huge ratio cannot produce an unbounded negative objective.

For finiteness the log-ratio (the per-token one, or for GSPO the per-sequence mean) is clamped to
[-max_log_ratio, max_log_ratio] before exp, as verl and OpenRLHF do at 20; a clamped token gets no gradient.

"Clipped" in the metrics means the clip zeroes that token's gradient: clip_frac_low counts A < 0 with
w < 1 - clip_low, clip_frac_high counts A > 0 with w > 1 + clip_high, clip_frac_dual counts A < 0 with w > c;
clip_frac is their sum. All are fractions of the unmasked tokens of this batch.
With old_logp = logp.detach() (one update per rollout) w = 1 and the gradient is REINFORCE's, -A per token.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo.algo._checks import as_bool_mask, check_choice, check_number, check_same_shape, check_tensor
from grpo.algo.masked import masked_mean

__all__ = ["RATIO_LEVELS", "clipped_surrogate", "cispo_surrogate"]

RATIO_LEVELS = ("token", "sequence")


def _check_tensors(logp, old_logp, adv, mask) -> None:
    check_tensor("logp", logp, ndim=2)
    check_same_shape("logp", logp, old_logp=old_logp, mask=mask)
    check_tensor("adv", adv, ndim=(1, 2))
    if adv.shape not in (logp.shape, logp.shape[:1]):
        raise ValueError(
            f"adv must have shape (N,) = {tuple(logp.shape[:1])} or (N, T) = {tuple(logp.shape)}, "
            f"got {tuple(adv.shape)}"
        )


def _check_args(logp, old_logp, adv, mask, clip_low, clip_high, level, dual_clip, max_log_ratio) -> None:
    _check_tensors(logp, old_logp, adv, mask)
    check_choice("level", level, RATIO_LEVELS)
    check_number("clip_low", clip_low, low=0.0, high=1.0, high_open=True)
    check_number("clip_high", clip_high, low=0.0)
    if dual_clip is not None:
        check_number("dual_clip", dual_clip, low=1.0, low_open=True)
    check_number("max_log_ratio", max_log_ratio, low=0.0, low_open=True)


def clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    level: str = "token",
    dual_clip: float | None = None,
    max_log_ratio: float = 20.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token clipped policy loss (to be minimised) and detached metrics.

    logp: (N, T) log-probs under the policy being trained (with gradient).  old_logp: (N, T) under pi_old.
    adv: (N,) one advantage per completion, or (N, T) per token.  mask: (N, T) bool or 0/1, 1 = response token.
    clip_low, clip_high: the ratio band [1 - clip_low, 1 + clip_high].  level: "token" or "sequence" (GSPO).
    dual_clip: c > 1 or None.  max_log_ratio: clamp on the log-ratio before exp.
    Returns loss (N, T), 0 at masked positions, and {"clip_frac", "clip_frac_low", "clip_frac_high",
    "clip_frac_dual", "ratio_mean", "ratio_min", "ratio_max"}: 0-d detached tensors over the unmasked tokens
    (ratio statistics are 1 when no token is unmasked).
    """
    _check_args(logp, old_logp, adv, mask, clip_low, clip_high, level, dual_clip, max_log_ratio)
    m = as_bool_mask(mask)
    a = adv.unsqueeze(-1) if adv.ndim == 1 else adv
    log_ratio = (logp - old_logp).where(m, 0)
    if level == "sequence":
        log_ratio = masked_mean(log_ratio, m, dim=-1, keepdim=True).expand_as(logp)
    ratio = log_ratio.clamp(-max_log_ratio, max_log_ratio).exp()
    objective = torch.minimum(ratio * a, ratio.clamp(1 - clip_low, 1 + clip_high) * a)
    if dual_clip is not None:
        objective = torch.where(a < 0, torch.maximum(objective, dual_clip * a), objective)
    loss = (-objective).where(m, 0)
    return loss, _metrics(ratio.detach(), a.detach().expand_as(ratio), m, clip_low, clip_high, dual_clip)


def _metrics(
    ratio: Tensor, a: Tensor, m: Tensor, clip_low: float, clip_high: float, dual_clip: float | None
) -> dict[str, Tensor]:
    low = (a < 0) & (ratio < 1 - clip_low)
    high = (a > 0) & (ratio > 1 + clip_high)
    dual = (a < 0) & (ratio > dual_clip) if dual_clip is not None else torch.zeros_like(m)
    frac = {name: masked_mean(x.to(ratio.dtype), m) for name, x in (("low", low), ("high", high), ("dual", dual))}
    one = torch.ones((), dtype=ratio.dtype, device=ratio.device)
    if ratio.numel() == 0:  # amin/amax of an empty tensor raise; this is a shape test, not a sync
        ratio, m = one.reshape(1), torch.ones(1, dtype=torch.bool, device=m.device)
    any_token = m.any()
    return {
        "clip_frac": frac["low"] + frac["high"] + frac["dual"],
        "clip_frac_low": frac["low"],
        "clip_frac_high": frac["high"],
        "clip_frac_dual": frac["dual"],
        "ratio_mean": torch.where(any_token, masked_mean(ratio, m), one),
        "ratio_min": torch.where(any_token, ratio.where(m, torch.inf).amin(), one),
        "ratio_max": torch.where(any_token, ratio.where(m, -torch.inf).amax(), one),
    }


def cispo_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 1.0,
    clip_high: float = 0.28,
    max_log_ratio: float = 20.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585, eq. 4-5): clip the importance weight, not the update.

        loss_t = -sg(clip(w_t, 1 - clip_low, 1 + clip_high)) * A * logp_t

    The clipped ratio is detached, so every token keeps a gradient, -clip(w_t) * A, however far its ratio has moved
    (PPO's clip zeroes it instead). clip_low = 1 (the default) puts no lower bound on the weight, as the paper does.
    Arguments and returns as clipped_surrogate; here the clip fractions count the tokens whose weight was capped
    (clip_frac_low: w < 1 - clip_low, clip_frac_high: w > 1 + clip_high), whatever the sign of A.
    With old_logp = logp.detach(), w = 1 and the gradient is REINFORCE's, -A per token, as for clipped_surrogate.
    """
    _check_tensors(logp, old_logp, adv, mask)
    check_number("clip_low", clip_low, low=0.0, high=1.0)
    check_number("clip_high", clip_high, low=0.0)
    check_number("max_log_ratio", max_log_ratio, low=0.0, low_open=True)
    m = as_bool_mask(mask)
    a = adv.unsqueeze(-1) if adv.ndim == 1 else adv
    ratio = (logp - old_logp).where(m, 0).clamp(-max_log_ratio, max_log_ratio).exp().detach()
    weight = ratio.clamp(1 - clip_low, 1 + clip_high)
    loss = (-(weight * a) * logp).where(m, 0)
    metrics = _metrics(ratio, a.detach().expand_as(ratio), m, clip_low, clip_high, None)
    low = masked_mean((ratio < 1 - clip_low).to(ratio.dtype), m)
    high = masked_mean((ratio > 1 + clip_high).to(ratio.dtype), m)
    metrics.update(clip_frac=low + high, clip_frac_low=low, clip_frac_high=high)  # capped weights, either sign of A
    return loss, metrics
