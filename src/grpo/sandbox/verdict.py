"""The verdict: run a program against a row's tests in the sandbox and judge the results here, in the trainer's
process, never inside the program's interpreter.

    plan = parse_tests(tests, entry_point)              # checks.py: call checks, I/O checks, unverifiable tests
    calls_passed(code, plan, opts)                      # one sandbox run for all call checks (harness.py)
    io_passed(code, plan.io[k], opts)                   # one sandbox run per I/O test
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from grpo.sandbox.budget import evaluate_budgeted
from grpo.sandbox.checks import IOCheck, TestPlan, io_equal
from grpo.sandbox.harness import SETUP_FAILED, build_harness, read_frame
from grpo.sandbox.run import run_python
from grpo.sandbox.wire import WireError, decode


@dataclass(frozen=True)
class VerdictOptions:
    """Limits of each program run and the comparison tolerance. backend None: the mode's choice (run.py)."""

    timeout: float = 10.0
    memory_mb: int = 1024
    site_packages: bool = True
    backend: str | None = None
    float_tol: float = 1e-6


def harness_budget(timeout: float) -> float:
    """Seconds the harness waits for the program's results: room is left for the start and for the frame."""
    return max(0.05, 0.75 * timeout - 0.1)


def calls_passed(code: str, plan: TestPlan, opts: VerdictOptions) -> int | None:
    """Tests passed among the row's call checks and unverifiable tests (one sandbox run); None: no signal. Raises
    budget.OverBudget when the checks' evaluation ran past what the row's parse left of the judge's budget (the
    completion then scores 0)."""
    key = secrets.token_bytes(32)
    holes = [h for c in plan.calls for h in c.holes]
    program = build_harness(code, holes, plan.unverifiable, plan.prelude, harness_budget(opts.timeout))
    res = run_python(program, timeout=opts.timeout, memory_mb=opts.memory_mb, backend=opts.backend,
                     site_packages=opts.site_packages, secret=key)
    if res.status == "sandbox_error":
        return None
    frame = read_frame(res.stdout, key, len(holes) + len(plan.unverifiable))
    if frame is None:
        if res.returncode == SETUP_FAILED and "grpo-harness: setup failed" in res.stderr:
            raise RuntimeError(f"the code harness could not set itself up in the sandbox: {res.stderr[-500:]}")
        return 0
    values: dict[int, Any] = {}
    for k, (ok, text) in frame.results.items():
        if ok and k < len(holes):
            try:
                values[k] = decode(text)
            except WireError:
                pass  # not a plain value: the checks that need it fail
    per_check, offset = [], 0
    for check in plan.calls:
        per_check.append({j: values[offset + j] for j in range(len(check.holes)) if offset + j in values})
        offset += len(check.holes)
    passed = sum(evaluate_budgeted(plan.calls, per_check, opts.float_tol, plan.judge_s))  # the judge process
    for j in range(len(plan.unverifiable)):
        passed += frame.results.get(len(holes) + j, (False, ""))[0]
    return passed


def io_passed(code: str, test: IOCheck, opts: VerdictOptions) -> int | None:
    """1 if the program, given the test's input on stdin, exits 0 and prints its output (io_equal); 0 if not;
    None: no signal (the sandbox failed)."""
    res = run_python(code, timeout=opts.timeout, memory_mb=opts.memory_mb, backend=opts.backend,
                     site_packages=opts.site_packages, stdin=test.input)
    if res.status == "sandbox_error":
        return None
    return int(res.status == "passed" and not res.stdout_truncated and io_equal(res.stdout, test.output,
                                                                               opts.float_tol))
