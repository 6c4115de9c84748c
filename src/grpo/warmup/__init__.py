"""The built-in model's supervised warm-up: a tool that makes a model to start RL from, never part of the RL step.

    supervised.py  next-token loss on the task's demonstrations (training split only); policy_directory: the
                   built-in model's directory (shipped, cached, or warmed up now and cached)
    recipe.py      a warm model's recipe.json: its spec, sha256, build machine and held-out accuracy

`grpo warmup` (grpo.cli) rebuilds a shipped model; `Trainer` calls policy_directory for model.name=builtin:tiny.
"""

from grpo.warmup.supervised import build_warm_model, policy_directory, warm_task, warm_up

__all__ = ["build_warm_model", "policy_directory", "warm_task", "warm_up"]
