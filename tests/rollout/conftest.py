"""Fixtures of the rollout tests; helpers live in rollout_helpers.py (a unique module name: every test folder
has a conftest)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tok():
    from grpo.models.builtin import build_tokenizer

    return build_tokenizer()
