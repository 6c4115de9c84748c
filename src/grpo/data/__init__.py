"""Prompts for training and evaluation: built-in tasks and data set files, validated row by row."""

from grpo.data.base import Task, get_task, register_task, TASKS

__all__ = ["Task", "get_task", "register_task", "TASKS"]
