"""Prompts for training and evaluation: built-in tasks and data set files, validated row by row.

The built-in tasks register themselves (grpo.data.base.register_task) when their modules are imported, which
happens here, once; grpo.data.select.task_from_config picks the task a config names.
"""

import grpo.data.arithmetic  # noqa: F401  (registers the built-in tasks)
import grpo.data.code  # noqa: F401
import grpo.data.tools  # noqa: F401
from grpo.data.base import TASKS, Task, get_task, register_task
from grpo.data.select import task_from_config

__all__ = ["Task", "get_task", "register_task", "task_from_config", "TASKS"]
