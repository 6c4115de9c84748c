"""The built-in code task: disjoint splits, right test cases, and a verifier that runs programs in the sandbox."""

import random

import pytest

from grpo.data import get_task
from grpo.data.code import LEVELS, format_reward


@pytest.mark.parametrize("difficulty", sorted(LEVELS))
def test_train_and_test_never_overlap(difficulty):
    task = get_task("code", difficulty=difficulty)
    train, test = task.split("train", 10**6), task._problems("test")
    assert not {p.text for p in train} & {p.text for p in test}
    assert len(test) > 0 and len(train) > 5 * len(test)


def test_default_level_has_500_held_out_problems_and_is_stable():
    a, b = get_task("code"), get_task("code")
    assert [p.text for p in a.split("test", 500)] == [p.text for p in b.split("test", 500)]
    with pytest.raises(ValueError, match="eval.n"):
        get_task("code", difficulty="easy").split("test", 500)
    with pytest.raises(ValueError, match="data.difficulty for code"):
        get_task("code", difficulty="seed")


def test_prompt_values_and_tests_match_the_hidden_function():
    for p in get_task("code").split("train", 200):
        a, b, x0 = p.meta["a"], p.meta["b"], p.meta["x0"]
        assert p.text == f"Write f(x) with f({x0}) = {a * x0 + b} and f({x0 + 1}) = {a * x0 + a + b}.\n"
        assert p.meta["tests"][2:] == [f"assert f(0) == {b}", f"assert f(9) == {9 * a + b}"]  # hidden points
        f = eval(f"lambda x: {p.answer}")  # trusted: the task's own reference, not model output
        for t in p.meta["tests"]:
            x, want = t.removeprefix("assert f(").split(") == ")
            assert f(int(x)) == int(want)


def test_every_test_is_judged_outside_the_sandbox():
    """The task's assertions parse as call checks: only `f(x)` enters the sandbox, never the expected value."""
    from grpo.sandbox.checks import evaluate_check, parse_tests

    for p in get_task("code").split("train", 300) + get_task("code").split("test", 50):
        plan = parse_tests(p.meta["tests"])
        assert plan.unverifiable == [] and plan.io == [] and len(plan.calls) == 4
        for check, test in zip(plan.calls, p.meta["tests"]):
            x, want = test.removeprefix("assert f(").split(") == ")
            assert check.holes == (f"f({x})",)  # the whole of what the sandbox sees of this test
            assert evaluate_check(check, {0: int(want)}) and not evaluate_check(check, {0: int(want) + 1})


def test_a_forged_answer_does_not_pass(no_leak):
    """An object equal to everything, and writing a fake verdict, pass nothing (the issue-12 attacks)."""
    task = get_task("code")
    p = task.split("train", 1)[0]
    cheats = ["```python\nclass A:\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return A()\n```",
              "```python\nimport os, sys\nos.write(1, (sys.stdin.readline().strip() + ' 4 4\\n').encode())\n"
              "os._exit(0)\n```"]
    assert task.is_correct_batch([p] * 3, cheats + [task.demonstration(p)]) == [False, False, True]


def test_both_demonstration_styles_pass_in_the_sandbox(no_leak):
    task = get_task("code")
    prompts = task.split("train", 24)
    worked = [task.demonstration(p, random.Random(0)) for p in prompts]  # first draw 0.84 > 0.35: direct
    task.worked_frac = 1.0
    direct, worked = worked, [task.demonstration(p) for p in prompts]
    assert "(x - " in "".join(worked) and "(x - " not in "".join(direct)
    assert task.is_correct_batch(prompts * 2, worked + direct) == [True] * 48
    assert format_reward(None, worked + direct) == [1.0] * 48


def test_wrong_hard_coded_and_escaping_programs_fail(no_leak):
    task = get_task("code")
    p = task.split("train", 1)[0]
    x0, y0 = p.meta["x0"], p.meta["a"] * p.meta["x0"] + p.meta["b"]
    y1 = y0 + p.meta["a"]
    fence = "```python\ndef f(x):\n    return {}\n```"
    bad = [fence.format(p.answer + " + 1"),  # off by one
           fence.format(f"{y0} if x == {x0} else {y1}"),  # passes the shown values, fails the hidden ones
           "```python\nimport sys\nsys.exit(0)\n```",  # exits before the tests
           p.answer,  # no code block
           fence.format("(")]  # a syntax error
    assert task.is_correct_batch([p] * len(bad), bad) == [False] * len(bad)
    assert format_reward(None, ["def f(x): return 1", fence.format("1") + "\nmore"]) == [0.0, 0.0]


def test_code_preset_trains_with_the_sandboxed_verifier(tmp_path, capsys, no_leak):
    import json

    from grpo.config import load_config
    from grpo.train.trainer import Trainer

    cfg = load_config("code", ["warmup.steps=0", "train.preflight=warn", "train.steps=2", "train.eval_every=0", "eval.n=8",
                               "rollout.prompts_per_step=2", "rollout.group_size=3", "rollout.max_new_tokens=12",
                               "data.train_size=50", "log.plots=false", "log.progress=false"])
    assert cfg.data.task == "code" and cfg.rollout.max_new_tokens == 12
    trainer = Trainer(cfg, run_dir=tmp_path / "run")
    trainer.train()
    trainer.close()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for row in rows[1:]:
        assert {"reward/tests", "reward/format"} <= row.keys()
        assert row["reward/missing_frac"] == 0.0  # every program ran: a sandbox failure would be missing
    from grpo.cli import main

    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run" / "final"), "--json"]) == 0  # the run's task: code, in the sandbox
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["task"] == "code" and result["n"] == 8 and result["accuracy"] == summary["eval/accuracy_after"]
