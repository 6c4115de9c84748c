"""Registries of the interchangeable parts of the update: advantage estimators and policy losses.

A new algorithm is one function registered here plus a preset that names it (`algo.advantage`, `algo.policy_loss`);
the trainer looks the function up by name and never branches on it. One keyword-only signature per kind:

    advantage estimator   fn(rewards, *, group_size, std, scale, eps) -> advantages
                          rewards (N,) prompt-major, NaN = missing; advantages (N,)
    policy loss           fn(logp, old_logp, adv, mask, *, clip_low, clip_high, level, dual_clip) -> (loss, metrics)
                          logp, old_logp, mask (N, T); adv (N,) or (N, T); loss (N, T), 0 at masked positions;
                          metrics: 0-d detached tensors (clip_frac, clip_frac_low, clip_frac_high, ratio_mean, ...)

An estimator or loss may ignore settings it has no use for (RLOO has no std). An unknown name is a ValueError that
lists the known ones. GAE (PPO) is not in the estimator registry: it needs a critic's per-token values, so it stays
its own explicit path (grpo.algo.gae, driven by train/ppo.py).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from grpo.algo.advantages import dr_grpo_advantages, group_advantages, rloo_advantages
from grpo.algo.policy_loss import cispo_surrogate, clipped_surrogate

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "POLICY_LOSSES",
    "register_advantage",
    "register_policy_loss",
    "advantage_estimator",
    "policy_loss",
]

ADVANTAGE_ESTIMATORS: dict[str, Callable[..., Tensor]] = {}
POLICY_LOSSES: dict[str, Callable[..., tuple[Tensor, dict[str, Tensor]]]] = {}


def register_advantage(name: str):
    """Decorator: register `fn(rewards, *, group_size, std, scale, eps) -> (N,)` as `algo.advantage=name`."""
    return _register(ADVANTAGE_ESTIMATORS, name, "advantage estimator")


def register_policy_loss(name: str):
    """Decorator: register `fn(logp, old_logp, adv, mask, *, clip_low, clip_high, level, dual_clip)` as
    `algo.policy_loss=name`."""
    return _register(POLICY_LOSSES, name, "policy loss")


def advantage_estimator(name: str) -> Callable[..., Tensor]:
    """The registered advantage estimator `name`; ValueError listing the known ones otherwise."""
    return _lookup(ADVANTAGE_ESTIMATORS, name, "algo.advantage", "advantage estimator")


def policy_loss(name: str) -> Callable[..., tuple[Tensor, dict[str, Tensor]]]:
    """The registered policy loss `name`; ValueError listing the known ones otherwise."""
    return _lookup(POLICY_LOSSES, name, "algo.policy_loss", "policy loss")


def _register(table: dict, name: str, kind: str):
    def deco(fn):
        if name in table and table[name] is not fn:
            raise ValueError(f"a {kind} named {name!r} is already registered ({table[name].__name__})")
        table[name] = fn
        return fn

    return deco


def _lookup(table: dict, name: str, key: str, kind: str):
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"{key}: unknown {kind} {name!r}; known: {', '.join(sorted(table))}") from None


# ------------------------------------------------------------------------------------------------ the built-ins


@register_advantage("grpo")
def _grpo(rewards: Tensor, *, group_size: int, std: str, scale: str, eps: float) -> Tensor:
    """The group z-score (DeepSeekMath; the seed's formula 4.1 with std="population")."""
    return group_advantages(rewards, group_size, std=std, scale=scale, eps=eps)


@register_advantage("dr_grpo")
def _dr_grpo(rewards: Tensor, *, group_size: int, std: str, scale: str, eps: float) -> Tensor:
    """Centre only: r_i - mean(r) (Dr. GRPO)."""
    return dr_grpo_advantages(rewards, group_size)


@register_advantage("rloo")
def _rloo(rewards: Tensor, *, group_size: int, std: str, scale: str, eps: float) -> Tensor:
    """Leave-one-out baseline: r_i - mean of the other rewards of the group."""
    return rloo_advantages(rewards, group_size)


@register_policy_loss("clip")
def _clip(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, *, clip_low: float, clip_high: float,
          level: str, dual_clip: float | None) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's clipped surrogate, token or sequence (GSPO) ratio, optional dual clip."""
    return clipped_surrogate(logp, old_logp, adv, mask, clip_low=clip_low, clip_high=clip_high, level=level,
                             dual_clip=dual_clip)


@register_policy_loss("cispo")
def _cispo(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, *, clip_low: float, clip_high: float,
           level: str, dual_clip: float | None) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO: the detached, clipped importance weight times log pi. Token level with no dual clip: the config
    refuses ratio_level=sequence and dual_clip with it (grpo.config)."""
    return cispo_surrogate(logp, old_logp, adv, mask, clip_low=clip_low, clip_high=clip_high)
