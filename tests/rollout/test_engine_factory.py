"""build_engine (rollout.engine): the native sampler by default, and a clear MissingExtraError for vllm where vLLM
is not installed (the engine itself is tested in test_vllm_engine.py, in vLLM's environment)."""

from __future__ import annotations

import importlib.util

import pytest

from grpo.config import load_config
from grpo.errors import MissingExtraError
from grpo.rollout import Sampler
from grpo.rollout.factory import build_engine


def _model(tok):
    from grpo.models.builtin import build_model

    return build_model(tok, size=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64))


def test_native_is_the_default(tok):
    cfg = load_config(None, ["rollout.max_new_tokens=7", "rollout.top_p=0.9"])
    engine = build_engine(cfg, _model(tok), tok, "unused")
    assert isinstance(engine, Sampler) and engine.max_new_tokens == 7 and engine.top_p == 0.9
    engine.sync_weights(engine.model)  # the native sampler decodes with the model itself: nothing to do


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_without_vllm_names_the_extra(tok):
    cfg = load_config(None, ["rollout.engine=vllm"])
    with pytest.raises(MissingExtraError, match=r"grpo\[vllm\]"):
        build_engine(cfg, _model(tok), tok, "unused")


def test_bad_engine_and_tis_settings_are_config_errors():
    from grpo.config import ConfigError

    with pytest.raises(ConfigError, match="rollout.engine"):
        load_config(None, ["rollout.engine=sglang"])
    with pytest.raises(ConfigError, match="tis_cap"):
        load_config(None, ["algo.tis_cap=0"])
    with pytest.raises(ConfigError, match="algo.tis_cap needs rollout.top_p=1"):
        load_config(None, ["algo.tis_cap=2", "rollout.top_p=0.9"])
    assert load_config(None, ["algo.tis_cap=2"]).algo.tis_cap == 2.0
