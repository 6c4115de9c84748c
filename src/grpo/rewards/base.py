"""The reward-function protocol, the registry of built-ins, and the errors the runner raises.

A reward function has TRL's signature, so TRL reward functions work unchanged:

    def my_reward(prompts, completions, **columns) -> list[float | None]: ...

It is called with keywords: `prompts` (N prompts, one per completion), `completions` (N strings, or N
conversations, each a list of {"role", "content"} messages) and the data set's other columns (`answer`, `tests`, ...),
each a list of N values. It returns N numbers; `None` means "no signal for this sample" (left out of the group
statistics, advantage 0, counted in `reward/missing_frac`). NaN, inf, non-numbers and a wrong length are errors.
Async functions (`async def`) are awaited.

Built-ins are registered by name (`REWARD_FUNCTIONS`); `get_reward_function(name, **options)` returns a ready reward
function. Parametrised built-ins (`regex_format`, `overlong`, `reward_model`) are factories: their options are required.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.util
import inspect
import os
from collections.abc import Callable
from typing import Any

from grpo.errors import UserError

__all__ = [
    "REWARD_FUNCTIONS",
    "STATUS_CAUSES",
    "RewardFunctionError",
    "RewardValues",
    "UnknownRewardFunction",
    "register_reward",
    "get_reward_function",
    "completion_text",
    "prompt_text",
    "failure_words",
]

REWARD_FUNCTIONS: dict[str, Callable[..., Any]] = {}
_FACTORIES: set[str] = set()
_BUILTIN_MODULES = (
    "grpo.rewards.answers",
    "grpo.rewards.formatting",
    "grpo.rewards.code_exec",
    "grpo.rewards.reward_model",
)


class RewardFunctionError(RuntimeError):
    """A reward function failed on more than `max_failure_frac` of the samples of one call."""

    def __init__(self, name: str, failed: int, total: int, max_failure_frac: float, traceback: str | None) -> None:
        self.name, self.failed, self.total, self.traceback = name, failed, total, traceback
        msg = (
            f"reward function {name!r} raised on {failed}/{total} samples, more than max_failure_frac="
            f"{max_failure_frac:g}"
        )
        if traceback:  # its last line: the traceback itself is logged once (grpo.rewards), not printed twice
            msg += f"; last error: {traceback.strip().splitlines()[-1]} (traceback in the log above)"
        super().__init__(msg)


class RewardValues(list):
    """A reward function's N values plus per-sample side metrics: `extras[key]` holds N floats (None: no value for
    that sample). RewardRunner logs the mean over the samples that have one as `reward/<name>/<key>`."""

    def __init__(self, values: Any = (), extras: dict[str, list[float | None]] | None = None) -> None:
        super().__init__(values)
        self.extras = dict(extras or {})

    def __reduce__(self):  # pickled across the runner's fork with its extras
        return (RewardValues, (list(self), self.extras))


class UnknownRewardFunction(UserError, KeyError):
    """No reward function is registered under that name (a UserError, so a ValueError, and a KeyError for
    dict-style callers)."""

    def __str__(self) -> str:
        return str(self.args[0])


def register_reward(name: str, fn: Callable[..., Any] | None = None, *, factory: bool = False):
    """Register `fn` under `name` (as a decorator when `fn` is omitted).

    factory=True: `fn(**options)` builds the reward function (get_reward_function passes the options).
    """

    def add(f: Callable[..., Any]) -> Callable[..., Any]:
        old = REWARD_FUNCTIONS.get(name)
        if old is not None and getattr(old, "__qualname__", None) != getattr(f, "__qualname__", None):
            raise ValueError(f"a reward function named {name!r} is already registered ({old!r})")
        REWARD_FUNCTIONS[name] = f
        (_FACTORIES.add if factory else _FACTORIES.discard)(name)
        return f

    return add(fn) if fn is not None else add


def _load_builtins() -> None:
    for mod in _BUILTIN_MODULES:
        importlib.import_module(mod)


def _looks_like_a_module(name: str) -> bool:
    """'my_rewards.py', 'lib/rewards.py' or 'my_pkg.rewards': a reference missing its ':function' part."""
    return name.endswith(".py") or "/" in name or os.sep in name or "." in name.strip(".")


def get_reward_function(name: str, **options: Any) -> Callable[..., Any]:
    """The reward function registered as `name`, configured with `options`.

    Factories are called with the options; a plain function gets them bound as keyword defaults (a partial that keeps
    its name and attributes). Unknown names raise UnknownRewardFunction (a ValueError) listing the known ones; options
    the function does not take, or a factory's missing options, raise ValueError. A built-in whose optional dependency
    is missing raises ImportError naming the extra to install. A reference, 'file.py:fn' or 'pkg.mod:fn', loads that
    function instead (grpo.rewards.references; errors are RewardReferenceError, a ConfigError).
    """
    if ":" in name:
        from grpo.rewards.references import load_reward_reference

        return load_reward_reference(name, **options)
    _load_builtins()
    if name not in REWARD_FUNCTIONS and _looks_like_a_module(str(name)):  # `my_rewards.py` without `:function`
        raise UnknownRewardFunction(f"reward.functions entry {name!r} names a file or module but no function in it; "
                                    f"add the function's name after a colon: {name}:<function name>")
    if name not in REWARD_FUNCTIONS:
        known = ", ".join(sorted(REWARD_FUNCTIONS))
        close = difflib.get_close_matches(str(name), list(REWARD_FUNCTIONS), n=3, cutoff=0.6)
        guess = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        raise UnknownRewardFunction(f"unknown reward function {name!r}{guess}; known: {known}. reward.functions "
                                    "takes these names, or a function of your own as FILE.py:FUNCTION (e.g. "
                                    "reward.functions=[my_rewards.py:accuracy]: a Python file in the current "
                                    "directory, a colon, the function's name)")
    fn = REWARD_FUNCTIONS[name]
    requires = getattr(fn, "requires", None)
    if requires and importlib.util.find_spec(requires[0]) is None:
        raise ImportError(f"reward function {name!r} needs the `{requires[0]}` package: pip install '{requires[1]}'")
    sig = inspect.signature(fn)
    if name in _FACTORIES:
        try:
            sig.bind(**options)
        except TypeError as e:
            raise ValueError(f"reward function {name!r} takes options {sig}: {e}") from None
        return fn(**options)
    if not options:
        return fn
    named = {p.name for p in sig.parameters.values() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    unknown = sorted(set(options) - named)
    if unknown:
        raise ValueError(f"reward function {name!r} has no option(s) {unknown}; its signature is {sig}")
    bound = functools.partial(fn, **options)
    functools.update_wrapper(bound, fn)
    return bound


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal parts: [{"type": "text", "text": ...}, ...]
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


def completion_text(completion: Any) -> str:
    """The text of one completion: the string itself, or the assistant messages' contents of a conversation."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return _content_text(completion.get("content"))
    if isinstance(completion, (list, tuple)):
        msgs = [m for m in completion if isinstance(m, dict)]
        assistant = [m for m in msgs if m.get("role") == "assistant"] or msgs
        return "\n".join(_content_text(m.get("content")) for m in assistant)
    return "" if completion is None else str(completion)


def prompt_text(prompt: Any) -> str:
    """The text of one prompt: the string itself, or all messages' contents of a conversation, joined by newlines."""
    if isinstance(prompt, (list, tuple)):
        return "\n".join(_content_text(m.get("content")) if isinstance(m, dict) else str(m) for m in prompt)
    return completion_text(prompt)


# what a function did to a sample, by its status in RewardResult.status: the words of every message that names a
# cause (the preflight's verdicts, evaluation's "could not judge")
STATUS_CAUSES = {"none": "returned None", "error": "raised", "timeout": "timed out (reward.timeout_s)",
                 "invalid": "returned NaN/inf or a value past reward.max_abs"}


def failure_words(counts: dict[str, int]) -> str:
    """{status: count} of failed samples -> "raised on 2, timed out (reward.timeout_s) on 1" (STATUS_CAUSES' words)."""
    return ", ".join(f"{STATUS_CAUSES[c]} on {k}" for c, k in counts.items())
