"""The judge's own process: whatever the judge computes from test text runs there, under a time and a memory
budget, never in the trainer's thread.

    plan = parse_budgeted(tests, entry_point, where="row 3")   # parse_tests in the judge process; plan.judge_s
    ok = evaluate_budgeted(plan.calls, values, float_tol, spent_s=plan.judge_s)   # evaluate_check of each check

Test text is data, and data can be hostile or just unlucky: `round(5, -10**9)`, `sum([[1]*1000]*3000, [])`, `str()`
over shared nested literals (1.6e9 items), many values each within the build budget (which counts 8 bytes an item
where a Python int takes ~36), constants substituted into each other; a program's values can make a check as costly
(`round(5, f(1))` with f(1) = -10**9). One long-lived worker (a plain `python` child with stdin/stdout pipes) parses
rows and evaluates checks; its address space is capped (RLIMIT_AS: what it holds after start + JUDGE_MEMORY_MB, real
bytes).

One budget, JUDGE_BUDGET_S, holds the whole judgement of one completion: the worker's start when a request has to
wait for one, the parse of its row (with the dry run of every part of a check that does not depend on the program:
the expected side, `round(5, -10**9)`) and the evaluation of its checks. A row is parsed once per process and the
seconds its parse took (plan.judge_s, measured in the worker) are charged to every completion of the row, so each
completion's evaluation gets what is left; as an evaluation computes the dry run's parts again, a row whose parse
plus its dry run reaches the budget is over budget at once (no completion of it could be judged within it). At the
deadline the parent SIGKILLs the worker and starts the next one at once (so the next request rarely waits for a
start). The outcome is JUDGE_OVER_BUDGET, never a pass:
  parse       the plan is marked over budget (plan.over_budget holds the reason; logged at WARNING naming the row):
              every completion of the row scores 0 without running, for as long as the process keeps the plan.
  evaluation  OverBudget is raised to the caller (verdict.calls_passed, then code_exec): that completion scores 0.
A MemoryError (RLIMIT_AS), a RecursionError, a reply over MAX_REPLY_BYTES or a worker that died are over budget too.
Requests are serialised on one lock and the budget starts once a request holds it (an evaluation takes well under a
millisecond; a parse happens once per row and process: code_exec caches the plans).
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

__all__ = ["parse_budgeted", "evaluate_budgeted", "OverBudget", "JUDGE_BUDGET_S", "JUDGE_OVER_BUDGET",
           "JUDGE_MEMORY_MB", "MAX_REPLY_BYTES"]

logger = logging.getLogger("grpo.rewards")

JUDGE_BUDGET_S = 2.0  # one completion's judgement: the worker's start, its row's parse (with the dry run), its checks
JUDGE_OVER_BUDGET = "judge budget exceeded"  # the reason a completion scores 0, in the reward log
JUDGE_MEMORY_MB = 512  # address space the worker may add to what it holds after its start
MAX_REPLY_BYTES = 16 * 1024 * 1024  # a parsed plan larger than this (pickled) is over budget
_HEADER = struct.Struct("<Q")


class OverBudget(Exception):
    """The judge process ran past its time or memory budget (or died) on a request. str(): the reason, beginning
    with JUDGE_OVER_BUDGET."""

    def __init__(self, why: str) -> None:
        super().__init__(f"{JUDGE_OVER_BUDGET} ({why})")


_WORKER_SRC = """\
import sys
sys.path[:0] = {path!r}
from grpo.sandbox.budget import _worker_main
_worker_main()
"""


class _Worker:
    """The judge process. It writes one byte when it is ready (its imports done), then answers requests."""

    def __init__(self) -> None:
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        path = [p for p in sys.path if p]
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER_SRC.format(path=path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, close_fds=True)
        os.set_blocking(self.proc.stdin.fileno(), False)  # a request's bytes are written within its budget too
        self.ready = False
        self.budget_s = 0.0

    def request(self, msg: Any, budget_s: float) -> tuple[str, Any, float]:
        """(status, value, seconds the worker spent on it); OverBudget past budget_s, which counts from now and
        holds the wait for the worker's start, the request's bytes and the reply's."""
        self.budget_s, deadline = budget_s, time.monotonic() + budget_s
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        self._write(_HEADER.pack(len(data)) + data, deadline)
        if not self.ready:
            self._read(1, deadline)
            self.ready = True
        head = self._read(_HEADER.size, deadline)
        (n,) = _HEADER.unpack(head)
        return pickle.loads(self._read(n, deadline))  # the worker runs only the judge's code: trusted

    def _over(self, timed_out: bool) -> OverBudget:
        if not timed_out:
            return OverBudget(f"the judge process ended (exit {self.proc.poll()})")
        starting = "" if self.ready else "; the judge process was still starting"
        return OverBudget(f"time: {self.budget_s:.3g} s{starting}")

    def _write(self, data: bytes, deadline: float) -> None:
        fd, view = self.proc.stdin.fileno(), memoryview(data)
        while view:
            try:
                view = view[os.write(fd, view):]
                continue
            except BlockingIOError:  # the pipe is full: wait for the worker to read, within the budget
                pass
            except OSError:
                raise self._over(False) from None
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [fd], [], left)[1]:
                raise self._over(True)

    def _read(self, n: int, deadline: float) -> bytes:
        out = bytearray()
        fd = self.proc.stdout.fileno()
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise self._over(True)
            chunk = os.read(fd, min(n - len(out), 1 << 20))
            if not chunk:
                raise self._over(False)
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


def _ask(kind: str, payload: Any, budget_s: float) -> tuple[Any, float]:
    """The worker's answer to (kind, payload) and the seconds it spent on it; OverBudget when it overran (it is then
    killed, and the next worker started at once) or failed. The budget starts once the request holds the lock."""
    with _lock:
        if budget_s <= 0:
            raise OverBudget("no time left")
        if not _worker:
            _worker.append(_Worker())
        try:
            status, value, seconds = _worker[0].request((kind, payload), budget_s)
        except OverBudget:
            _worker.pop().kill()
            _worker.append(_Worker())  # its start overlaps what the trainer does until the next request
            raise
    if status == "ok":
        return value, seconds
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
    """parse_tests (and the dry run) in the judge process, within JUDGE_BUDGET_S; plan.judge_s holds the seconds
    the worker spent on it. Over budget: a plan with nothing to run whose `over_budget` holds the reason (every
    completion of the row scores 0), with a WARNING naming `where`. A ValueError of parse_tests (a malformed row) is
    raised as is."""
    try:
        (plan, dry_s), seconds = _ask("parse", (tests, entry_point), JUDGE_BUDGET_S)
        if seconds + dry_s >= JUDGE_BUDGET_S:  # every evaluation computes the dry run's parts again
            raise OverBudget(f"time: the parse took {seconds:.2f} s and each evaluation repeats {dry_s:.2f} s of it")
    except OverBudget as e:
        items = [tests] if isinstance(tests, (str, dict)) else list(tests or [])
        first = next((i for i in items if isinstance(i, str) and i.strip()), "")
        logger.warning("code_tests: %s: %s while parsing its tests (the judge's %.3g s for parse + evaluation + "
                       "start, %d MB): every completion of it scores 0 (first test: %s)", where, e, JUDGE_BUDGET_S,
                       JUDGE_MEMORY_MB, _head(first))
        return TestPlan(over_budget=str(e))
    plan.judge_s = seconds
    return plan


def evaluate_budgeted(checks: list[CallCheck], values: list[dict[int, Any]], float_tol: float,
                      spent_s: float = 0.0) -> list[bool]:
    """evaluate_check(checks[k], values[k], float_tol) for each k, in the judge process, within what is left of
    JUDGE_BUDGET_S after `spent_s` (the row's parse: plan.judge_s). Over budget: raises OverBudget (the completion
    scores 0; its caller logs it)."""
    if not checks:
        return []
    return _ask("evaluate", ([c.test for c in checks], values, float_tol), JUDGE_BUDGET_S - spent_s)[0]


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
    stdout.write(b"R")  # ready: the parent's wait for the start ends here
    stdout.flush()
    while True:
        head = stdin.read(_HEADER.size)
        if len(head) < _HEADER.size:
            return
        kind, payload = pickle.loads(stdin.read(_HEADER.unpack(head)[0]))
        t0 = time.perf_counter()
        try:
            if kind == "parse":
                plan = parse_tests(*payload)
                t1 = time.perf_counter()
                dry_run(plan)
                t2 = time.perf_counter()
                reply = ("ok", (plan, t2 - t1), t2 - t0)
            else:
                tests, values, tol = payload
                reply = ("ok", [evaluate_check(CallCheck("", (), t), v, tol) for t, v in zip(tests, values)],
                         time.perf_counter() - t0)
            data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
            if len(data) > MAX_REPLY_BYTES:
                data = pickle.dumps(("over", f"a reply of {len(data)} bytes", 0.0))
        except ValueError as e:
            data = pickle.dumps(("value_error", str(e), 0.0))
        except MemoryError:
            data = pickle.dumps(("over", f"memory: {JUDGE_MEMORY_MB} MB", 0.0))
        except RecursionError:
            data = pickle.dumps(("over", "RecursionError", 0.0))
        except Exception as e:  # noqa: BLE001 - a bug of the judge on odd text: over budget, the row trains on
            data = pickle.dumps(("over", repr(e)[:200], 0.0))
        stdout.write(_HEADER.pack(len(data)) + data)
        stdout.flush()
