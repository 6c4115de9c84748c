"""grpo.algo: the pure tensor math of GRPO, its variants and the PPO baseline. Imports torch only.

Advantages (advantages.py), the clipped surrogate policy loss (policy_loss.py), KL estimators (kl.py), loss
aggregation with global counts (aggregate.py), log-probabilities and entropy from logits (logprobs.py), masked
reductions and whitening (masked.py), the clipped value loss (value_loss.py) and DAPO's overlong reward shaping
(shaping.py). docs/math.md gives every formula, the config axis that selects it, and the test vectors.
"""

from grpo.algo.advantages import (
    SCALE_MODES,
    STD_MODES,
    dr_grpo_advantages,
    gae,
    group_advantages,
    rloo_advantages,
    zero_std_groups,
)
from grpo.algo.aggregate import AGGREGATE_MODES, aggregate
from grpo.algo.kl import KL_KINDS, kl_estimate
from grpo.algo.logprobs import entropy_from_logits, hidden_token_logprobs, token_logprobs
from grpo.algo.masked import high_entropy_mask, masked_mean, masked_sum, masked_var, masked_whiten
from grpo.algo.policy_loss import RATIO_LEVELS, cispo_surrogate, clipped_surrogate
from grpo.algo.shaping import overlong_penalty
from grpo.algo.value_loss import clipped_value_loss

__all__ = [
    "AGGREGATE_MODES",
    "KL_KINDS",
    "RATIO_LEVELS",
    "SCALE_MODES",
    "STD_MODES",
    "aggregate",
    "cispo_surrogate",
    "clipped_surrogate",
    "clipped_value_loss",
    "dr_grpo_advantages",
    "entropy_from_logits",
    "gae",
    "group_advantages",
    "hidden_token_logprobs",
    "high_entropy_mask",
    "kl_estimate",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "overlong_penalty",
    "rloo_advantages",
    "token_logprobs",
    "zero_std_groups",
]
