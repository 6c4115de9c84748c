"""algo.mask_truncated (DAPO's overlong filtering): completions cut at max_new_tokens add nothing to the loss."""

from __future__ import annotations

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
