"""Trainer-level wiring of PPO (algo.advantage=gae): the KL to the reference folded into the per-token rewards
(kl.coef, kl.estimator), GAE with the critic's values (algo.gamma, algo.lam), whitening over the batch, and the
token-mean clipped surrogate, against a naive reference written here (loops over rows and tokens, no grpo.algo).

    r_t = -beta * KL_t(pi_old || pi_ref)  (+ the completion's reward at its last token)
    delta_t = r_t + gamma * V_{t+1} - V_t,   A_t = delta_t + gamma * lam * A_{t+1}   (V, A after the last token: 0)
    A <- (A - mean) / sqrt(var + 1e-8) over every token of the batch (Bessel variance)
"""

from __future__ import annotations

import copy
import math

import torch
from wiring_helpers import one_thread  # noqa: F401  (an autouse fixture)
from wiring_helpers import Setting, assert_matches, fixed_step, kl_term, perturb_, reference_grad, row_logprobs, rows_of

G = 4
LOSS = Setting(advantage="gae", aggregate="token_mean")  # the policy loss of the ppo preset (no KL in the loss)


@torch.no_grad()
def ppo_advantages(policy, ref, critic, rows, *, beta, gamma, lam, estimator="k1") -> list[list[float]]:
    per_row = []
    for row in rows:
        n, L = len(row.completion), len(row.prompt)
        old = row_logprobs(policy, row, 1.0)[0]
        ref_logp = row_logprobs(ref, row, 1.0)[0]
        ids = torch.tensor([row.prompt + row.completion])
        values = critic(ids, torch.ones_like(ids))[0, L - 1:L - 1 + n].tolist()
        rewards = [-beta * float(kl_term(old[t], float(ref_logp[t]), estimator)) for t in range(n)]
        rewards[-1] += row.reward
        adv, next_value, next_adv = [0.0] * n, 0.0, 0.0
        for t in reversed(range(n)):
            delta = rewards[t] + gamma * next_value - values[t]
            adv[t] = next_adv = delta + gamma * lam * next_adv
            next_value = values[t]
        per_row.append(adv)
    tokens = [a for row in per_row for a in row]
    mean = sum(tokens) / len(tokens)
    var = sum((a - mean) ** 2 for a in tokens) / (len(tokens) - 1)
    return [[(a - mean) / math.sqrt(var + 1e-8) for a in row] for row in per_row]


def test_ppo_folds_the_kl_into_the_rewards_and_uses_gamma_and_lam(make_trainer):
    saved = {}

    def before(trainer):
        saved["ref"] = copy.deepcopy(trainer.policy)
        saved["critic"] = copy.deepcopy(trainer.critic.model)
        perturb_(trainer.policy, 0.06)  # pi_old != pi_ref, so the KL part of the rewards is not 0

    beta, gamma, lam = 0.2, 0.9, 0.8
    trainer, spy, calls, initial = fixed_step(make_trainer, LOSS, f"kl.coef={beta}", "kl.estimator=k1",
                                              f"algo.gamma={gamma}", f"algo.lam={lam}", before=before)
    rows = rows_of(calls[0])

    def grad(**kw):
        args = dict(beta=beta, gamma=gamma, lam=lam) | kw
        adv = ppo_advantages(initial, saved["ref"], saved["critic"], rows, **args)
        return reference_grad(initial, rows, LOSS, G=G, adv=adv)

    want = grad()
    assert_matches(spy.grads[0], want, grad(beta=0.0))  # the KL in the rewards is not ignored
    assert_matches(spy.grads[0], want, grad(gamma=1.0, lam=1.0))  # nor are gamma and lam
    assert_matches(spy.grads[0], want, grad(estimator="k3"))  # the estimator is k1 as configured
