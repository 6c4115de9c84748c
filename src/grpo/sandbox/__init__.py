"""Run untrusted Python (a model's completion) in a throwaway sandbox, and judge it outside the sandbox.

The sandbox is its own unit with its own threat model (run.py's docstring, docs/rewards.md). Two entries:

    run_python(code, timeout=5.0, memory_mb=512) -> SandboxResult     run a program (rewards, the python tool)
    calls_passed(code, plan, opts) / io_passed(code, test, opts)      the verdict on a row's tests (code rewards)

    run.py      run_python, the backends and modes (bwrap by default, unsafe fallbacks only when named)
    process.py  one run's mechanics: start, capped output, kill everything, classify
    command.py  the bwrap / unshare / rlimit command lines and the scrubbed environment
    seccomp.py  the seccomp filter bwrap installs
    cleanup.py  deleting a run's directory whatever the program left in it
    fork.py     a function run in a forked child with a hard kill (the reward runner's isolation)
    checks.py   tests parsed into call checks, I/O checks and unverifiable tests; values compared here
    harness.py  the program that evaluates call checks in the sandbox and frames their values
    wire.py     the strict serializer of those values
    verdict.py  the verdict API above
"""

from grpo.sandbox.checks import IOCheck, TestPlan, parse_tests
from grpo.sandbox.run import (
    BACKENDS,
    MODES,
    STATUSES,
    SandboxResult,
    SandboxUnavailable,
    available_backends,
    default_backend,
    resolve_backend,
    run_python,
    sandbox_mode,
    set_sandbox_mode,
)
from grpo.sandbox.verdict import VerdictOptions, calls_passed, io_passed

__all__ = ["BACKENDS", "MODES", "STATUSES", "IOCheck", "SandboxResult", "SandboxUnavailable", "TestPlan",
           "VerdictOptions", "available_backends", "calls_passed", "default_backend", "io_passed", "parse_tests",
           "resolve_backend", "run_python", "sandbox_mode", "set_sandbox_mode"]
