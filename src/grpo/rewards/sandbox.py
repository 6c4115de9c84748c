"""Run untrusted Python (a model's completion) in a throwaway sandbox: the code rewards' executor.

    from grpo.rewards.sandbox import run_python
    res = run_python("print(1 + 1)", timeout=5.0, memory_mb=512)
    res.status, res.stdout, res.wall_s                  # ("passed", "2\\n", 0.05)

`status` is one of
  passed         the program exited 0
  failed         it exited with a non-zero code (an uncaught exception, a failed assert, MemoryError, ...)
  timeout        still running at `timeout` seconds of wall-clock time: killed, with everything it started
  error          killed by a signal (a resource limit, a crash), or more than OUTPUT_LIMIT bytes on one stream
  sandbox_error  the sandbox itself could not start the program: not the program's fault (code rewards score it None)
`stdout` and `stderr` keep the first OUTPUT_CAP bytes of each stream (decoded as UTF-8, bad bytes replaced).

Every call gets a new process group (session) that is SIGKILLed as a whole at the wall-clock limit; rlimits set in
the sandboxed interpreter before the program's first line (RLIMIT_AS = memory_mb, RLIMIT_CPU = timeout + 1 s,
RLIMIT_NPROC, RLIMIT_NOFILE, RLIMIT_FSIZE, no core files); a private temporary working directory (deleted
afterwards); an environment with nothing but PATH, HOME, LANG, MALLOC_ARENA_MAX; the interpreter in isolated mode
(`python -I`: no PYTHON* variables, no user site, no script directory on sys.path); output caps. The limits are
applied by the interpreter itself rather than a `preexec_fn`, which is unsafe in a multi-threaded parent (the trainer
is one).

Backends. Safe by default: without a working bwrap, run_python raises SandboxUnavailable (saying how to install it)
unless an unsafe fallback is asked for by name: `backend=` / GRPO_SANDBOX_BACKEND, or set_sandbox_mode("unsafe_local")
(the config's reward.sandbox), which allows the first of unshare/rlimit that works; a fallback logs a WARNING once
per process. The binaries are resolved to absolute paths once per process (_sandbox_cmd.tool).

  bwrap    Debian's bubblewrap. New pid, network, ipc, uts (and cgroup) namespaces; a new root that holds only
           /usr (+ the /bin, /lib, ... links), the Python installation and the dynamic loader's /etc files, all
           read-only, a fresh /proc and /dev, and size-capped private tmpfs mounts at /tmp, /dev/shm and /work (the
           working directory), new each run. Host files outside those are invisible. --die-with-parent,
           --new-session, --clearenv; a seccomp filter (_seccomp.py: no new user namespaces, no memfd/shmget, no
           ptrace); --disable-userns as a normal user when bwrap has it.
  unshare  util-linux `unshare`: the same pid, network, ipc and uts namespaces, but NO filesystem isolation: the
           program sees the host's files with the permissions of its uid (below) and works in a private temporary
           directory on the host.
  rlimit   plain subprocess: rlimits, process group, private working dir, scrubbed environment only. NO network
           isolation, and a process that calls setsid() escapes the group kill (after the run, processes carrying
           this run's environment token are killed as a best effort).

When we run as root, every backend drops the program to an unprivileged uid of its own (0x70000000 + random, no
capabilities, no_new_privs) with util-linux `setpriv`, because the kernel does not apply RLIMIT_NPROC to root: without
the drop a fork bomb is bounded only by the wall clock. (If the interpreter itself is not readable by other users,
the unshare/rlimit backends keep CAP_DAC_READ_SEARCH so the interpreter can load: the program can then read any file.)

What is covered (bwrap): infinite loops (wall-clock kill of the whole pid namespace); fork bombs (RLIMIT_NPROC as an
unprivileged uid, then the namespace kill); large allocations (RLIMIT_AS); huge output (caps, then a kill); huge files
(RLIMIT_FSIZE, tmpfs size); reading or writing host files outside the sandbox (not mounted / read-only); network
access (empty network namespace); daemons that setsid() and outlive the program (killed with the pid namespace);
signals to host processes (pid namespace); privilege escalation through setuid binaries (no_new_privs).

What is NOT covered: the seccomp filter is a short deny list, so a kernel vulnerability in an allowed call is an
escape; no cgroup, so memory is bounded by MAX_PROCESSES x memory_mb plus the tmpfs sizes and CPU time is shared with
the host; readable files under /usr and the Python installation (e.g. installed packages) are visible; timing and
other side channels. (Gaming the verdict from inside the program's interpreter is code_exec's concern: it judges
outside the sandbox.)
This is a guard against buggy and reward-hacking model output, not a boundary against a determined attacker: for
that run code rewards on separate machines (SandboxFusion, E2B, ...).
"""

from __future__ import annotations

import logging
import math
import os
import queue
import secrets
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

import psutil

from grpo.rewards import _seccomp
from grpo.rewards._fork import exited as _exited
from grpo.rewards._sandbox_cmd import command, sandbox_env, tool

__all__ = ["SandboxResult", "SandboxUnavailable", "run_python", "available_backends", "default_backend",
           "resolve_backend", "set_sandbox_mode", "sandbox_mode", "remove_tree", "BACKENDS", "MODES", "STATUSES"]

logger = logging.getLogger("grpo.rewards")

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
_CLEANUP_S = 5.0  # at most this long (and never longer than the call's timeout) to delete a run's directory
_JANITOR_S = 300.0  # then a background thread gets this long more

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


def run_python(
    code: str,
    *,
    timeout: float = 10.0,
    memory_mb: int = 1024,
    stdin: str | bytes | None = None,
    backend: str | None = None,
    max_processes: int = MAX_PROCESSES,
    site_packages: bool = True,
    secret: bytes | None = None,
) -> SandboxResult:
    """Run `code` as a Python program in a fresh sandbox and return its SandboxResult.

    timeout: wall-clock seconds before the whole sandbox is SIGKILLed (status "timeout").
    memory_mb: address-space limit of each process (RLIMIT_AS); allocations beyond it raise MemoryError.
    stdin: data for the program's standard input (empty by default).
    backend: "bwrap" | "unshare" | "rlimit" | None. None: GRPO_SANDBOX_BACKEND if set, else bwrap; without a working
        bwrap this raises SandboxUnavailable unless set_sandbox_mode("unsafe_local") allowed the fallbacks. Naming
        "unshare" or "rlimit" (here or in the variable) runs without filesystem isolation, with a warning.
    max_processes: RLIMIT_NPROC, processes plus threads (a program starting more threads gets an error).
    site_packages: False starts the interpreter with -S: the standard library only, and a start about 20 ms
        faster (no site-packages to scan), for programs that need nothing else.
    secret: bytes delivered on a pipe whose read end is open in the program as file descriptor int(sys.argv[1]);
        nothing else (stdin, environment, files) carries them. The code harness reads and closes it (_harness.py).
    """
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0, got {timeout!r}")
    if memory_mb < 64:
        raise ValueError(f"memory_mb must be >= 64 (the interpreter needs it), got {memory_mb!r}")
    if max_processes < 1:
        raise ValueError(f"max_processes must be >= 1, got {max_processes!r}")
    named = backend or os.environ.get("GRPO_SANDBOX_BACKEND") or None
    if named is not None and named not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {named!r}; known: {', '.join(BACKENDS)}")
    if named is not None:
        reason = _probe(named)
        if reason:
            return SandboxResult(
                "sandbox_error", "", f"sandbox backend {named!r} does not work here: {reason}", 0.0, None, named
            )
    name = resolve_backend(named)
    return _run(code, timeout=timeout, memory_mb=memory_mb, stdin=stdin, backend=name, max_processes=max_processes,
                site_packages=site_packages, secret=secret)


class SandboxUnavailable(RuntimeError):
    """No safe sandbox here (bubblewrap missing or not working) and no unsafe fallback was asked for by name."""


MODES = ("auto", "bwrap", "unsafe_local")
_mode = ["auto"]
_warned_unsafe: set[str] = set()


def set_sandbox_mode(mode: str) -> None:
    """The process-wide choice when no backend is named (`reward.sandbox`): "auto" and "bwrap" run programs under
    bubblewrap only and refuse without it; "unsafe_local" also allows the unshare/rlimit fallbacks (a warning says
    so at the first use after each call of this function, i.e. once per training run, and once per process)."""
    if mode not in MODES:
        raise ValueError(f"reward.sandbox must be one of {', '.join(MODES)}, got {mode!r}")
    _mode[0] = mode
    _warned_unsafe.clear()  # each training run (which sets the mode) warns again when it uses a fallback


def sandbox_mode() -> str:
    """The mode set_sandbox_mode last set ("auto" by default)."""
    return _mode[0]


def resolve_backend(named: str | None = None) -> str:
    """The backend a call runs under: `named` (or GRPO_SANDBOX_BACKEND) as is; else bwrap when it works; else, in
    mode unsafe_local, the first fallback that works. Raises SandboxUnavailable (saying how to install bubblewrap)
    when nothing may run. A fallback logs a WARNING once per process."""
    named = named or os.environ.get("GRPO_SANDBOX_BACKEND") or None
    if named is not None:
        if named not in BACKENDS:
            raise ValueError(f"unknown sandbox backend {named!r}; known: {', '.join(BACKENDS)}")
        _warn_unsafe(named, "named")
        return named
    why = _probe("bwrap")
    if not why:
        return "bwrap"
    if _mode[0] == "unsafe_local":
        for b in BACKENDS[1:]:
            if not _probe(b):
                _warn_unsafe(b, f"reward.sandbox=unsafe_local, bubblewrap unavailable: {why}")
                return b
    raise SandboxUnavailable(
        f"refusing to run model-written code: bubblewrap (bwrap) is not available here ({why}). Install it "
        "with `apt-get install bubblewrap` (Debian/Ubuntu; `dnf install bubblewrap` on Fedora), or, only on a "
        "machine you can afford to expose to the program, run the unsafe fallback by name: reward.sandbox="
        "unsafe_local (config), or backend='unshare'/'rlimit' / GRPO_SANDBOX_BACKEND (docs/rewards.md)"
    )


def _warn_unsafe(backend: str, why: str) -> None:
    if backend != "bwrap" and backend not in _warned_unsafe:
        _warned_unsafe.add(backend)
        logger.warning(
            "sandbox backend %r (%s): model-written code runs WITHOUT filesystem isolation%s; it can read the "
            "host's files and leave files in /tmp (docs/rewards.md, the sandbox)", backend, why,
            " or network isolation" if backend == "rlimit" else "")


def available_backends() -> list[str]:
    """The backends that work on this machine, best first."""
    return [b for b in BACKENDS if not _probe(b)]


def default_backend() -> str:
    """The backend `run_python` uses when none is named (see resolve_backend; raises SandboxUnavailable)."""
    return resolve_backend(None)


# ----------------------------------------------------------------------------------------------- backend probing

_probe_lock = threading.Lock()
_probe_cache: dict[str, str] = {}


def _probe(backend: str) -> str:
    """'' when `backend` can run a trivial program here, else the reason it cannot. Cached per process."""
    with _probe_lock:
        if backend not in _probe_cache:
            _probe_cache[backend] = _probe_uncached(backend)
            if _probe_cache[backend]:
                logger.info("sandbox backend %r unavailable: %s", backend, _probe_cache[backend])
        return _probe_cache[backend]


def _probe_uncached(backend: str) -> str:
    name = {"bwrap": "bwrap", "unshare": "unshare"}.get(backend)
    if name and not tool(name):
        return f"`{name}` not found on PATH"
    if not sys.platform.startswith("linux") and backend != "rlimit":
        return "namespaces need Linux"
    res = _run("import sys; sys.exit(0)", timeout=20.0, memory_mb=512, stdin=None, backend=backend)
    if res.status != "passed":
        return f"{res.status}: {res.stderr.strip()[-500:]}"
    return ""


# ------------------------------------------------------------------------------------------------------ running


def _run(
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
    token = secrets.token_hex(8)
    uid = _UID_BASE + secrets.randbelow(1 << 24)
    limits = [
        ("RLIMIT_AS", memory_mb * 1024 * 1024),
        ("RLIMIT_CPU", int(math.ceil(timeout)) + 1),
        ("RLIMIT_NPROC", max_processes),
        ("RLIMIT_NOFILE", MAX_OPEN_FILES),
        ("RLIMIT_FSIZE", MAX_FILE_BYTES),
        ("RLIMIT_CORE", 0),
    ]
    workdir = tempfile.mkdtemp(prefix="grpo-sandbox-")
    t0 = time.monotonic()
    proc = None
    fds: list[int] = []  # read ends handed to the sandbox (the secret, the seccomp filter); closed here afterwards
    try:
        with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        os.chmod(os.path.join(workdir, "main.py"), 0o644)
        data = stdin.encode() if isinstance(stdin, str) else (stdin or b"")
        with open(os.path.join(workdir, "stdin"), "wb") as f:
            f.write(data)
        argv = ["main.py"]
        if secret is not None:
            fds.append(_pipe_with(secret))
            argv.append(str(fds[-1]))
        filt = _seccomp.build() if backend == "bwrap" else None
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
        out, err, timed_out, overflow = _communicate(proc, deadline)
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
            _finish_later(workdir)


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


def remove_tree(path: str, deadline: float, *, log: bool = True) -> bool:
    """Delete directory `path` and everything under it, never raising and stopping at `deadline` (monotonic).

    No recursion and no long paths: each directory met is first renamed to the top level (`path`), so every
    operation is relative to a file descriptor at depth one or two, whatever the tree's depth (a 3,000-deep tree
    costs 3,000 renames). Errors are skipped; what is left when time runs out is logged. -> True if it is gone."""
    try:
        root = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return True
    except OSError:
        _unlink(path)
        return not os.path.lexists(path)
    tag, count = secrets.token_hex(6), 0
    todo = _empty_dir(root, root, tag, 0)
    count = len(todo)
    try:
        while todo and time.monotonic() < deadline:
            name = todo.pop()
            fd = _open_dir(name, root)
            if fd is None:
                continue
            try:
                moved = _empty_dir(fd, root, tag, count)
            finally:
                os.close(fd)
            count += len(moved)
            todo += moved
            try:
                os.rmdir(name, dir_fd=root)
            except OSError:
                pass
    except Exception:  # noqa: BLE001 - cleanup never raises
        pass
    finally:
        os.close(root)
    try:
        os.rmdir(path)
    except OSError:
        pass
    gone = not os.path.lexists(path)
    if not gone and log:
        logger.warning("sandbox cleanup: could not remove all of %s in time; left in place", path)
    return gone


_janitor_queue: queue.SimpleQueue[str] = queue.SimpleQueue()
_janitor_started = threading.Event()


def _finish_later(path: str) -> None:
    """Hand a directory the call could not delete in its time to a background thread (the call returns now)."""
    if not _janitor_started.is_set():
        _janitor_started.set()
        threading.Thread(target=_janitor, name="grpo-sandbox-cleanup", daemon=True).start()
    _janitor_queue.put(path)


def _janitor() -> None:
    while True:
        path = _janitor_queue.get()
        remove_tree(path, time.monotonic() + _JANITOR_S)


def _open_dir(name: str, root: int) -> int | None:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        return os.open(name, flags, dir_fd=root)
    except PermissionError:
        try:  # a directory the program made unreadable (same uid): open it up once
            os.chmod(name, 0o700, dir_fd=root, follow_symlinks=False)
            return os.open(name, flags, dir_fd=root)
        except (OSError, NotImplementedError):
            return None
    except OSError:
        return None


def _empty_dir(fd: int, root: int, tag: str, start: int) -> list[str]:
    """Unlink the non-directories in directory `fd`; rename its subdirectories to the top level (`root`) under
    fresh names, which are returned. Errors are skipped."""
    moved: list[str] = []
    try:
        entries = list(os.scandir(fd))
    except OSError:
        return moved
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False):
                if fd == root:
                    moved.append(e.name)
                    continue
                new = f".grpo-rm-{tag}-{start + len(moved)}"
                os.rename(e.name, new, src_dir_fd=fd, dst_dir_fd=root)
                moved.append(new)
            else:
                os.unlink(e.name, dir_fd=fd)
        except OSError:
            continue
    return moved


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class _Stream:
    def __init__(self) -> None:
        self.head = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = OUTPUT_CAP + len(_STARTED) - len(self.head)
        if room > 0:
            self.head += data[:room]


def _communicate(proc: subprocess.Popen, deadline: float) -> tuple[_Stream, _Stream, bool, bool]:
    """Read both pipes until EOF, the deadline or an overflow, keeping the head of each.

    -> (out, err, timed_out, overflow)"""
    streams = {proc.stdout.fileno(): _Stream(), proc.stderr.fileno(): _Stream()}
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
            for key, _ in sel.select(min(deadline - now, 0.1)):
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
                    return *streams.values(), False, True
    finally:
        sel.close()
    return *streams.values(), False, False


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
    rc: int | None, out: _Stream, err: _Stream, timed_out: bool, overflow: bool, wall: float, backend: str
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
        stderr += f"\n[sandbox] killed: more than {OUTPUT_LIMIT} bytes of output on one stream"
    elif not started:
        status = "sandbox_error"
    elif rc == 0:
        status = "passed"
    elif rc is None or rc < 0 or rc >= 128:
        status = "error"
    else:
        status = "failed"
    return SandboxResult(status, stdout, stderr, wall, rc, backend, out.total > OUTPUT_CAP, err_total > OUTPUT_CAP)
