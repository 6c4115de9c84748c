"""The warm models that ship with grpo: the default `grpo train` loads its model with no warm-up; the weights
match the recorded sha256; and they score the recorded held-out accuracy (greedy, eval.n problems) within 0.01 on
this machine, whatever its CPU (float kernels may flip a few greedy answers). The code task's model is checked the
same way once it ships (`grpo warmup --task code --output src/grpo/models/weights/code`), and so is the tool task's
(`grpo warmup --task tools`, which starts from the shipped arithmetic model: its recipe records that model's sha256)."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil

import pytest

from grpo.config import load_config
from grpo.models import builtin
from grpo.models.loading import builtin_spec, model_directory
from grpo.warmup import policy_directory

PRESETS = {"arithmetic": "grpo", "code": "code", "tools": "tools"}
SHIPPED = ["arithmetic"] + [t for t in ("code", "tools") if (builtin.SHIPPED_DIR / t / "recipe.json").exists()]


def recipe(task: str) -> dict:
    return json.loads((builtin.SHIPPED_DIR / task / "recipe.json").read_text())


@pytest.mark.parametrize("task", SHIPPED)
def test_the_default_run_loads_the_shipped_model(task, tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_CACHE", str(tmp_path))
    cfg = load_config(PRESETS[task])
    path, source = policy_directory(cfg)
    assert (path, source) == (builtin.SHIPPED_DIR / task, "shipped")
    assert recipe(task)["spec"] == builtin_spec(cfg)
    assert recipe(task)["sha256"] == hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    assert not any(tmp_path.iterdir())  # nothing built, nothing cached
    other = load_config(PRESETS[task], ["warmup.seed=1"])
    with pytest.raises(ValueError, match="not built yet"):  # any other recipe is not shipped
        model_directory(other)


def test_the_tool_models_recipe_names_the_model_it_started_from():
    if "tools" not in SHIPPED:
        pytest.skip("the tool task's model does not ship")
    start = recipe("tools")["warm_start"]
    assert start == {"task": "arithmetic", "sha256": recipe("arithmetic")["sha256"]}


def test_damaged_shipped_weights_are_not_used(tmp_path, monkeypatch, caplog):
    copy = tmp_path / "weights"
    shutil.copytree(builtin.SHIPPED_DIR, copy)
    monkeypatch.setattr(builtin, "SHIPPED_DIR", copy)
    spec = builtin_spec(load_config())
    assert builtin.shipped_model_dir(spec) == copy / "arithmetic"
    data = bytearray((copy / "arithmetic" / "model.safetensors").read_bytes())
    data[-1] ^= 1  # one bit of one weight
    (copy / "arithmetic" / "model.safetensors").write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="grpo.models"):
        assert builtin.shipped_model_dir(spec) is None
    assert "does not match its recorded sha256" in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize("task", SHIPPED)
def test_the_shipped_model_scores_its_recorded_accuracy(task):
    from grpo.train.evaluate import heldout_accuracy

    held = recipe(task)["heldout"]
    cfg = load_config(PRESETS[task])
    assert held["n"] == cfg.eval.n  # what the default run evaluates
    assert task != "arithmetic" or held["n"] == 300
    measured = heldout_accuracy(cfg, builtin.SHIPPED_DIR / task)
    assert measured["n"] == held["n"] and measured["max_new_tokens"] == held["max_new_tokens"]
    assert abs(measured["accuracy"] - held["accuracy"]) <= 0.01, (measured["accuracy"], held["accuracy"])
    assert measured.get("tool_use_frac") == held.get("tool_use_frac")  # greedy episodes that call: tools only
    # A recorded 0.0 (the tool model, greedy) cannot tell this model from a broken one: the next test can.


@pytest.mark.slow
def test_the_shipped_tool_model_calls_the_calculator_when_sampled_and_only_calls_score():
    """The tool model's recorded greedy accuracy and tool use are both 0.0 (greedy, it answers in its head, and
    wrongly), which a model that never calls or an evaluation that scores no episode would match too. What its
    warm-up taught (30% of the demonstrations call the calculator and copy the result) shows when it samples: at
    temperature 1, a share of the episodes call the tool, some of those are right, and no episode without a call
    is right (a product of a 3-digit and a 2-digit number, which it cannot do in its head)."""
    if "tools" not in SHIPPED:
        pytest.skip("the tool task's model does not ship")
    import torch
    from transformers import AutoModelForCausalLM

    from grpo.data import get_task
    from grpo.models.loading import load_tokenizer
    from grpo.rollout import Sampler
    from grpo.rollout.episodes import run_episodes
    from grpo.train.episodes import env_limits, task_environment
    from grpo.train.evaluate import test_problems

    cfg, task, path = load_config("tools"), get_task("tools"), builtin.SHIPPED_DIR / "tools"
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path).eval(), load_tokenizer(path)
    prompts = test_problems(task, cfg.eval.n, cfg.eval.val_n)[:40]
    sampler = Sampler(model, tokenizer, max_new_tokens=cfg.rollout.max_new_tokens, temperature=1.0)
    with torch.no_grad():
        r = run_episodes(sampler, prompts, 4, task_environment(task, tokenizer),
                         generator=torch.Generator().manual_seed(0), **env_limits(cfg))
    called = [e["tool_calls"] > 0 for e in r.episodes]
    right = [task.is_correct(p, text) for p, text in zip([p for p in prompts for _ in range(4)], r.texts)]
    assert 0.1 <= sum(called) / len(called) <= 0.6, sum(called) / len(called)
    assert any(right) and all(c for c, ok in zip(called, right) if ok), list(zip(called, right))
