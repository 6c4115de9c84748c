"""Reward functions named by reference: `path/to/file.py:function` or `package.module:function`.

    reward.functions=[my_rewards.py:accuracy, my_pkg.rewards:format_ok, exact_answer]

The part before the last ':' is a Python file (it ends in `.py` or contains a path separator; relative paths are
relative to the current directory) or an importable module (the current directory is tried as well, as `python -m`
would). The part after it is an attribute of that file or module (dots reach into a class or object). The function
keeps TRL's signature, `fn(prompts, completions, **columns) -> list[float | None]`, and is checked to accept
`prompts` and `completions` as keywords. Every process loads the reference itself (the Trainer resolves
`reward.functions` in its constructor, which torchrun runs on every rank), so nothing is pickled between processes.

Every failure is a `RewardReferenceError` (a ConfigError: the command line prints one line and exits 2) naming the
reference, the file or module, the attribute and what was found there.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from grpo.config import ConfigError

__all__ = ["RewardReferenceError", "is_reference", "reference_name", "load_reward_reference"]


class RewardReferenceError(ConfigError):
    """A `file.py:function` or `module:function` reward reference that cannot be loaded; the message says why."""


def is_reference(name: str) -> bool:
    """True for 'file.py:fn' or 'pkg.mod:fn' (a ':' with text on both sides); built-in names have no ':'."""
    left, sep, right = name.rpartition(":")
    return bool(sep and left and right)


def reference_name(name: str) -> str:
    """The short name a reward is logged under: 'my_rewards.py:accuracy' -> 'accuracy'; other names unchanged."""
    return name.rpartition(":")[2].rpartition(".")[2] if is_reference(name) else name


def _is_file(target: str) -> bool:
    return target.endswith(".py") or "/" in target or os.sep in target


def _load_file(ref: str, target: str) -> ModuleType:
    path = Path(target).expanduser()
    full = path.resolve()
    if not full.is_file():
        raise RewardReferenceError(f"reward.functions: {ref!r}: no file {target!r} (looked for {full})")
    key = "grpo_user_rewards._" + hashlib.sha1(str(full).encode()).hexdigest()[:12] + "_" + full.stem
    if key in sys.modules:  # the same file named twice (two functions of one file): load it once
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, full)
    if spec is None or spec.loader is None:
        raise RewardReferenceError(f"reward.functions: {ref!r}: {full} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    if str(full.parent) not in sys.path:  # so the file can import its neighbours, as `python file.py` would
        sys.path.append(str(full.parent))
    sys.modules[key] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as e:
        del sys.modules[key]
        raise RewardReferenceError(f"reward.functions: {ref!r}: importing {full} raised "
                                   f"{type(e).__name__}: {e}") from e
    return module


def _load_module(ref: str, target: str) -> ModuleType:
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as e:
        top_missing = (e.name or target).split(".")[0] == target.split(".")[0]
        if not top_missing or os.getcwd() in sys.path:  # a dependency of the module is missing: say which
            raise RewardReferenceError(f"reward.functions: {ref!r}: importing module {target!r} failed: "
                                       f"{type(e).__name__}: {e}") from e
    except BaseException as e:
        raise RewardReferenceError(f"reward.functions: {ref!r}: importing module {target!r} raised "
                                   f"{type(e).__name__}: {e}") from e
    sys.path.append(os.getcwd())  # the `grpo` console script does not put the current directory on sys.path
    try:
        return importlib.import_module(target)
    except BaseException as e:
        raise RewardReferenceError(f"reward.functions: {ref!r}: no module {target!r} on the Python path nor in "
                                   f"the current directory {os.getcwd()} ({type(e).__name__}: {e}); give a "
                                   "file path (my_rewards.py:fn) or install the package") from e


def _callables(module: ModuleType) -> list[str]:
    return sorted(k for k, v in vars(module).items()
                  if not k.startswith("_") and inspect.isfunction(v) and v.__module__ == module.__name__)


def _check_signature(ref: str, fn: Callable[..., Any]) -> None:
    """The runner calls fn(prompts=..., completions=..., **columns): both names must be accepted as keywords."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature: let the call tell
        return
    params = sig.parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    missing = [n for n in ("prompts", "completions") if n not in names]
    if missing:
        raise RewardReferenceError(f"reward.functions: {ref!r}: the function's signature is {sig}, which does not "
                                   f"take {missing}; a reward function is fn(prompts, completions, **columns) -> "
                                   "list[float | None] (TRL's signature)")


def load_reward_reference(ref: str, **options: Any) -> Callable[..., Any]:
    """The function `ref` ('file.py:fn' or 'pkg.mod:fn') points at, with `options` bound as keyword defaults.

    Raises RewardReferenceError naming the file or module, the attribute and what was found.
    """
    target, _, attr = ref.rpartition(":")
    if not target or not attr:
        raise RewardReferenceError(f"reward.functions: {ref!r} is not a reference: write file.py:function or "
                                   "package.module:function")
    module = _load_file(ref, target) if _is_file(target) else _load_module(ref, target)
    where = getattr(module, "__file__", None) or target
    obj: Any = module
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            seen = _callables(module) if i == 0 else sorted(k for k in dir(obj) if not k.startswith("_"))
            raise RewardReferenceError(f"reward.functions: {ref!r}: {where} has no attribute "
                                       f"{'.'.join(attr.split('.')[:i + 1])!r}; it defines {seen or 'no functions'}")
        obj = getattr(obj, part)
    if inspect.isclass(obj) or not callable(obj):
        what = f"class {obj.__name__}" if inspect.isclass(obj) else f"{type(obj).__name__} {obj!r:.60}"
        raise RewardReferenceError(f"reward.functions: {ref!r}: {attr!r} in {where} is a {what}, not a function "
                                   "(name a function, or an instance with __call__)")
    _check_signature(ref, obj)
    if not options:
        return obj
    bound = functools.partial(obj, **options)
    functools.update_wrapper(bound, obj)
    return bound
