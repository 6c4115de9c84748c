"""Advantage estimators: group-relative (GRPO, Dr. GRPO, RLOO) from scalar rewards, and GAE from a critic.

Rewards arrive prompt-major: N = P * G rows, row i belongs to group i // G. A NaN reward means "missing" (a reward
function returned None): it is left out of its group's statistics and its advantage is exactly 0.

GRPO (DeepSeekMath §4.1.2; the seed's formula 4.1) scores each completion against its own group:

    A_i = (r_i - mean(r)) / (std(r) + eps)

where mean and std run over the present rewards of the group. `std="population"` divides the squared deviations by
G (the seed's formula 4.1: sqrt(1/G * sum_j (r_j - mean)^2)); `std="sample"` divides by G - 1 (Bessel; what TRL,
verl and OpenRLHF compute). `scale` picks the divisor: "group" is the group std (the paper), "batch" is the std of
all present rewards of the batch, not group-centred (TRL `scale_rewards="batch"`), "none" divides by nothing (centre
only). The seed's worked std values (4.27 for [10, 0, 10, 7]; 4.2 and 0.58 for its cases A and B) match neither
definition (population 4.085 / 4.031 / 0.5, sample 4.717 / 4.655 / 0.577); this code follows the formula.

Dr. GRPO (arXiv 2503.20783) keeps only the centring: A_i = r_i - mean(r).
RLOO (arXiv 2402.14740) subtracts the mean of the other present rewards: A_i = r_i - sum_{j != i} r_j / (G' - 1),
which equals G'/(G'-1) * (r_i - mean(r)) with G' the number of present rewards.

For all three, a group whose present rewards are all equal, or which has fewer than two present rewards, gets
advantage exactly 0 (never NaN, never eps-sized noise from rounding in the mean); so does a group whose std
underflows to 0 when eps = 0.

GAE (Schulman et al. 2016; the PPO baseline) works per token: delta_t = r_t + gamma * V_{t+1} - V_t and
A_t = delta_t + gamma * lam * A_{t+1}, with V and A after the last response token taken as 0; returns R_t = A_t + V_t.
Masked positions (padding, or tool/observation tokens in multi-turn rollouts) are skipped by the recursion exactly as in
verl's `compute_gae_advantage_return`: the next *unmasked* token supplies V_{t+1} and A_{t+1}, and rewards and values at
masked positions are never read. Whitening is separate (`grpo.algo.masked.masked_whiten`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from grpo.algo._checks import as_bool_mask, check_choice, check_number, check_same_shape, check_tensor, float_dtype

__all__ = [
    "STD_MODES",
    "SCALE_MODES",
    "group_advantages",
    "dr_grpo_advantages",
    "rloo_advantages",
    "zero_std_groups",
    "gae",
]

STD_MODES = ("population", "sample")
SCALE_MODES = ("group", "batch", "none")


class _GroupStats(NamedTuple):
    r: Tensor  # (P, G) rewards, NaN where missing
    present: Tensor  # (P, G) bool
    count: Tensor  # (P, 1) number of present rewards
    dev: Tensor  # (P, G) r - group mean, 0 where missing
    flat: Tensor  # (P, 1) bool: fewer than two present rewards, or all present rewards equal


def _grouped(rewards: Tensor, group_size: int) -> Tensor:
    """Check the arguments and view rewards (N,) as (P, G) floats."""
    check_tensor("rewards", rewards, ndim=1)
    check_number("group_size", group_size, integer=True)
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2, got {group_size}")
    n = rewards.shape[0]
    if n % group_size:
        raise ValueError(f"rewards has {n} rows, not divisible by group_size={group_size}")
    return rewards.to(float_dtype(rewards)).reshape(-1, group_size)


def _group_stats(rewards: Tensor, group_size: int) -> _GroupStats:
    r = _grouped(rewards, group_size)
    present = ~torch.isnan(r)
    count = present.sum(dim=1, keepdim=True)
    mean = r.where(present, 0).sum(dim=1, keepdim=True) / count.clamp(min=1)
    dev = (r - mean).where(present, 0)
    hi = r.where(present, -torch.inf).amax(dim=1, keepdim=True)
    lo = r.where(present, torch.inf).amin(dim=1, keepdim=True)
    flat = (count < 2) | (hi == lo)
    return _GroupStats(r, present, count, dev, flat)


def _std(sq_sum: Tensor, count: Tensor, std: str) -> Tensor:
    """sqrt(sum of squared deviations / count) for "population", / (count - 1) for "sample"; 0 for empty."""
    ddof = 1 if std == "sample" else 0
    return (sq_sum / (count - ddof).clamp(min=1)).sqrt()


def group_advantages(
    rewards: Tensor, group_size: int, *, std: str = "population", scale: str = "group", eps: float = 1e-6
) -> Tensor:
    """GRPO group-normalised advantages, A_i = (r_i - mean_group) / (std + eps).

    rewards: (N,) float, prompt-major, NaN = missing.  group_size: G >= 2 with N % G == 0.
    std: "population" (1/G, the seed's formula 4.1) or "sample" (1/(G-1)).
    scale: "group" (divide by the group std), "batch" (by the std of all present rewards in the batch), "none".
    Returns (N,): 0 for missing rewards and for groups with zero spread or fewer than two present rewards.
    """
    check_choice("std", std, STD_MODES)
    check_choice("scale", scale, SCALE_MODES)
    check_number("eps", eps, low=0.0)
    s = _group_stats(rewards, group_size)
    if scale == "group":
        denom = _std(s.dev.square().sum(dim=1, keepdim=True), s.count, std) + eps
    elif scale == "batch":
        n_present = s.count.sum()
        batch_mean = s.r.where(s.present, 0).sum() / n_present.clamp(min=1)
        sq_sum = (s.r - batch_mean).where(s.present, 0).square().sum()
        denom = _std(sq_sum, n_present, std) + eps
    else:
        denom = torch.ones((), dtype=s.dev.dtype, device=s.dev.device)
    adv = s.dev / denom  # denom is 0 only with eps=0 and a std that is 0 or underflows (subnormal spreads)
    return adv.where(s.present & ~s.flat & (denom > 0), 0).reshape(-1)


def dr_grpo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """Dr. GRPO: A_i = r_i - mean_group (no std division).  rewards (N,), NaN = missing -> (N,)."""
    s = _group_stats(rewards, group_size)
    return s.dev.where(s.present & ~s.flat, 0).reshape(-1)


def rloo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """RLOO: A_i = r_i - mean of the other present rewards of the group.  rewards (N,), NaN = missing -> (N,)."""
    s = _group_stats(rewards, group_size)
    total = s.r.where(s.present, 0).sum(dim=1, keepdim=True)
    adv = s.r - (total - s.r) / (s.count - 1).clamp(min=1)
    return adv.where(s.present & ~s.flat, 0).reshape(-1)


def zero_std_groups(rewards: Tensor, group_size: int) -> Tensor:
    """(P,) bool: groups whose advantages are all 0 (present rewards all equal, or fewer than two present).

    For the `adv/zero_std_frac` metric and DAPO's dynamic sampling.  rewards (N,), NaN = missing.
    """
    return _group_stats(rewards, group_size).flat.reshape(-1)


@torch.no_grad()
def gae(token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over the unmasked tokens of each row.

    token_rewards, values, mask: (N, T).  gamma, lam in [0, 1].
    Returns (advantages, returns), both (N, T), 0 at masked positions, without gradient (computed under no_grad).
    Rewards and values at masked positions are ignored (the recursion skips them, as verl's multi-turn GAE does).
    """
    check_tensor("token_rewards", token_rewards, ndim=2)
    check_same_shape("token_rewards", token_rewards, values=values, mask=mask)
    check_number("gamma", gamma, low=0.0, high=1.0)
    check_number("lam", lam, low=0.0, high=1.0)
    m = as_bool_mask(mask)
    dtype = torch.promote_types(float_dtype(token_rewards), float_dtype(values))
    r, v = token_rewards.to(dtype), values.to(dtype)
    n, t_len = r.shape
    next_value = torch.zeros(n, dtype=dtype, device=r.device)
    last_adv = torch.zeros_like(next_value)
    columns: list[Tensor] = [next_value] * t_len
    for t in reversed(range(t_len)):
        candidate = r[:, t] + gamma * next_value - v[:, t] + gamma * lam * last_adv
        present = m[:, t]
        last_adv = candidate.where(present, last_adv)
        next_value = v[:, t].where(present, next_value)
        columns[t] = candidate.where(present, 0)
    adv = torch.stack(columns, dim=1) if t_len else r.new_zeros(n, 0)
    returns = (adv + v).where(m, 0)
    return adv, returns
