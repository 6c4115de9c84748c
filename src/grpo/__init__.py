"""grpo: Group Relative Policy Optimization (and PPO, its baseline) for causal language models.

Importing `grpo` is cheap: the heavy pieces (transformers, the trainer) load when first used.

    from grpo import load_config, Trainer
    cfg = load_config("grpo", ["train.steps=50"])
    Trainer(cfg).train()
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "load_config", "Config", "Trainer", "evaluate_model"]


def __getattr__(name: str):
    # Lazy re-exports keep `import grpo` (and `import grpo.algo`) free of transformers.
    if name in ("load_config", "Config"):
        from grpo import config

        return getattr(config, name)
    if name == "Trainer":
        from grpo.train.trainer import Trainer

        return Trainer
    if name == "evaluate_model":
        from grpo.train.evaluate import evaluate_model

        return evaluate_model
    raise AttributeError(f"module 'grpo' has no attribute {name!r}")
