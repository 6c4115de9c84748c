"""The judge's own process: whatever the judge computes from test text runs there, under a time and a memory
budget, never in the trainer's thread.

    plan = parse_budgeted(tests, entry_point, where="row 3")   # parse_tests in the judge process (PARSE_BUDGET_S)
    ok = evaluate_budgeted(plan.calls, values, float_tol)       # evaluate_check of each check (EVAL_BUDGET_S)

Test text is data, and data can be hostile or just unlucky: `round(5, -10**9)`, `sum([[1]*1000]*3000, [])`, `str()`
over shared nested literals (1.6e9 items), many values each within the build budget (which counts 8 bytes an item
where a Python int takes ~36), constants substituted into each other. One long-lived worker (a plain `python` child
with stdin/stdout pipes) parses rows and evaluates checks; its address space is capped (RLIMIT_AS: what it holds after
start + JUDGE_MEMORY_MB, real bytes), and the parent SIGKILLs it at the request's time budget and starts a new one at
the next request. The outcome of an overrun:
  parse       the row's strings of test code are unverifiable (run in the sandbox as before; its I/O tests stay),
              logged at WARNING naming the row. Parsing also evaluates every part of a check that does not depend on
              the program (`round(5, -10**9)`, the expected side), so test text that is too costly is caught here.
  evaluation  the completion's checks fail (0) for this call, logged at WARNING naming the first check: the cost then
              depends on the program's values, so making it overrun never helps a program.
Requests are serialised on one lock (an evaluation takes well under a millisecond; a parse happens once per row and
process: code_exec caches the plans).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from typing import Any

from grpo.sandbox.checks import CallCheck, TestPlan, parse_tests

__all__ = ["parse_budgeted", "evaluate_budgeted", "OverBudget", "PARSE_BUDGET_S", "EVAL_BUDGET_S",
           "JUDGE_MEMORY_MB", "MAX_REPLY_BYTES"]

logger = logging.getLogger("grpo.rewards")

PARSE_BUDGET_S = 3.0  # one row's tests, including the dry run of their program-free parts
EVAL_BUDGET_S = 2.0  # one completion's checks
JUDGE_MEMORY_MB = 512  # address space the worker may add to what it holds after its start
MAX_REPLY_BYTES = 16 * 1024 * 1024  # a parsed plan larger than this (pickled) is over budget
_HEADER = struct.Struct("<Q")


class OverBudget(Exception):
    """The judge process ran past its time or memory budget (or died) on a request."""


_WORKER_SRC = """\
import sys
sys.path[:0] = {path!r}
from grpo.sandbox.budget import _worker_main
_worker_main()
"""


class _Worker:
    def __init__(self) -> None:
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        path = [p for p in sys.path if p]
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER_SRC.format(path=path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, close_fds=True)

    def request(self, msg: Any, budget_s: float) -> Any:
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self.proc.stdin.write(_HEADER.pack(len(data)) + data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise OverBudget(f"the judge process is gone ({e})") from None
        deadline = time.monotonic() + budget_s
        head = self._read(_HEADER.size, deadline)
        (n,) = _HEADER.unpack(head)
        return pickle.loads(self._read(n, deadline))  # the worker runs only the judge's code: trusted

    def _read(self, n: int, deadline: float) -> bytes:
        out = bytearray()
        fd = self.proc.stdout.fileno()
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise OverBudget("time")
            chunk = os.read(fd, min(n - len(out), 1 << 20))
            if not chunk:
                raise OverBudget(f"the judge process ended (exit {self.proc.poll()})")
            out += chunk
        return bytes(out)

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


_lock = threading.Lock()
_worker: list[_Worker] = []


def _ask(kind: str, payload: Any, budget_s: float) -> Any:
    """The worker's answer to (kind, payload); OverBudget when it overran (it is then killed) or failed."""
    with _lock:
        if not _worker:
            _worker.append(_Worker())
        try:
            status, value = _worker[0].request((kind, payload), budget_s)
        except OverBudget:
            _worker.pop().kill()
            raise
    if status == "ok":
        return value
    if status == "value_error":
        raise ValueError(value)
    raise OverBudget(value)


def _forget_after_fork() -> None:
    """A forked child (the reward runner's) starts its own worker: the parent's pipes and lock are not its."""
    global _lock
    _lock = threading.Lock()
    _worker.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


@atexit.register
def _shutdown() -> None:
    with _lock:
        while _worker:
            _worker.pop().kill()


def parse_budgeted(tests: Any, entry_point: str | None = None, where: str = "a row") -> TestPlan:
    """parse_tests in the judge process. Over budget: the row's strings of test code are unverifiable (its I/O tests
    are kept), with a WARNING naming `where`. A ValueError of parse_tests (a malformed row) is raised as is."""
    try:
        return _ask("parse", (tests, entry_point), PARSE_BUDGET_S)
    except OverBudget as e:
        items = [tests] if isinstance(tests, (str, dict)) else list(tests or [])
        plan = parse_tests([i for i in items if isinstance(i, dict)], entry_point)
        plan.unverifiable = [i for i in items if isinstance(i, str) and i.strip()]
        logger.warning("code_tests: %s's tests are over the judge's budget (%s; %.0f s, %d MB): its %d strings of "
                       "test code are unverifiable: %s", where, e, PARSE_BUDGET_S, JUDGE_MEMORY_MB,
                       len(plan.unverifiable), _head(plan.unverifiable[0]) if plan.unverifiable else "")
        return plan


def evaluate_budgeted(checks: list[CallCheck], values: list[dict[int, Any]], float_tol: float) -> list[bool]:
    """evaluate_check(checks[k], values[k], float_tol) for each k, in the judge process. Over budget: all False for
    this call, with a WARNING naming the first check."""
    if not checks:
        return []
    try:
        return _ask("evaluate", ([c.test for c in checks], values, float_tol), EVAL_BUDGET_S)
    except OverBudget as e:
        logger.warning("code_tests: evaluating %d checks went over the judge's budget (%s; %.0f s, %d MB): they "
                       "fail for this completion (first: %s)", len(checks), e, EVAL_BUDGET_S, JUDGE_MEMORY_MB,
                       _head(checks[0].source))
        return [False] * len(checks)


def _head(text: str) -> str:
    return json.dumps(text[:120])


# --------------------------------------------------------------------------------------------- the worker side


def _worker_main() -> None:
    """The judge process: answer requests on stdin until EOF, within RLIMIT_AS; exits when the parent is gone."""
    import resource

    from grpo.sandbox.checks import dry_run
    from grpo.sandbox.judge import evaluate_check

    with open("/proc/self/statm") as f:
        held = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (held + (JUDGE_MEMORY_MB << 20), resource.RLIM_INFINITY))
    parent = os.getppid()

    def watch() -> None:  # a request that runs on after the trainer died ends here
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        head = stdin.read(_HEADER.size)
        if len(head) < _HEADER.size:
            return
        kind, payload = pickle.loads(stdin.read(_HEADER.unpack(head)[0]))
        try:
            if kind == "parse":
                plan = parse_tests(*payload)
                dry_run(plan)
                reply = ("ok", plan)
            else:
                tests, values, tol = payload
                reply = ("ok", [evaluate_check(CallCheck("", (), t), v, tol) for t, v in zip(tests, values)])
            data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
            if len(data) > MAX_REPLY_BYTES:
                data = pickle.dumps(("over", f"a reply of {len(data)} bytes"))
        except ValueError as e:
            data = pickle.dumps(("value_error", str(e)))
        except (MemoryError, RecursionError) as e:
            data = pickle.dumps(("over", type(e).__name__))
        except Exception as e:  # noqa: BLE001 - a bug of the judge on odd text: over budget, the row trains on
            data = pickle.dumps(("over", repr(e)[:200]))
        stdout.write(_HEADER.pack(len(data)) + data)
        stdout.flush()
