"""Trainer-level wiring of PPO (algo.advantage=gae): the KL to the reference folded into the per-token rewards
(kl.coef, kl.estimator), GAE with the critic's values (algo.gamma, algo.lam), whitening over the batch, the
token-mean clipped surrogate, and the critic's own update (algo.value_coef, value_clip, value_lr), against a naive
reference written here (loops over rows and tokens, no grpo.algo).

    r_t = -beta * KL_t(pi_old || pi_ref)  (+ the completion's reward at its last token)
    delta_t = r_t + gamma * V_{t+1} - V_t,   A_t = delta_t + gamma * lam * A_{t+1}   (V, A after the last token: 0)
    A <- (A - mean) / sqrt(var + 1e-8) over every token of the batch (Bessel variance)
"""

from __future__ import annotations

import copy
import math

import torch
from wiring_helpers import one_thread  # noqa: F401  (an autouse fixture)
from wiring_helpers import (Setting, StepSpy, assert_matches, fixed_step, kl_term, load_params, perturb_,
                            reference_grad, rel, row_logprobs, rows_of)

G = 4
LOSS = Setting(advantage="gae", aggregate="token_mean")  # the policy loss of the ppo preset (no KL in the loss)


@torch.no_grad()
def ppo_advantages(policy, ref, critic, rows, *, beta, gamma, lam, estimator="k1") -> list[list[float]]:
    """Whitened GAE advantages, one list of per-token floats per row."""
    return ppo_targets(policy, ref, critic, rows, beta=beta, gamma=gamma, lam=lam, estimator=estimator)[0]


@torch.no_grad()
def ppo_targets(policy, ref, critic, rows, *, beta, gamma, lam, estimator="k1"):
    """(whitened advantages, returns = GAE + V_old, V_old): per row, lists of per-token floats."""
    per_row, returns, old_values = [], [], []
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
        returns.append([a + v for a, v in zip(adv, values)])
        old_values.append(values)
    tokens = [a for row in per_row for a in row]
    mean = sum(tokens) / len(tokens)
    var = sum((a - mean) ** 2 for a in tokens) / (len(tokens) - 1)
    return [[(a - mean) / math.sqrt(var + 1e-8) for a in row] for row in per_row], returns, old_values


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


def critic_grad(critic, rows, returns, old_values, *, clip: float, coef: float) -> dict[str, torch.Tensor]:
    """Gradient of coef * token-mean of 0.5 * max((V - R)^2, (V_old + clip(V - V_old, +-clip) - R)^2)."""
    critic = copy.deepcopy(critic)
    critic.zero_grad(set_to_none=True)
    total, count = 0.0, 0
    for row, ret, old in zip(rows, returns, old_values):
        L, n = len(row.prompt), len(row.completion)
        ids = torch.tensor([row.prompt + row.completion])
        values = critic(ids, torch.ones_like(ids))[0, L - 1:L - 1 + n]
        for t in range(n):
            clipped = old[t] + (values[t] - old[t]).clamp(-clip, clip)
            total = total + 0.5 * torch.maximum((values[t] - ret[t]) ** 2, (clipped - ret[t]) ** 2)
            count += 1
    (coef * total / count).backward()
    return {k: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for k, p in critic.named_parameters()}


def test_the_critic_update_uses_value_coef_value_clip_and_value_lr(make_trainer):
    """Two epochs: the critic's first gradient is value_coef times the token-mean value loss against the returns
    (no clip can bind at V = V_old), its first step is AdamW's at value_lr, and its second gradient, with V moved,
    has the value clip binding."""
    saved, spies = {}, {}

    def before(trainer):
        saved["critic"] = copy.deepcopy(trainer.critic.model)
        spies["critic"] = StepSpy(trainer.critic.optimizer, trainer.critic.model)

    coef, clip, lr = 0.5, 0.002, 0.01
    trainer, spy, calls, initial = fixed_step(make_trainer, LOSS.but(epochs=2), f"algo.value_coef={coef}",
                                              f"algo.value_clip={clip}", f"algo.value_lr={lr}", before=before)
    rows, critic_spy = rows_of(calls[0]), spies["critic"]
    # kl.coef = 0: no KL in the rewards (the reference argument is then unused)
    _, returns, old_values = ppo_targets(initial, initial, saved["critic"], rows, beta=0.0, gamma=1.0, lam=1.0)
    assert len(critic_spy.grads) == 2

    def grad(model, **kw):
        return critic_grad(model, rows, returns, old_values, **({"clip": clip, "coef": coef} | kw))

    first = grad(saved["critic"])
    assert_matches(critic_spy.grads[0], first, grad(saved["critic"], coef=1.0))
    step = {k: critic_spy.params[1][k] - critic_spy.params[0][k] for k in first}
    adam = {k: -lr * g / (g.abs() + 1e-8) for k, g in critic_spy.grads[0].items()}  # AdamW's first step, no decay
    assert rel(step, adam) < 1e-3  # (the default value_lr=1e-4 would be 100 times smaller: rel 0.99)
    moved = load_params(saved["critic"], critic_spy.params[1])
    assert_matches(critic_spy.grads[1], grad(moved), grad(moved, clip=0.2))
