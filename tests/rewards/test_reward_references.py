"""Reward functions named by reference (`file.py:fn`, `pkg.mod:fn`) in reward.functions: loading, the names they
are logged under, every error naming the file, the attribute and what was found, and a real CLI run with one."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from grpo.config import ConfigError, load_config
from grpo.rewards import RewardRunner, get_reward_function
from grpo.rewards.references import RewardReferenceError, is_reference, reference_name

USER_FILE = textwrap.dedent('''
    import helper_mod  # a neighbour of this file: importable because its folder is put on sys.path

    def accuracy(prompts, completions, answer, **kwargs):
        return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

    def scaled(prompts, completions, scale=1.0, **kwargs):
        return [scale * len(c) for c in completions]

    class Judge:
        def __call__(self, prompts, completions, **kwargs):
            return [helper_mod.CONST] * len(completions)

    judge = Judge()
    NOT_A_FUNCTION = 42

    def wrong_signature(texts):
        return [0.0] * len(texts)
''')


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(USER_FILE)
    (tmp_path / "helper_mod.py").write_text("CONST = 0.5\n")
    pkg = tmp_path / "my_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "rewards.py").write_text("def format_ok(prompts, completions, **kw):\n"
                                    "    return [float(c.startswith('<')) for c in completions]\n")
    (tmp_path / "broken.py").write_text("def f(:\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    for name in [m for m in sys.modules if m.startswith(("my_pkg", "helper_mod"))]:
        monkeypatch.delitem(sys.modules, name)
    return tmp_path


def test_names():
    assert is_reference("my_rewards.py:accuracy") and is_reference("my_pkg.rewards:format_ok")
    assert not is_reference("exact_answer") and not is_reference(":x") and not is_reference("x:")
    assert reference_name("my_rewards.py:accuracy") == "accuracy"
    assert reference_name("pkg.mod:Judge.__call__") == "__call__"
    assert reference_name("exact_answer") == "exact_answer"


def test_file_and_module_references_load_and_score(user_dir):
    acc = get_reward_function("my_rewards.py:accuracy")
    assert acc(prompts=["p", "q"], completions=["4", "5"], answer=["4", "4"]) == [1.0, 0.0]
    fmt = get_reward_function("my_pkg.rewards:format_ok")  # found in the current directory
    assert fmt(prompts=["p", "q"], completions=["<a>", "b"]) == [1.0, 0.0]
    judge = get_reward_function(str(user_dir / "my_rewards.py") + ":judge")  # absolute path, callable instance
    assert judge(prompts=["p"], completions=["x"]) == [0.5]
    scaled = get_reward_function("my_rewards.py:scaled", scale=2.0)  # options bind as keyword defaults
    assert scaled(prompts=["p"], completions=["abc"]) == [6.0] and scaled.__name__ == "scaled"
    # one file named twice is loaded once: both functions come from the same module object
    assert get_reward_function("./my_rewards.py:accuracy").__globals__ is acc.__globals__
    runner = RewardRunner([("accuracy", acc, 1.0), ("format_ok", fmt, 0.5)], timeout_s=5.0)
    try:
        res = runner(["p", "q"], ["4", "<b"], {"answer": ["4", "4"]})
    finally:
        runner.close()
    assert res.total.tolist() == [1.0, 0.5]


@pytest.mark.parametrize("ref, pattern", [
    ("nofile.py:f", r"'nofile\.py:f': no file 'nofile\.py' \(looked for .*nofile\.py\)"),
    ("my_rewards.py:acuracy", r"my_rewards\.py has no attribute 'acuracy'; it defines \['accuracy', "
                              r"'scaled', 'wrong_signature'\]"),
    ("my_rewards.py:NOT_A_FUNCTION", r"'NOT_A_FUNCTION' in .*my_rewards\.py is a int 42, not a function"),
    ("my_rewards.py:Judge", r"'Judge' in .*my_rewards\.py is a class Judge, not a function"),
    ("my_rewards.py:wrong_signature", r"signature is \(texts\), which does not take \['prompts', 'completions'\]"),
    ("broken.py:f", r"importing .*broken\.py raised SyntaxError"),
    ("no_such_pkg.mod:f", r"no module 'no_such_pkg\.mod' on the Python path nor in the current directory"),
    ("my_pkg.rewards:nope", r"my_pkg/rewards\.py has no attribute 'nope'; it defines \['format_ok'\]"),
])
def test_errors_name_the_file_the_attribute_and_what_was_found(user_dir, ref, pattern):
    with pytest.raises(RewardReferenceError, match=pattern) as e:
        get_reward_function(ref)
    assert isinstance(e.value, ConfigError) and ref in str(e.value)


def test_yaml_config_and_overrides_accept_references(user_dir):
    (user_dir / "run.yaml").write_text("extends: grpo\nreward:\n  functions: [my_rewards.py:accuracy, "
                                       "my_pkg.rewards:format_ok, exact_answer]\n  weights: [1.0, 0.1, 1.0]\n")
    cfg = load_config(str(user_dir / "run.yaml"))
    assert cfg.reward.functions == ["my_rewards.py:accuracy", "my_pkg.rewards:format_ok", "exact_answer"]
    cfg = load_config(None, ["reward.functions=[my_rewards.py:accuracy, exact_answer]"])
    assert cfg.reward.functions == ["my_rewards.py:accuracy", "exact_answer"]


@pytest.mark.slow
def test_cli_train_with_a_reward_file(user_dir, monkeypatch, capsys):
    """`grpo train reward.functions=[my_rewards.py:accuracy, exact_answer]`: the file's function scores every
    step, is logged under its own name, and a misspelt attribute is one line on stderr with exit code 2."""
    from grpo.cli import main

    monkeypatch.setenv("GRPO_CACHE", str(user_dir / "cache"))
    tiny = ["warmup.steps=0", "train.steps=1", "eval.n=4", "rollout.prompts_per_step=2", "rollout.group_size=2",
            "rollout.max_new_tokens=4", "data.train_size=20", "log.plots=false", "train.preflight=off"]
    out = user_dir / "run"
    assert main(["train", *tiny, "reward.functions=[my_rewards.py:accuracy, exact_answer]", "reward.weights=[1, 0]",
                 "--output-dir", str(out), "--quiet"]) == 0
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert "reward/accuracy" in row and "reward/exact_answer" in row
    capsys.readouterr()
    assert main(["train", *tiny, "reward.functions=[my_rewards.py:acuracy]", "--output-dir", str(out / "x")]) == 2
    err = capsys.readouterr().err
    assert "my_rewards.py has no attribute 'acuracy'" in err and "Traceback" not in err
