"""How each sandbox backend starts a program: the bwrap/unshare/setpriv command lines (see run.py)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading

__all__ = ["command", "sandbox_env", "tool", "bwrap_disables_userns", "TMPFS_BYTES"]

logger = logging.getLogger("grpo.rewards")

TMPFS_BYTES = 64 * 1024 * 1024  # size of each tmpfs (/work, /tmp, /dev/shm) under bwrap
_SETPRIV_DROP = ["--clear-groups", "--no-new-privs", "--inh-caps=-all"]
_CAP_DAC_READ_SEARCH = 2


_tools: dict[str, str | None] = {}
_tools_lock = threading.Lock()


def tool(name: str) -> str | None:
    """The absolute path of `name` (bwrap, unshare, setpriv), looked up on PATH once per process and then kept:
    a later change of PATH (or of the working directory) cannot swap the binary the sandbox runs."""
    with _tools_lock:
        if name not in _tools:
            found = shutil.which(name)
            _tools[name] = os.path.realpath(found) if found else None
        return _tools[name]


_userns_flag: list[bool] = []


def bwrap_disables_userns() -> bool:
    """True if this bwrap has --disable-userns (bubblewrap >= 0.8), read once from `bwrap --help`."""
    if not _userns_flag:
        path, ok = tool("bwrap"), False
        if path:
            try:
                ok = "--disable-userns" in subprocess.run([path, "--help"], capture_output=True, text=True,
                                                          timeout=10).stdout
            except (OSError, subprocess.SubprocessError):
                ok = False
        _userns_flag.append(ok)
    return _userns_flag[0]


def _python_roots() -> list[str]:
    """Directories the interpreter needs that are not under /usr (venv, pyenv, conda installs)."""
    exe = os.path.realpath(sys.executable)
    cands = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, os.path.dirname(os.path.dirname(exe))}
    cands |= {os.path.dirname(os.path.dirname(os.path.abspath(sys.executable)))}
    roots = sorted({os.path.realpath(c) for c in cands if c} | {os.path.abspath(c) for c in cands if c})
    keep: list[str] = []
    for r in roots:
        if r in ("/", "/usr") or r.startswith("/usr/") or not os.path.isdir(r):
            continue
        if any(r == k or r.startswith(k + "/") for k in keep):
            continue
        keep.append(r)
    return keep


def _bwrap_args(workdir: str, seccomp_fd: int | None) -> list[str]:
    root = os.geteuid() == 0
    ns = (
        ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
        if root
        else ["--unshare-all", *(["--disable-userns"] if bwrap_disables_userns() else [])]
    )
    args = [tool("bwrap") or "bwrap", *ns, "--die-with-parent", "--new-session", "--clearenv"]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    for k, v in sandbox_env("/work", None).items():
        args += ["--setenv", k, v]
    args += ["--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
    for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    args += ["--perms", "0755", "--dir", "/etc"]  # (bwrap would create it 0700: the loader could not read its cache)
    for f in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime"):
        args += ["--ro-bind-try", f, f]
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--perms", "1777", "--size", str(TMPFS_BYTES), "--tmpfs", "/dev/shm"]  # else /dev's unbounded tmpfs
    args += ["--perms", "1777", "--size", str(TMPFS_BYTES), "--tmpfs", "/tmp"]
    args += ["--perms", "0777", "--size", str(TMPFS_BYTES), "--tmpfs", "/work"]
    args += ["--ro-bind", os.path.join(workdir, "main.py"), "/work/main.py"]
    made: set[str] = set()
    for r in _python_roots():
        parts = r.strip("/").split("/")
        for i in range(1, len(parts)):  # traversable parents even where the host's are 0700 (/root)
            d = "/" + "/".join(parts[:i])
            if d not in made:
                args += ["--perms", "0755", "--dir", d]
                made.add(d)
        args += ["--ro-bind", r, r]
    return args + ["--chdir", "/work", "--"]


def sandbox_env(home: str, token: str | None) -> dict[str, str]:
    # MALLOC_ARENA_MAX: glibc reserves 64 MiB of address space per thread arena, which RLIMIT_AS would count.
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8", "MALLOC_ARENA_MAX": "2"}
    env["GRPO_SANDBOX"] = "1"
    if token:
        env["GRPO_SANDBOX_TOKEN"] = token
    return env


def _exe_readable_by_others() -> bool:
    """True if every directory above the interpreter is searchable and the files readable by any user."""
    for path in {os.path.realpath(sys.executable), os.path.abspath(sys.executable), *_python_roots()}:
        p = path
        while p not in ("/", ""):
            try:
                mode = os.stat(p).st_mode
            except OSError:
                return False
            if os.path.isdir(p) and not mode & 0o001 or not os.path.isdir(p) and not mode & 0o004:
                return False
            p = os.path.dirname(p)
    return True


def _have_cap(bit: int) -> bool:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> bit & 1)
    except OSError:
        pass
    return False


def _drop_uid(uid: int, *, inside_bwrap: bool) -> list[str]:
    """setpriv prefix that runs the program as `uid` (only when we are root), or [] when no drop is possible."""
    setpriv = tool("setpriv")
    if os.geteuid() != 0 or not setpriv:
        if os.geteuid() == 0:
            _warn_once("nosetpriv", "`setpriv` not found: sandboxed code runs as root, RLIMIT_NPROC is not enforced")
        return []
    ids = [f"--reuid={uid}", f"--regid={uid}"]
    if inside_bwrap or _exe_readable_by_others():
        return [setpriv, *ids, *_SETPRIV_DROP, "--bounding-set=-all", "--"]
    if _have_cap(_CAP_DAC_READ_SEARCH):
        keep = "+dac_read_search"
        return [
            setpriv,
            *ids,
            "--clear-groups",
            "--no-new-privs",
            f"--inh-caps=-all,{keep}",
            f"--ambient-caps={keep}",
            "--bounding-set=-all,+dac_read_search",
            "--",
        ]
    _warn_once("noread", "the Python installation is not readable by other users: sandboxed code runs as root")
    return []


_warned: set[str] = set()


def _warn_once(key: str, msg: str) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(msg)


def command(backend: str, workdir: str, boot: str, uid: int, site_packages: bool = True,
            seccomp_fd: int | None = None) -> list[str]:
    """The command line that runs `boot` under `backend`. seccomp_fd: an open fd holding a filter (bwrap only)."""
    py = [sys.executable, "-I", *([] if site_packages else ["-S"]), "-c", boot]
    if backend == "bwrap":
        return [*_bwrap_args(workdir, seccomp_fd), *_drop_uid(uid, inside_bwrap=True), *py]
    pdeath = [tool("setpriv"), "--pdeathsig", "KILL", "--"] if tool("setpriv") else []
    drop = _drop_uid(uid, inside_bwrap=False)
    if backend == "unshare":
        user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
        ns = [tool("unshare") or "unshare", "--fork", "--kill-child", "--pid", "--mount-proc", "--net", "--ipc",
              "--uts", *user, "--"]
        return [*pdeath, *ns, *drop, *py]
    return [drop[0], "--pdeathsig", "KILL", *drop[1:], *py] if drop else [*pdeath, *py]
