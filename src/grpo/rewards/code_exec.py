"""Code reward: run the completion's Python in the sandbox, and judge it outside the sandbox.

    code_tests(prompts, completions, tests=[["assert add(1, 2) == 3", "assert add(0, 0) == 0"], ...])
    code_tests(prompts, completions, tests=[[{"input": "1 2\\n", "output": "3\\n"}], ...])
    code_tests(prompts, completions, tests=[humaneval_test, ...], entry_point=["add", ...])

A row's tests are split by grpo.sandbox.checks.parse_tests:
  call checks   the sandbox evaluates only the call expressions (`add(1, 2)`) after the solution, in one run per
                completion (harness.py), and returns their values through a strict serializer (wire.py) in a
                frame authenticated with a per-call key the program cannot read. The assertion (`== 3`, with
                floats compared at `float_tol`) is evaluated here, in the trainer's process, on fresh plain values.
  I/O checks    one sandbox run per test: the program reads `input` on stdin; its stdout is compared here with
                `output`, whitespace-normalised.
  unverifiable  anything else runs in the harness as before (the program's own process says whether the test
                raised: forgeable, see docs/rewards.md) and is counted in `reward/<name>/unverifiable_frac`.

Reward: the fraction of the row's tests passed (partial=True), else 1.0 if all passed and 0.0 otherwise; never
above 1. A completion without a fenced code block, a timeout, a crash, a forged or missing frame: 0.0 (the
program's fault). A judgement past the judge's budget (grpo.sandbox.budget.JUDGE_BUDGET_S for the row's parse, the
checks' evaluation and the judge process's start): 0.0 with the reason "judge budget exceeded" logged at WARNING,
and counted in `reward/<name>/judge_budget_exceeded`; a row whose parse ran past it is not run at all. None (no
signal) when the sandbox itself failed (status sandbox_error) or the row has no tests.
Without bubblewrap the function refuses (SandboxUnavailable) unless an unsafe backend is named: `backend=` or
reward.sandbox=unsafe_local (grpo.sandbox.set_sandbox_mode).
The programs run concurrently (max_workers threads, each waiting on its own sandbox process); the function is marked
in_process for RewardRunner because every program already has its own hard kill at `timeout`.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from grpo.rewards.base import RewardValues, completion_text, register_reward
from grpo.scan import fenced_blocks
from grpo.sandbox import SandboxUnavailable, TestPlan, VerdictOptions, calls_passed, io_passed, resolve_backend
from grpo.sandbox import budget
from grpo.sandbox.budget import JUDGE_OVER_BUDGET, OverBudget, parse_budgeted

__all__ = ["code_tests", "extract_code", "plan_row", "unverifiable_rows", "prepare_code_rewards"]

logger = logging.getLogger("grpo.rewards")

def extract_code(text: str) -> str | None:
    """The last fenced code block tagged python/python3/py (or untagged) in `text`; None if there is none. Linear in
    the text (grpo.scan.fenced_blocks; a regex here backtracked for seconds on a fence followed by spaces)."""
    blocks = [body for info, body in fenced_blocks(text) if info in ("", "python", "python3", "py")]
    return blocks[-1] if blocks else None


_PLANS: dict[tuple[str, str | None], TestPlan] = {}  # parsed rows, kept for the process (training re-reads rows)
_PLANS_MAX = 100_000
_plans_lock = threading.Lock()


def _key(tests: Any) -> str:
    """The row's tests as text that tells any two rows apart (repr() elides the middle of a long numpy array)."""
    return json.dumps(tests, sort_keys=True, default=lambda o: o.tolist() if hasattr(o, "tolist") else repr(o))


def plan_row(tests: Any, entry_point: str | None = None, row: int | None = None) -> TestPlan:
    """parse_tests in the judge process, under its budget (grpo.sandbox.budget: a row over budget is unverifiable,
    logged), with the row named in its error; parsed once per process."""
    where = f"row {row}" if row is not None else "a row"
    key = (_key(tests), entry_point)
    with _plans_lock:
        if key in _PLANS:
            return _PLANS[key]
    try:
        plan = parse_budgeted(tests, entry_point, where)
    except ValueError as e:
        raise ValueError(f"code_tests: {where}'s `tests`: {e}") from None
    with _plans_lock:
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def _entry_points(entry_point: Any, n: int) -> list[str | None]:
    if entry_point is None or isinstance(entry_point, str):
        return [entry_point] * n
    eps = list(entry_point)
    if len(eps) != n:
        raise ValueError(f"code_tests: entry_point has {len(eps)} values for {n} completions")
    return eps


@register_reward("code_tests")
def code_tests(
    prompts: list[Any],
    completions: list[Any],
    tests: list[Any],
    *,
    entry_point: Any = None,
    timeout: float = 10.0,
    memory_mb: int = 1024,
    partial: bool = False,
    max_workers: int | None = None,
    site_packages: bool = True,
    float_tol: float = 1e-6,
    backend: str | None = None,
    **kwargs: Any,
) -> RewardValues:
    """Run each completion's last ```python block against its row's `tests` (assert statements, a HumanEval
    check(candidate) with the row's `entry_point`, or {"input", "output"} dicts) and judge the results outside
    the sandbox. The fraction passed with partial=True, else 1.0 only if all pass; None on a sandbox failure or a
    row without tests. `timeout` and `memory_mb` are per program; float_tol: relative and absolute tolerance of
    == where a float is involved (0: exact); site_packages=False runs on the standard library alone (starts
    faster); backend: name a sandbox backend (unshare/rlimit run without isolation, with a warning).
    The result carries `extras["unverifiable_frac"]`: per sample, the share of its tests judged inside, and
    `extras["judge_budget_exceeded"]`: 1.0 where the judgement ran past the judge's budget (that sample scores 0)."""
    if not float_tol >= 0:
        raise ValueError(f"code_tests: float_tol must be >= 0, got {float_tol!r}")
    n = len(completions)
    if len(tests) != n:
        raise ValueError(f"code_tests: {len(tests)} rows of tests for {n} completions")
    resolve_backend(backend)  # refuses here, once, when no sandbox may run (SandboxUnavailable)
    eps = _entry_points(entry_point, n)
    opts = VerdictOptions(timeout=timeout, memory_mb=memory_mb, site_packages=site_packages, backend=backend,
                          float_tol=float_tol)
    cache: dict[tuple[str, str | None], TestPlan] = {}
    plans = []
    for i, (t, ep) in enumerate(zip(tests, eps)):
        key = (repr(t), ep)
        if key not in cache:
            cache[key] = plan_row(t, ep, i)
        plans.append(cache[key])
    codes = [extract_code(completion_text(c)) if p.n and not p.over_budget else None
             for c, p in zip(completions, plans)]
    workers = max(1, max_workers or min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grpo-code") as pool:
        jobs: list[list] = []
        for code, plan in zip(codes, plans):
            row = []
            if code is not None and plan.n:
                if plan.calls or plan.unverifiable:
                    row.append(pool.submit(calls_passed, code, plan, opts))
                row += [pool.submit(io_passed, code, t, opts) for t in plan.io]
            jobs.append(row)
        counts = [[_outcome(f) for f in row] for row in jobs]
    scores: list[float | None] = []
    over: list[tuple[int, str]] = []  # (sample, reason): the judgement ran past the judge's budget
    for i, (code, plan, got) in enumerate(zip(codes, plans, counts)):
        reason = plan.over_budget or next((str(c) for c in got if isinstance(c, OverBudget)), "")
        if reason:
            scores.append(0.0)  # never a pass, never missing: a policy cannot trade a wrong answer for no signal
            over.append((i, reason if plan.over_budget else f"{reason} while evaluating its checks"))
        elif not plan.n:
            scores.append(None)
        elif code is None:
            scores.append(0.0)
        elif any(c is None for c in got):
            scores.append(None)
        else:
            passed = min(sum(got), plan.n)
            scores.append(passed / plan.n if partial else float(passed == plan.n))
    if over:
        logger.warning("code_tests: %s on %d of %d completions (the judge's %.3g s for parse + evaluation + start): "
                       "they score 0 (first: completion %d: %s)", JUDGE_OVER_BUDGET, len(over), n,
                       budget.JUDGE_BUDGET_S, *over[0])
    frac = [len(p.unverifiable) / p.n if p.n else None for p in plans]
    exceeded = [None if s is None else 0.0 for s in scores]
    for i, _ in over:
        exceeded[i] = 1.0
    return RewardValues(scores, extras={"unverifiable_frac": frac, "judge_budget_exceeded": exceeded})


code_tests.in_process = True  # type: ignore[attr-defined]


def _outcome(job: Any) -> int | OverBudget | None:
    """A job's count; the OverBudget it raised (the sample scores 0); None (no signal for that sample only) when it
    raised anything else but SandboxUnavailable: one bad sample never stops the call."""
    try:
        return job.result()
    except SandboxUnavailable:
        raise
    except OverBudget as e:
        return e
    except Exception as e:  # noqa: BLE001 - logged; the other samples are scored
        logger.warning("code_tests: a sample's run raised %s: %s (that sample scores None)", type(e).__name__, e)
        return None


def unverifiable_rows(rows: list[tuple[Any, Any]]) -> list[int]:
    """Indices of the rows (tests, entry_point) that have at least one test judged inside the sandbox."""
    return [i for i, (t, ep) in enumerate(rows) if plan_row(t, ep, i).unverifiable]


def _uses_code_tests(fn: Any) -> bool:
    while fn is not None:
        if fn is code_tests:
            return True
        fn = getattr(fn, "func", None) if isinstance(fn, functools.partial) else getattr(fn, "__wrapped__", None)
    return False


def prepare_code_rewards(reward_specs: list, prompts: list, sandbox: str = "auto") -> None:
    """At the start of training: set the sandbox mode (reward.sandbox) and, when a reward function is code_tests,
    refuse now if no sandbox may run, and warn naming the rows whose tests cannot be judged outside the sandbox.
    reward_specs: (name, fn, weight) tuples; prompts: the training rows (grpo.types.Prompt)."""
    from grpo.sandbox import set_sandbox_mode

    set_sandbox_mode(sandbox)
    if not any(_uses_code_tests(s[1]) for s in reward_specs):
        return
    resolve_backend(None)
    rows = [(p.meta.get("tests"), p.meta.get("entry_point")) for p in prompts]
    bad = unverifiable_rows(rows)
    if bad:
        names = ", ".join(f"{i} ({prompts[i].uid})" for i in bad[:10])
        logger.warning(
            "code_tests: %d of %d training rows have tests that cannot be judged outside the sandbox (rows %s%s); "
            "their verdict comes from the program's own process and a policy can forge it (docs/rewards.md, "
            "threat model). Write them as `assert f(...) == <literal>` or {input, output} pairs.",
            len(bad), len(rows), names, ", ..." if len(bad) > 10 else "")
