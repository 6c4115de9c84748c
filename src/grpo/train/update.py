"""The policy update: mu epochs over the rollout batch, micro-batches by token budget, one optimizer step
per epoch, gradient clipping, and a non-finite guard (a NaN/inf loss or gradient norm skips the step).

Per micro-batch:  hidden states -> logp (N_mb, T) in chunks of `optim.logprob_chunk_tokens` positions, never the
(N_mb, T, V) logits (models/forward.py, `completion_token_logprobs`) -> clipped surrogate (+ beta * KL in the
loss) -> aggregate with the GLOBAL token/sequence counts of the whole batch, so the gradient does not depend on
the micro-batching.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import torch

from grpo.algo import aggregate, high_entropy_mask, kl_estimate, masked_mean
from grpo.algo.registry import policy_loss as policy_loss_fn
from grpo.algo.tis import truncated_is_weight
from grpo.models.compute import compute_context
from grpo.models.forward import (DEFAULT_CHUNK_TOKENS, completion_logits, completion_token_logprobs,
                                 lean_head_gradients, shares_prompt)
from grpo.train.memory_plan import release_freed_memory
from grpo.train.optim import guarded_step

log = logging.getLogger("grpo.train")


@dataclass
class PolicyBatch:
    """Tensors of one rollout batch, on the training device.

    prompt_ids, prompt_mask: (P, L); completion_ids, mask: (N, T) with N = P*G; adv: (N,) or (N, T);
    old_logp, ref_logp: (N, T) or None (old_logp None means mu = 1: the ratio's denominator is logp.detach()).
    sampler_logp: (N, T) or None, the log-probs the sampler computed for the tokens it drew; compared with the
        trainer's own in the first epoch (`rollout/logp_diff`): a mismatch means the two compute different policies.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    mask: torch.Tensor
    adv: torch.Tensor
    group_size: int
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    sampler_logp: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None  # (N, T) what the forward attends; None: `mask` (multi-turn
    # episodes: environment tokens are attended but carry no loss, grpo.rollout.episodes)

    @classmethod
    def from_rollouts(cls, rollouts, cfg, device) -> "PolicyBatch":
        """The batch of a Rollouts (advantages still 0): the loss mask is the policy's tokens (episodes: not the
        environment's, which are attended but carry no loss and no KL), without truncated completions when
        algo.mask_truncated (DAPO section 3.3: a cut-off completion's reward says little about its tokens)."""
        mask = (rollouts.completion_mask if rollouts.loss_mask is None else rollouts.loss_mask).float()
        if cfg.algo.mask_truncated:
            mask = mask * (~rollouts.truncated).to(mask.dtype)[:, None]
        return cls(prompt_ids=rollouts.prompt_ids, prompt_mask=rollouts.prompt_mask,
                   completion_ids=rollouts.completion_ids, mask=mask,
                   adv=torch.zeros(rollouts.num_completions, device=device), group_size=rollouts.group_size,
                   # top-p renormalises the sampler's distribution: its log-probs are not comparable then
                   sampler_logp=rollouts.logp if cfg.rollout.top_p == 1.0 else None,
                   attention_mask=None if rollouts.loss_mask is None else rollouts.completion_mask)

    @property
    def num_groups(self) -> int:
        return self.prompt_ids.shape[0]

    def forward_tokens(self, model, token_budget: int | None = None) -> int:
        """The tokens the update's forwards over the batch compute, padding included, as `group_chunks(token_budget)`
        cuts it: per micro-batch, each prompt once and its rows up to the micro-batch's `columns` (groups x L + rows x
        columns), or every row in full when the prompt cannot be shared (rows x (L + columns): FSDP2, gradient
        checkpointing, a cache that cannot share; `_shared_prefix`)."""
        shared = _shared_prefix(model, training=True)
        L, total = self.prompt_ids.shape[1], 0
        for rows_p, rows_n, _ in self.group_chunks(token_budget, shared_prefix=shared):
            rows, groups, t = rows_n.stop - rows_n.start, rows_p.stop - rows_p.start, self.columns(rows_n)
            total += groups * L + rows * t if shared else rows * (L + t)
        return total

    @property
    def attended(self) -> torch.Tensor:
        """(N, T) what the forward attends: attention_mask (episodes) or else the loss mask."""
        return self.mask if self.attention_mask is None else self.attention_mask

    def lengths(self) -> torch.Tensor:
        """(N,) each completion row's attended length: the last position its forward attends, plus 1 (0: none).
        Past it a row is padding, which no loss, metric or later position reads."""
        attended = self.attended != 0
        positions = torch.arange(1, attended.shape[1] + 1, device=attended.device)
        return (attended * positions).amax(-1)

    def columns(self, rows_n: slice) -> int:
        """The completion columns a micro-batch of rows_n computes: its longest row's attended length (at least 1);
        the columns after it are padding in every one of its rows."""
        return max(1, int(self.lengths()[rows_n].max()))

    def group_chunks(self, token_budget: int | None, shared_prefix: bool = True):
        """Micro-batches of about `token_budget` tokens each, as (prompt rows, completion rows, rows per prompt):
        consecutive whole groups while they fit (k groups whose longest row attends t positions cost k x (L + G x t)
        tokens when each prompt is computed once, the shared prefix, k x G x (L + t) when it is repeated); a group
        that does not fit alone in parts, each with its prompt computed once (L + g x t tokens for g of its rows),
        so a micro-batch's activations stay within the budget whatever G and T are (at least one row). Every
        completion row is in exactly one micro-batch; each computes `columns(rows)` completion positions, not the
        batch's T: a few long completions cost their own micro-batch, not every one. token_budget None: the whole
        batch at once (a Trainer resolves optim.micro_batch_tokens from its memory plan; this is for direct calls)."""
        L, G = self.prompt_ids.shape[1], self.group_size
        if token_budget is None:
            yield slice(0, self.num_groups), slice(0, self.num_groups * G), G
            return
        group_t = [max(1, int(t)) for t in self.lengths().view(self.num_groups, G).amax(-1).tolist()]

        def cost(groups: int, t: int) -> int:
            return groups * (L + G * t) if shared_prefix else groups * G * (L + t)

        g0 = 0
        while g0 < self.num_groups:
            g1, t = g0 + 1, group_t[g0]
            if cost(1, t) > token_budget and G > 1:  # one group is too many tokens: parts of it
                rows = max(1, (token_budget - L) // t if shared_prefix else token_budget // (L + t))
                for r0 in range(0, G, rows):
                    r1 = min(r0 + rows, G)
                    yield slice(g0, g1), slice(g0 * G + r0, g0 * G + r1), r1 - r0
                g0 = g1
                continue
            while g1 < self.num_groups and cost(g1 + 1 - g0, max(t, group_t[g1])) <= token_budget:
                t = max(t, group_t[g1])
                g1 += 1
            yield slice(g0, g1), slice(g0 * G, g1 * G), G
            g0 = g1


def completion_logprobs(model, batch: PolicyBatch, rows_p: slice, rows_n: slice, temperature: float,
                        with_entropy: bool = False, chunk_size: int = DEFAULT_CHUNK_TOKENS,
                        group_size: int | None = None, head_grad_in_place: bool = False):
    """logp (n, T) of the sampled tokens for the completion rows rows_n of the prompts rows_p, group_size of them
    per prompt (None: the batch's G, whole groups; fewer: a part of one group, `PolicyBatch.group_chunks`), and
    the entropy, without gradient, if asked. The forward computes the micro-batch's own `columns` only; the
    positions after them, padding in every row, are 0 in logp and entropy."""
    t = batch.columns(rows_n)
    logp, entropy = completion_token_logprobs(model, batch.prompt_ids[rows_p], batch.prompt_mask[rows_p],
                                              batch.completion_ids[rows_n, :t], batch.attended[rows_n, :t],
                                              group_size or batch.group_size, temperature=temperature,
                                              chunk_size=chunk_size, with_entropy=with_entropy,
                                              forward_fn=_logits_fn(model), head_grad_in_place=head_grad_in_place)
    T = batch.mask.shape[1]
    return pad_columns(logp, T), None if entropy is None else pad_columns(entropy, T)


def pad_columns(x: torch.Tensor, width: int) -> torch.Tensor:
    """x (n, t) -> (n, width), zeros after column t (differentiable)."""
    return x if x.shape[1] == width else torch.nn.functional.pad(x, (0, width - x.shape[1]))


def _shared_prefix(model, training: bool) -> bool:
    """Whether the forwards compute each prompt once for its group (the cost micro-batches are packed by), in the
    update's training forwards (`training`) or the no-grad passes: not when FSDP2 trains (`_logits_fn`), nor for a
    model whose cache cannot share or, training, that checkpoints its layers (models/forward.py shares_prompt)."""
    from grpo.parallel import is_fsdp

    return not (training and is_fsdp(model)) and shares_prompt(model, training)


def _logits_fn(model):
    """FSDP2 frees a layer's gathered weights after that layer's backward, so a forward whose prompt KV cache
    carries gradients into a second forward of the same layers (a shared-prefix forward) cannot train under it:
    sharded models take the plain forward over the N full sequences."""
    from grpo.models import forward
    from grpo.parallel import is_fsdp

    if is_fsdp(model) and torch.is_grad_enabled():
        return getattr(forward, "unshared_completion_logits", completion_logits)
    return completion_logits


@torch.no_grad()
def batch_logprobs(model, batch: PolicyBatch, token_budget: int, temperature: float,
                   chunk_size: int = DEFAULT_CHUNK_TOKENS, compute: str = "weights") -> torch.Tensor:
    """(N, T) log-probabilities under `model` without gradients (pi_old when mu > 1, or pi_ref), computed as
    `compute` says (model.compute_dtype resolved: models/compute.py), as the update's forwards are."""
    with compute_context(compute, batch.mask.device):
        parts = [completion_logprobs(model, batch, p, n, temperature, chunk_size=chunk_size, group_size=g)[0]
                 for p, n, g in batch.group_chunks(token_budget, shared_prefix=_shared_prefix(model, False))]
    return torch.cat(parts) * batch.mask


@dataclass
class MicroBatchLoss:
    """The loss of one micro-batch and what it logs.

    loss: 0-d, what backward() takes: the aggregated policy loss (+ kl.coef * the KL term when the KL is in the loss).
    policy_loss: 0-d detached, the aggregated policy loss alone (loss/policy).
    forward_metrics: contributions known from the forward pass (KL, the entropy mask's share, the sampler's log-prob
        gap), logged even when the loss is not finite (they show where a NaN came from).
    backward_metrics: contributions logged only when the micro-batch was backpropagated.
    Each contribution is a 0-d tensor already weighted by the micro-batch's share, so the update sums them.
    """

    loss: torch.Tensor
    policy_loss: torch.Tensor
    forward_metrics: dict[str, torch.Tensor]
    backward_metrics: dict[str, torch.Tensor]


def micro_batch_loss(model, batch: PolicyBatch, rows_p: slice, rows_n: slice, cfg, *, num_tokens: torch.Tensor,
                     num_seqs: int, kl_in_loss: bool, first_epoch: bool, group_size: int | None = None,
                     head_grad_in_place: bool = False) -> MicroBatchLoss:
    """The loss of the prompts rows_p / completions rows_n (n of them, group_size a prompt: `group_chunks`).

    logp (n, T) from hidden states in chunks -> algo.policy_loss (grpo.algo.registry) per token (n, T) -> the
    high-entropy mask (algo.top_entropy_quantile < 1) -> aggregate with the batch's GLOBAL counts num_tokens (0-d)
    and num_seqs, so the micro-batching does not change the gradient; + kl.coef * KL(pi || pi_ref) when kl_in_loss
    (PPO puts its KL in the reward instead: the caller decides). first_epoch: also log the sampler's log-prob gap.
    head_grad_in_place: inside models.forward.lean_head_gradients when it yielded True.
    """
    algo, kl_cfg = cfg.algo, cfg.kl
    loss_fn = policy_loss_fn(algo.policy_loss)  # grpo.algo.registry: clip, cispo, or a user's registered loss
    mask = batch.mask[rows_n]
    logp, entropy = completion_logprobs(model, batch, rows_p, rows_n, cfg.rollout.temperature, True,
                                        chunk_size=cfg.optim.logprob_chunk_tokens, group_size=group_size,
                                        head_grad_in_place=head_grad_in_place)
    old = batch.old_logp[rows_n] if batch.old_logp is not None else logp.detach()
    token_loss, m = loss_fn(logp, old, batch.adv[rows_n], mask, clip_low=algo.clip_low, clip_high=algo.clip_high,
                            level=algo.ratio_level, dual_clip=algo.dual_clip)
    weight = mask.sum() / num_tokens  # token share of this micro-batch, to average the metrics
    forward: dict[str, torch.Tensor] = {}
    if isinstance(algo.tis_cap, float) and batch.sampler_logp is not None:  # the engine's drift (algo/tis.py);
        # "auto" is resolved by the trainer (train/defaults.py tis_cap_for), unresolved it is off
        tis, tis_m = truncated_is_weight(old, batch.sampler_logp[rows_n], mask, cap=algo.tis_cap)
        token_loss = token_loss * tis
        forward["policy/tis_weight_mean"] = weight * tis_m["weight_mean"]
        forward["policy/tis_capped_frac"] = weight * tis_m["capped_frac"]
        forward["policy/tis_invalid_frac"] = weight * tis_m["invalid_frac"]
        _warn_invalid_sampler_logp(tis_m["invalid_frac"], mask)
    if algo.top_entropy_quantile < 1.0:  # only the high-entropy "forking" tokens carry the gradient; the
        keep = high_entropy_mask(entropy, mask, algo.top_entropy_quantile)  # normaliser stays (as TRL)
        token_loss = token_loss * keep
        forward["policy/entropy_kept_frac"] = weight * masked_mean(keep.float(), mask)
    agg = dict(mode=algo.aggregate, num_tokens=num_tokens, num_seqs=num_seqs, max_len=cfg.rollout.max_new_tokens)
    policy_loss = aggregate(token_loss, mask, **agg)
    loss = policy_loss
    if first_epoch and batch.sampler_logp is not None:
        diff = (logp.detach() - batch.sampler_logp[rows_n]).abs().nan_to_num(0.0, posinf=0.0)  # invalid: counted above
        forward["rollout/logp_diff"] = weight * masked_mean(diff, mask)
    if batch.ref_logp is not None:
        kl = kl_estimate(logp, batch.ref_logp[rows_n], kind=kl_cfg.estimator)
        kl_term = aggregate(kl, mask, **agg)
        if kl_in_loss and kl_cfg.coef > 0:
            loss = loss + kl_cfg.coef * kl_term
        forward["loss/kl"] = kl_term.detach()
        forward["policy/kl"] = weight * masked_mean(kl.detach(), mask)
    backward = {"loss/policy": policy_loss.detach(), "policy/entropy": weight * masked_mean(entropy, mask)}
    for key in ("clip_frac", "clip_frac_low", "clip_frac_high", "ratio_mean"):
        backward[f"policy/{key}"] = weight * m[key]
    return MicroBatchLoss(loss, policy_loss.detach(), forward, backward)


FIRST_EPOCH = ("rollout/logp_diff",)  # metrics of the policy that sampled: the first epoch's, not averaged


def _warn_invalid_sampler_logp(invalid_frac: torch.Tensor, mask: torch.Tensor) -> None:
    """One warning per micro-batch whose sampler log-probs hold NaN/+inf at sampled tokens (algo/tis.py gives
    those tokens weight 0); when that is every token, it says the micro-batch's policy gradient is 0."""
    share = float(invalid_frac)
    if share > 0:
        n = int(mask.sum())
        whole = " (every token: this micro-batch's policy gradient is 0)" if share == 1.0 else ""
        log.warning("algo.tis_cap: %d of %d sampled tokens have a NaN or +inf sampler log-prob, so no importance "
                    "weight: their policy-gradient terms are dropped (weight 0)%s. The rollout engine returned "
                    "them; see policy/tis_invalid_frac", round(share * n), n, whole)


def policy_update(model, optimizer, scheduler, batch: PolicyBatch, cfg, dist=None, *,
                  kl_in_loss: bool = True, compute: str = "weights") -> dict[str, float]:
    """mu = algo.epochs passes over `batch`, each one guarded optimizer step (train/optim.py `guarded_step`) on the
    gradient of the micro-batches' losses (`micro_batch_loss`); returns averaged metrics (floats).

    kl_in_loss: add kl.coef * KL(pi || pi_ref) to the loss (when batch.ref_logp is set); the trainer passes False
    for PPO, whose KL is in the reward. dist (grpo.parallel.Dist, data-parallel): `batch` is this rank's share; the
    counts are the job's, each rank's loss is scaled by world_size against DDP's gradient averaging, so the gradient
    is the 1-process one, and every rank runs the same number of backward passes (a non-finite loss is skipped
    jointly, after the backward). compute: model.compute_dtype resolved (models/compute.py); each micro-batch's
    forward runs in it, its backward follows what the forward recorded, the loss and the step stay float32.
    """
    with training_mode(model):
        return _policy_update(model, optimizer, scheduler, batch, cfg, dist, kl_in_loss, compute)


@contextlib.contextmanager
def training_mode(model):
    """`model` in train mode for the update's forwards, back in its own mode after (sampling and the no-grad passes
    run in eval mode). Gradient checkpointing acts only in train mode (transformers checkpoints a layer when
    `self.training`), as does LoRA's `model.lora_dropout` and any dropout the model's config sets (0 in the families
    the project targets: Llama, Qwen2/3, Gemma 3, Mistral)."""
    was_training = model.training
    model.train()
    try:
        yield
    finally:
        model.train(was_training)


def _policy_update(model, optimizer, scheduler, batch: PolicyBatch, cfg, dist, kl_in_loss: bool,
                   compute: str) -> dict[str, float]:
    """policy_update's body, the model in train mode."""
    from grpo.parallel import SINGLE, backward_sync

    dist = dist or SINGLE
    num_tokens, num_seqs = batch.mask.sum(), batch.mask.shape[0]
    if dist.enabled:
        counts = dist.reduce([float(num_tokens), float(num_seqs)])
        num_tokens, num_seqs = num_tokens.new_tensor(counts[0]), int(counts[1])
    sums: dict[str, float] = {}
    first_epoch: dict[str, float] = {}  # metrics of the policy that sampled (before any update of this batch)
    skipped = 0
    for epoch in range(cfg.algo.epochs):
        optimizer.zero_grad(set_to_none=True)
        finite = True
        chunks = list(batch.group_chunks(cfg.optim.micro_batch_tokens, shared_prefix=_shared_prefix(model, True)))
        for i, (rows_p, rows_n, group_size) in enumerate(chunks):
            with (compute_context(compute, batch.mask.device),
                  lean_head_gradients(model, enabled=not dist.enabled) as in_place):  # one process: no (V, H) temps
                mb = micro_batch_loss(model, batch, rows_p, rows_n, cfg, num_tokens=num_tokens, num_seqs=num_seqs,
                                      kl_in_loss=kl_in_loss, first_epoch=epoch == 0, group_size=group_size,
                                      head_grad_in_place=in_place)
            for key, value in mb.forward_metrics.items():
                _add(first_epoch if key in FIRST_EPOCH else sums, key, value)
            if not torch.isfinite(mb.loss):
                finite = False
                if not dist.enabled:
                    break
            with backward_sync(model, dist, sync=i == len(chunks) - 1):  # one gradient all-reduce per update
                (mb.loss * dist.world_size if dist.enabled else mb.loss).backward()
            release_freed_memory()  # this micro-batch's activations: else the next one's land beside them
            for key, value in mb.backward_metrics.items():
                _add(sums, key, value)
        grad_norm = guarded_step(model.parameters(), optimizer, scheduler, cfg.optim.max_grad_norm,
                                 dist.all(finite))
        if grad_norm is None:
            skipped += 1
            continue
        _add(sums, "policy/grad_norm", grad_norm)
    optimizer.zero_grad(set_to_none=True)  # the gradients' memory is free while the next batch is sampled
    return _update_metrics(sums, first_epoch, skipped, cfg.algo.epochs, scheduler, dist)


def _update_metrics(sums: dict, first_epoch: dict, skipped: int, epochs: int, scheduler, dist) -> dict[str, float]:
    """The update's metrics: sums averaged over the epochs, the first epoch's as they are; the job's with several
    processes (each rank holds its share of the global sums; the gradient norm is already the job's)."""
    out = {k: float(v) / epochs for k, v in sums.items()} | {k: float(v) for k, v in first_epoch.items()}
    if dist.enabled:
        keys = sorted(k for k in out if k != "policy/grad_norm")
        out |= dict(zip(keys, dist.reduce([out[k] for k in keys])))
    out.setdefault("loss/kl", 0.0)
    out.setdefault("policy/kl", 0.0)
    out["train/skipped_updates"] = float(skipped)
    out["optim/lr"] = float(scheduler.get_last_lr()[0])  # torchao's optimizers keep the rate as a tensor
    return out


def _add(sums: dict, key: str, value) -> None:
    sums[key] = sums.get(key, 0.0) + value
