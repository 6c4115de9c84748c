"""Run untrusted Python (a model's completion) in a throwaway sandbox: the code rewards' executor.

    from grpo.sandbox import run_python
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
RLIMIT_NPROC, RLIMIT_NOFILE, RLIMIT_FSIZE, no core files, RLIMIT_MSGQUEUE = 0); a private temporary working
directory (deleted afterwards); an environment with nothing but PATH, HOME, LANG, MALLOC_ARENA_MAX; the
interpreter in isolated mode (`python -I`: no PYTHON* variables, no user site, no script directory on sys.path);
output caps. The limits are applied by the interpreter itself rather than a `preexec_fn`, which is unsafe in a
multi-threaded parent (the trainer is one).

Backends. Safe by default: without a working bwrap, run_python raises SandboxUnavailable (saying how to install it)
unless an unsafe fallback is asked for by name: `backend=` / GRPO_SANDBOX_BACKEND, or set_sandbox_mode("unsafe_local")
(the config's reward.sandbox), which allows the first of unshare/rlimit that works; a fallback logs a WARNING once
per process. The binaries are resolved to absolute paths once per process (command.tool).

  bwrap    Debian's bubblewrap. New pid, network, ipc, uts (and cgroup) namespaces; a new root that holds only
           /usr (+ the /bin, /lib, ... links), the Python installation and the dynamic loader's /etc files, all
           read-only, a fresh /proc and /dev, and size-capped private tmpfs mounts at /tmp, /dev/shm and /work (the
           working directory), new each run. Host files outside those are invisible. --die-with-parent,
           --new-session, --clearenv; a seccomp filter (seccomp.py: no new user namespaces, no memfd, no System V
           IPC or POSIX message queues, no ptrace); --disable-userns as a normal user when bwrap has it.
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
(RLIMIT_FSIZE, tmpfs size); many files (the parent counts each tmpfs's inodes every 20 ms: MAX_INODES, process.py);
file locks and file notifications as channels between sandboxes (seccomp); reading or writing host files outside the sandbox (not mounted / read-only); network
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
import os
import sys
import threading

from grpo.sandbox.command import tool
from grpo.sandbox.process import BACKENDS, MAX_PROCESSES, STATUSES, SandboxResult, run_in

__all__ = ["SandboxResult", "SandboxUnavailable", "run_python", "available_backends", "default_backend",
           "resolve_backend", "set_sandbox_mode", "sandbox_mode", "BACKENDS", "MODES", "STATUSES"]

logger = logging.getLogger("grpo.rewards")


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
        nothing else (stdin, environment, files) carries them. The code harness reads and closes it (harness.py).
    """
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0, got {timeout!r}")
    if memory_mb < 64:
        raise ValueError(f"memory_mb must be >= 64 (the interpreter needs it), got {memory_mb!r}")
    if max_processes < 1:
        raise ValueError(f"max_processes must be >= 1, got {max_processes!r}")
    named = backend or _env_backend()
    if named is not None and named not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {named!r}; known: {', '.join(BACKENDS)}")
    if named is not None:
        reason = _probe(named)
        if reason:
            return SandboxResult(
                "sandbox_error", "", f"sandbox backend {named!r} does not work here: {reason}", 0.0, None, named
            )
    name = resolve_backend(named)
    return run_in(code, timeout=timeout, memory_mb=memory_mb, stdin=stdin, backend=name, max_processes=max_processes,
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
    named = named or _env_backend()
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


def _env_backend() -> str | None:
    """GRPO_SANDBOX_BACKEND, unless the config named bwrap (reward.sandbox=bwrap): then the config wins, with a
    warning, and bubblewrap it is (an environment variable left over from another job never lowers a config that
    asked for isolation)."""
    env = os.environ.get("GRPO_SANDBOX_BACKEND") or None
    if env is not None and _mode[0] == "bwrap" and env != "bwrap":
        if ("env", env) not in _warned_unsafe:
            _warned_unsafe.add(("env", env))
            logger.warning("GRPO_SANDBOX_BACKEND=%s is ignored: reward.sandbox=bwrap names bubblewrap", env)
        return "bwrap"
    return env


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
    res = run_in("import sys; sys.exit(0)", timeout=20.0, memory_mb=512, stdin=None, backend=backend)
    if res.status != "passed":
        return f"{res.status}: {res.stderr.strip()[-500:]}"
    return ""
