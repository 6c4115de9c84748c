"""The built-in model: built by a warm-up (grpo.warmup), cached by everything that determines it
(warmup.seed, not train.seed), reused, and rebuilt when its files are missing or corrupt; grpo.models only finds
and loads directories."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo.config import ConfigError, load_config
from grpo.models.loading import model_directory
from grpo.warmup import policy_directory

FAST = ["warmup.steps=2", "warmup.batch_size=4", "data.train_size=50"]


def test_cache_is_keyed_by_the_warm_up_not_the_rl_seed(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_CACHE", str(tmp_path))
    first, source = policy_directory(load_config(None, FAST + ["train.seed=0"]))
    assert source == "warm-up"
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert policy_directory(load_config(None, FAST + ["train.seed=7"])) == (first, "cache")  # same for every RL seed
    assert model_directory(load_config(None, FAST)) == first  # models/ finds the built directory
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt
    other, _ = policy_directory(load_config(None, FAST + ["warmup.seed=1"]))
    assert other != first
    a, b = (AutoModelForCausalLM.from_pretrained(d) for d in (first, other))
    assert type(a).__name__ == "LlamaForCausalLM" and AutoTokenizer.from_pretrained(first).eos_token == "<eos>"
    assert any((p != q).any() for p, q in zip(a.parameters(), b.parameters()))


def test_corrupt_or_missing_files_are_rebuilt(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("GRPO_CACHE", str(tmp_path))
    cfg = load_config(None, FAST)
    path, _ = policy_directory(cfg)
    (path / "model.safetensors").write_bytes(b"not a safetensors file")
    with caplog.at_level(logging.WARNING, logger="grpo.models"):
        assert policy_directory(cfg) == (path, "warm-up")
    assert "unreadable" in caplog.text
    AutoModelForCausalLM.from_pretrained(path)
    (path / "tokenizer.json").unlink()
    assert policy_directory(cfg)[0] == path
    AutoTokenizer.from_pretrained(path)
    assert not list(tmp_path.glob(".tmp-*"))  # no half-built directory left behind


def test_models_never_warm_up_a_missing_built_in_model(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_CACHE", str(tmp_path))
    with pytest.raises(ConfigError, match="not built yet.*grpo warmup"):
        model_directory(load_config(None, FAST))
    assert not any(tmp_path.iterdir()) or not list(tmp_path.glob("builtin-*"))


def test_models_only_load_directories_no_import_of_train():
    import ast

    import grpo.models

    for path in Path(grpo.models.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):  # module-level and inside functions
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.startswith("grpo.train") for n in names), f"{path.name} imports grpo.train"
