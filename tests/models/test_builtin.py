"""The built-in model: built by a warm-up, cached by everything that determines it (warmup.seed, not train.seed),
reused, and rebuilt when its files are missing or corrupt."""

from __future__ import annotations

import logging

from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo.config import load_config
from grpo.models.loading import model_directory

FAST = ["warmup.steps=2", "warmup.batch_size=4", "data.train_size=50"]


def test_cache_is_keyed_by_the_warm_up_not_the_rl_seed(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_CACHE", str(tmp_path))
    first = model_directory(load_config(None, FAST + ["train.seed=0"]))
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert model_directory(load_config(None, FAST + ["train.seed=7"])) == first  # same model for every RL seed
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt
    other = model_directory(load_config(None, FAST + ["warmup.seed=1"]))
    assert other != first
    a, b = (AutoModelForCausalLM.from_pretrained(d) for d in (first, other))
    assert type(a).__name__ == "LlamaForCausalLM" and AutoTokenizer.from_pretrained(first).eos_token == "<eos>"
    assert any((p != q).any() for p, q in zip(a.parameters(), b.parameters()))


def test_corrupt_or_missing_files_are_rebuilt(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("GRPO_CACHE", str(tmp_path))
    cfg = load_config(None, FAST)
    path = model_directory(cfg)
    (path / "model.safetensors").write_bytes(b"not a safetensors file")
    with caplog.at_level(logging.WARNING, logger="grpo.models"):
        assert model_directory(cfg) == path
    assert "unreadable" in caplog.text
    AutoModelForCausalLM.from_pretrained(path)
    (path / "tokenizer.json").unlink()
    assert model_directory(cfg) == path
    AutoTokenizer.from_pretrained(path)
    assert not list(tmp_path.glob(".tmp-*"))  # no half-built directory left behind
