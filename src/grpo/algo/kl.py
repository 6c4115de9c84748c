"""Per-token estimators of KL(pi_theta || pi_ref) from log-probabilities of tokens sampled from pi_theta.

With d = ref_logp - logp (log of pi_ref / pi_theta at the sampled token), Schulman's estimators are

    k1 = -d = logp - ref_logp            unbiased, can be negative, high variance
    k2 = d^2 / 2                          biased, never negative, low variance
    k3 = exp(d) - d - 1                   unbiased and never negative: DeepSeekMath eq. 4, the seed's D_KL

No clamp is applied to k1 or k2. For k3 the exponent input d is clamped to [-20, 20] (as NeMo RL does), so exp
cannot overflow; inside that range the value is exact, and beyond it k3 is the value at the boundary (e^20 - 21
for d > 20) with zero gradient. No output clamp (verl and NeMo clip k3 at 10; we do not).
k3 is computed as expm1(d) - d, which is exactly the same quantity, but stays >= 0 under rounding (exp(d) - d - 1
can give -1e-16 for tiny d) and keeps its precision when pi_theta and pi_ref nearly agree.
As a loss, k3's expected gradient is that of KL(pi_ref || pi_theta), not the reverse KL (ALGORITHMS.md §8 (b)).
Masking and averaging are the caller's (`grpo.algo.aggregate`).
"""

from __future__ import annotations

from torch import Tensor

from grpo.algo._checks import check_choice, check_same_shape, check_tensor

__all__ = ["KL_KINDS", "K3_EXP_CLAMP", "kl_estimate"]

KL_KINDS = ("k1", "k2", "k3")
K3_EXP_CLAMP = 20.0


def kl_estimate(logp: Tensor, ref_logp: Tensor, *, kind: str = "k3") -> Tensor:
    """Per-token KL estimate between the policy and the reference.

    logp: (N, T) policy log-probs of the sampled tokens (gradient flows through it).  ref_logp: (N, T).
    kind: "k1", "k2" or "k3".  Returns (N, T); masked positions are not zeroed here.
    """
    check_choice("kind", kind, KL_KINDS)
    check_tensor("logp", logp)
    check_same_shape("logp", logp, ref_logp=ref_logp)
    if kind == "k1":
        return logp - ref_logp
    if kind == "k2":
        return 0.5 * (logp - ref_logp).square()
    d = (ref_logp - logp).clamp(-K3_EXP_CLAMP, K3_EXP_CLAMP)
    return d.expm1() - d  # = exp(d) - 1 - d; expm1 keeps it >= 0 and accurate for |d| << 1
