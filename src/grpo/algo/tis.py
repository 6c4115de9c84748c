"""Truncated importance sampling (TIS): the correction for a rollout engine whose policy differs from the trainer's.

An engine such as vLLM samples token y_t with its own probabilities pi_engine (other kernels, other precision), so
the rollout is slightly off-policy for the trainer's pi_train (Yao et al. 2025, "Your efficient RL framework
secretly brings you off-policy RL training"). The policy-gradient term of each token is multiplied by

    w_t = min(pi_train(y_t) / pi_engine(y_t), C) = min(exp(logp_train - logp_engine), C)

detached (a constant weight, no gradient through it), 0 at masked positions. pi_train is the trainer's policy at
rollout time (pi_old: the old log-probs when mu > 1, the current ones detached when mu = 1). The cap C bounds the
variance; with identical log-probs every weight is 1 and the update is unchanged.

The log-ratio is clamped at `max_log_ratio` before exp (as the clipped surrogate does) so the weight stays finite
even for a token the engine gave a probability of 0 (log-prob -inf: the weight is the cap). An engine log-prob that
is no probability (NaN, +inf) says nothing about how the token was sampled: that token's weight is 0 (its
policy-gradient term dropped, never NaN) and it is counted in `invalid_frac`, which the update logs and warns about.
"""

from __future__ import annotations

import math

from torch import Tensor

from grpo.algo._checks import as_bool_mask, check_number, check_same_shape, check_tensor
from grpo.algo.masked import masked_mean

__all__ = ["truncated_is_weight"]


def truncated_is_weight(logp_train: Tensor, logp_engine: Tensor, mask: Tensor, *, cap: float,
                        max_log_ratio: float = 20.0) -> tuple[Tensor, dict[str, Tensor]]:
    """The TIS weight of every token, and detached metrics.

    logp_train: (N, T) the trainer's log-probs of the sampled tokens (any gradient is dropped).
    logp_engine: (N, T) the rollout engine's log-probs of the same tokens.  mask: (N, T) bool or 0/1.
    cap: C > 0, finite (verl's and TRL's default is 2; C < 1 would down-weight even on-policy tokens).
    Returns (weight (N, T) detached, 0 at masked positions and where logp_engine is NaN or +inf, {"weight_mean",
    "capped_frac", "invalid_frac"}: 0-d tensors over the unmasked tokens (0 when there are none); capped_frac is
    the fraction whose ratio exceeded the cap, invalid_frac the fraction whose engine log-prob was NaN or +inf).
    """
    check_tensor("logp_train", logp_train, ndim=2)
    check_same_shape("logp_train", logp_train, logp_engine=logp_engine, mask=mask)
    check_number("cap", cap, low=0.0, low_open=True)
    if math.isinf(cap):
        raise ValueError("cap must be finite (no truncation is tis_cap=None, not inf)")
    check_number("max_log_ratio", max_log_ratio, low=0.0, low_open=True)
    m = as_bool_mask(mask)
    engine = logp_engine.detach().float()
    invalid = engine.isnan() | (engine == float("inf"))
    log_ratio = (logp_train.detach().float() - engine).clamp(-max_log_ratio, max_log_ratio)
    ratio = log_ratio.exp().masked_fill(invalid, 0.0)
    weight = ratio.clamp(max=cap).masked_fill(~m, 0.0)
    metrics = {"weight_mean": masked_mean(weight, m), "capped_frac": masked_mean((ratio > cap).float(), m),
               "invalid_frac": masked_mean(invalid.float(), m)}
    return weight.to(logp_train.dtype), {k: v.detach() for k, v in metrics.items()}
