"""The mechanics of one sandboxed run: write the program, start it under a backend's command (command.py), read its
output with caps, kill everything it started, and classify the outcome. Policy (which backend, the modes) is in
run.py; the public entry is grpo.sandbox.run_python."""

from __future__ import annotations

import math
import os
import secrets
import selectors
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass

import psutil

from grpo.sandbox.seccomp import build as seccomp_filter
from grpo.sandbox.cleanup import finish_later, remove_tree
from grpo.sandbox.command import TMPFS_BYTES, command, sandbox_env
from grpo.sandbox.fork import exited as _exited

STATUSES = ("passed", "failed", "timeout", "error", "sandbox_error")
BACKENDS = ("bwrap", "unshare", "rlimit")
OUTPUT_CAP = 64 * 1024  # bytes of each stream kept in the result
OUTPUT_LIMIT = 1024 * 1024  # bytes on one stream after which the program is killed (status "error")
MAX_PROCESSES = 16  # RLIMIT_NPROC: processes + threads of the sandbox uid
MAX_OPEN_FILES = 64  # RLIMIT_NOFILE
MAX_FILE_BYTES = 16 * 1024 * 1024  # RLIMIT_FSIZE
_UID_BASE = 0x70000000  # above the ranges systemd hands out to users and containers
_STARTED = b"\x1e[grpo-sandbox: program started]\n"
_KILL_GRACE_S = 1.0
MAX_INODES = 20_000  # files (and directories) on each of the sandbox's tmpfs mounts (bwrap), checked from outside
INODE_POLL_S = 0.02  # how often: a flood of ~70k files/s overshoots by ~1.4k
_CLEANUP_S = 5.0  # at most this long (and never longer than the call's timeout) to delete a run's directory,
# then the janitor (cleanup.py) gets more

_BOOT = """\
import os, resource, sys
for _k, _v in {limits!r}:
    resource.setrlimit(getattr(resource, _k), (_v, _v))
os.write(2, {marker!r})
sys.argv = {argv!r}
with open("main.py", encoding="utf-8") as _f:
    _src = _f.read()
del _f, _k, _v
exec(compile(_src, "main.py", "exec"), {{"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__}})
"""


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one `run_python` call. `status` is one of STATUSES (see the module docstring)."""

    status: str
    stdout: str
    stderr: str
    wall_s: float
    returncode: int | None = None
    backend: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False


def run_in(
    code: str,
    *,
    timeout: float,
    memory_mb: int,
    stdin: str | bytes | None,
    backend: str,
    max_processes: int = MAX_PROCESSES,
    site_packages: bool = True,
    secret: bytes | None = None,
) -> SandboxResult:
    """Run `code` under `backend` as it is (no probing, no mode check: run.py's run_python decides the backend)."""
    token = secrets.token_hex(8)
    uid = _UID_BASE + secrets.randbelow(1 << 24)
    limits = [
        ("RLIMIT_AS", memory_mb * 1024 * 1024),
        ("RLIMIT_CPU", int(math.ceil(timeout)) + 1),
        ("RLIMIT_NPROC", max_processes),
        ("RLIMIT_NOFILE", MAX_OPEN_FILES),
        ("RLIMIT_FSIZE", MAX_FILE_BYTES),
        ("RLIMIT_CORE", 0),
        ("RLIMIT_MSGQUEUE", 0),  # no POSIX message queue bytes (bwrap's seccomp denies mq_open too)
    ]
    workdir = tempfile.mkdtemp(prefix="grpo-sandbox-")
    t0 = time.monotonic()
    proc = None
    fds: list[int] = []  # read ends handed to the sandbox (the secret, the seccomp filter); closed here afterwards
    try:
        # malformed Unicode (a lone surrogate in the program or in a test's input) is passed on as the bytes it
        # stands for: the program meets it (and fails on it), never this call
        with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(code)
        os.chmod(os.path.join(workdir, "main.py"), 0o644)
        data = stdin.encode("utf-8", "surrogatepass") if isinstance(stdin, str) else (stdin or b"")
        with open(os.path.join(workdir, "stdin"), "wb") as f:
            f.write(data)
        argv = ["main.py"]
        if secret is not None:
            fds.append(_pipe_with(secret))
            argv.append(str(fds[-1]))
        filt = seccomp_filter() if backend == "bwrap" else None
        seccomp_fd = None
        if filt is not None:
            fds.append(_pipe_with(filt))
            seccomp_fd = fds[-1]
        boot = _BOOT.format(limits=limits, marker=_STARTED, argv=argv)
        cmd = command(backend, workdir, boot, uid, site_packages=site_packages, seccomp_fd=seccomp_fd)
        if backend != "bwrap" and os.geteuid() == 0 and any(a.startswith("--reuid=") for a in cmd):
            os.chown(workdir, uid, uid)
        with open(os.path.join(workdir, "stdin"), "rb") as fin:
            try:
                proc = subprocess.Popen(
                    cmd,
                    stdin=fin,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd=workdir,
                    env=sandbox_env(workdir, token),
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=tuple(fds),
                )
            except OSError as e:
                return SandboxResult(
                    "sandbox_error", "", f"could not start the sandbox: {e}", time.monotonic() - t0, None, backend
                )
        for fd in fds:
            os.close(fd)
        fds.clear()
        deadline = t0 + timeout
        out, err, timed_out, overflow = _communicate(proc, deadline, inode_watch=backend == "bwrap")
        if not (timed_out or overflow):
            timed_out = not _wait_exit(proc.pid, deadline)
        _kill_all(proc, backend, token, kill_first=timed_out or overflow)
        return _result(proc.returncode, out, err, timed_out, overflow, time.monotonic() - t0, backend)
    finally:
        for fd in fds:
            os.close(fd)
        if proc is not None and proc.returncode is None:
            _kill_all(proc, backend, token, kill_first=True)
        if not remove_tree(workdir, time.monotonic() + min(timeout, _CLEANUP_S), log=False):
            finish_later(workdir)


def _pipe_with(data: bytes) -> int:
    """A pipe holding `data` with its write end closed: -> the read end (inheritable, for pass_fds)."""
    if len(data) > 60000:  # a pipe buffer holds 64 KiB; more would block this thread
        raise ValueError(f"sandbox pipe data of {len(data)} bytes is too long")
    r, w = os.pipe()
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(w, view):]
    finally:
        os.close(w)
    return r


class _Stream:
    def __init__(self) -> None:
        self.head = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = OUTPUT_CAP + len(_STARTED) - len(self.head)
        if room > 0:
            self.head += data[:room]


def _communicate(proc: subprocess.Popen, deadline: float,
                 inode_watch: bool = False) -> tuple[_Stream, _Stream, bool, str | None]:
    """Read both pipes until EOF, the deadline or an overflow, keeping the head of each. inode_watch (bwrap): every
    INODE_POLL_S, the files of the sandbox's tmpfs mounts are counted, and more than MAX_INODES on one is an overflow.

    -> (out, err, timed_out, overflow: None, "output" or "inodes")"""
    streams = {proc.stdout.fileno(): _Stream(), proc.stderr.fileno(): _Stream()}
    watch = _InodeWatch(proc.pid) if inode_watch else None
    sel = selectors.DefaultSelector()
    for fd in streams:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    exited_at = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                return *streams.values(), True, False
            if exited_at is None and _exited(proc.pid):
                exited_at = now
            if exited_at is not None and now - exited_at > 0.5:
                break  # the program is gone; something it left behind holds the pipes (rlimit backend)
            if watch is not None and watch.over():
                return *streams.values(), False, "inodes"
            for key, _ in sel.select(min(deadline - now, INODE_POLL_S if watch is not None else 0.1)):
                try:
                    data = os.read(key.fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not data:
                    sel.unregister(key.fd)
                    continue
                s = streams[key.fd]
                s.add(data)
                if s.total > OUTPUT_LIMIT + len(_STARTED):
                    return *streams.values(), False, "output"
    finally:
        sel.close()
    return *streams.values(), False, None


class _InodeWatch:
    """Counts the files on the sandbox's tmpfs mounts from outside: statvfs of /proc/<the namespace's init>/root/<mount>
    (bubblewrap 0.8 caps a tmpfs's bytes, not its inodes, and a flood of empty files took +212 MB of kernel memory in
    3 s). Checked at most every INODE_POLL_S, so the overshoot is what a program creates in that time."""

    def __init__(self, wrapper_pid: int) -> None:
        self.wrapper, self.init, self.next_at = wrapper_pid, None, 0.0

    def over(self) -> bool:
        now = time.monotonic()
        if now < self.next_at:
            return False
        self.next_at = now + INODE_POLL_S
        if self.init is None:
            try:
                kids = psutil.Process(self.wrapper).children()
            except psutil.Error:
                return False
            if not kids:
                return False
            self.init = kids[0].pid
        for mount in ("/work", "/tmp", "/dev/shm"):
            try:
                st = os.statvfs(f"/proc/{self.init}/root{mount}")
            except OSError:  # gone, or not ours to read: nothing to count
                return False
            if st.f_blocks * st.f_frsize != TMPFS_BYTES:
                continue  # not (yet) the sandbox's own tmpfs: bwrap has not set up its root, or no such mount
            if st.f_files - st.f_ffree > MAX_INODES:
                return True
        return False


def _wait_exit(pid: int, deadline: float) -> bool:
    while not _exited(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


def _kill_all(proc: subprocess.Popen, backend: str, token: str, *, kill_first: bool) -> None:
    """Leave nothing running and nothing unreaped. In a pid namespace, kill its init (the wrapper's child) so the
    kernel kills every process inside and the wrapper reaps it; then kill the group and reap the wrapper."""
    if kill_first and backend in ("bwrap", "unshare"):
        try:
            kids = psutil.Process(proc.pid).children()
        except psutil.Error:
            kids = []
        for k in kids:
            try:
                k.kill()
            except psutil.Error:
                pass
        _wait_exit(proc.pid, time.monotonic() + _KILL_GRACE_S)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the wrapper is unreaped, so this group id is still ours
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    for f in (proc.stdout, proc.stderr):
        if f is not None:
            f.close()
    if backend == "rlimit":
        _sweep(token)


def _sweep(token: str) -> None:
    """Kill processes that carry this run's environment token (daemons that left the process group)."""
    for p in psutil.process_iter():
        try:
            if p.environ().get("GRPO_SANDBOX_TOKEN") == token:
                p.kill()
        except (psutil.Error, OSError):
            continue


def _result(
    rc: int | None, out: _Stream, err: _Stream, timed_out: bool, overflow: str | None, wall: float, backend: str
) -> SandboxResult:
    started = err.head.startswith(_STARTED)
    err_head = err.head[len(_STARTED) :] if started else err.head
    err_total = err.total - (len(_STARTED) if started else 0)
    stderr = bytes(err_head[:OUTPUT_CAP]).decode("utf-8", "replace")
    stdout = bytes(out.head[:OUTPUT_CAP]).decode("utf-8", "replace")
    if timed_out:
        status = "timeout"
    elif overflow:
        status = "error"
        stderr += (f"\n[sandbox] killed: more than {OUTPUT_LIMIT} bytes of output on one stream" if overflow == "output"
                   else f"\n[sandbox] killed: more than {MAX_INODES} files on one of its file systems")
    elif not started:
        status = "sandbox_error"
    elif rc == 0:
        status = "passed"
    elif rc is None or rc < 0 or rc >= 128:
        status = "error"
    else:
        status = "failed"
    return SandboxResult(status, stdout, stderr, wall, rc, backend, out.total > OUTPUT_CAP, err_total > OUTPUT_CAP)
