"""Run Python code in a forked child that can be killed: the reward runner's hard timeout.

`signal.alarm` only works on the main thread and `asyncio.wait_for` / `future.result(timeout)` stop waiting without
stopping the work (RELIABILITY.md section 3). A forked child inherits the reward function as is (closures and lambdas
need no pickling), runs in its own process group, and is SIGKILLed with that whole group at the deadline. Results come
back pickled through a pipe as length-prefixed frames, so a child killed half-way still delivers what it finished.
The child also gets PR_SET_PDEATHSIG=SIGKILL, so it dies with the thread that forked it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import pickle
import select
import signal
import struct
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

_HEADER = struct.Struct("<Q")
_PR_SET_PDEATHSIG = 1
_EXIT_GRACE_S = 1.0

try:
    _libc = (
        ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True) if sys.platform.startswith("linux") else None
    )
except OSError:  # pragma: no cover
    _libc = None

FORK_AVAILABLE = hasattr(os, "fork") and sys.platform.startswith("linux")

# Python >= 3.12 warns on every fork of a multi-threaded process (a lock held by another thread stays held in the
# child). That risk is accepted knowingly here: the child runs only the reward function, and a child that deadlocks
# is killed at the timeout like any other hang.
warnings.filterwarnings(
    "ignore", message=r".*multi-threaded, use of fork\(\) may lead to deadlocks", category=DeprecationWarning
)


@dataclass
class ForkOutcome:
    """What came back from one forked call. messages: the frames the child sent, in order."""

    messages: list[Any] = field(default_factory=list)
    timed_out: bool = False
    exit_detail: str = ""  # how the child ended: "exit 0", "exit 70", "signal 9", ...


class LiveChildren:
    """The process groups a runner has in flight, so close() can kill them from another thread."""

    def __init__(self) -> None:
        self._pids: set[int] = set()
        self._lock = threading.Lock()

    def add(self, pid: int) -> None:
        with self._lock:
            self._pids.add(pid)

    def discard(self, pid: int) -> None:
        with self._lock:
            self._pids.discard(pid)

    def kill_all(self) -> None:
        with self._lock:
            pids = list(self._pids)
        for pid in pids:
            _killpg(pid)


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _child_main(body: Callable[[Callable[[Any], None]], None], w: int, parent: int) -> None:
    code = 0
    try:
        os.setpgid(0, 0)
        if _libc is not None:
            _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the death signal was armed
            os._exit(1)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)

        def emit(obj: Any) -> None:
            data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
            _write_all(w, _HEADER.pack(len(data)) + data)

        body(emit)
    except BaseException:  # noqa: BLE001 - report anything, then exit without running the parent's cleanup
        code = 70
        try:
            sys.stderr.write(traceback.format_exc())
        except BaseException:  # noqa: BLE001
            pass
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001
                pass
        os._exit(code)


def run_forked(
    body: Callable[[Callable[[Any], None]], None], timeout: float, live: LiveChildren | None = None
) -> ForkOutcome:
    """Fork; in the child call body(emit), where emit(obj) sends a picklable obj to the parent. Wait at most
    `timeout` seconds, then SIGKILL the child's whole process group. Always kills leftovers of the group and reaps
    the child before returning."""
    for stream in (sys.stdout, sys.stderr):  # so buffered parent output is not written twice
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    r, w = os.pipe()
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError as e:  # out of processes or memory: no result, like a crash
        os.close(r)
        os.close(w)
        return ForkOutcome(exit_detail=f"fork failed: {e}")
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(r)
        _child_main(body, w, parent)
    os.close(w)
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass  # the child already did it (or has exited)
    if live is not None:
        live.add(pid)
    out = ForkOutcome()
    buf = bytearray()
    try:
        out.timed_out = not _read_until_eof(r, buf, time.monotonic() + timeout)
    finally:
        os.close(r)
        if not out.timed_out:  # EOF: the child is exiting; give it a moment to finish cleanly
            end = time.monotonic() + _EXIT_GRACE_S
            while not exited(pid) and time.monotonic() < end:
                time.sleep(0.002)
        _killpg(pid)  # the child is not reaped yet, so its group id cannot have been reused
        _, status = os.waitpid(pid, 0)
        if live is not None:
            live.discard(pid)
    out.exit_detail = (
        f"signal {-os.waitstatus_to_exitcode(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
    )
    out.messages = _frames(bytes(buf))
    return out


def _read_until_eof(fd: int, buf: bytearray, deadline: float) -> bool:
    """Append everything from `fd` to `buf` until EOF (-> True) or the deadline (-> False)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if not poller.poll(min(left, 1.0) * 1000):
            continue
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return True
        buf += chunk


def exited(pid: int) -> bool:
    """True once child `pid` has exited; does not reap it (so its pid and process group id cannot be reused yet)."""
    if hasattr(os, "waitid"):
        try:
            return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True
    try:  # no waitid (macOS): a zombie has exited
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _frames(data: bytes) -> list[Any]:
    out, pos = [], 0
    while pos + _HEADER.size <= len(data):
        (n,) = _HEADER.unpack_from(data, pos)
        if pos + _HEADER.size + n > len(data):
            break  # a frame cut off by the kill
        out.append(pickle.loads(data[pos + _HEADER.size : pos + _HEADER.size + n]))
        pos += _HEADER.size + n
    return out
