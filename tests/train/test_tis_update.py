"""algo.tis_cap in the update (train/update.py): the weight multiplies the policy-gradient term only, and only when
the engine's log-probs differ from the trainer's."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from grpo.train.update import batch_logprobs, policy_update


def _gradients(trainer, batch, tis_cap, sampler_logp):
    """The policy's gradient after one policy_update of a copy of the trainer's model on `batch`."""
    model = copy.deepcopy(trainer.policy)
    cfg = trainer.cfg.model_copy(deep=True)
    cfg.algo.tis_cap = tis_cap
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    grads = []  # read as the optimizer is about to apply them (the update frees them afterwards)
    opt.register_step_pre_hook(lambda *_: grads.extend(p.grad.clone() for p in model.parameters()
                                                       if p.grad is not None))
    batch = copy.copy(batch)
    batch.sampler_logp = sampler_logp
    metrics = policy_update(model, opt, sched, batch, cfg)
    assert grads and all(p.grad is None for p in model.parameters())  # freed while the next batch is sampled
    return grads, metrics


def _sampled_batch(make_trainer):
    """(trainer, a batch of 2 prompts x 2 completions it sampled with fixed advantages, the trainer's log-probs of
    its tokens); no gradient clipping, so gradients compare by their scale."""
    trainer = make_trainer("optim.max_grad_norm=1e9")
    rollouts = trainer.producer.generate(trainer.stream.next(2), 2, trainer.step_count, 0)
    batch = trainer._policy_batch(rollouts)
    batch.adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    cfg = trainer.cfg
    train_logp = batch_logprobs(trainer.policy, batch, cfg.optim.micro_batch_tokens, cfg.rollout.temperature,
                                cfg.optim.logprob_chunk_tokens)
    return trainer, batch, train_logp


def test_tis_changes_the_update_only_when_the_log_probs_differ(make_trainer):
    trainer, batch, train_logp = _sampled_batch(make_trainer)
    plain, m_plain = _gradients(trainer, batch, None, train_logp)
    equal, m_equal = _gradients(trainer, batch, 2.0, train_logp)
    assert all(torch.equal(a, b) for a, b in zip(plain, equal))  # weight exactly 1 on every token
    assert m_equal["policy/tis_weight_mean"] == 1.0 and m_equal["policy/tis_capped_frac"] == 0.0
    # the engine gave every sampled token 0.5 nats more than the trainer: every weight is e^-0.5 (< cap), so the
    # policy gradient is e^-0.5 times the plain one
    shifted, m_shift = _gradients(trainer, batch, 2.0, train_logp + 0.5 * batch.mask)
    scale = math.exp(-0.5)
    assert all(torch.allclose(b, scale * a, rtol=1e-4, atol=1e-7) for a, b in zip(plain, shifted))
    assert not all(torch.allclose(a, b) for a, b in zip(plain, shifted))
    assert abs(m_shift["policy/tis_weight_mean"] - scale) < 1e-5
    # 1.5 nats less: ratio e^1.5 = 4.48 is capped at 2
    capped, m_cap = _gradients(trainer, batch, 2.0, train_logp - 1.5 * batch.mask)
    assert all(torch.allclose(b, 2.0 * a, rtol=1e-4, atol=1e-7) for a, b in zip(plain, capped))
    assert m_cap["policy/tis_capped_frac"] == 1.0
    assert "policy/tis_weight_mean" not in m_plain  # off: no metric, no weight


def test_nan_sampler_log_probs_drop_only_their_tokens_and_say_so(make_trainer, caplog):
    """Issue #51: a sampler log-prob of NaN at some sampled tokens: those tokens' policy-gradient terms are dropped
    (weight 0, the gradient finite), policy/tis_invalid_frac counts them, one warning names them; NaN everywhere
    says the micro-batch's policy gradient is 0 rather than training on it silently."""
    trainer, batch, train_logp = _sampled_batch(make_trainer)
    mask = batch.mask.bool()
    broken = train_logp.clone()
    broken[0][mask[0]] = float("nan")  # every sampled token of completion 0
    with caplog.at_level("WARNING", logger="grpo.train"):
        grads, metrics = _gradients(trainer, batch, 2.0, broken)
    assert all(torch.isfinite(g).all() for g in grads)
    share = float(mask[0].sum() / mask.sum())
    assert metrics["policy/tis_invalid_frac"] == pytest.approx(share, rel=1e-5)
    assert metrics["policy/tis_weight_mean"] == pytest.approx(1 - share, rel=1e-5)  # the rest weigh exactly 1
    said = f"{int(mask[0].sum())} of {int(mask.sum())} sampled tokens have a NaN or +inf sampler log-prob"
    assert said in caplog.text
    # the same update with completion 0's advantage 0 instead: its tokens then carry no gradient either
    zeroed = copy.copy(batch)
    zeroed.adv = batch.adv.clone()
    zeroed.adv[0] = 0.0
    want, _ = _gradients(trainer, zeroed, None, train_logp)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(grads, want))
    caplog.clear()
    with caplog.at_level("WARNING", logger="grpo.train"):
        grads, metrics = _gradients(trainer, batch, 2.0, torch.full_like(train_logp, float("nan")))
    assert metrics["policy/tis_invalid_frac"] == 1.0 and metrics["policy/tis_weight_mean"] == 0.0
    assert "every token: this micro-batch's policy gradient is 0" in caplog.text
    assert all(torch.isfinite(g).all() for g in grads)
