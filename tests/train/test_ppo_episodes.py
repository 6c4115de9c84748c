"""PPO with multi-turn episodes: the environment's tokens are not actions. GAE runs over the policy's tokens only
(the value at the next *policy* token bootstraps across an environment reply, the reward sits at the episode's
last policy token), the value loss covers the policy's tokens only, and the critic's forward attends every token.

Checked on a hand-built batch with gaps in the loss mask against a naive reference written here (one unpadded
forward per episode for V, a plain loop over the policy positions for GAE, whitening and the value loss), and by a
short PPO run with a tiny environment defined here."""

from __future__ import annotations

import math

import pytest
import torch
from train_helpers import eos_logit

from grpo.config import load_config
from grpo.envs.base import EnvReply
from grpo.models.builtin import build_model, build_tokenizer
from grpo.models.value import ValueModel
from grpo.tracking.metrics import read_jsonl
from grpo.train.ppo import Critic
from grpo.train.update import PolicyBatch

SIZE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=64)
BETA, GAMMA, LAM = 0.1, 0.9, 0.8  # gamma < 1 so that a wrong discount across the gap shows


def _episodes(tok):
    """P=2 prompts (left-padded), G=2 episodes each. Each row is a list of (text, is_policy) turns:
    row 0 policy / tool / policy / tool (a reply after the last policy turn: the reward stays on the policy's last
    token); row 1 policy / tool / policy / tool / policy; row 2 one policy turn (single-turn);
    row 3 policy / tool / policy (its reward is missing)."""
    return (["3*4?", "12+5=?"],
            [[("ca7", True), ("<12>", False), ("12", True), ("<ok>", False)],
             [("c", True), ("<1>", False), ("x9", True), ("<ok>", False), ("13", True)],
             [("17", True)],
             [("cal", True), ("<17>", False), ("1", True)]])


def gap_batch(tok) -> tuple[PolicyBatch, list[list[int]]]:
    """The batch of `_episodes`: completion ids right-padded, `mask` = policy tokens, `attention_mask` = every real
    token; the environment's turns are the gaps. Returns (batch, the unpadded prompt ids per prompt)."""
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    eos, pad = tok.eos_token_id, tok.pad_token_id
    prompts, rows = _episodes(tok)
    prompt_ids = [enc(p) for p in prompts]
    L = max(map(len, prompt_ids)) + 1
    seqs = [[(enc(text) + ([eos] if policy else []), policy) for text, policy in row] for row in rows]
    T = max(sum(len(ids) for ids, _ in row) for row in seqs) + 2  # right padding on every row
    ids = torch.full((4, T), pad)
    attn, loss = torch.zeros((4, T)), torch.zeros((4, T))
    for i, row in enumerate(seqs):
        k = 0
        for part, policy in row:
            ids[i, k:k + len(part)] = torch.tensor(part)
            attn[i, k:k + len(part)] = 1
            loss[i, k:k + len(part)] = float(policy)
            k += len(part)
    p_ids = torch.full((2, L), pad)
    p_mask = torch.zeros((2, L), dtype=torch.long)
    for j, p in enumerate(prompt_ids):
        p_ids[j, L - len(p):] = torch.tensor(p)
        p_mask[j, L - len(p):] = 1
    batch = PolicyBatch(prompt_ids=p_ids, prompt_mask=p_mask, completion_ids=ids, mask=loss, adv=torch.zeros(4),
                        group_size=2, attention_mask=attn)
    return batch, prompt_ids


@torch.no_grad()
def naive_values(value: ValueModel, batch: PolicyBatch, prompt_ids) -> list[list[float]]:
    """V(state before completion token t) per row, from one forward of the unpadded prompt + whole episode."""
    out = []
    for i in range(batch.completion_ids.shape[0]):
        n, prompt = int(batch.attention_mask[i].sum()), prompt_ids[i // batch.group_size]
        seq = torch.tensor([prompt + batch.completion_ids[i, :n].tolist()])
        v = value(seq, torch.ones_like(seq))[0]
        out.append([float(v[len(prompt) - 1 + t]) for t in range(n)])
    return out


def naive_targets(values, batch: PolicyBatch, rewards, kl) -> tuple[dict, dict]:
    """Plain loops over the policy positions of each present row: rewards r_t = -beta*kl_t (+ the score at the
    last policy token), delta_t = r_t + gamma*V_next - V_t with V_next the value at the next policy position (0
    after the last), A_t = delta_t + gamma*lam*A_next, R_t = A_t + V_t. Returns ({(i, t): A}, {(i, t): R})."""
    adv, ret = {}, {}
    for i in range(batch.mask.shape[0]):
        if math.isnan(rewards[i]):
            continue
        policy = [t for t in range(batch.mask.shape[1]) if batch.mask[i, t] == 1]
        next_v, next_a = 0.0, 0.0
        for j in reversed(range(len(policy))):
            t = policy[j]
            r = -BETA * float(kl[i, t]) + (rewards[i] if j == len(policy) - 1 else 0.0)
            a = r + GAMMA * next_v - values[i][t] + GAMMA * LAM * next_a
            adv[i, t], ret[i, t] = a, a + values[i][t]
            next_v, next_a = values[i][t], a
    return adv, ret


def _critic(tok, *overrides):
    cfg = load_config("ppo", ["rollout.group_size=2", f"algo.gamma={GAMMA}", f"algo.lam={LAM}", f"kl.coef={BETA}",
                              "kl.estimator=k1", "algo.value_coef=0.5", "algo.epochs=1", "optim.max_grad_norm=1e9",
                              *overrides])
    torch.manual_seed(0)
    policy = build_model(tok, seed=0, size=SIZE).float()
    critic = Critic(policy, cfg, total_updates=4)
    with torch.no_grad():  # a head with visible values (the default init is 1e-3 wide)
        critic.model.head.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    return critic, cfg


def test_gae_over_policy_tokens_and_the_value_loss_mask_match_a_naive_loop():
    tok = build_tokenizer()
    batch, prompt_ids = gap_batch(tok)
    assert ((batch.attention_mask == 1) & (batch.mask == 0)).sum(-1).tolist()[:3] == [8, 7, 0]  # the gaps
    critic, cfg = _critic(tok)
    g = torch.Generator().manual_seed(2)
    # log-probs at the policy's tokens; garbage at the environment's (never read) and 0 at padding
    env = (batch.attention_mask == 1) & (batch.mask == 0)
    batch.old_logp = torch.where(env, 7.0, -torch.rand(batch.mask.shape, generator=g) * batch.mask)
    batch.ref_logp = torch.where(env, -9.0, -torch.rand(batch.mask.shape, generator=g) * batch.mask)
    kl = batch.old_logp - batch.ref_logp
    rewards = [1.0, 0.0, 0.5, float("nan")]

    adv, metrics = critic.advantages(batch, torch.tensor(rewards))
    _, old_values, returns, keep = critic._targets

    values = naive_values(critic.model, batch, prompt_ids)  # the critic attends the environment's tokens
    policy = batch.mask == 1
    for i, t in policy.nonzero().tolist():
        assert float(old_values[i, t]) == pytest.approx(values[i][t], abs=1e-5), (i, t)
    want_adv, want_ret = naive_targets(values, batch, rewards, kl)
    tokens = list(want_adv.values())  # whitening over the policy tokens of the present rows (Bessel variance)
    mean = sum(tokens) / len(tokens)
    std = math.sqrt(sum((a - mean) ** 2 for a in tokens) / (len(tokens) - 1) + 1e-8)
    for (i, t), a in want_adv.items():
        assert float(adv[i, t]) == pytest.approx((a - mean) / std, abs=1e-4), (i, t)
        assert float(returns[i, t]) == pytest.approx(want_ret[i, t], abs=1e-5), (i, t)
    assert torch.all(adv[~keep] == 0)  # environment, padding, and the row without a reward
    assert torch.all(returns[~policy] == 0)  # (the reward-less row's returns are not fitted: `keep` below)
    # the value loss's mask: the policy's tokens of the rows with a reward, never the environment's
    want_keep = policy.clone()
    want_keep[3] = False
    assert torch.equal(keep, want_keep)
    assert metrics["ppo/kl_mean"] == pytest.approx(float(kl[policy].mean()), abs=1e-6)

    # Critic.update: before its step V == V_old (nothing clipped), so the loss is the naive token mean over `keep`
    out = critic.update(batch)
    n = len(want_ret)
    want = cfg.algo.value_coef * sum(0.5 * (values[i][t] - r) ** 2 for (i, t), r in want_ret.items()) / n
    assert out["loss/value"] == pytest.approx(want, rel=1e-4)
    assert out["critic/clip_frac"] == 0.0 and math.isfinite(out["critic/grad_norm"])


def test_the_environment_reply_reaches_the_next_turns_values_but_not_the_targets_of_its_own_tokens():
    tok = build_tokenizer()
    batch, _ = gap_batch(tok)
    critic, _ = _critic(tok)
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.25])
    critic.advantages(batch, rewards)
    base = critic._targets[1].clone()
    other = PolicyBatch(**{**batch.__dict__, "completion_ids": batch.completion_ids.clone()})
    other.completion_ids[0, 4] = tok.convert_tokens_to_ids("9")  # row 0's tool reply "<12>" -> "<92>"
    critic.advantages(other, rewards)
    moved = (critic._targets[1][0] - base[0]).abs()
    assert moved[:4].max() == 0  # the first turn and the reply's own first token: before the change
    assert moved[8:11].min() > 1e-6  # the second policy turn's values see the changed reply
    assert torch.equal(critic._targets[1][1:], base[1:])


class OneToolReply:
    """A tiny environment: answers the first policy turn with a tool result, ends the episode on the second."""

    def __init__(self, prompt):
        self.k = 0

    def step(self, turn):
        self.k += 1
        if self.k == 1:
            return EnvReply(message="<result>42</result>\n", tool_calls=1, tool_errors=0)
        return EnvReply(done=True)


def test_a_short_ppo_run_with_episodes_trains_the_critic_on_policy_tokens(make_trainer):
    trainer = make_trainer("data.task=tools", "env.max_turns=3", "train.steps=3", "algo.advantage=gae",
                           "algo.aggregate=token_mean", "algo.lam=0.95", "kl.coef=0.05", "kl.estimator=k1",
                           "rollout.max_new_tokens=6", "rollout.group_size=2", "rollout.prompts_per_step=2")
    trainer.env_factory = OneToolReply
    eos_logit(trainer, 4.0)  # turns of 1..6 tokens, most of them ending in EOS: policy, tool, policy
    seen = []
    advantages = trainer.critic.advantages

    def spy(batch, rewards):
        out = advantages(batch, rewards)
        seen.append((batch.mask.clone(), batch.attention_mask.clone(), trainer.critic._targets[3].clone()))
        return out

    trainer.critic.advantages = spy
    trainer.train()
    rows = [r for r in read_jsonl(trainer.run_dir / "metrics.jsonl") if "loss/value" in r]
    assert len(rows) == 3
    for r in rows:
        for key in ("loss/value", "critic/grad_norm", "critic/explained_var", "critic/value_mean", "loss/policy"):
            assert math.isfinite(r[key]), (key, r)
    assert sum(r["env/turns_mean"] for r in rows) > 3  # some episodes had a second turn
    gaps = 0
    for mask, attn, keep in seen:
        env = (attn == 1) & (mask == 0)
        gaps += int(env.sum())
        assert not keep[env].any() and torch.equal(keep, mask.bool())  # every reward present: keep = policy tokens
    assert gaps > 0
