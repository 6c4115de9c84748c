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
the expected side, `round(5, -10**9)`) and the evaluation of its checks. A row is parsed once per process and the CPU
seconds its parse took (plan.judge_s, measured in the worker) are charged to every completion of the row, so each
completion's evaluation gets what is left; as an evaluation computes the dry run's parts again, a row whose parse
plus its dry run reaches the budget is over budget at once (no completion of it could be judged within it). A
request ends at its budget on the wall clock when the worker computed (at least a quarter of a core on average),
else at STARVED_FACTOR times it: a machine too loaded to give the judge CPU does not fail an honest row whose
judgement takes milliseconds, and a request whose worker had not even started by then is tried once more. The
parent then SIGKILLs the worker and starts the next one at once (so the next request rarely waits for a start).
The outcome is JUDGE_OVER_BUDGET, never a pass:
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
STARVED_FACTOR = 2.0  # a request whose worker had under a quarter of a core is stopped at this times its budget
POLL_S = 0.05  # past the budget, how often the worker's CPU time is read
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
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
    """The judge process. It writes one byte when it is ready (its imports done), then answers requests; each reply
    carries the CPU seconds the request took and the process's CPU seconds so far."""

    def __init__(self) -> None:
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        path = [p for p in sys.path if p]
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER_SRC.format(path=path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, close_fds=True)
        os.set_blocking(self.proc.stdin.fileno(), False)  # a request's bytes are written within its budget too
        self.ready = False
        self.cpu_s = 0.0  # the process's CPU seconds after its last reply (0 before: its start is counted)
        self.budget_s = self.t0 = 0.0

    def request(self, msg: Any, budget_s: float) -> tuple[str, Any, float]:
        """(status, value, CPU seconds the worker spent on it); OverBudget past budget_s (see _wait), which counts
        from now and holds the wait for the worker's start, the request's bytes and the reply's."""
        self.budget_s, self.t0 = budget_s, time.monotonic()
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        self._write(_HEADER.pack(len(data)) + data)
        if not self.ready:
            self._read(1)
            self.ready = True
        head = self._read(_HEADER.size)
        (n,) = _HEADER.unpack(head)
        status, value, seconds, self.cpu_s = pickle.loads(self._read(n))  # only the judge's code ran: trusted
        return status, value, seconds

    def _wait(self) -> float:
        """How long to wait before looking again; OverBudget once the request is over its budget: at the budget
        when the worker computed (at least a quarter of a core on average since the request began), else at
        STARVED_FACTOR times it (a worker the machine starves of CPU, a slow start, is not what the budget is for)."""
        wall, budget_s = time.monotonic() - self.t0, self.budget_s
        if wall < budget_s:
            return budget_s - wall
        if wall >= STARVED_FACTOR * budget_s:
            raise self._over(True, starved=True)
        if self._cpu() - self.cpu_s >= budget_s / 4:
            raise self._over(True)
        return min(POLL_S, STARVED_FACTOR * budget_s - wall)

    def _cpu(self) -> float:
        """The worker's CPU seconds so far (user + system, from /proc); inf when they cannot be read."""
        try:
            with open(f"/proc/{self.proc.pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
        except (OSError, IndexError, ValueError):
            return float("inf")

    def _over(self, timed_out: bool, starved: bool = False) -> OverBudget:
        if not timed_out:
            return OverBudget(f"the judge process ended (exit {self.proc.poll()})")
        if not self.ready:
            return OverBudget(f"time: {STARVED_FACTOR * self.budget_s:.3g} s; the judge process was still starting")
        if starved:
            return OverBudget(f"time: {STARVED_FACTOR * self.budget_s:.3g} s, the judge process short of CPU")
        return OverBudget(f"time: {self.budget_s:.3g} s")

    def _write(self, data: bytes) -> None:
        fd, view = self.proc.stdin.fileno(), memoryview(data)
        while view:
            try:
                view = view[os.write(fd, view):]
                continue
            except BlockingIOError:  # the pipe is full: wait for the worker to read, within the budget
                pass
            except OSError:
                raise self._over(False) from None
            select.select([], [fd], [], self._wait())

    def _read(self, n: int) -> bytes:
        out = bytearray()
        fd = self.proc.stdout.fileno()
        while len(out) < n:
            if not select.select([fd], [], [], self._wait())[0]:
                continue
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
    """The worker's answer to (kind, payload) and the CPU seconds it spent on it; OverBudget when it overran (it is
    then killed, and the next worker started at once) or failed. The budget starts once the request holds the lock.
    A request whose worker had not even started by the end of its wait (a loaded machine) is tried once more: a
    slow start alone never fails a row or a completion; a second overrun does."""
    with _lock:
        if budget_s <= 0:
            raise OverBudget("no time left")
        for attempt in (1, 2):
            if not _worker:
                _worker.append(_Worker())
            worker = _worker[0]
            try:
                status, value, seconds = worker.request((kind, payload), budget_s)
                break
            except OverBudget:
                _worker.pop().kill()
                _worker.append(_Worker())  # its start overlaps what the trainer does until the next request
                if worker.ready or attempt == 2:
                    raise
                logger.info("code_tests: the judge process did not start within %.3g s; trying once more",
                            STARVED_FACTOR * budget_s)
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
    """parse_tests (and the dry run) in the judge process, within JUDGE_BUDGET_S; plan.judge_s holds the CPU
    seconds the worker spent on it. Over budget: a plan with nothing to run whose `over_budget` holds the reason (every
    completion of the row scores 0), with a WARNING naming `where`. A ValueError of parse_tests (a malformed row) is
    raised as is."""
    try:
        (plan, dry_s), seconds = _ask("parse", (tests, entry_point), JUDGE_BUDGET_S)
        if seconds + dry_s >= JUDGE_BUDGET_S:  # every evaluation computes the dry run's parts again
            raise OverBudget(f"time: the parse took {seconds:.2f} s of CPU and each evaluation repeats {dry_s:.2f} s")
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
        cpu = time.process_time  # CPU seconds: what the judge computed, whatever else the machine runs
        t0 = cpu()
        try:
            if kind == "parse":
                plan = parse_tests(*payload)
                t1 = cpu()
                dry_run(plan)
                t2 = cpu()
                reply = ("ok", (plan, t2 - t1), t2 - t0, t2)
            else:
                tests, values, tol = payload
                checked = [evaluate_check(CallCheck("", (), t), v, tol) for t, v in zip(tests, values)]
                reply = ("ok", checked, cpu() - t0, cpu())
            data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
            if len(data) > MAX_REPLY_BYTES:
                data = pickle.dumps(("over", f"a reply of {len(data)} bytes", 0.0, cpu()))
        except ValueError as e:
            data = pickle.dumps(("value_error", str(e), 0.0, cpu()))
        except MemoryError:
            data = pickle.dumps(("over", f"memory: {JUDGE_MEMORY_MB} MB", 0.0, cpu()))
        except RecursionError:
            data = pickle.dumps(("over", "RecursionError", 0.0, cpu()))
        except Exception as e:  # noqa: BLE001 - a bug of the judge on odd text: over budget, the row trains on
            data = pickle.dumps(("over", repr(e)[:200], 0.0, cpu()))
        stdout.write(_HEADER.pack(len(data)) + data)
        stdout.flush()
