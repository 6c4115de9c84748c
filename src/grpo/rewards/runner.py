"""RewardRunner: call several reward functions on a batch, weighted, concurrently, with hard timeouts.

    runner = RewardRunner([("exact_answer", exact_answer, 1.0), ("format", format_tags, 0.1)], timeout_s=10.0)
    res = runner(prompts, completions, {"answer": answers})     # each column a list of N values
    res.total          # (N,) float32: sum of weight * reward; NaN where the sample is missing
    res.per_function   # {name: (N,) float32}, NaN where that function gave no signal
    res.missing        # (N,) bool: some function with a non-zero weight gave no signal (None, raised, timed out)
    res.metrics        # reward/<name>, reward/<name>/{missing_frac,error_frac,timeout_frac,s}, reward/missing_frac

Failure semantics (RELIABILITY.md sections 3 and 9, cases 4-7):
- `None` from a function is "no signal": the sample is missing, never scored 0.
- A function that raises is retried one sample at a time, so only the samples that raise become missing. Each
  function's traceback is logged once per exception type (logger "grpo.rewards"). If more than `max_failure_frac`
  of one call's samples raised, the call raises RewardFunctionError naming the function and its last error.
- Every call runs in a forked child (closures and lambdas need no pickling) that is SIGKILLed, with its whole
  process group, at `timeout_s`. After a timeout the samples are retried one at a time in a new child, streaming
  results back, for at most one more `timeout_s`; samples without a result by then are missing (status "timeout").
  So one function costs at most about 2 x timeout_s. Timeouts make samples missing but do not count as failures.
- A wrong length or a non-number: RewardOutputError (a UserError) naming the function and the index; NaN, inf or a
  value past max_abs makes that sample missing (status "invalid").
- Functions run concurrently in threads; those that must not fork (`in_process=True`, e.g. RewardModel) run in
  their thread with no kill on timeout. A sample missing any weighted function has total NaN.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import numbers
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from grpo.errors import ConfigError, RewardOutputError
from grpo.sandbox.fork import FORK_AVAILABLE, LiveChildren, run_forked
from grpo.rewards.base import STATUS_CAUSES, RewardFunctionError, RewardValues
from grpo.rewards.specs import reward_spec

__all__ = ["STATUS_CAUSES", "RewardResult", "RewardRunner", "RewardSpec", "reward_mean_std"]

logger = logging.getLogger("grpo.rewards")


@dataclass
class RewardSpec:
    """One reward function in a runner. in_process / timeout_s of None: the function's own `in_process` attribute
    (default False) and the runner's timeout_s."""

    name: str
    fn: Callable[..., Any]
    weight: float = 1.0
    in_process: bool | None = None
    timeout_s: float | None = None


@dataclass
class RewardResult:
    """Rewards for N completions. Shapes: total, missing and each per_function value are (N,)."""

    total: torch.Tensor
    per_function: dict[str, torch.Tensor]
    missing: torch.Tensor
    metrics: dict[str, float]
    status: dict[str, list[str]] = field(default_factory=dict)  # per sample: ok | none | error | timeout
    tracebacks: dict[str, str] = field(default_factory=dict)  # last traceback of each function that raised


def reward_mean_std(rewards: torch.Tensor) -> tuple[float, float]:
    """(mean, population std) of the present rewards of `rewards` (any shape, NaN = missing); (nan, nan) when none
    is present. The one rule for reward/mean, reward/std and samples.jsonl's reward_mean/reward_std."""
    present = rewards[~torch.isnan(rewards)]
    if not present.numel():
        return float("nan"), float("nan")
    return float(present.mean()), float(present.std(correction=0))


class _Invalid(Exception):
    """A reward function broke the output contract (length, type)."""


class _Unstorable(str):
    """One value that cannot be stored as a reward (NaN, inf, past reward.max_abs, past float32): the reason. The
    sample gets no value from that function (missing), counted in reward/<fn>/invalid_frac."""


DEFAULT_MAX_ABS = 1e6
_F32_MAX = 3.4028234663852886e38


@dataclass
class _Outcome:
    values: list[float | None]
    status: list[str]
    seconds: float = 0.0
    last_tb: str | None = None
    invalid: str | None = None
    extras: dict[str, list[float | None]] = field(default_factory=dict)  # per-sample side metrics (RewardValues)
    unstorable: str | None = None  # the first reason a value could not be stored (that sample: invalid)


@dataclass
class _Batch:
    prompts: Sequence[Any]
    completions: Sequence[Any]
    columns: dict[str, Sequence[Any]]

    @property
    def n(self) -> int:
        return len(self.completions)

    def one(self, i: int) -> _Batch:
        return _Batch(
            self.prompts[i : i + 1], self.completions[i : i + 1], {k: v[i : i + 1] for k, v in self.columns.items()}
        )


def _call(fn: Callable[..., Any], batch: _Batch) -> Any:
    out = fn(
        prompts=list(batch.prompts),
        completions=list(batch.completions),
        **{k: list(v) for k, v in batch.columns.items()},
    )
    if inspect.isawaitable(out):

        async def wait() -> Any:
            return await out

        out = asyncio.run(wait())
    return out


def _normalize(name: str, out: Any, n: int, offset: int = 0,
               max_abs: float = DEFAULT_MAX_ABS) -> list[float | None | _Unstorable]:
    """Check a function's output against the contract; -> N floats, None, or _Unstorable (a value that cannot be
    stored: NaN, inf, |x| > max_abs, past float32; its reason) (a RewardValues, with its checked extras, when the
    function returned one). Raises _Invalid (the whole output: its length or a non-numeric value) naming the index."""
    if isinstance(out, RewardValues):
        extras = {}
        for key, vals in out.extras.items():
            vals = list(vals)
            if len(vals) != n or any(v is not None and not isinstance(v, numbers.Real) for v in vals):
                raise _Invalid(f"reward function {name!r} returned extras[{key!r}] that is not {n} numbers or None")
            extras[key] = [None if v is None else float(v) for v in vals]
        return RewardValues(_normalize(name, list(out), n, offset, max_abs), extras)
    if hasattr(out, "tolist") and not isinstance(out, (list, tuple)):
        out = out.tolist()
    if isinstance(out, (str, bytes, dict)) or not hasattr(out, "__len__"):
        raise _Invalid(
            f"reward function {name!r} returned {type(out).__name__}, expected a list of {n} numbers or None"
        )
    if len(out) != n:
        raise _Invalid(f"reward function {name!r} returned {len(out)} values for {n} completions")
    values: list[float | None] = []
    for j, v in enumerate(out):
        if v is None:
            values.append(None)
            continue
        if not isinstance(v, numbers.Real) and hasattr(v, "item"):
            v = v.item()
        if not isinstance(v, numbers.Real):
            raise _Invalid(f"reward function {name!r} returned a non-numeric value {v!r:.60} at index {offset + j}")
        values.append(_storable(name, v, offset + j, max_abs))
    return values


def _storable(name: str, v: numbers.Real, index: int, max_abs: float) -> float | _Unstorable:
    """v as the float32 it will be stored as, or why it cannot be: checked before any conversion can overflow."""
    if isinstance(v, numbers.Integral) and abs(int(v)) > max_abs:  # 10**400 never reaches float()
        return _Unstorable(f"reward function {name!r} returned an integer of {len(str(abs(int(v))))} digits at "
                           f"index {index}, past reward.max_abs={max_abs:g}")
    try:
        x = float(v)
    except (OverflowError, ValueError) as e:
        return _Unstorable(f"reward function {name!r} returned {v!r:.40} at index {index}: {e}")
    if not math.isfinite(x) or abs(x) > max_abs or abs(x) > _F32_MAX:
        why = "NaN/inf" if not math.isfinite(x) else f"|x| > reward.max_abs={max_abs:g}"
        return _Unstorable(f"reward function {name!r} returned {x} at index {index} ({why}; the sample gets no value "
                           "from it: return None for no signal)")
    return x


def _guarded(name: str, fn: Callable[..., Any], batch: _Batch, offset: int = 0,
             max_abs: float = DEFAULT_MAX_ABS) -> tuple[str, Any]:
    """Call and normalize, catching everything. -> ("ok", values) | ("invalid", msg) | ("raised", traceback)."""
    try:
        return "ok", _normalize(name, _call(fn, batch), batch.n, offset, max_abs)
    except _Invalid as e:
        return "invalid", str(e)
    except BaseException:  # noqa: BLE001 - a reward function may raise anything, SystemExit included
        return "raised", traceback.format_exc()


class RewardRunner:
    """Weighted reward functions with failure isolation and hard timeouts (see the module docstring).

    functions: (name, fn, weight) or (name, fn, weight, {"in_process": bool, "timeout_s": float}) tuples,
        RewardSpec objects, or bare callables (named by __name__, weight 1).
    timeout_s: per-call wall-clock limit (default 10 s). max_failure_frac: share of one call's samples a function
    may raise on before RewardFunctionError. retry_per_sample: after an exception or a timeout on the whole batch,
    retry one sample at a time to isolate the bad ones (else the whole batch is missing). logged: a shared set.
    """

    def __init__(
        self,
        functions: Sequence[Any],
        *,
        timeout_s: float = 10.0,
        max_failure_frac: float = 0.5,
        retry_per_sample: bool = True,
        max_abs: float = DEFAULT_MAX_ABS,
        logged: set | None = None,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if not 0 < max_abs <= _F32_MAX:
            raise ValueError(f"max_abs must be in (0, {_F32_MAX:.3g}] (rewards are stored as float32), got {max_abs!r}")
        if not 0.0 <= max_failure_frac <= 1.0:
            raise ValueError(f"max_failure_frac must be in [0, 1], got {max_failure_frac!r}")
        self.specs = [self._spec(f) for f in functions]
        if not self.specs:
            raise ConfigError("reward.functions: at least one reward function is needed")
        names = [s.name for s in self.specs]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError(f"reward.functions: names must be unique (each is logged as reward/<name>); repeated: {dup}")
        self.timeout_s, self.max_failure_frac, self.max_abs = float(timeout_s), float(max_failure_frac), float(max_abs)
        if sum(abs(s.weight) for s in self.specs) * self.max_abs > _F32_MAX:  # the total would be inf in float32
            raise ConfigError(f"reward.weights {[s.weight for s in self.specs]} x reward.max_abs={self.max_abs:g}: "
                              "the weighted total can pass float32 (3.4e38); lower the weights or reward.max_abs")
        self.retry_per_sample = retry_per_sample
        self._live = LiveChildren()
        self._pool = ThreadPoolExecutor(max_workers=len(self.specs), thread_name_prefix="grpo-reward")
        # (function, failure kind) logged at WARNING; evaluation's judge shares one set across its runners
        self._logged: set[tuple[str, str]] = logged if logged is not None else set()
        self._closed = False

    @staticmethod
    def _spec(f: Any) -> RewardSpec:
        if isinstance(f, RewardSpec):
            spec = f
            if not callable(spec.fn):
                raise ConfigError(f"reward function {spec.name!r} is not callable: {spec.fn!r:.80}")
            if not math.isfinite(spec.weight):
                raise ConfigError(f"reward function {spec.name!r} has a non-finite weight {spec.weight}")
        else:
            name, fn, weight, *options = reward_spec(f)  # grpo.rewards.specs: the one rule
            spec = RewardSpec(name, fn, weight, **(options[0] if options else {}))
        if spec.in_process is None:
            spec.in_process = bool(getattr(spec.fn, "in_process", False)) or not FORK_AVAILABLE
        return spec

    # ------------------------------------------------------------------------------------------------ calling

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], columns: dict[str, Sequence[Any]] | None = None
    ) -> RewardResult:
        if self._closed:
            raise RuntimeError("RewardRunner is closed")
        batch = self._batch(prompts, completions, columns or {})
        futures = [self._pool.submit(self._evaluate, spec, batch) for spec in self.specs]
        outcomes = {spec.name: fut.result() for spec, fut in zip(self.specs, futures, strict=True)}
        for spec in self.specs:
            if outcomes[spec.name].invalid:
                raise RewardOutputError(outcomes[spec.name].invalid)  # a ValueError, as before
        for spec in self.specs:
            o = outcomes[spec.name]
            failed = o.status.count("error")
            if batch.n and failed / batch.n > self.max_failure_frac:
                raise RewardFunctionError(spec.name, failed, batch.n, self.max_failure_frac, o.last_tb)
        return self._result(batch.n, outcomes)

    @staticmethod
    def _batch(prompts: Sequence[Any], completions: Sequence[Any], columns: dict[str, Sequence[Any]]) -> _Batch:
        n = len(completions)
        if len(prompts) != n:
            raise ValueError(f"got {len(prompts)} prompts for {n} completions (pass one prompt per completion)")
        for k, v in columns.items():
            if k in ("prompts", "completions"):
                raise ValueError(f"column {k!r} clashes with the reward function argument of the same name")
            if not hasattr(v, "__len__") or isinstance(v, (str, bytes)) or len(v) != n:
                got = len(v) if hasattr(v, "__len__") else type(v).__name__
                raise ValueError(f"column {k!r} must hold one value per completion ({n}), got {got}")
        return _Batch(list(prompts), list(completions), {k: list(v) for k, v in columns.items()})

    def _evaluate(self, spec: RewardSpec, batch: _Batch) -> _Outcome:
        t0 = time.monotonic()
        out = _Outcome([None] * batch.n, ["none"] * batch.n)
        if batch.n:
            kind, payload = self._whole(spec, batch)
            if kind == "ok":
                self._fill(out, range(batch.n), payload)
            elif kind == "invalid":
                out.invalid = payload
            else:
                self._note(spec.name, kind, payload)
                if self.retry_per_sample and batch.n > 1:
                    self._per_sample(spec, batch, out)
                else:
                    out.status = ["timeout" if kind == "timeout" else "error"] * batch.n
                    out.last_tb = payload if kind == "raised" else None
        out.seconds = time.monotonic() - t0
        if out.unstorable:
            self._note(spec.name, "unstorable", out.unstorable)
        if spec.in_process and out.seconds > self._timeout(spec):
            self._note(
                spec.name,
                "slow",
                f"in-process call took {out.seconds:.1f} s > timeout {self._timeout(spec):g} s "
                "(in-process functions cannot be killed)",
            )
        return out

    def _timeout(self, spec: RewardSpec) -> float:
        return spec.timeout_s if spec.timeout_s is not None else self.timeout_s

    def _whole(self, spec: RewardSpec, batch: _Batch) -> tuple[str, Any]:
        """One call on the whole batch. -> (ok | invalid | raised | timeout | crashed, payload)."""
        if spec.in_process:
            return _guarded(spec.name, spec.fn, batch, max_abs=self.max_abs)
        res = run_forked(lambda emit: emit(_guarded(spec.name, spec.fn, batch, max_abs=self.max_abs)),
                         self._timeout(spec), self._live)
        if res.messages:
            return res.messages[0]
        if res.timed_out:
            return "timeout", f"no result within {self._timeout(spec):g} s"
        return "crashed", f"the worker process ended ({res.exit_detail}) without a result"

    def _per_sample(self, spec: RewardSpec, batch: _Batch, out: _Outcome) -> None:
        """Retry one sample at a time: in-process, or streamed from forked children within one more timeout_s."""
        if spec.in_process:
            for i in range(batch.n):
                self._record(spec, out, i, _guarded(spec.name, spec.fn, batch.one(i), offset=i, max_abs=self.max_abs))
            return
        todo = list(range(batch.n))
        deadline = time.monotonic() + self._timeout(spec)

        def body(emit: Callable[[Any], None]) -> None:
            for i in list(todo):
                emit((i, _guarded(spec.name, spec.fn, batch.one(i), offset=i, max_abs=self.max_abs)))

        while todo:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            res = run_forked(body, left, self._live)
            for i, msg in res.messages:
                self._record(spec, out, i, msg)
                todo.remove(i)
            if res.timed_out:
                break
            if todo:  # the child died on todo[0] (a crash, os._exit, a signal): blame it, go on with the rest
                i = todo.pop(0)
                self._record(spec, out, i, ("crashed", f"the worker process ended ({res.exit_detail}) on this sample"))
        for i in todo:
            out.status[i] = "timeout"

    def _record(self, spec: RewardSpec, out: _Outcome, i: int, msg: tuple[str, Any]) -> None:
        kind, payload = msg
        if kind == "ok":
            self._fill(out, [i], payload)
        elif kind == "invalid":
            out.invalid = out.invalid or payload
        else:
            out.status[i] = "error"
            out.last_tb = payload
            self._note(spec.name, kind, payload)

    @staticmethod
    def _fill(out: _Outcome, indices: Sequence[int], values: list[float | None | _Unstorable]) -> None:
        indices = list(indices)
        for i, v in zip(indices, values, strict=True):
            if isinstance(v, _Unstorable):
                out.values[i], out.status[i] = None, "invalid"
                out.unstorable = out.unstorable or str(v)
                continue
            out.values[i] = v
            out.status[i] = "none" if v is None else "ok"
        for key, vals in getattr(values, "extras", {}).items():
            column = out.extras.setdefault(key, [None] * len(out.values))
            for i, v in zip(indices, vals, strict=True):
                column[i] = v

    def _note(self, name: str, kind: str, detail: str) -> None:
        """Log a failure: the full traceback once per (function, exception type), then only at DEBUG."""
        last = detail.strip().splitlines()[-1] if detail.strip() else kind
        key = (name, kind if kind not in ("raised", "unstorable") else last.split(":")[0])
        level = logging.DEBUG if key in self._logged else logging.WARNING
        self._logged.add(key)
        if kind == "timeout":
            logger.log(level, "reward function %r timed out (%s); its samples are retried one at a time", name, detail)
        elif kind == "unstorable":
            logger.log(level, "%s (counted in reward/%s/invalid_frac)", detail, name)
        elif kind in ("crashed", "slow"):
            logger.log(level, "reward function %r: %s", name, detail)
        else:
            logger.log(level, "reward function %r raised; the sample(s) count as missing:\n%s", name, detail.rstrip())

    # ------------------------------------------------------------------------------------------------ results

    def _result(self, n: int, outcomes: dict[str, _Outcome]) -> RewardResult:
        nan = float("nan")
        exact = {name: torch.tensor([nan if v is None else v for v in o.values], dtype=torch.float64)
                 for name, o in outcomes.items()}
        per_function = {name: r.float() for name, r in exact.items()}  # each value was checked to fit float32
        # summed in float64 (1e6 x 1e6 - 1e6 x 999999 is 1e6; float32 gave 983040), checked where it becomes float32
        total64, missing = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.bool)
        for spec in (s for s in self.specs if s.weight != 0):
            missing |= torch.isnan(exact[spec.name])
            total64 += spec.weight * torch.nan_to_num(exact[spec.name], nan=0.0)
        for i in (~missing & ~(total64.abs() <= _F32_MAX)).nonzero().flatten().tolist():  # that sample: invalid
            self._note("total", "unstorable", f"a weighted total cannot be stored as float32: sample {i}")
            missing[i] = True
        total = total64.float().masked_fill(missing, nan)
        metrics: dict[str, float] = {"reward/missing_frac": float(missing.float().mean()) if n else 0.0}
        for name, o in outcomes.items():
            r = per_function[name]
            present = ~torch.isnan(r)
            metrics[f"reward/{name}"] = float(r[present].mean()) if present.any() else nan
            metrics[f"reward/{name}/missing_frac"] = float((~present).float().mean()) if n else 0.0
            metrics[f"reward/{name}/error_frac"] = o.status.count("error") / n if n else 0.0
            metrics[f"reward/{name}/timeout_frac"] = o.status.count("timeout") / n if n else 0.0
            metrics[f"reward/{name}/invalid_frac"] = o.status.count("invalid") / n if n else 0.0
            metrics[f"reward/{name}/s"] = o.seconds
            for key, vals in o.extras.items():
                got = [v for v in vals if v is not None]
                metrics[f"reward/{name}/{key}"] = sum(got) / len(got) if got else nan
        status = {name: o.status for name, o in outcomes.items()}
        tracebacks = {name: o.last_tb for name, o in outcomes.items() if o.last_tb}
        return RewardResult(total, per_function, missing, metrics, status, tracebacks)

    # ---------------------------------------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Kill any worker process still running and stop the threads. The runner cannot be used afterwards."""
        self._closed = True
        self._live.kill_all()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
