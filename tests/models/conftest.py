"""Fixtures of the model tests: tiny random Qwen2 / Llama directories (chat tokenizer) and a JSONL of chat prompts,
built once per session; no test touches ~/.cache/grpo."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_hf import save_tiny_model, write_chat_jsonl  # noqa: E402


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-hf")
    return {arch: save_tiny_model(root / arch, arch) for arch in ("qwen2", "llama")}


@pytest.fixture(scope="session")
def chat_data(tmp_path_factory) -> Path:
    return write_chat_jsonl(tmp_path_factory.mktemp("data") / "train.jsonl", 20, system=True)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_CACHE", str(tmp_path / "grpo-cache"))
