"""algo.mask_truncated (DAPO overlong filtering), and the sampler-vs-trainer log-prob check of the update."""

from __future__ import annotations

import pytest
import torch


def params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_only_the_cut_off_completions_lose_their_tokens(make_trainer):
    trainer = make_trainer("algo.mask_truncated=true")
    rollouts = trainer._generate(trainer.stream.next(2), 2, 0)
    rollouts.truncated = torch.tensor([True, False, False, True])
    batch = trainer._policy_batch(rollouts)
    assert batch.mask[[0, 3]].sum() == 0
    assert torch.equal(batch.mask[1:3], rollouts.completion_mask[1:3].float())
    plain = make_trainer(run_dir=trainer.run_dir.parent / "plain")._policy_batch(rollouts)
    assert torch.equal(plain.mask, rollouts.completion_mask.float())  # off by default


def test_a_step_of_only_truncated_completions_changes_nothing(make_trainer, monkeypatch):
    trainer = make_trainer("algo.mask_truncated=true")
    generate = trainer._generate

    def all_truncated(*args, **kwargs):
        rollouts = generate(*args, **kwargs)
        rollouts.truncated[:] = True
        return rollouts

    monkeypatch.setattr(trainer, "_generate", all_truncated)
    before = params(trainer.policy)
    metrics = trainer.step()
    assert metrics["adv/abs_mean"] > 0  # the rewards still differ: only the loss is masked
    assert metrics["loss/policy"] == 0.0
    assert all(torch.equal(v, params(trainer.policy)[k]) for k, v in before.items())


def test_sampler_and_trainer_log_probs_agree_and_a_mismatch_shows(make_trainer, monkeypatch):
    """rollout/logp_diff: the sampler's log-probs against the trainer's on the same tokens (first epoch)."""
    trainer = make_trainer()
    metrics = trainer.step()
    assert 0.0 <= metrics["rollout/logp_diff"] < 1e-4  # fp32, the same weights: the same policy
    generate = trainer._generate

    def shifted(*args, **kwargs):
        rollouts = generate(*args, **kwargs)
        rollouts.logp = rollouts.logp + 0.5 * rollouts.completion_mask  # a sampler that is off by 0.5 nats
        return rollouts

    monkeypatch.setattr(trainer, "_generate", shifted)
    assert trainer.step()["rollout/logp_diff"] == pytest.approx(0.5, abs=1e-3)
    assert "rollout/logp_diff" not in make_trainer("rollout.top_p=0.9", run_dir=trainer.run_dir.parent / "p").step()
