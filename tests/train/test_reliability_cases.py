"""RELIABILITY.md section 9, row by row, through the trainer: each test is named `test_row_<n>_...` and asserts the
behaviour docs/reliability.md states for that row. Rows checked elsewhere (kill -9, SIGTERM, resume, NaN, disk
full) are in tests/train/test_faults.py and tests/train/test_resume_e2e.py; the last test here checks that the
table in docs/reliability.md names an existing test for every row.

The small-model fixtures are those of tests/train/conftest.py.
"""

from __future__ import annotations

import logging
import math
import re
import time
from pathlib import Path

import psutil
import pytest
import torch
from train_helpers import eos_logit, varied_reward

from grpo.algo import group_advantages
from grpo.config import ConfigError, load_config
from grpo.data.validate import DataError
from grpo.rewards import RewardFunctionError
from grpo.tracking.metrics import read_jsonl
from grpo.train.optim import build_optimizer
from grpo.train.update import batch_logprobs, policy_update
from grpo.types import Prompt

ROOT = Path(__file__).resolve().parents[2]


class ListTask:
    """A task over given prompts (the data set rows of these tests); its test split is its train split."""

    name = "list"

    def __init__(self, rows: list[Prompt]):
        self.rows = rows

    def split(self, name: str, n: int) -> list[Prompt]:
        return self.rows[:n]

    def reward_functions(self):
        return [("test_varied", varied_reward, 1.0)]

    def is_correct(self, prompt, completion) -> bool:
        return False

    def demonstration(self, prompt) -> str:
        return ""


GOOD_BAD = [Prompt("good", "What is 1 + 2?\n", "3"), Prompt("bad", "What is 2 + 2?\n", "bad")]


def in_process(fn):
    fn.in_process = True
    return fn


def finite_metrics(metrics: dict, allow_nan: tuple[str, ...] = ()) -> None:
    bad = {k: v for k, v in metrics.items() if not math.isfinite(v) and k not in allow_nan}
    assert not bad, f"non-finite metrics: {bad}"


# ----------------------------------------------------------------------------------------------- rows 1, 20
@pytest.mark.parametrize(("override", "field"), [
    ("rollout.group_size=1", "rollout.group_size"), ("rollout.group_size=0", "rollout.group_size"),
    ("rollout.prompts_per_step=0", "rollout.prompts_per_step")])
def test_row_1_group_size_below_2_is_a_config_error(override, field):
    with pytest.raises(ConfigError, match=re.escape(field)):
        load_config(None, [override])


@pytest.mark.parametrize(("overrides", "text"), [
    (["algo.ratio_level=sequence", "algo.aggregate=seq_sum_norm"], "algo.ratio_level=sequence"),
    (["algo.clip_low=1.0"], "algo.clip_low"), (["algo.dual_clip=1.0"], "algo.dual_clip"),
    (["algo.advantage=ppo"], "algo.advantage")])
def test_row_20_conflicting_or_invalid_options_are_config_errors(overrides, text):
    with pytest.raises(ConfigError, match=re.escape(text)):
        load_config(None, overrides)


# ----------------------------------------------------------------------------------------------- rows 2, 3
def test_row_2_3_all_equal_rewards_give_zero_advantage_no_nan_and_a_warning(make_trainer, tmp_path, capsys):
    constant = in_process(lambda prompts, completions, **kw: [1.0] * len(completions))
    trainer = make_trainer("train.steps=3", reward_functions=[("constant", constant, 1.0)])
    trainer.train()
    for row in read_jsonl(tmp_path / "run" / "samples.jsonl"):
        assert row["advantages"] == [0.0] * len(row["advantages"])
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")[1:]  # [0]: step 0, the accuracy before training
    for r in rows:
        assert r["adv/zero_std_frac"] == 1.0 and r["adv/abs_mean"] == 0.0 and r["reward/std"] == 0.0
        assert r["policy/grad_norm"] == 0.0  # a zero-gradient step
        finite_metrics({k: v for k, v in r.items() if isinstance(v, float)})
    assert "100% of groups have the same reward for every completion" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------- rows 4-7
def test_row_4_none_rewards_are_missing_with_zero_advantage(make_trainer):
    maybe = in_process(lambda prompts, completions, answer, **kw: [None if a == "bad" else 1.0 + 0.1 * len(c)
                                                                   for c, a in zip(completions, answer)])
    trainer = make_trainer(task=ListTask(GOOD_BAD), reward_functions=[("maybe", maybe, 1.0)])
    result = trainer.step()
    metrics = result.metrics
    bad = torch.tensor([p.uid == "bad" for p in result.rollouts.prompts]).repeat_interleave(2)
    assert metrics["reward/missing_frac"] == 0.5 and metrics["reward/maybe/missing_frac"] == 0.5
    assert torch.isnan(result.scores.total[bad]).all()
    assert torch.equal(result.advantages[bad], torch.zeros(2)) and torch.isfinite(result.advantages).all()
    finite_metrics(metrics)


@pytest.mark.parametrize("values", [[1.0, float("nan"), 1.0, 1.0], [1.0, 1.0, float("inf"), 1.0],
                                    [1.0, 1.0, 1.0, 1e39]])
def test_row_5_unstorable_reward_values_are_that_samples_invalid_value(values, make_trainer, caplog):
    """NaN, inf or a value past reward.max_abs (1e39 would be inf as float32): that sample has no value from the
    function (missing, counted in reward/<fn>/invalid_frac, the reason logged), the others train (issue #28)."""
    broken = in_process(lambda prompts, completions, **kw: values)
    trainer = make_trainer(reward_functions=[("broken", broken, 1.0)])
    with caplog.at_level(logging.WARNING, logger="grpo.rewards"):
        result = trainer.step()
    bad = [i for i, v in enumerate(values) if not abs(v) <= 1e6]
    assert result.metrics["reward/broken/invalid_frac"] == 0.25 and result.scores.status["broken"][bad[0]] == "invalid"
    assert torch.isnan(result.scores.total[bad]).all() and torch.isfinite(result.advantages).all()
    assert f"reward function 'broken' returned" in caplog.text and f"at index {bad[0]}" in caplog.text


@pytest.mark.parametrize(("values", "message"), [
    (["x", 1.0, 1.0, 1.0], "reward function 'broken' returned a non-numeric value 'x' at index 0"),
    ([1.0, 1.0, 1.0], "reward function 'broken' returned 3 values for 4 completions")])
def test_row_5_invalid_reward_outputs_are_errors_naming_function_and_index(values, message, make_trainer):
    broken = in_process(lambda prompts, completions, **kw: values)
    trainer = make_trainer(reward_functions=[("broken", broken, 1.0)])
    with pytest.raises(ValueError, match=re.escape(message)):
        trainer.step()


def test_row_6_raising_rewards_are_missing_logged_once_and_abort_above_the_limit(make_trainer, caplog):
    def fragile(prompts, completions, answer, **kw):
        if "bad" in answer:
            raise ZeroDivisionError("cannot score this one")
        return [1.0 + 0.1 * len(c) for c in completions]

    trainer = make_trainer(task=ListTask(GOOD_BAD), reward_functions=[("fragile", in_process(fragile), 1.0)])
    with caplog.at_level(logging.WARNING, logger="grpo.rewards"):
        result = trainer.step()
    metrics = result.metrics
    assert metrics["reward/fragile/error_frac"] == 0.5 and metrics["reward/missing_frac"] == 0.5
    bad = torch.tensor([p.uid == "bad" for p in result.rollouts.prompts]).repeat_interleave(2)
    assert torch.equal(result.advantages[bad], torch.zeros(2))
    assert caplog.text.count("ZeroDivisionError: cannot score this one") == 1
    always = in_process(lambda prompts, completions, **kw: 1 / 0)
    with pytest.raises(RewardFunctionError, match="reward function 'always' raised on 4/4 samples"):
        make_trainer(reward_functions=[("always", always, 1.0)]).step()


def test_row_7_a_hanging_reward_is_killed_at_the_timeout_and_missing(make_trainer):
    def hangs(prompts, completions, answer, **kw):
        if "bad" in answer:
            time.sleep(1e6)
        return [1.0] * len(completions)

    trainer = make_trainer("reward.timeout_s=0.5", task=ListTask(GOOD_BAD), reward_functions=[("hangs", hangs, 1.0)])
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    t0 = time.monotonic()
    result = trainer.step()
    metrics = result.metrics
    assert time.monotonic() - t0 < 0.5 * 2 + 4.0  # at most about 2 x timeout_s, plus the step itself
    assert metrics["reward/hangs/timeout_frac"] == 0.5 and metrics["reward/missing_frac"] == 0.5
    bad = torch.tensor([p.uid == "bad" for p in result.rollouts.prompts]).repeat_interleave(2)
    assert torch.isnan(result.scores.total[bad]).all() and not torch.isnan(result.scores.total[~bad]).any()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = [p for p in psutil.Process().children(recursive=True) if p.pid not in children]
        if not left:
            break
        time.sleep(0.05)
    assert not left, f"reward worker processes left behind: {left}"


# ----------------------------------------------------------------------------------------------- rows 9, 10
def test_row_9_empty_completions_give_a_finite_zero_loss(make_trainer):
    trainer = make_trainer()
    eos_logit(trainer, 50.0)
    result = trainer.step()
    metrics = result.metrics
    assert result.rollouts.texts == [""] * 4 and metrics["rollout/len_mean"] == 1.0  # EOS only
    assert metrics["loss/policy"] == 0.0
    finite_metrics(metrics)
    # A batch where no completion has an unmasked token: the denominators are clamped, the loss is 0, and a fresh
    # optimizer leaves the parameters unchanged.
    batch = trainer._policy_batch(result.rollouts)
    batch.mask = torch.zeros_like(batch.mask)
    batch.adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    opt, sched = build_optimizer(trainer.policy.parameters(), trainer.cfg.optim, 10)
    out = policy_update(trainer.policy, opt, sched, batch, trainer.cfg)
    assert out["loss/policy"] == 0.0 and out["train/skipped_updates"] == 0
    assert all(torch.equal(before[k], v) for k, v in trainer.policy.state_dict().items())


def test_row_10_all_truncated_completions_train_finitely_with_a_warning(make_trainer, capsys):
    trainer = make_trainer("train.steps=3")
    eos_logit(trainer, float("-inf"))
    trainer.train()
    assert "100% of completions hit rollout.max_new_tokens without ending" in capsys.readouterr().out
    for r in read_jsonl(trainer.run_dir / "metrics.jsonl")[1:]:
        assert r["rollout/truncated_frac"] == 1.0 and math.isfinite(r["loss/policy"])


# ----------------------------------------------------------------------------------------------- rows 12-15
LONG = [Prompt("a", "What is 1 + 2?\n", "3"), Prompt("b", "What is 3 + 4?\n", "7"),
        Prompt("long", "What is " + " + ".join(["1"] * 40) + "?\n", "40")]


def test_row_12_an_over_long_prompt_is_an_error_naming_it(make_trainer):
    with pytest.raises(DataError, match=r"train prompt 'long': column 'prompt' has 167 tokens.*"
                                        r"data.max_prompt_tokens=64.*data.filter_long_prompts=true"):
        make_trainer("data.max_prompt_tokens=64", task=ListTask(LONG))


def test_row_12_over_long_prompts_are_dropped_with_a_count_when_configured(make_trainer, caplog):
    with caplog.at_level(logging.WARNING, logger="grpo.data"):
        trainer = make_trainer("data.max_prompt_tokens=64", "data.filter_long_prompts=true", task=ListTask(LONG))
    assert [p.uid for p in trainer.train_prompts] == ["a", "b"]
    assert "dropped 1 of 3 train prompts" in caplog.text and "dropped 1 of 3 test prompts" in caplog.text
    finite_metrics(trainer.step().metrics)


@pytest.fixture
def no_model_load(monkeypatch):
    """Data errors must come before any model is loaded (or the built-in one warmed up)."""
    import grpo.train.trainer as trainer_module

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the data was checked")

    monkeypatch.setattr(trainer_module, "load_policy", refuse)


def test_row_13_a_missing_reward_column_is_an_error_before_model_load(make_trainer, no_model_load):
    def needs_answer(prompts, completions, answer, **kw):
        return [1.0] * len(completions)

    rows = [Prompt("a", "What is 1 + 2?\n", "3"), Prompt("no-answer", "What is 2 + 2?\n", None)]
    with pytest.raises(DataError, match=r"train prompt 'no-answer' has no column 'answer', which reward "
                                        r"function 'needs_answer' needs"):
        make_trainer(task=ListTask(rows), reward_functions=[("needs_answer", needs_answer, 1.0)])
    with_meta = in_process(lambda prompts, completions, difficulty, **kw: [1.0] * len(completions))
    with pytest.raises(DataError, match=r"train prompt 'a' has no column 'difficulty'"):
        make_trainer(task=ListTask(rows), reward_functions=[("with_meta", with_meta, 1.0)])


def test_row_13_an_empty_prompt_is_an_error_naming_row_and_column(make_trainer, no_model_load):
    rows = [Prompt("a", "What is 1 + 2?\n", "3"), Prompt("b", "What is 3 + 4?\n", "7"), Prompt("blank", "  ", "0")]
    with pytest.raises(DataError, match=r"train prompt 'blank': column 'prompt' is empty"):
        make_trainer(task=ListTask(rows))


@pytest.mark.parametrize(("rows", "message"), [
    ([], "the train split has no prompts"),
    ([Prompt("a", "What is 1 + 2?\n", "3")], ("the train split has 1 prompts, fewer than one step's "
                                              "rollout.prompts_per_step=2"))])
def test_row_14_empty_or_too_small_data_set_is_an_error_before_model_load(rows, message, make_trainer,
                                                                         no_model_load):
    with pytest.raises(DataError, match=re.escape(message)):
        make_trainer(task=ListTask(rows))


def test_row_15_duplicate_prompts_stay_separate_groups(make_trainer):
    """Two rows with the same text but different uids and answers: two groups, normalised separately."""
    rows = [Prompt("first", "What is 1 + 2?\n", "1"), Prompt("second", "What is 1 + 2?\n", "2")]
    by_answer = in_process(lambda prompts, completions, answer, **kw: [float(a) + (sum(map(ord, c)) % 7) / 10
                                                                      for c, a in zip(completions, answer)])
    trainer = make_trainer(task=ListTask(rows), reward_functions=[("by_answer", by_answer, 1.0)])
    result = trainer.step()
    assert sorted(p.uid for p in result.rollouts.prompts) == ["first", "second"]
    adv, total = result.advantages, result.scores.total
    assert torch.equal(adv, group_advantages(total, 2))
    assert abs(float(adv[:2].sum())) < 1e-4 and abs(float(adv[2:].sum())) < 1e-4  # merged, they would not be


# ----------------------------------------------------------------------------------------------- rows 16, 19
@pytest.mark.parametrize("shift", [50.0, -50.0])
def test_row_16_an_extreme_log_ratio_keeps_the_loss_finite(shift, make_trainer):
    trainer = make_trainer()
    batch = trainer._policy_batch(trainer.step().rollouts)
    batch.adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    batch.old_logp = batch_logprobs(trainer.policy, batch, 10**6, 1.0) - shift  # stale pi_old: ratio e^(+-50)
    out = policy_update(trainer.policy, trainer.optimizer, trainer.scheduler, batch, trainer.cfg)
    assert out["train/skipped_updates"] == 0 and math.isfinite(out["loss/policy"])
    assert out["policy/clip_frac"] > 0
    assert all(torch.isfinite(p).all() for p in trainer.policy.parameters())


def test_row_19_beta_above_0_loads_a_frozen_reference_and_beta_0_none(make_trainer, tmp_path):
    assert make_trainer().ref is None
    trainer = make_trainer("kl.coef=0.04", run_dir=tmp_path / "kl")
    assert trainer.ref is not None
    with trainer.ref.active() as ref:
        assert ref is not trainer.policy and not ref.training
        assert not any(p.requires_grad for p in ref.parameters())
        assert all(torch.equal(a, b) for a, b in zip(ref.state_dict().values(), trainer.policy.state_dict().values()))
    metrics = trainer.step().metrics
    assert math.isfinite(metrics["loss/kl"]) and metrics["policy/kl"] >= 0.0
    finite_metrics(metrics)


# ----------------------------------------------------------------------------------------------- the table
def test_docs_table_names_an_existing_test_for_every_applicable_row():
    """docs/reliability.md: one line per section 9 row; every test it cites exists."""
    table = [line for line in (ROOT / "docs" / "reliability.md").read_text().splitlines()
             if re.match(r"^\| *\d+ *\|", line)]
    assert sorted(int(line.split("|")[1]) for line in table) == list(range(1, 25))
    for line in table:
        for path, name in re.findall(r"`(tests/[\w/]+\.py)::(\w+)", line):
            assert re.search(rf"^(async )?def {name}\(", (ROOT / path).read_text(), re.MULTILINE), f"{path}::{name} missing"
        if "not applicable" not in line.lower():
            assert "tests/" in line, f"row {line.split('|')[1].strip()} names no test"
