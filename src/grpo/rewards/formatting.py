"""Format rewards (think/answer tags, any regex) and DAPO's overlong shaping. TRL signature; no answer needed."""

from __future__ import annotations

import logging
import re
from typing import Any

import torch

from grpo.algo.shaping import overlong_penalty
from grpo.rewards.base import completion_text, register_reward

__all__ = ["format_tags", "regex_format", "overlong_reward"]

logger = logging.getLogger("grpo.rewards")

_TAGS = re.compile(r"\s*<think>.*?</think>\s*<answer>.*?</answer>\s*", re.DOTALL)


def _tags_ok(text: str) -> bool:
    # each tag exactly once first (linear): then the pattern has one way to match and cannot backtrack
    if not all(text.count(t) == 1 for t in ("<think>", "</think>", "<answer>", "</answer>")):
        return False
    return bool(_TAGS.fullmatch(text))


@register_reward("format_tags")
def format_tags(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """1.0 when the completion is exactly `<think>...</think><answer>...</answer>` (whitespace around allowed, each
    tag once), else 0.0. If your prompt already opens <think>, use regex_format with the pattern you expect."""
    return [1.0 if _tags_ok(completion_text(c)) else 0.0 for c in completions]


@register_reward("regex_format", factory=True)
def regex_format(pattern: str, *, flags: int = re.DOTALL, full: bool = True):
    """Factory: a reward of 1.0 when the completion matches `pattern` (re.fullmatch; re.search with full=False),
    else 0.0. Example: regex_format(r"<answer>\\s*-?\\d+\\s*</answer>", full=False)."""
    rx = re.compile(pattern, flags)
    match = rx.fullmatch if full else rx.search

    def regex_format_reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        return [1.0 if match(completion_text(c)) else 0.0 for c in completions]

    regex_format_reward.__name__ = "regex_format"
    regex_format_reward.pattern = pattern  # type: ignore[attr-defined]
    return regex_format_reward


def _lengths(completions: list[Any], kwargs: dict[str, Any]) -> tuple[list[int], str]:
    if kwargs.get("completion_lengths") is not None:
        return [int(x) for x in kwargs["completion_lengths"]], "tokens"
    if kwargs.get("completion_ids") is not None:
        return [len(ids) for ids in kwargs["completion_ids"]], "tokens"
    return [len(completion_text(c)) for c in completions], "characters"


@register_reward("overlong", factory=True)
def overlong_reward(max_len: int, cache_len: int):
    """Factory: DAPO's soft overlong punishment (eq. 13) as a reward, in [-1, 0].

    0 up to max_len - cache_len, then a linear ramp down to -1 at max_len, and -1 beyond. Lengths come from the
    `completion_lengths` column (tokens; the trainer passes it), else `completion_ids` (TRL's name), else the
    completion's length in characters (set max_len/cache_len in characters then; a warning says so once).
    Add it with weight 1 next to the correctness reward, as DAPO does.
    """
    overlong_penalty(torch.zeros(1), max_len=max_len, cache_len=cache_len)  # validates both now, not mid-training
    warned: list[bool] = []

    def overlong(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        lengths, unit = _lengths(completions, kwargs)
        if unit == "characters" and not warned:
            warned.append(True)
            logger.warning("overlong reward: no completion_lengths/completion_ids column, measuring characters")
        pen = overlong_penalty(torch.tensor(lengths, dtype=torch.float64), max_len=max_len, cache_len=cache_len)
        return pen.tolist()

    overlong.max_len, overlong.cache_len = max_len, cache_len  # type: ignore[attr-defined]
    return overlong
