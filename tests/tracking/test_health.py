"""The "is it learning?" warnings: each fires once, after `patience` consecutive steps, naming the setting to change."""

from __future__ import annotations

import pytest

from grpo.tracking.health import HealthMonitor

HEALTHY = {"adv/zero_std_frac": 0.1, "rollout/truncated_frac": 0.0, "policy/kl": 0.01, "rollout/logp_diff": 1e-6}


@pytest.mark.parametrize("key,value,setting", [
    ("adv/zero_std_frac", 0.9, "rollout.group_size"),
    ("rollout/truncated_frac", 0.7, "rollout.max_new_tokens"),
    ("policy/kl", 2.5, "kl.coef"),
    ("rollout/logp_diff", 0.2, "model.compute_dtype=float32"),
])
def test_each_warning_fires_once_after_patience_steps(key, value, setting):
    monitor = HealthMonitor(patience=3)
    bad = HEALTHY | {key: value, "reward/mean": 0.0}
    assert monitor.observe(bad) == [] and monitor.observe(bad) == []
    fired = monitor.observe(bad)
    assert len(fired) == 1 and setting in fired[0]
    assert monitor.observe(bad) == []  # once per run


def test_a_healthy_step_resets_the_streak():
    monitor = HealthMonitor(patience=2)
    bad = HEALTHY | {"rollout/truncated_frac": 0.9}
    assert monitor.observe(bad) == [] and monitor.observe(HEALTHY) == [] and monitor.observe(bad) == []
    assert len(monitor.observe(bad)) == 1


def test_flat_reward_is_reported_after_the_window():
    monitor = HealthMonitor(flat_window=5)
    outs = [monitor.observe(HEALTHY | {"reward/mean": 0.3}) for _ in range(5)]
    assert outs[:4] == [[]] * 4 and "has not changed for 5 steps" in outs[4][0]
    moving = HealthMonitor(flat_window=5)
    assert all(moving.observe(HEALTHY | {"reward/mean": 0.1 * i}) == [] for i in range(10))


def test_the_zero_spread_advice_fits_where_the_prompts_come_from():
    bad = HEALTHY | {"adv/zero_std_frac": 1.0, "reward/mean": 0.0}
    builtin, data_file = HealthMonitor(patience=1), HealthMonitor(patience=1, data_file=True)
    (task_warning,), (file_warning,) = builtin.observe(bad), data_file.observe(bad)
    assert "data.difficulty" in task_warning  # only the built-in tasks have difficulty levels
    assert "data.difficulty" not in file_warning and "data file" in file_warning and "reward" in file_warning
    assert "rollout.group_size" in file_warning and "100% of groups" in file_warning


def test_a_resumed_monitor_warns_as_the_uninterrupted_one():
    """state_dict()/load_state_dict(): streaks, fired warnings and the flat-reward window survive a resume."""
    steps = [HEALTHY | {"rollout/truncated_frac": 0.9, "reward/mean": 0.5}] * 4 + [HEALTHY | {"reward/mean": 0.5}] * 4
    straight = HealthMonitor(patience=3, flat_window=6)
    expected = [straight.observe(m) for m in steps]
    first = HealthMonitor(patience=3, flat_window=6)
    got = [first.observe(m) for m in steps[:2]]  # stopped mid-streak, before anything fired
    resumed = HealthMonitor(patience=3, flat_window=6)
    resumed.load_state_dict(first.state_dict())
    got += [resumed.observe(m) for m in steps[2:]]
    assert got == expected
    assert [i for i, w in enumerate(expected) if w] == [2, 5]  # truncation after 3 steps, flat reward after 6
    fresh = HealthMonitor(patience=3, flat_window=6)
    fresh.load_state_dict({})
    assert [fresh.observe(m) for m in steps[2:]] != expected[2:]  # without the state, the streak starts again
