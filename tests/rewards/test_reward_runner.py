"""RewardRunner: TRL compatibility, weights, metrics, and the failure semantics (RELIABILITY.md section 9-10)."""

from __future__ import annotations

import logging
import math
import os
import time

import pytest
import torch

from grpo.algo.advantages import group_advantages
from grpo.rewards import RewardFunctionError, RewardRunner, RewardSpec

PROMPTS = ["p0", "p1", "p2", "p3", "p4", "p5"]
COMPLETIONS = ["a", "bb", "ccc", "dddd", "eeeee", "ffffff"]


# TRL's documented examples, unchanged.
def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def format_reward_func(completions, **kwargs):
    import re

    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    return [1.0 if re.match(pattern, content) else 0.0 for content in completion_contents]


def ground_truth_reward(prompts, completions, ground_truth, **kwargs):
    return [float(c == gt) for c, gt in zip(completions, ground_truth, strict=True)]


@pytest.fixture
def runner_factory():
    made = []

    def make(functions, **kw):
        kw.setdefault("timeout_s", 5.0)
        r = RewardRunner(functions, **kw)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def test_trl_functions_work_unchanged(runner_factory, no_leak):
    runner = runner_factory([reward_len, ("truth", ground_truth_reward, 2.0)])
    res = runner(PROMPTS, COMPLETIONS, {"ground_truth": ["a", "x", "ccc", "x", "x", "x"]})
    lens = torch.tensor([-abs(20 - len(c)) for c in COMPLETIONS], dtype=torch.float32)
    truth = torch.tensor([1, 0, 1, 0, 0, 0], dtype=torch.float32)
    torch.testing.assert_close(res.per_function["reward_len"], lens)
    torch.testing.assert_close(res.per_function["truth"], truth)
    torch.testing.assert_close(res.total, lens + 2 * truth)
    assert res.total.dtype == torch.float32 and res.missing.dtype == torch.bool and not res.missing.any()
    assert res.metrics["reward/truth"] == pytest.approx(2 / 6)
    assert res.metrics["reward/missing_frac"] == 0.0
    assert {"reward/reward_len/missing_frac", "reward/reward_len/s", "reward/truth/s"} <= set(res.metrics)


def test_conversational_completions(runner_factory):
    convs = [
        [{"role": "assistant", "content": "<think>x</think><answer>1</answer>"}],
        [{"role": "assistant", "content": "no"}],
    ]
    prompts = [[{"role": "user", "content": "q"}]] * 2
    res = runner_factory([format_reward_func])(prompts, convs, {})
    assert res.per_function["format_reward_func"].tolist() == [1.0, 0.0]


def test_closures_lambdas_async_and_numpy_outputs(runner_factory):
    import numpy as np

    offset = 10.0

    async def async_reward(prompts, completions, **kw):
        return [1.0] * len(completions)

    runner = runner_factory(
        [
            ("closure", lambda prompts, completions, **kw: [offset + len(c) for c in completions], 1.0),
            ("async", async_reward, 1.0),
            ("numpy", lambda completions, **kw: np.arange(len(completions), dtype=np.float64), 1.0),
            ("tensor", lambda completions, **kw: torch.ones(len(completions)), 1.0),
        ]
    )
    res = runner(PROMPTS[:2], COMPLETIONS[:2], {})
    assert res.per_function["closure"].tolist() == [11.0, 12.0]
    assert res.total.tolist() == [13.0, 15.0]


def test_none_is_missing_and_weight_zero_is_logged_only(runner_factory):
    runner = runner_factory(
        [
            ("sometimes", lambda completions, **kw: [None if i == 1 else 1.0 for i in range(len(completions))], 1.0),
            ("log_only", lambda completions, **kw: [None] * len(completions), 0.0),
        ]
    )
    res = runner(PROMPTS[:3], COMPLETIONS[:3], {})
    assert res.missing.tolist() == [False, True, False]
    assert math.isnan(res.total[1]) and res.total[0] == 1.0
    assert res.metrics["reward/missing_frac"] == pytest.approx(1 / 3)
    assert res.metrics["reward/sometimes/missing_frac"] == pytest.approx(1 / 3)
    assert math.isnan(res.metrics["reward/log_only"])
    assert res.status["sometimes"] == ["ok", "none", "ok"]


def _raise_every_third(prompts, completions, **kw):
    out = []
    for c in completions:
        if len(c) % 3 == 0:
            raise ValueError(f"bad sample {c!r}")
        out.append(1.0 if len(c) % 2 else 0.0)
    return out


def test_raising_on_every_third_sample(runner_factory, caplog, no_leak):
    runner = runner_factory([("flaky", _raise_every_third, 1.0)])
    with caplog.at_level(logging.WARNING, logger="grpo.rewards"):
        res = runner(PROMPTS, COMPLETIONS, {})
        res2 = runner(PROMPTS, COMPLETIONS, {})
    assert res.missing.tolist() == [False, False, True, False, False, True]
    assert res.status["flaky"] == ["ok", "ok", "error", "ok", "ok", "error"]
    assert res.metrics["reward/missing_frac"] == pytest.approx(1 / 3)
    assert res.metrics["reward/flaky/error_frac"] == pytest.approx(1 / 3)
    assert "bad sample" in res.tracebacks["flaky"] and res2.missing.tolist() == res.missing.tolist()
    adv = group_advantages(res.total, group_size=3)
    assert adv[res.missing].tolist() == [0.0, 0.0]
    assert torch.isfinite(adv).all() and adv[~res.missing].abs().sum() > 0
    logged = [r for r in caplog.records if "flaky" in r.getMessage() and "Traceback" in r.getMessage()]
    assert len(logged) == 1, "the traceback is logged once per function and exception type"


def test_raising_always_is_an_error_naming_the_function(runner_factory):
    def always_broken(completions, **kw):
        raise RuntimeError("verifier exploded")

    runner = runner_factory([("ok", reward_len, 1.0), ("always_broken", always_broken, 1.0)], max_failure_frac=0.5)
    with pytest.raises(RewardFunctionError, match="always_broken") as info:
        runner(PROMPTS, COMPLETIONS, {})
    assert "verifier exploded" in str(info.value) and info.value.name == "always_broken"


def test_failure_threshold_is_configurable(runner_factory):
    res = runner_factory([("flaky", _raise_every_third, 1.0)], max_failure_frac=0.5)(PROMPTS, COMPLETIONS, {})
    assert res.missing.sum() == 2
    with pytest.raises(RewardFunctionError, match="flaky"):
        runner_factory([("flaky", _raise_every_third, 1.0)], max_failure_frac=0.2)(PROMPTS, COMPLETIONS, {})


def test_sleeping_forever_is_killed_and_the_step_completes(runner_factory, no_leak):
    def sleeper(completions, **kw):
        time.sleep(1e6)

    runner = runner_factory([("sleeper", sleeper, 1.0), ("len", reward_len, 1.0)], timeout_s=1.0)
    t0 = time.monotonic()
    res = runner(PROMPTS, COMPLETIONS, {})
    elapsed = time.monotonic() - t0
    assert elapsed < 2 * 1.0 + 1.5, elapsed  # the batch call, then one more timeout for the per-sample retry
    assert res.missing.all() and res.status["sleeper"] == ["timeout"] * 6
    assert res.metrics["reward/sleeper/timeout_frac"] == 1.0
    assert res.per_function["len"].isfinite().all()


def test_one_hung_sample_is_isolated(runner_factory, no_leak):
    def hangs_on_ccc(completions, **kw):
        if "ccc" in completions:
            while True:
                pass
        return [1.0] * len(completions)

    res = runner_factory([("h", hangs_on_ccc, 1.0)], timeout_s=1.0)(PROMPTS, COMPLETIONS, {})
    assert res.status["h"][:3] == ["ok", "ok", "timeout"]
    assert res.missing.tolist()[:3] == [False, False, True]


def test_a_crashing_sample_does_not_take_the_others(runner_factory, no_leak):
    def crashes(completions, **kw):
        if "bb" in completions:
            os._exit(3)
        return [1.0] * len(completions)

    res = runner_factory([("c", crashes, 1.0)], max_failure_frac=1.0)(PROMPTS, COMPLETIONS, {})
    assert res.status["c"] == ["ok", "error", "ok", "ok", "ok", "ok"]
    assert "exit 3" in res.tracebacks["c"]


def test_slow_functions_overlap(runner_factory, tmp_path):
    """The three functions run at the same time: each records, in its own forked child, when it started and ended
    (CLOCK_MONOTONIC is one clock for all processes), and there is a moment when all three were running. Run one
    after another, each would start after the previous one ended. No bound on the call's wall time, which a busy
    machine stretches."""
    def slow(name):
        def fn(completions, **kw):
            start = time.monotonic()
            time.sleep(1.0)
            (tmp_path / name).write_text(f"{start} {time.monotonic()}")
            return [0.0] * len(completions)
        return fn

    runner_factory([(name, slow(name), 1.0) for name in "abc"])(PROMPTS, COMPLETIONS, {})
    spans = [[float(t) for t in (tmp_path / name).read_text().split()] for name in "abc"]
    assert max(start for start, _ in spans) < min(end for _, end in spans), spans


@pytest.mark.parametrize(
    "output, match",
    [
        ([1.0] * 5, "returned 5 values for 6 completions"),
        ([1.0, 1.0, 1.0, "1.0", 1.0, 1.0], "non-numeric value '1.0' at index 3"),
        ("oops", "expected a list"),
    ],
)
@pytest.mark.parametrize("in_process", [False, True])
def test_invalid_outputs_are_errors_naming_function_and_index(runner_factory, output, match, in_process):
    runner = runner_factory([RewardSpec("bad_fn", lambda completions, **kw: output, in_process=in_process)])
    with pytest.raises(ValueError, match="bad_fn") as info:
        runner(PROMPTS, COMPLETIONS, {})
    assert match in str(info.value)


@pytest.mark.parametrize("in_process", [False, True])
def test_unstorable_values_are_that_samples_invalid_value(runner_factory, in_process):
    """NaN, inf, 1e39 (inf as float32), 10**400 and a value past max_abs: each sample gets no value from the function
    (status invalid, reward/<fn>/invalid_frac), the others keep theirs; nothing raises (issue #28)."""
    out = [1.0, float("nan"), float("inf"), 1e39, 10 ** 400, 2e6]
    runner = runner_factory([RewardSpec("wild", lambda completions, **kw: out, in_process=in_process)])
    res = runner(PROMPTS, COMPLETIONS, {})
    assert res.status["wild"] == ["ok"] + ["invalid"] * 5 and res.metrics["reward/wild/invalid_frac"] == 5 / 6
    assert res.per_function["wild"][0] == 1.0 and torch.isnan(res.per_function["wild"][1:]).all()


def test_in_process_functions_isolate_exceptions_per_sample(runner_factory):
    res = runner_factory([RewardSpec("flaky", _raise_every_third, in_process=True)])(PROMPTS, COMPLETIONS, {})
    assert res.status["flaky"] == ["ok", "ok", "error", "ok", "ok", "error"]


def test_input_validation(runner_factory):
    runner = runner_factory([reward_len])
    with pytest.raises(ValueError, match="column 'answer'"):
        runner(PROMPTS, COMPLETIONS, {"answer": ["1"]})
    with pytest.raises(ValueError, match="prompts"):
        runner(PROMPTS[:2], COMPLETIONS, {})
    with pytest.raises(ValueError, match="unique"):
        RewardRunner([reward_len, reward_len])
    with pytest.raises(ValueError, match="timeout_s"):
        RewardRunner([reward_len], timeout_s=0)
    with pytest.raises(ValueError, match="unknown reward option"):
        RewardRunner([("x", reward_len, 1.0, {"bogus": 1})])
    assert runner([], [], {}).total.shape == (0,)


def test_close_stops_the_runner(no_leak):
    runner = RewardRunner([reward_len])
    runner.close()
    with pytest.raises(RuntimeError, match="closed"):
        runner(PROMPTS, COMPLETIONS, {})


def test_fork_failure_is_a_failure_not_a_crash_of_the_runner(runner_factory, monkeypatch):
    def no_fork():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    res = runner_factory([("f", reward_len, 1.0)], max_failure_frac=1.0)(PROMPTS, COMPLETIONS, {})
    assert res.missing.all() and res.status["f"] == ["error"] * 6
    assert "fork failed" in res.tracebacks["f"]


@pytest.mark.parametrize("in_process", [False, True])
def test_side_metrics_from_reward_values(runner_factory, in_process):
    """RewardValues extras become reward/<name>/<key>: the mean over samples that have one, also after retries."""
    from grpo.rewards import RewardValues

    def fn(prompts, completions, **kw):
        if len(completions) > 1 and "boom" in completions:
            raise RuntimeError("retry me one at a time")
        vals = [float(len(c)) for c in completions]
        return RewardValues(vals, extras={"share": [None if c == "x" else len(c) / 10 for c in completions]})

    runner = runner_factory([("f", fn, 1.0, {"in_process": in_process})], max_failure_frac=1.0)
    res = runner(["p"] * 3, ["x", "abcd", "ab"])
    assert res.per_function["f"].tolist() == [1.0, 4.0, 2.0]
    assert res.metrics["reward/f/share"] == pytest.approx((0.4 + 0.2) / 2)  # "x" has none
    res = runner(["p"] * 3, ["abcd", "boom", "ab"])  # the whole call raises: per-sample retries keep the extras
    assert res.metrics["reward/f/share"] == pytest.approx((0.4 + 0.4 + 0.2) / 3)
    bad = runner_factory([("g", lambda prompts, completions: RewardValues([1.0], extras={"k": [1, 2]}), 1.0)])
    with pytest.raises(ValueError, match="extras"):
        bad(["p"], ["c"])
