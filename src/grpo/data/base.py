"""The task protocol: where prompts, their reference answers and their default rewards come from.

A task owns two splits that never overlap (`train` for RL and warm-up, `test` for held-out evaluation),
the reward functions that score its completions (TRL signature), and, for the built-in model's warm-up,
a demonstration completion per training prompt.
"""

from __future__ import annotations

from typing import Callable, Protocol

from grpo.errors import ConfigError
from grpo.types import Prompt

RewardSpec = tuple[str, Callable, float]  # (name, fn(prompts, completions, **columns) -> list[float | None], weight)


class Task(Protocol):
    name: str

    def split(self, name: str, n: int) -> list[Prompt]:
        """The first n prompts of split `name` ('train' or 'test'), in a fixed order."""

    def reward_functions(self) -> list[RewardSpec]:
        """The task's default rewards, weighted and summed by the reward runner."""

    def is_correct(self, prompt: Prompt, completion: str) -> bool:
        """Held-out accuracy criterion (greedy pass@1). A task may also define
        `is_correct_batch(prompts, completions) -> list[bool]`, which evaluation then uses instead (the code task
        runs its programs concurrently that way), and a task with an environment `is_correct_episode(prompt,
        record) -> bool`, which judges a whole episode (its record: turns, tool calls, how it ended) instead of its
        final policy turn (the verifiers adapter does: its rubric reads the transcript)."""

    def demonstration(self, prompt: Prompt) -> str:
        """A correct, well-formatted completion (used only by the built-in model's supervised warm-up)."""


TASKS: dict[str, Callable[..., Task]] = {}


def register_task(name: str):
    def add(factory):
        if name in TASKS:
            raise ValueError(f"task {name!r} registered twice")
        TASKS[name] = factory
        return factory

    return add


def get_task(name: str, **kwargs) -> Task:
    """A registered task by name (the built-in ones register when grpo.data is imported); ConfigError (a
    ValueError) naming the choices for an unknown name."""
    if name not in TASKS:
        raise ConfigError(f"data.task must be one of {sorted(TASKS)}, reasoning_gym:<name> or verifiers:<id>, or "
                          f"use data.path=<a data set file>; got {name!r}")
    return TASKS[name](**kwargs)
