"""grpo.algo.registry: a new advantage estimator or policy loss is one registered function, found by name.

The trainer must call what the registry holds (not a hard-wired if-chain that falls through to RLOO), and an
unknown name must be an error that lists the known ones, in the config and in the registry itself.
"""

from __future__ import annotations

import pytest
import torch

from grpo.algo import registry
from grpo.config import ConfigError, describe_keys, load_config


@pytest.fixture
def scratch_registry(monkeypatch):
    """Registrations made in a test are removed afterwards."""
    monkeypatch.setattr(registry, "ADVANTAGE_ESTIMATORS", dict(registry.ADVANTAGE_ESTIMATORS))
    monkeypatch.setattr(registry, "POLICY_LOSSES", dict(registry.POLICY_LOSSES))


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'grp0'; known: dr_grpo, grpo, rloo"):
        registry.advantage_estimator("grp0")
    with pytest.raises(ValueError, match=r"unknown policy loss 'clipp'; known: cispo, clip"):
        registry.policy_loss("clipp")
    with pytest.raises(ConfigError, match=r"algo.advantage.*unknown advantage estimator 'ppo'.*known: dr_grpo"):
        load_config(None, ["algo.advantage=ppo"])
    with pytest.raises(ConfigError, match=r"algo.policy_loss.*unknown policy loss 'gspo'"):
        load_config(None, ["algo.policy_loss=gspo"])


def test_list_keys_shows_the_registered_choices():
    kinds = {key: kind for key, kind, _, _ in describe_keys()}
    assert kinds["algo.advantage"] == "grpo|dr_grpo|rloo|gae"
    assert kinds["algo.policy_loss"] == "clip|cispo"


def test_a_name_cannot_be_registered_twice(scratch_registry):
    with pytest.raises(ValueError, match="already registered"):
        registry.register_advantage("grpo")(lambda rewards, **kw: rewards)


def test_builtin_estimators_are_the_formulas():
    """Hand vector: rewards [1, 0, 0, 1] (G = 4): mean 0.5, population std 0.5, RLOO baseline 1/3 or 2/3."""
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    kw = dict(group_size=4, std="population", scale="group", eps=0.0)
    torch.testing.assert_close(registry.advantage_estimator("grpo")(r, **kw), torch.tensor([1.0, -1.0, -1.0, 1.0]))
    torch.testing.assert_close(registry.advantage_estimator("dr_grpo")(r, **kw), torch.tensor([0.5, -0.5, -0.5, 0.5]))
    torch.testing.assert_close(registry.advantage_estimator("rloo")(r, **kw),
                               torch.tensor([1 - 1 / 3, -2 / 3, -2 / 3, 1 - 1 / 3]))


def test_trainer_uses_a_registered_estimator(make_trainer, scratch_registry):
    """An estimator that returns all zeros: the policy gradient is 0, so the first AdamW step moves nothing;
    the same run with the default estimator moves the parameters."""
    calls = []

    @registry.register_advantage("zeros_test")
    def zeros(rewards, *, group_size, std, scale, eps):
        calls.append((rewards.shape[0], group_size, std))
        return torch.zeros_like(rewards)

    moved = {}
    for name in ("zeros_test", "grpo"):
        trainer = make_trainer(f"algo.advantage={name}", "algo.std=sample", "optim.warmup_steps=0")
        before = [p.detach().clone() for p in trainer.policy.parameters()]
        trainer.step()
        moved[name] = max(float((p.detach() - b).abs().max()) for p, b in zip(trainer.policy.parameters(), before))
    assert calls == [(4, 2, "sample")], "the registered estimator was not called with the config's settings"
    assert moved["zeros_test"] == 0.0
    assert moved["grpo"] > 1e-4


def test_trainer_uses_a_registered_policy_loss(make_trainer, scratch_registry):
    """A loss that is -2x the clipped surrogate's: the trainer must call it with the config's clip settings, and
    report what it returned (loss/policy is -2x the default run's on the same first batch)."""
    seen = []

    @registry.register_policy_loss("double_test")
    def double(logp, old_logp, adv, mask, *, clip_low, clip_high, level, dual_clip):
        seen.append((clip_low, clip_high, level, dual_clip))
        loss, metrics = registry.policy_loss("clip")(logp, old_logp, adv, mask, clip_low=clip_low,
                                                     clip_high=clip_high, level=level, dual_clip=dual_clip)
        return -2 * loss, metrics

    losses = {}
    for name in ("clip", "double_test"):
        torch.manual_seed(0)
        # on-policy (ratio 1) a group's terms sum to 0 exactly, unless some tokens are left out: the high-entropy
        # half of the tokens (the same ones in both runs: the same model, batch and seed)
        trainer = make_trainer(f"algo.policy_loss={name}", "algo.clip_high=0.3", "algo.dual_clip=3.0",
                               "algo.top_entropy_quantile=0.5")
        losses[name] = trainer.step().metrics["loss/policy"]
    assert seen == [(0.2, 0.3, "token", 3.0)]
    assert losses["clip"] != 0.0
    assert losses["double_test"] == pytest.approx(-2 * losses["clip"], rel=1e-5)
