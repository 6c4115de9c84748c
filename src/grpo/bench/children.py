"""The benchmarks' child processes (`grpo train` runs, TRL's worker): the benchmark owns them.

Each child runs in its own process group (its async rollout worker included), and whatever ends the benchmark's wait
for it (SIGTERM or Ctrl-C to the benchmark, an error) ends that whole group: SIGTERM, then SIGKILL after a grace
period. `owning_signals()` turns SIGTERM/SIGINT into an exception in the main thread, so the `with` blocks between
it and the wait (temporary directories) unwind and clean up, and the benchmark exits 128 + the signal's number with
one line (BenchStopped). A child that fails is one message with its own last words (`run_failure`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

from grpo.errors import GrpoError, UserError

GRACE_S = 10.0  # a `grpo train` child finishes its step and checkpoints on SIGTERM; a bench's runs need no checkpoint


class BenchRunError(GrpoError):
    """A child run of the benchmark failed; the message holds its last words."""


class BenchStopped(GrpoError):
    """SIGTERM/SIGINT stopped the benchmark: its running child was ended and its temporary files removed."""

    def __init__(self, what: str, signum: int, kept: Path | None):
        self.exit_code = 128 + signum
        tail = f"; what it measured before is in {kept}" if kept is not None else ""
        super().__init__(f"{what} stopped by {signal.Signals(signum).name}: its running child was ended and its "
                         f"temporary directory removed{tail}")


class _Stop(BaseException):
    """Raised in the main thread by the benchmark's signal handler (a BaseException: no `except Exception` eats it)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def spawn(cmd: list[str], env: dict, log_path: Path, stderr_only: bool = False) -> subprocess.Popen:
    """Start `cmd` in a process group of its own, its output (stdout and stderr, or stderr alone) to `log_path`."""
    with open(log_path, "w") as log:  # the child holds its own descriptor; ours can close
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL if stderr_only else log,
                                stderr=log if stderr_only else subprocess.STDOUT, env=env, start_new_session=True)


def end_group(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """End `proc`'s whole process group: SIGTERM, SIGKILL after `grace_s`, and SIGKILL to whatever of the group is
    left once `proc` is gone (grandchildren such as the async worker)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def owned(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """Whatever leaves this block by an exception (a signal's _Stop included) ends `proc`'s group first."""
    try:
        yield proc
    except BaseException:
        end_group(proc)
        raise


@contextlib.contextmanager
def owning_signals(what: str, kept: Callable[[], Path | None] = lambda: None) -> Iterator[None]:
    """SIGTERM and SIGINT raise in the main thread while the block runs; when one ended it, BenchStopped (exit
    128 + signum) is raised once everything inside has unwound. `kept()`: where the results so far are, if any.
    The previous handlers are put back."""
    def stop(signum, _frame):
        raise _Stop(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    except _Stop as e:
        raise BenchStopped(what, e.signum, kept()) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_failure(what: str, returncode: int, output: str) -> GrpoError:
    """The error for a child that exited `returncode`: a UserError (exit 2) carrying the child's own one-line
    message when it refused its input (exit 2 and a "grpo: " line), else a BenchRunError with its last words."""
    said = [line for line in output.splitlines() if line.startswith("grpo: ")]
    if returncode == 2 and said:
        return UserError(f"{what} refused its input: {said[-1][len('grpo: '):]}")
    return BenchRunError(f"{what} failed (exit code {returncode}): "
                         f"{said[-1] if said else output[-2000:].strip() or '(no output)'}")
