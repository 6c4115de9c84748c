"""Code reward: run the completion's Python against the row's test cases in the sandbox.

    code_tests(prompts, completions, tests=[["assert add(1, 2) == 3", "assert add(0, 0) == 0"], ...])

The program the sandbox runs is a harness: it reads a random per-call nonce from stdin, points the solution's
stdout at stderr, executes the last ```python block of the completion (with __name__ == "solution", so a
`if __name__ == "__main__":` demo does not run), then each test in the same namespace, and only at the very end
writes "<nonce> <passed> <total>" to the real stdout. The reward requires that line, so a completion that calls
sys.exit(0) / os._exit(0) / raises before the tests, or crashes the interpreter, earns nothing.

Reward: 1.0 when every test passed, else 0.0 (partial=True: the fraction passed). A timeout, a crash or a resource
limit is 0.0: that is the program's fault. None (no signal) when the sandbox itself failed (status sandbox_error),
or the row has no tests. A completion without a fenced code block scores 0.0.
The programs run concurrently (max_workers threads, each waiting on its own sandbox process); the function is marked
in_process for RewardRunner because every program already has its own hard kill at `timeout`.
"""

from __future__ import annotations

import os
import re
import secrets
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from grpo.rewards.base import completion_text, register_reward
from grpo.rewards.sandbox import SandboxResult, run_python

__all__ = ["code_tests", "extract_code", "build_program", "score_result"]

_FENCE = re.compile(r"```[ \t]*(python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)

_HARNESS = """\
import os, sys, traceback
NONCE = sys.stdin.readline().strip()
VERDICT_FD = os.dup(1)
os.dup2(2, 1)
SOLUTION = {solution!r}
TESTS = {tests!r}
ns = {{"__name__": "solution", "__builtins__": __builtins__}}
try:
    exec(compile(SOLUTION, "solution.py", "exec"), ns)
except BaseException:
    traceback.print_exc()
    sys.stderr.flush()
    os._exit(1)
passed = 0
for i, test in enumerate(TESTS):
    try:
        exec(compile(test, "test_%d.py" % i, "exec"), ns)
        passed += 1
    except BaseException:
        traceback.print_exc()
sys.stdout.flush()
sys.stderr.flush()
os.write(VERDICT_FD, ("%s %d %d\\n" % (NONCE, passed, len(TESTS))).encode())
os._exit(0)
"""


def extract_code(text: str) -> str | None:
    """The last fenced code block tagged python/py (or untagged) in `text`; None if there is none."""
    blocks = [body for lang, body in _FENCE.findall(text)]
    return blocks[-1] if blocks else None


def _tests_list(tests: Any) -> list[str]:
    if tests is None:
        return []
    if isinstance(tests, str):
        return [tests] if tests.strip() else []
    return [str(t) for t in tests if str(t).strip()]


def build_program(solution: str, tests: list[str]) -> str:
    """The harness program for one solution and its tests (the nonce arrives on stdin)."""
    return _HARNESS.format(solution=solution, tests=list(tests))


def score_result(res: SandboxResult, nonce: str, n_tests: int, *, partial: bool = False) -> float | None:
    """Reward for one sandbox run of build_program: see the module docstring."""
    if res.status == "sandbox_error":
        return None
    if res.status != "passed":
        return 0.0
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == nonce and parts[2] == str(n_tests):
            passed = int(parts[1])
            return passed / n_tests if partial else float(passed == n_tests)
    return 0.0


def _run_one(completion: Any, tests: Any, timeout: float, memory_mb: int, partial: bool,
             site_packages: bool = True) -> float | None:
    cases = _tests_list(tests)
    if not cases:
        return None
    code = extract_code(completion_text(completion))
    if code is None:
        return 0.0
    nonce = secrets.token_hex(16)
    res = run_python(build_program(code, cases), timeout=timeout, memory_mb=memory_mb, stdin=nonce + "\n",
                     site_packages=site_packages)
    return score_result(res, nonce, len(cases), partial=partial)


@register_reward("code_tests")
def code_tests(
    prompts: list[Any],
    completions: list[Any],
    tests: list[Any],
    *,
    timeout: float = 10.0,
    memory_mb: int = 1024,
    partial: bool = False,
    max_workers: int | None = None,
    site_packages: bool = True,
    **kwargs: Any,
) -> list[float | None]:
    """Run each completion's last ```python block against its row's `tests` (a list of assert statements, or one
    string of test code) in the sandbox. 1.0 if all pass (partial=True: the fraction), 0.0 otherwise, None on a
    sandbox failure or a row without tests. `timeout` and `memory_mb` are per program; site_packages=False runs
    them on the standard library alone, which starts faster."""
    workers = max_workers or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="grpo-code") as pool:
        futs = [
            pool.submit(_run_one, c, t, timeout, memory_mb, partial, site_packages)
            for c, t in zip(completions, tests, strict=True)
        ]
        return [f.result() for f in futs]


code_tests.in_process = True  # type: ignore[attr-defined]
