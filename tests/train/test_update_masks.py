"""algo.mask_truncated (DAPO overlong filtering), and the sampler-vs-trainer log-prob check of the update."""

from __future__ import annotations

import pytest
import torch


def params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_only_the_cut_off_completions_lose_their_tokens(make_trainer):
    trainer = make_trainer("algo.mask_truncated=true")
    rollouts = trainer.producer.generate(trainer.stream.next(2), 2, trainer.step_count, 0)
    rollouts.truncated = torch.tensor([True, False, False, True])
    batch = trainer._policy_batch(rollouts)
    assert batch.mask[[0, 3]].sum() == 0
    assert torch.equal(batch.mask[1:3], rollouts.completion_mask[1:3].float())
    plain = make_trainer(run_dir=trainer.run_dir.parent / "plain")._policy_batch(rollouts)
    assert torch.equal(plain.mask, rollouts.completion_mask.float())  # off by default


def test_a_step_of_only_truncated_completions_changes_nothing(make_trainer, monkeypatch):
    trainer = make_trainer("algo.mask_truncated=true")
    generate = trainer.producer.generate

    def all_truncated(*args, **kwargs):
        rollouts = generate(*args, **kwargs)
        rollouts.truncated[:] = True
        return rollouts

    monkeypatch.setattr(trainer.producer, "generate", all_truncated)
    before = params(trainer.policy)
    metrics = trainer.step().metrics
    assert metrics["adv/abs_mean"] > 0  # the rewards still differ: only the loss is masked
    assert metrics["loss/policy"] == 0.0
    assert all(torch.equal(v, params(trainer.policy)[k]) for k, v in before.items())


def test_sampler_and_trainer_log_probs_agree_and_a_mismatch_shows(make_trainer, monkeypatch):
    """rollout/logp_diff: the sampler's log-probs against the trainer's on the same tokens (first epoch)."""
    trainer = make_trainer()
    metrics = trainer.step().metrics
    assert 0.0 <= metrics["rollout/logp_diff"] < 1e-4  # fp32, the same weights: the same policy
    generate = trainer.producer.generate

    def shifted(*args, **kwargs):
        rollouts = generate(*args, **kwargs)
        rollouts.logp = rollouts.logp + 0.5 * rollouts.completion_mask  # a sampler that is off by 0.5 nats
        return rollouts

    monkeypatch.setattr(trainer.producer, "generate", shifted)
    assert trainer.step().metrics["rollout/logp_diff"] == pytest.approx(0.5, abs=1e-3)
    assert "rollout/logp_diff" not in make_trainer("rollout.top_p=0.9", run_dir=trainer.run_dir.parent / "p").step().metrics


def test_top_entropy_quantile_keeps_that_share_of_the_tokens(make_trainer):
    """algo.top_entropy_quantile=q: the loss keeps the top q of the tokens by entropy (one micro-batch here)."""
    trainer = make_trainer("algo.top_entropy_quantile=0.25")
    generate, seen = trainer.producer.generate, {}

    def record(*args, **kwargs):
        seen["rollouts"] = generate(*args, **kwargs)
        return seen["rollouts"]

    trainer.producer.generate = record
    metrics = trainer.step().metrics
    tokens = int(seen["rollouts"].completion_mask.sum())
    assert 0.25 <= metrics["policy/entropy_kept_frac"] <= 0.25 + 1.0 / tokens + 1e-6
    lone = make_trainer("algo.top_entropy_quantile=1e-9", run_dir=trainer.run_dir.parent / "lone")
    lone.producer.generate = record
    metrics = lone.step().metrics  # only the one highest-entropy token of the batch
    assert metrics["policy/entropy_kept_frac"] == pytest.approx(1.0 / int(seen["rollouts"].completion_mask.sum()))
    assert "policy/entropy_kept_frac" not in make_trainer(run_dir=trainer.run_dir.parent / "all").step().metrics


def test_the_entropy_mask_multiplies_the_loss(make_trainer, monkeypatch):
    """The mask reaches the loss: a mask that keeps nothing gives loss 0 and leaves the parameters as they were."""
    from grpo.train import update

    monkeypatch.setattr(update, "high_entropy_mask", lambda entropy, mask, q: torch.zeros_like(mask, dtype=torch.bool))
    trainer = make_trainer("algo.top_entropy_quantile=0.5")
    before = params(trainer.policy)
    metrics = trainer.step().metrics
    assert metrics["loss/policy"] == 0.0 and metrics["policy/entropy_kept_frac"] == 0.0
    assert all(torch.equal(v, params(trainer.policy)[k]) for k, v in before.items())
