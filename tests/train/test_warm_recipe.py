"""`grpo warmup` rebuilds a built-in warm model: a short rebuild runs, writes the model, its tokenizer (with the
chat template) and a recipe whose spec, sha256 and held-out accuracy are those of the written files."""

from __future__ import annotations

import hashlib
import json

from grpo.cli import main
from grpo.config import load_config
from grpo.models.loading import builtin_spec

SHORT = ["warmup.steps=3", "warmup.batch_size=4", "data.train_size=50", "eval.n=8"]


def test_a_short_rebuild_writes_the_model_and_its_recipe(tmp_path, capsys):
    out = tmp_path / "warm"
    assert main(["warmup", *SHORT, "--output", str(out)]) == 0
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["spec"] == builtin_spec(load_config(None, SHORT))
    assert recipe["sha256"] == hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    held = recipe["heldout"]
    assert held["n"] == 8 and held["task"] == "arithmetic" and held["max_new_tokens"] == 32
    assert 0.0 <= held["accuracy"] <= 1.0 and (held["accuracy"] * 8).is_integer()
    assert recipe["built_on"]["cpu"] and recipe["built_on"]["warmup_s"] >= 0
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(out)
    assert AutoTokenizer.from_pretrained(out).chat_template
    printed = capsys.readouterr().out
    acc = held["accuracy"]  # 8 problems: printed with its standard error (issue 42)
    assert "sha256" in printed and f"held-out accuracy {acc:.3f} ± {(acc * (1 - acc) / 8) ** 0.5:.3f} on 8" in printed
    # the same settings again: bitwise the same weights on this machine (the warm-up is seeded)
    again = tmp_path / "again"
    assert main(["warmup", *SHORT, "--output", str(again), "--no-eval"]) == 0
    assert json.loads((again / "recipe.json").read_text())["sha256"] == recipe["sha256"]


def test_the_code_task_rebuild_takes_the_code_preset(tmp_path):
    out = tmp_path / "warm-code"
    assert main(["warmup", "--task", "code", "warmup.steps=1", "warmup.batch_size=2", "data.train_size=20",
                 "--no-eval", "--output", str(out)]) == 0
    spec = json.loads((out / "recipe.json").read_text())["spec"]
    assert spec["task"] == "code" and spec == builtin_spec(load_config("code", ["warmup.steps=1",
                                                                                  "warmup.batch_size=2",
                                                                                  "data.train_size=20"]))
