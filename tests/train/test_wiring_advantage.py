"""Trainer-level wiring of the advantage settings: one `Trainer.step()` on a fixed batch gives the gradient of a
naive reference written in wiring_helpers.py (loops over groups and tokens, no grpo.algo), and not the default's.

algo.advantage (grpo, dr_grpo, rloo; gae in test_wiring_ppo.py), algo.std, algo.scale, algo.eps,
algo.drop_zero_std_groups and algo.max_resample_batches.
"""

from __future__ import annotations

import pytest
import torch
from wiring_helpers import one_thread  # noqa: F401  (an autouse fixture)
from wiring_helpers import EXTRA_GROUP, FLAT_GROUP, GROUPS, Setting, assert_matches, fixed_step, reference_grad, rows_of

DEFAULT = Setting()


@pytest.mark.parametrize("setting", [
    Setting(advantage="dr_grpo"),
    Setting(advantage="rloo"),
    Setting(std="sample"),
    Setting(scale="batch"),
    Setting(scale="none"),
    Setting(eps=0.5),
], ids=lambda s: " ".join(s.overrides()))
def test_advantage_settings_shape_the_gradient(setting, make_trainer, precision):
    trainer, spy, calls, initial = fixed_step(make_trainer, setting, precision=precision)
    rows = rows_of(calls[0])
    assert len(spy.grads) == 1
    assert_matches(spy.grads[0], reference_grad(initial, rows, setting, G=4),
                   reference_grad(initial, rows, DEFAULT, G=4), precision)


def test_default_grpo_advantage_matches_the_reference(make_trainer, precision):
    """The default itself (population std, group scale) against the reference; a flipped sign would fail."""
    trainer, spy, calls, initial = fixed_step(make_trainer, DEFAULT, precision=precision)
    rows = rows_of(calls[0])
    want = reference_grad(initial, rows, DEFAULT, G=4)
    flipped = {k: -v for k, v in want.items()}
    assert_matches(spy.grads[0], want, flipped, precision)


def test_drop_zero_std_groups_trains_on_the_informative_groups_only(make_trainer, precision):
    """Round 1 samples [a group with equal rewards, GROUPS[0]]; the flat group is dropped and round 2 supplies
    [GROUPS[1], EXTRA_GROUP], of which the first fills the batch. The update is that of GROUPS[0] + GROUPS[1] (P=2,
    N=8 in the 1/N), while without dynamic sampling it is that of the flat group + GROUPS[0]."""
    batches = [[FLAT_GROUP, GROUPS[0]], [GROUPS[1], EXTRA_GROUP]]
    s = Setting()
    trainer, spy, calls, initial = fixed_step(make_trainer, s, "algo.drop_zero_std_groups=true", batches=batches,
                                              precision=precision)
    assert len(calls) == 2
    rows = rows_of(calls[0])[4:] + rows_of(calls[1])[:4]
    assert [r.reward for r in rows] == [1.0, 0.0, 0.5, 0.0, 0.2, 0.9, 0.7, 0.1]
    ignored = rows_of(calls[0])  # what the step would train on without dynamic sampling
    assert_matches(spy.grads[0], reference_grad(initial, rows, s, G=4), reference_grad(initial, ignored, s, G=4),
                   precision)


def test_dynamic_sampling_is_bounded_by_max_resample_batches(make_trainer, precision):
    """Rounds stop at algo.max_resample_batches: a batch left short trains on the informative groups it has (here
    GROUPS[0] alone, N=4), and a step where no round yields an informative group makes no update and reports the
    sampled rewards (it used to fail on the empty batch's metrics)."""
    s = Setting()
    trainer, spy, calls, initial = fixed_step(make_trainer, s, "algo.drop_zero_std_groups=true",
                                              "algo.max_resample_batches=2",
                                              batches=[[FLAT_GROUP, GROUPS[0]], [FLAT_GROUP, FLAT_GROUP]],
                                              precision=precision)
    assert len(calls) == 2
    rows = rows_of(calls[0])[4:]
    assert_matches(spy.grads[0], reference_grad(initial, rows, s, G=4), reference_grad(initial, rows_of(calls[0]), s,
                                                                                      G=4), precision)
    trainer, spy, calls, initial = fixed_step(make_trainer, s, "algo.drop_zero_std_groups=true",
                                              "algo.max_resample_batches=3", batches=[[FLAT_GROUP, FLAT_GROUP]] * 3,
                                              precision=precision)
    assert len(calls) == 3
    assert all(not g.any() for g in spy.grads[0].values())
    assert all(torch.equal(v, trainer.policy.state_dict()[k]) for k, v in initial.state_dict().items())
    assert spy.metrics["adv/zero_std_frac"] == 1.0 and spy.metrics["reward/mean"] == pytest.approx(0.3)
