"""The PPO critic: the one place where PPO differs from GRPO in `Trainer.step()` (ALGORITHMS.md section 1).

    critic = Critic(policy, cfg, total_updates)
    batch.adv, metrics = critic.advantages(batch, rewards)   # before the policy update
    metrics |= critic.update(batch)                           # after it: the critic's own optimizer step

Advantages, per completion i and response token t (mask m, last unmasked token t_last):

    r_t  = -beta * KL_t(pi_old || pi_ref)  (+ the scalar reward r_i at t = t_last)     KL folded into the reward
    A, R = gae(r, V_old, m, gamma, lam)                                                 R = A + V_old
    A    = masked_whiten(A)   over the unmasked tokens of the whole batch

KL_t is `kl_estimate(old_logp, ref_logp, kind=kl.estimator)` (k1 in the ppo preset: old_logp - ref_logp, as verl).
A missing reward (NaN) counts as 0 in r, and that completion's advantages are 0 and it is left out of the
whitening statistics and of the value loss. The value loss is `clipped_value_loss(V, V_old, R)` averaged over the
tokens (token_mean), times `algo.value_coef`, with gradient clipping and the critic's own AdamW and schedule
(`algo.value_lr`). The critic's parameters are a copy, never shared with the policy's.

Multi-turn episodes (grpo.rollout.episodes; batch.mask = the policy's tokens, batch.attention_mask = every real
token): the environment's tokens are not actions, so everything above runs over the policy's tokens only, as in
verl's `compute_gae_advantage_return`. The scalar reward sits at the episode's last *policy* token, the KL reward
at policy tokens; GAE skips the environment's replies, so the last token of a policy turn bootstraps from V at the
first token of the next policy turn (the state after the reply; gamma is applied once per policy token, not per
environment token); whitening and the value loss cover the policy's tokens of the rows with a reward. The critic's
forward attends every token (attention_mask), so V at a policy token has seen the replies before it.
(tests/train/test_ppo_episodes.py checks this against a naive loop over the policy positions.)
"""

from __future__ import annotations

import torch

from grpo.algo import (
    aggregate,
    clipped_value_loss,
    gae,
    kl_estimate,
    masked_mean,
    masked_var,
    masked_whiten,
)
from grpo.models.compute import compute_context
from grpo.models.value import ValueModel
from grpo.parallel import SINGLE, all_reduce_grads
from grpo.train.optim import build_optimizer, guarded_step
from grpo.train.update import pad_columns

__all__ = ["Critic", "build_value_model", "token_rewards"]


def build_value_model(policy, cfg) -> ValueModel:
    """The critic network: from `algo.value_model` (a checkpoint directory) if set, else a copy of the policy."""
    path = getattr(cfg.algo, "value_model", None)
    device = next(policy.parameters()).device
    if path:
        dtype = next(policy.parameters()).dtype
        return ValueModel.from_pretrained(path, like=policy, dtype=dtype, device=device)
    return ValueModel.from_policy(policy, seed=cfg.train.seed)


def token_rewards(rewards: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None, beta: float):
    """Per-token rewards (N, T): -beta * kl at unmasked tokens, plus the scalar reward at the last unmasked token.

    rewards: (N,), NaN = missing (counts as 0).  mask: (N, T) 0/1 or bool.  kl: (N, T) or None.
    Returns (token_rewards (N, T), kl_part (N, T)); both 0 at masked positions.
    """
    m = mask.bool()
    kl_part = torch.zeros(m.shape, dtype=torch.float32, device=m.device)
    if kl is not None and beta > 0:
        kl_part = (-beta * kl.float()).where(m, 0.0)
    T = m.shape[1]
    positions = torch.arange(T, device=m.device).expand_as(m)
    last = torch.where(m, positions, -1).amax(dim=-1)  # (N,), -1 for an empty completion
    score = torch.nan_to_num(rewards.float().to(m.device), nan=0.0)
    has = last >= 0
    out = kl_part.clone()
    rows = has.nonzero()[:, 0]
    out[rows, last[rows]] += score[rows]
    return out, kl_part


class Critic:
    """The value model, its optimizer and schedule, and the GAE advantages it provides to PPO."""

    compute = "weights"  # model.compute_dtype resolved (models/compute.py): the trainer passes its own

    def __init__(self, policy, cfg, total_updates: int, dist=None, compute: str = "weights"):
        self.cfg = cfg
        self.compute = compute  # as the policy's forwards
        self.dist = dist or SINGLE  # several processes: each rank holds the whole critic; gradients are summed
        self.model = build_value_model(policy, cfg)
        self.optimizer, self.scheduler = build_optimizer(self.model.parameters(), cfg.optim, total_updates,
                                                         lr=cfg.algo.value_lr)
        self._targets = None  # (batch id, old values, returns, value mask) of the batch advantages() last saw

    @torch.no_grad()
    def values(self, batch) -> torch.Tensor:
        """(N, T) values of the batch's completion states, no gradient, 0 at masked positions."""
        parts = [self._values(batch, *chunk) for chunk in batch.group_chunks(self.cfg.optim.micro_batch_tokens,
                                                                             shared_prefix=False)]
        return torch.cat(parts) * batch.mask

    def _values(self, batch, rows_p: slice, rows_n: slice, group_size: int) -> torch.Tensor:
        """(n, T) float32 values (a bf16 forward's too: the value loss is float32); the forward computes the
        micro-batch's own columns (PolicyBatch.columns), the padding after them is 0."""
        t = batch.columns(rows_n)
        with compute_context(self.compute, batch.mask.device):  # episodes: environment tokens attended
            v = self.model.completion_values(batch.prompt_ids[rows_p], batch.prompt_mask[rows_p],
                                             batch.completion_ids[rows_n, :t], batch.attended[rows_n, :t],
                                             group_size)
        return pad_columns(v.float(), batch.mask.shape[1])

    def advantages(self, batch, rewards: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """(N, T) whitened GAE advantages for `batch` and metrics; remembers V_old and the returns for update()."""
        cfg = self.cfg
        mask = batch.mask.bool()
        rewards = rewards.to(batch.mask.device)
        present = ~torch.isnan(rewards)
        kl = None
        if cfg.kl.coef > 0 and batch.ref_logp is not None:
            if batch.old_logp is None:
                raise RuntimeError("PPO's KL-in-reward needs batch.old_logp (pi_old) next to batch.ref_logp")
            kl = kl_estimate(batch.old_logp, batch.ref_logp, kind=cfg.kl.estimator)
        r, kl_part = token_rewards(rewards, mask, kl, cfg.kl.coef)
        old_values = self.values(batch).float()
        adv, returns = gae(r, old_values, mask, gamma=cfg.algo.gamma, lam=cfg.algo.lam)
        keep = mask & present[:, None]
        adv = self._whiten(adv.float(), keep)
        self._targets = (id(batch), old_values, returns.float(), keep)
        resid_var = masked_var(returns - old_values, keep)
        ret_var = masked_var(returns, keep)
        n_present = int(present.sum())
        metrics = {
            "critic/value_mean": float(masked_mean(old_values, keep)),
            "critic/return_mean": float(masked_mean(returns, keep)),
            "critic/explained_var": float(1.0 - resid_var / ret_var) if float(ret_var) > 0 else 0.0,
            "ppo/kl_reward_mean": float(kl_part.sum(-1)[present].mean()) if n_present else 0.0,
            "ppo/kl_mean": float(masked_mean(kl, mask)) if kl is not None else 0.0,
            "ppo/score_mean": float(rewards[present].mean()) if n_present else float("nan"),
        }
        return adv.to(batch.mask.dtype), metrics

    def _whiten(self, adv: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """masked_whiten over the job's batch: with several processes the mean and the (Bessel) variance are those of
        every rank's tokens together, in two passes like masked_var, so N processes whiten as one would."""
        d = self.dist
        if not d.enabled:
            return masked_whiten(adv, keep)
        total, count = d.reduce([float((adv * keep).sum()), float(keep.sum())])
        mean = total / max(count, 1.0)
        squares = d.sum(float(((adv - mean) ** 2 * keep).sum()))
        return masked_whiten(adv, keep, stats=(mean, squares / max(count - 1.0, 1.0)))

    def _all_reduce_grads(self, params) -> None:
        """Sum the critic's gradients over the ranks (each rank's loss is already divided by the job's token count)."""
        if self.dist.enabled:
            all_reduce_grads(params)

    def update(self, batch) -> dict[str, float]:
        """algo.epochs passes of the clipped value loss over micro-batches, each one optimizer step of the critic."""
        cfg = self.cfg
        if self._targets is None or self._targets[0] != id(batch):
            raise RuntimeError("Critic.update(batch) needs Critic.advantages(batch) first (it computes V_old and R)")
        _, old_values, returns, keep = self._targets
        d = self.dist
        num_tokens = keep.sum()
        if d.enabled:  # the job's count: every rank's loss is a share of the one-process loss
            num_tokens = num_tokens.new_tensor(d.sum(float(num_tokens)))
        out = {"loss/value": 0.0, "critic/grad_norm": 0.0, "critic/clip_frac": 0.0, "critic/skipped_updates": 0.0}
        if int(num_tokens) == 0:  # every reward missing: nothing to fit
            return out
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.model.train()
        for _ in range(cfg.algo.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            loss_sum, clipped, finite = 0.0, 0.0, True
            # the critic computes every row's prompt (models/value.py completion_values): packed by that cost
            for rows_p, rows_n, group_size in batch.group_chunks(cfg.optim.micro_batch_tokens, shared_prefix=False):
                m = keep[rows_n]
                v = self._values(batch, rows_p, rows_n, group_size)
                per_token = clipped_value_loss(v, old_values[rows_n], returns[rows_n], m, clip=cfg.algo.value_clip)
                loss = cfg.algo.value_coef * aggregate(per_token, m, mode="token_mean", num_tokens=num_tokens)
                if not torch.isfinite(loss):
                    finite = False
                    break
                loss.backward()
                loss_sum += float(loss.detach())
                clipped += float(((v.detach() - old_values[rows_n]).abs() > cfg.algo.value_clip)[m].sum())
            finite = d.all(finite)
            if finite and d.enabled:
                self._all_reduce_grads(params)
                loss_sum, clipped = d.reduce([loss_sum, clipped])
            grad_norm = guarded_step(params, self.optimizer, self.scheduler, cfg.optim.max_grad_norm, finite)
            if grad_norm is None:  # a non-finite loss or gradient norm: skipped, the gradients cleared
                out["critic/skipped_updates"] += 1
                continue
            out["loss/value"] += loss_sum / cfg.algo.epochs
            out["critic/grad_norm"] += float(grad_norm) / cfg.algo.epochs
            out["critic/clip_frac"] += clipped / float(num_tokens) / cfg.algo.epochs
        out["optim/value_lr"] = float(self.scheduler.get_last_lr()[0])  # a tensor under torchao's optimizers
        return out
