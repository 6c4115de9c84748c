"""The one rule for naming a reward: what the trainer, a data set file's task and the reward runner accept.

    'exact_answer', 'my_rewards.py:accuracy'    a registered name or a reference; logged as 'accuracy', weight 1
    fn                                          (fn.__name__, fn, 1.0)
    (name, fn) | (name, fn, weight)             weight 1 when absent
    (name, fn, weight, {"in_process": bool, "timeout_s": float})    options for the runner (grpo.rewards.runner)

`reward_spec` turns each into the task-level tuple (name, fn, weight), with the options as a 4th element when
given; anything else is a ConfigError naming the entry.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from grpo.errors import ConfigError

__all__ = ["RUNNER_OPTIONS", "reward_spec", "reward_specs"]

RUNNER_OPTIONS = ("in_process", "timeout_s")


def reward_spec(entry: Any) -> tuple:
    """(name, fn, weight) or (name, fn, weight, options) for one reward entry (module docstring)."""
    if isinstance(entry, str):
        from grpo.rewards.base import get_reward_function
        from grpo.rewards.references import reference_name

        return reference_name(entry), get_reward_function(entry), 1.0
    if isinstance(entry, (tuple, list)) and 2 <= len(entry) <= 4:
        name, fn = str(entry[0]), entry[1]
        weight = float(entry[2]) if len(entry) > 2 else 1.0
        if not callable(fn):
            raise ConfigError(f"reward function {name!r} is not callable: {fn!r:.80}")
        if not math.isfinite(weight):
            raise ConfigError(f"reward function {name!r} has a non-finite weight {weight}")
        if len(entry) < 4:
            return name, fn, weight
        options = dict(entry[3])
        bad = set(options) - set(RUNNER_OPTIONS)
        if bad:
            raise ConfigError(f"unknown reward option(s) {sorted(bad)} for {name!r}; known: {', '.join(RUNNER_OPTIONS)}")
        return name, fn, weight, options
    if callable(entry):
        return _name_of(entry), entry, 1.0
    raise ConfigError(f"expected a reward name, a function, or (name, fn[, weight[, options]]), got {entry!r:.80}")


def reward_specs(entries) -> list[tuple]:
    """`reward_spec` of each entry, in order."""
    return [reward_spec(e) for e in entries]


def _name_of(fn: Callable) -> str:
    return getattr(fn, "__name__", type(fn).__name__)
