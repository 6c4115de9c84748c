"""The task a config names: a data set file, a task library's task, or a registered task."""

from __future__ import annotations

from grpo.data.base import Task, get_task


def task_from_config(cfg, reward_functions=None, tokenizer=None, tokenizer_loader=None) -> Task:
    """The configured task: the data set at data.path (see grpo.data.files) when set, else data.task: a built-in
    task, reasoning_gym:<name> (grpo.data.reasoning_gym) or verifiers:<environment id> (grpo.envs.verifiers_env).
    A data set's chat templates are rendered with `tokenizer`, or `tokenizer_loader()` called when first needed
    (model.name's tokenizer: grpo.models.loading.model_tokenizer; data/ never loads a model itself)."""
    _check_task_options(cfg)
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


def _check_task_options(cfg) -> None:
    """data.task_options is read by reasoning_gym:<name> and verifiers:<id> only: anywhere else it would be
    ignored without a word, so it is a ConfigError."""
    options, task = cfg.data.task_options, cfg.data.task
    if not options or cfg.data.path is None and task.startswith(("reasoning_gym:", "verifiers:")):
        return
    from grpo.errors import ConfigError

    what = f"data.path={cfg.data.path}" if cfg.data.path is not None else f"data.task={task}"
    raise ConfigError(f"data.task_options {sorted(options)}: {what} reads no task options (only reasoning_gym:<name> "
                      "and verifiers:<id> tasks do); remove them, or set data.difficulty for a built-in task")
