"""Argument checks shared by the `grpo.algo` functions.

Every check looks only at Python values, shapes and dtypes, never at tensor contents, so none of them forces a
device sync. Each error names the argument and, for a choice, the allowed values.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch
from torch import Tensor


def check_choice(name: str, value: object, allowed: Sequence[str]) -> None:
    """Raise ValueError unless `value` is one of `allowed` (e.g. "std must be one of [...], got 'foo'")."""
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")


def check_tensor(name: str, x: object, *, ndim: int | Sequence[int] | None = None) -> Tensor:
    """Raise TypeError unless `x` is a tensor; ValueError unless it has `ndim` dimensions (an int or a set)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if x.ndim not in allowed:
            want = " or ".join(f"{d}-D" for d in allowed)
            raise ValueError(f"{name} must be {want}, got shape {tuple(x.shape)}")
    return x


def check_same_shape(ref_name: str, ref: Tensor, **others: Tensor) -> None:
    """Raise ValueError unless every tensor in `others` has exactly `ref`'s shape (no silent broadcasting)."""
    for name, x in others.items():
        check_tensor(name, x)
        if x.shape != ref.shape:
            raise ValueError(
                f"{name} has shape {tuple(x.shape)}, but {ref_name} has shape {tuple(ref.shape)}; they must match"
            )


def check_number(
    name: str,
    value: object,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    integer: bool = False,
) -> None:
    """Raise ValueError unless `value` is a real number inside the given (closed unless *_open) bounds."""
    kind = numbers.Integral if integer else numbers.Real  # Python and NumPy scalars alike
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"{name} must be {'an int' if integer else 'a number'}, got {value!r}")
    if value != value:
        raise ValueError(f"{name} must not be NaN")
    if low is not None and (value < low or (low_open and value == low)):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low}, got {value!r}")
    if high is not None and (value > high or (high_open and value == high)):
        raise ValueError(f"{name} must be {'<' if high_open else '<='} {high}, got {value!r}")


def as_bool_mask(mask: Tensor) -> Tensor:
    """A bool view of a mask given as bool or 0/1 numbers (nonzero counts as present)."""
    return mask if mask.dtype == torch.bool else mask != 0


def float_dtype(x: Tensor) -> torch.dtype:
    """x's dtype if floating point, else the default float dtype (for integer rewards or lengths)."""
    return x.dtype if x.is_floating_point() else torch.get_default_dtype()
