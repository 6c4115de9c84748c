"""PPO (preset `ppo`): the critic's value model, KL-in-reward GAE advantages, the clipped value loss, its own
optimizer, and a 2-step smoke run of the same Trainer (ALGORITHMS.md section 1 and the vectors of section 9)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers.tiny_models import tiny_model
from transformers import LlamaForCausalLM

from grpo.algo import clipped_value_loss, gae, masked_whiten
from grpo.config import load_config
from grpo.models.value import ValueModel, backbone_of
from grpo.train.ppo import Critic, token_rewards
from grpo.train.update import PolicyBatch, policy_update

TINY = {"vocab_size": 40, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 64, "pad_token_id": 0, "tie_word_embeddings": False}


def tiny_policy(seed: int = 0) -> LlamaForCausalLM:
    return tiny_model("llama", seed=seed, **TINY)


def ppo_cfg(*overrides: str):
    return load_config("ppo", ["train.steps=2", "rollout.group_size=2", "rollout.prompts_per_step=2", *overrides])


def random_batch(P: int = 2, G: int = 2, L: int = 5, T: int = 6, seed: int = 1) -> PolicyBatch:
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(1, 40, (P, L), generator=g)
    prompt_mask = torch.ones(P, L, dtype=torch.long)
    prompt_mask[0, :2] = 0  # left padding
    prompt_ids[0, :2] = 0
    mask = torch.ones(P * G, T)
    if P * G >= 4:
        mask[1, 4:] = 0  # right padding
        mask[2, 2:] = 0
    completion_ids = torch.randint(1, 40, (P * G, T), generator=g) * mask.long()
    return PolicyBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids, mask=mask,
                       adv=torch.zeros(P * G), group_size=G)


class FixedValues(torch.nn.Module):
    """A stand-in critic whose predictions are one trainable tensor (N, T) (for the loss vectors)."""

    def __init__(self, values: torch.Tensor):
        super().__init__()
        self.v = torch.nn.Parameter(values.clone())

    def completion_values(self, prompt_ids, prompt_mask, completion_ids, completion_mask, group_size):
        return self.v[: completion_ids.shape[0]]  # the tests' batches are one micro-batch


def critic_with(values: torch.Tensor, cfg) -> Critic:
    critic = Critic.__new__(Critic)
    from grpo.parallel import SINGLE

    critic.cfg, critic.model, critic._targets, critic.dist = cfg, FixedValues(values), None, SINGLE
    from grpo.train.optim import build_optimizer

    critic.optimizer, critic.scheduler = build_optimizer(critic.model.parameters(), cfg.optim, 10, lr=cfg.algo.value_lr)
    return critic


# ------------------------------------------------------------------ GAE and value-loss vectors (ALGORITHMS.md §9)
@pytest.mark.parametrize("gamma,lam,expected", [(1.0, 1.0, [0.5, 0.4, 0.3]), (1.0, 0.95, [0.46575, 0.385, 0.3]),
                                                (0.99, 0.95, [0.446829, 0.37515, 0.3])])
def test_gae_vectors_from_the_scalar_reward_at_the_last_token(gamma, lam, expected):
    mask = torch.ones(1, 3)
    r, kl_part = token_rewards(torch.tensor([1.0]), mask, None, 0.05)
    assert r.tolist() == [[0.0, 0.0, 1.0]] and kl_part.abs().sum() == 0
    values = torch.tensor([[0.5, 0.6, 0.7]])
    adv, ret = gae(r, values, mask, gamma=gamma, lam=lam)
    assert adv[0].tolist() == pytest.approx(expected, abs=1e-6)
    if gamma == 1.0 and lam == 1.0:
        assert ret[0].tolist() == pytest.approx([1.0, 1.0, 1.0])


def test_critic_advantages_are_whitened_gae_of_the_kl_folded_reward():
    cfg = ppo_cfg("algo.gamma=1.0", "algo.lam=0.95", "kl.coef=0.1", "kl.estimator=k1")
    batch = random_batch()
    g = torch.Generator().manual_seed(3)
    batch.old_logp = -torch.rand(batch.mask.shape, generator=g) * batch.mask
    batch.ref_logp = -torch.rand(batch.mask.shape, generator=g) * batch.mask
    values = torch.rand(batch.mask.shape, generator=g)
    critic = critic_with(values, cfg)
    rewards = torch.tensor([1.0, 0.0, 2.0, float("nan")])  # the last completion's reward is missing
    adv, metrics = critic.advantages(batch, rewards)
    m = batch.mask.bool()
    # hand-built token rewards: -beta * k1 everywhere, the score at the last unmasked token (row 3: 0)
    r = (-0.1 * (batch.old_logp - batch.ref_logp)) * batch.mask
    for i, last in enumerate([5, 3, 1, 5]):
        r[i, last] += [1.0, 0.0, 2.0, 0.0][i]
    ref_adv, ref_ret = gae(r, values * batch.mask, m, gamma=1.0, lam=0.95)
    keep = m.clone()
    keep[3] = False
    assert torch.allclose(adv, masked_whiten(ref_adv, keep), atol=1e-6)
    assert adv[3].abs().sum() == 0  # missing reward: advantage 0
    assert adv[m & keep].mean().abs() < 1e-5 and adv[m & keep].std() == pytest.approx(1.0, abs=1e-4)
    assert torch.equal(critic._targets[3], keep)  # nor is it fitted by the value loss
    assert torch.allclose(critic._targets[2][keep], ref_ret[keep])
    assert metrics["ppo/kl_reward_mean"] == pytest.approx(float(r.sum(-1)[:3].mean() - 3.0 / 3), abs=1e-6)
    assert set(metrics) >= {"critic/value_mean", "critic/explained_var", "critic/return_mean", "ppo/kl_reward_mean"}


@pytest.mark.parametrize("v,expected", [(0.6, 0.08), (0.9, 0.045), (0.2, 0.32)])
def test_value_loss_clipping_vectors(v, expected):
    # the per-token vector of ALGORITHMS.md §9: V_old=0.5, R=1, eps_v=0.2
    mask = torch.ones(1, 1)
    loss = clipped_value_loss(torch.tensor([[v]]), torch.tensor([[0.5]]), torch.tensor([[1.0]]), mask, clip=0.2)
    assert float(loss) == pytest.approx(expected)
    # and the same number out of Critic.update (token mean over the tokens, times value_coef)
    cfg = ppo_cfg("algo.value_clip=0.2", "algo.value_coef=1.0", "optim.max_grad_norm=1e9")
    batch = random_batch(P=1, G=2, T=3)
    batch.mask = torch.ones(2, 3)
    critic = critic_with(torch.full((2, 3), v), cfg)
    critic._targets = (id(batch), torch.full((2, 3), 0.5), torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool))
    out = critic.update(batch)
    assert out["loss/value"] == pytest.approx(expected, rel=1e-6)
    assert out["critic/clip_frac"] == (1.0 if abs(v - 0.5) > 0.2 else 0.0)
    # clipped: no gradient reaches V (the clipped branch is the max), so AdamW leaves V where it was
    moved = (critic.model.v - v).abs().max() > 0
    assert moved == (abs(v - 0.5) <= 0.2 or v < 0.5)  # V=0.2: unclipped branch (0.32) is the max and moves


def test_update_needs_advantages_first():
    cfg = ppo_cfg()
    critic = critic_with(torch.zeros(4, 6), cfg)
    with pytest.raises(RuntimeError, match="advantages"):
        critic.update(random_batch())


# ------------------------------------------------------------------ the value model
def test_value_model_is_a_copy_and_aligned_with_completion_logits():
    policy = tiny_policy()
    torch.manual_seed(5)
    value = ValueModel.from_policy(policy)
    draw = torch.rand(1)
    torch.manual_seed(5)
    assert torch.equal(draw, torch.rand(1))  # building the critic leaves the sampling RNG where it was
    assert backbone_of(policy) is policy.model
    policy_ptrs = {p.data_ptr() for p in policy.parameters()}
    assert not policy_ptrs & {p.data_ptr() for p in value.parameters()}  # no shared tensors
    assert all(p.requires_grad for p in value.parameters())
    batch = random_batch()
    v = value.completion_values(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.mask, 2)
    assert v.shape == batch.mask.shape
    # values[:, t] is V(state before token t): the full-sequence value at the position just before token t
    ids = torch.cat([batch.prompt_ids.repeat_interleave(2, 0), batch.completion_ids], 1)
    am = torch.cat([batch.prompt_mask.repeat_interleave(2, 0), batch.mask.long()], 1)
    full = value(ids, am)
    L = batch.prompt_ids.shape[1]
    assert torch.allclose(v, full[:, L - 1:-1], atol=1e-6)
    # causal: changing token t changes V only after it
    changed = batch.completion_ids.clone()
    changed[:, 3] = (changed[:, 3] + 7) % 40
    v2 = value.completion_values(batch.prompt_ids, batch.prompt_mask, changed, batch.mask, 2)
    assert torch.allclose(v[:, :4], v2[:, :4], atol=1e-6) and not torch.allclose(v[0, 4:], v2[0, 4:])


def test_value_model_of_a_lora_policy_is_a_full_copy():
    peft = pytest.importorskip("peft")
    policy = peft.get_peft_model(tiny_policy(), peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    value = ValueModel.from_policy(policy)
    assert not {p.data_ptr() for p in policy.parameters()} & {p.data_ptr() for p in value.parameters()}
    assert all(p.requires_grad for p in value.parameters())
    batch = random_batch()
    v = value.completion_values(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.mask, 2)
    assert v.shape == batch.mask.shape  # hidden states through the head, not the LM's logits


def test_critic_gets_gradients_from_the_value_loss_only():
    cfg = ppo_cfg("kl.coef=0.05")
    policy = tiny_policy()
    critic = Critic(policy, cfg, total_updates=2)
    assert critic.optimizer is not None and critic.scheduler is not None
    in_optimizer = {id(p) for g in critic.optimizer.param_groups for p in g["params"]}
    assert in_optimizer == {id(p) for p in critic.model.parameters()}
    batch = random_batch()
    with torch.no_grad():
        from grpo.train.update import batch_logprobs

        batch.old_logp = batch_logprobs(policy, batch, 10_000, 1.0)
    batch.ref_logp = batch.old_logp - 0.1 * batch.mask
    batch.adv, _ = critic.advantages(batch, torch.tensor([1.0, 0.0, 1.0, 0.0]))
    critic_before = [p.detach().clone() for p in critic.model.parameters()]
    policy_before = [p.detach().clone() for p in policy.parameters()]
    # the policy update touches no critic parameter
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    policy_update(policy, opt, sched, batch, cfg)
    assert all(p.grad is None for p in critic.model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(critic_before, critic.model.parameters()))
    assert any(not torch.equal(a, b) for a, b in zip(policy_before, policy.parameters()))
    # the critic update touches no policy parameter and fills the critic's gradients
    for p in policy.parameters():
        p.grad = None
    policy_after = [p.detach().clone() for p in policy.parameters()]
    out = critic.update(batch)
    assert all(p.grad is None for p in policy.parameters())
    assert all(torch.equal(a, b) for a, b in zip(policy_after, policy.parameters()))
    grads = [p.grad for p in critic.model.parameters()]
    assert all(g is not None for g in grads) and sum(float(g.abs().sum()) for g in grads) > 0
    assert critic.model.head.weight.grad.abs().sum() > 0
    assert out["loss/value"] > 0 and math.isfinite(out["critic/grad_norm"])
    assert any(not torch.equal(a, b) for a, b in zip(critic_before, critic.model.parameters()))


def test_value_model_from_a_reward_model_checkpoint(tmp_path):
    rm = tiny_model("llama", head="sequence", seed=0, **TINY, num_labels=1)
    rm.save_pretrained(tmp_path / "rm")
    value = ValueModel.from_pretrained(tmp_path / "rm")
    assert torch.equal(value.head.weight, rm.score.weight)
    ids = torch.randint(1, 40, (2, 7))
    am = torch.ones_like(ids)
    with torch.no_grad():
        assert torch.allclose(value(ids, am)[:, -1], rm(input_ids=ids, attention_mask=am).logits[:, 0], atol=1e-5)


# ------------------------------------------------------------------ the 2-step PPO smoke run (same Trainer)
def reward_model_dir(path):
    """A tiny randomly initialised sequence-classification model with the built-in tokenizer (a learned RM)."""
    from grpo.models.builtin import build_tokenizer

    tok = build_tokenizer()
    rm = tiny_model("llama", head="sequence", seed=0, **{**TINY, "vocab_size": len(tok), "pad_token_id": tok.pad_token_id,
                                                         "num_labels": 1})
    rm.save_pretrained(path)
    tok.save_pretrained(path)
    return path


SMOKE = ["warmup.steps=2", "warmup.batch_size=8", "train.preflight=warn", "eval.n=4", "rollout.max_new_tokens=6", "log.plots=false",
         "log.progress=false", "data.train_size=64"]


@pytest.mark.parametrize("reward", ["functions", "reward_model"])
def test_ppo_two_step_smoke_run_with_checkpointed_critic(tmp_path, reward):
    from grpo.rewards import RewardModel
    from grpo.train.checkpoint import latest_checkpoint
    from grpo.train.trainer import Trainer

    cfg = ppo_cfg(*SMOKE)
    assert cfg.algo.advantage == "gae" and cfg.kl.coef == 0.05 and cfg.kl.estimator == "k1"
    fns = [RewardModel(str(reward_model_dir(tmp_path / "rm")))] if reward == "reward_model" else None
    trainer = Trainer(cfg, run_dir=tmp_path / "run", reward_functions=fns)
    try:
        assert trainer.ref is not None and trainer.critic is not None
        summary = trainer.train()
    finally:
        trainer.close()
    assert summary["steps"] == 2
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        for key in ("loss/value", "critic/grad_norm", "critic/explained_var", "critic/value_mean", "ppo/kl_reward_mean",
                    "loss/policy", "policy/kl", "eval/accuracy" if r["step"] == 2 else "step"):
            assert key in r and math.isfinite(r[key]), key
    ckpt = latest_checkpoint(tmp_path / "run")
    value = ValueModel.from_pretrained(ckpt / "extra" / "value", like=trainer.policy)
    for a, b in zip(value.state_dict().values(), trainer.critic.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    if reward == "reward_model":
        return
    # resume: the critic, its optimizer and schedule come back from the checkpoint, and training goes on
    resumed = Trainer(ppo_cfg(*SMOKE, "train.steps=3"), run_dir=tmp_path / "run")
    try:
        resumed.train(resume=True)
        critic = resumed.critic
        assert critic.scheduler.last_epoch == 3 and critic.optimizer.state  # 2 restored + 1 new critic step
    finally:
        resumed.close()
    assert [json.loads(x)["step"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3]
