"""The task libraries are optional extras: without their package, the settings that need one raise
MissingExtraError naming the pip extra (these tests run whether or not the packages are installed)."""

from __future__ import annotations

import sys

import pytest

from grpo.errors import MissingExtraError


def test_reasoning_gym_missing_names_the_extra(monkeypatch):
    from grpo.data.reasoning_gym import ReasoningGymTask

    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym -> ImportError
    with pytest.raises(MissingExtraError, match=r"pip install 'grpo\[gym\]'"):
        ReasoningGymTask("basic_arithmetic")


def test_verifiers_missing_names_the_extra(monkeypatch):
    from grpo.envs.verifiers_env import VerifiersTask

    monkeypatch.setitem(sys.modules, "verifiers", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'grpo\[verifiers\]'"):
        VerifiersTask(object())


def test_a_verifiers_without_the_classic_api_is_refused(monkeypatch):
    """verifiers 0.4's package root has only `verifiers.v1` (harness programs, no environment object to step)."""
    import types

    from grpo.envs.verifiers_env import VerifiersTask

    monkeypatch.setitem(sys.modules, "verifiers", types.SimpleNamespace(__version__="0.4.0"))
    with pytest.raises(MissingExtraError, match=r"0\.4\.0 has no classic environment API"):
        VerifiersTask(object())
