"""Typed configuration: sections, YAML presets and dotted command-line overrides.

A config is built in three layers, each validated field by field:
    defaults (schema.py)  <-  a preset or YAML file  <-  `section.key=value` overrides   (load.py)
Unknown keys and bad values raise `ConfigError` naming the field and, for choices, the allowed values (hints.py
suggests the key a TRL or verl user meant). The resolved config is saved as `config.yaml` in the run directory and
loads back to the same object.
"""

from grpo.config.load import (
    PRESET_DIR,
    build_config,
    describe_keys,
    flat_dict,
    list_presets,
    load_config,
    parse_override,
    preset_summary,
)
from grpo.config.schema import (
    AlgoConfig,
    Config,
    DataConfig,
    EnvConfig,
    EvalConfig,
    KLConfig,
    LogConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    RewardConfig,
    RolloutConfig,
    TrainConfig,
    WarmupConfig,
)
from grpo.errors import ConfigError  # the user-error hierarchy lives in grpo.errors; re-exported here

__all__ = ["AlgoConfig", "Config", "ConfigError", "DataConfig", "EnvConfig", "EvalConfig", "KLConfig", "LogConfig",
           "ModelConfig", "OptimConfig", "PRESET_DIR", "ParallelConfig", "RewardConfig", "RolloutConfig",
           "TrainConfig", "WarmupConfig", "build_config", "describe_keys", "flat_dict", "list_presets", "load_config",
           "parse_override", "preset_summary"]
