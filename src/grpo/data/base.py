"""The task protocol: where prompts, their reference answers and their default rewards come from.

A task owns two splits that never overlap (`train` for RL and warm-up, `test` for held-out evaluation),
the reward functions that score its completions (TRL signature), and, for the built-in model's warm-up,
a demonstration completion per training prompt.
"""

from __future__ import annotations

from typing import Callable, Protocol

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


def task_from_config(cfg, reward_functions=None, tokenizer=None, tokenizer_loader=None) -> Task:
    """The configured task: the data set at data.path (see grpo.data.files) when set, else data.task: a built-in
    task, reasoning_gym:<name> (grpo.data.reasoning_gym) or verifiers:<environment id> (grpo.envs.verifiers_env).
    A data set's chat templates are rendered with `tokenizer`, or `tokenizer_loader()` called when first needed
    (model.name's tokenizer: grpo.models.loading.model_tokenizer; data/ never loads a model itself)."""
    if cfg.data.path is not None:
        from grpo.data.files import FileTask

        return FileTask.from_config(cfg, reward_functions=reward_functions, tokenizer=tokenizer,
                                    tokenizer_loader=tokenizer_loader)
    if cfg.data.task.startswith("reasoning_gym:"):  # pip install 'grpo[gym]' (data/reasoning_gym.py)
        from grpo.data.reasoning_gym import task_from_config as reasoning_gym_task

        return reasoning_gym_task(cfg, tokenizer=tokenizer, tokenizer_loader=tokenizer_loader)
    if cfg.data.task.startswith("verifiers:"):  # pip install 'grpo[verifiers]' (envs/verifiers_env.py)
        from grpo.envs.verifiers_env import load_task

        if cfg.model.name == "builtin:tiny":
            from grpo.errors import ConfigError

            raise ConfigError(f"data.task={cfg.data.task}: the built-in model has no warm-up for a verifiers "
                              "environment; use model.name=<a local Hugging Face model directory>")
        return load_task(cfg.data.task[len("verifiers:"):], cfg.data.task_options, tokenizer=tokenizer,
                         tokenizer_loader=tokenizer_loader)
    return get_task(cfg.data.task, difficulty=cfg.data.difficulty)


def get_task(name: str, **kwargs) -> Task:
    import grpo.data.arithmetic  # noqa: F401  (registers the built-in tasks)
    import grpo.data.code  # noqa: F401
    import grpo.data.tools  # noqa: F401

    if name not in TASKS:
        raise ValueError(f"data.task must be one of {sorted(TASKS)}, got {name!r}")
    return TASKS[name](**kwargs)
