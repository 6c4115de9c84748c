"""grpo.train.guards.RewardGuard on hand-written step metrics: what counts as a dead step, streaks and their reset,
the cause named, the total-reward case, weight-0 functions, and the state a checkpoint keeps; then through the
trainer, API callers get RewardsMissing (a HealthGuardError) and no final/."""

from __future__ import annotations

import pytest

from grpo.errors import EXIT_HEALTH, HealthGuardError
from grpo.train.guards import RewardGuard, RewardsMissing


def metrics(total_missing: float = 0.0, **fns: tuple[float, float, float]) -> dict[str, float]:
    """Step metrics: fns = {name: (missing_frac, error_frac, timeout_frac)}."""
    out = {"reward/missing_frac": total_missing}
    for name, (missing, error, timeout) in fns.items():
        out |= {f"reward/{name}/missing_frac": missing, f"reward/{name}/error_frac": error,
                f"reward/{name}/timeout_frac": timeout}
    return out


ALL_NONE = (1.0, 0.0, 0.0)
FINE = (0.0, 0.0, 0.0)


def test_a_function_missing_on_every_sample_for_limit_steps_stops_naming_it_and_the_cause():
    guard = RewardGuard({"judge": 1.0, "fmt": 0.1}, limit=3)
    for step in (1, 2):
        assert guard.observe(step, metrics(1.0, judge=ALL_NONE, fmt=FINE)) == (None, [])
    err, warnings = guard.observe(3, metrics(1.0, judge=ALL_NONE, fmt=FINE))
    assert isinstance(err, RewardsMissing) and isinstance(err, HealthGuardError) and err.exit_code == EXIT_HEALTH
    assert str(err).startswith("reward function 'judge' gave no value for any sample in 3 steps in a row (steps 1-3): "
                               "it returned None for every sample (reward.max_missing_steps=3)")
    assert "'fmt'" not in str(err) and warnings == []


def test_one_step_with_a_value_resets_the_streak():
    guard = RewardGuard({"judge": 1.0}, limit=2)
    assert guard.observe(1, metrics(1.0, judge=ALL_NONE))[0] is None
    assert guard.observe(2, metrics(0.75, judge=(0.75, 0.0, 0.0)))[0] is None  # a quarter of the samples scored
    assert guard.observe(3, metrics(1.0, judge=ALL_NONE))[0] is None
    err, _ = guard.observe(4, metrics(1.0, judge=ALL_NONE))
    assert "in 2 steps in a row (steps 3-4)" in str(err)


@pytest.mark.parametrize(("fracs", "cause"), [
    ((1.0, 0.0, 1.0), "timed out (reward.timeout_s) for every sample"),
    ((1.0, 1.0, 0.0), "raised (see the traceback logged above) for every sample"),
    ((1.0, 0.25, 0.5), "returned None for 25% of the samples; timed out (reward.timeout_s) for 50% of the samples; "
                       "raised (see the traceback logged above) for 25% of the samples"),
])
def test_the_cause_is_what_the_function_did(fracs, cause):
    err, _ = RewardGuard({"judge": 1.0}, limit=1).observe(7, metrics(1.0, judge=fracs))
    assert f"reward function 'judge' gave no value for any sample in step 7: it {cause}" in str(err)


def test_no_total_reward_although_each_function_scored_some_samples():
    guard = RewardGuard({"a": 1.0, "b": 1.0}, limit=2)
    half_a, half_b = (0.5, 0.0, 0.0), (0.5, 0.0, 0.0)  # a misses one half, b the other: every total is NaN
    assert guard.observe(1, metrics(1.0, a=half_a, b=half_b))[0] is None
    err, _ = guard.observe(2, metrics(1.0, a=half_a, b=half_b))
    assert str(err).startswith("no sample had a total reward in 2 steps in a row (steps 1-2) "
                               "(reward.max_missing_steps=2): each sample misses some weighted reward function "
                               "(missing per function: 'a' 50%, 'b' 50%)")


def test_a_weight_zero_function_only_warns_once():
    guard = RewardGuard({"judge": 1.0, "logged": 0.0}, limit=1)
    err, warnings = guard.observe(1, metrics(0.0, judge=FINE, logged=ALL_NONE))
    assert err is None and warnings == ["reward function 'logged' (weight 0, logged only) gave no value for any "
                                         "sample at step 1: it returned None for every sample"]
    assert guard.observe(2, metrics(0.0, judge=FINE, logged=ALL_NONE)) == (None, [])


def test_the_state_survives_a_checkpoint():
    guard = RewardGuard({"judge": 1.0}, limit=3)
    guard.observe(4, metrics(1.0, judge=ALL_NONE))
    guard.observe(5, metrics(1.0, judge=ALL_NONE))
    resumed = RewardGuard({"judge": 1.0}, limit=3, state=guard.state_dict())
    err, _ = resumed.observe(6, metrics(1.0, judge=ALL_NONE))
    assert "3 steps in a row (steps 4-6)" in str(err)


def test_the_trainer_raises_rewards_missing_and_writes_no_final(make_trainer, tmp_path):
    def none_reward(prompts, completions, **columns):
        return [None] * len(completions)

    none_reward.in_process = True
    trainer = make_trainer("train.steps=5", "reward.max_missing_steps=2",
                           reward_functions=[("nothing", none_reward, 1.0)])
    with pytest.raises(RewardsMissing, match=r"'nothing' gave no value for any sample in 2 steps in a row "
                                             r"\(steps 1-2\): it returned None for every sample"):
        trainer.train()
    run_dir = tmp_path / "run"
    assert not (run_dir / "final").exists() and not (run_dir / "summary.json").exists()
    assert (run_dir / "checkpoints" / "step-000002" / "COMMITTED").is_file()


# ------------------------------------------------------------------------------------------- zero spread
FLAT = {"adv/zero_std_frac": 1.0, "reward/std": 0.0, "reward/mean": 0.0}


def test_zero_spread_steps_in_a_row_stop_and_one_informative_step_resets():
    from grpo.train.guards import NoLearningSignal, ZeroSpreadGuard

    guard = ZeroSpreadGuard(limit=3, hint="Change one of: rollout.group_size.")
    assert guard.observe(1, FLAT) is None and guard.observe(2, FLAT) is None
    assert guard.observe(3, FLAT | {"reward/std": 0.5}) is None  # groups flat, but rewards differ across groups
    assert guard.observe(4, FLAT | {"adv/zero_std_frac": 0.75}) is None  # one group had spread
    assert guard.observe(5, FLAT) is None and guard.observe(6, FLAT) is None
    err = guard.observe(7, FLAT)
    assert isinstance(err, NoLearningSignal) and isinstance(err, HealthGuardError)
    assert "every reward was 0 in 3 steps in a row (steps 5-7; train.zero_spread_steps=3)" in str(err)
    assert str(err).endswith("Change one of: rollout.group_size.")
    off = ZeroSpreadGuard(limit=0)
    assert all(off.observe(s, FLAT) is None for s in range(1, 50))


def test_the_zero_spread_count_survives_a_checkpoint():
    from grpo.train.guards import ZeroSpreadGuard

    guard = ZeroSpreadGuard(limit=3)
    guard.observe(1, FLAT), guard.observe(2, FLAT)
    again = ZeroSpreadGuard(limit=3, state=guard.state_dict())
    assert "steps 1-3" in str(again.observe(3, FLAT))


def test_a_run_without_reward_spread_stops_with_a_checkpoint_and_exit_3(tiny_model_dir, tmp_path, monkeypatch,
                                                                        capsys):
    """train.preflight=warn (trains anyway), then every step's rewards are all 0: the run ends at step
    train.zero_spread_steps with a committed checkpoint to resume from, no final/, exit 3."""
    from grpo.cli import main

    (tmp_path / "r.py").write_text("def zero(prompts, completions, **kw):\n    return [0.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    code = main(["train", f"model.name={tiny_model_dir}", "reward.functions=[r.py:zero]", "rollout.group_size=2",
                 "rollout.prompts_per_step=2", "rollout.max_new_tokens=4", "data.train_size=20", "eval.n=2",
                 "train.eval_every=0", "train.steps=10", "train.preflight=warn", "train.zero_spread_steps=3",
                 "log.plots=false", "--output-dir", "run", "--quiet"])
    captured = capsys.readouterr()
    out = captured.out + captured.err  # the stop's message is on stderr
    assert code == EXIT_HEALTH, out[-2000:]
    assert "every reward was 0 in 3 steps in a row (steps 1-3; train.zero_spread_steps=3)" in out
    assert (tmp_path / "run" / "checkpoints" / "step-000003" / "COMMITTED").is_file()
    assert not (tmp_path / "run" / "final").exists()
