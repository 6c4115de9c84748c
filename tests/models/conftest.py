"""Fixtures of the model tests: tiny random Qwen2 / Llama directories (chat tokenizer) and a JSONL of chat prompts,
built once per session (the private GRPO_CACHE is the root conftest's)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.tiny_hf import save_tiny_model, write_chat_jsonl


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-hf")
    return {arch: save_tiny_model(root / arch, arch) for arch in ("qwen2", "llama")}


@pytest.fixture(scope="session")
def chat_data(tmp_path_factory) -> Path:
    return write_chat_jsonl(tmp_path_factory.mktemp("data") / "train.jsonl", 20, system=True)
