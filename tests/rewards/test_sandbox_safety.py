"""The sandbox is safe by default: refusal without bubblewrap, no user namespaces, bounded shared memory, a binary
resolved once, cleanup that never raises, a writable area per run, and training that survives any program."""

from __future__ import annotations

import functools
import logging
import os
import time
import types

import pytest

from grpo.sandbox import cleanup, run as sandbox
from grpo.rewards import RewardRunner, code_exec
from grpo.sandbox import command as _sandbox_cmd, seccomp as _seccomp
from grpo.rewards.code_exec import code_tests, prepare_code_rewards
from grpo.sandbox import SandboxUnavailable, run_python
from grpo.types import Prompt

HAVE_BWRAP = "bwrap" in sandbox.available_backends()
needs_bwrap = pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap does not work here")
FALLBACK = next((b for b in ("unshare", "rlimit") if b in sandbox.available_backends()), None)
TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]
HONEST = "```python\ndef add(a, b):\n    return a + b\n```"


@pytest.fixture
def no_bwrap(monkeypatch):
    """This machine as if bubblewrap were missing (the probe says so); the fallbacks still work."""
    real = sandbox._probe
    monkeypatch.setattr(sandbox, "_probe", lambda b: "`bwrap` not found on PATH" if b == "bwrap" else real(b))
    monkeypatch.setattr(sandbox, "_mode", ["auto"])
    monkeypatch.setattr(sandbox, "_warned_unsafe", set())
    monkeypatch.delenv("GRPO_SANDBOX_BACKEND", raising=False)


# --- refusal without bubblewrap --------------------------------------------------------------------------------


def test_without_bwrap_run_python_and_code_tests_refuse(no_bwrap):
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        run_python("print(1)")
    with pytest.raises(SandboxUnavailable, match="reward.sandbox=unsafe_local"):
        code_tests(None, [HONEST], [TESTS])
    sandbox.set_sandbox_mode("bwrap")
    with pytest.raises(SandboxUnavailable):
        run_python("print(1)")


@pytest.mark.skipif(FALLBACK is None, reason="no fallback backend works here")
def test_unsafe_fallback_runs_only_when_named_and_warns(no_bwrap, caplog, monkeypatch, no_leak):
    caplog.set_level(logging.WARNING, logger="grpo.rewards")
    sandbox.set_sandbox_mode("unsafe_local")
    res = run_python("print(1)")
    assert res.status == "passed" and res.backend in ("unshare", "rlimit")
    assert "WITHOUT filesystem isolation" in caplog.text
    assert list(code_tests(None, [HONEST], [TESTS])) == [1.0]
    sandbox.set_sandbox_mode("auto")
    caplog.clear()
    monkeypatch.setattr(sandbox, "_warned_unsafe", set())
    assert run_python("print(1)", backend="rlimit").status == "passed"  # named by argument
    assert "'rlimit'" in caplog.text and "WITHOUT filesystem isolation" in caplog.text
    assert list(code_tests(None, [HONEST], [TESTS], backend="rlimit")) == [1.0]
    with pytest.raises(ValueError, match="reward.sandbox must be one of"):
        sandbox.set_sandbox_mode("docker")


def test_training_start_refuses_and_names_unverifiable_rows(no_bwrap, caplog):
    rows = [Prompt(uid="a", text="p", meta={"tests": TESTS}),
            Prompt(uid="b", text="p", meta={"tests": ["x = add(1, 2)\nassert x == 3"]})]
    specs = [("tests", code_exec.code_tests, 1.0)]
    with pytest.raises(SandboxUnavailable):
        prepare_code_rewards(specs, rows, "auto")
    prepare_code_rewards([("other", lambda prompts, completions: [0.0], 1.0)], rows, "auto")  # no code reward
    caplog.set_level(logging.WARNING, logger="grpo.rewards")
    prepare_code_rewards(specs, rows, "unsafe_local")
    assert "1 of 2 training rows" in caplog.text and "1 (b)" in caplog.text


# --- bubblewrap: namespaces, memory, binary --------------------------------------------------------------------

SYSCALLS = """\
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def err(rc):
    return 0 if rc == 0 else ctypes.get_errno()
out = {}
out["unshare_user"] = err(libc.unshare(0x10000000))
out["clone3"] = err(libc.syscall(435, None, 0))
try:
    os.memfd_create("x")
    out["memfd"] = 0
except OSError as e:
    out["memfd"] = e.errno
shm = libc.shmget(0, 1 << 20, 0o1600)
out["shmget"] = 0 if shm >= 0 else ctypes.get_errno()
st = os.statvfs("/dev/shm")
out["shm_bytes"] = st.f_blocks * st.f_frsize
print(out)
"""


@needs_bwrap
def test_bwrap_denies_user_namespaces_and_unbounded_shared_memory(no_leak):
    res = run_python(SYSCALLS, backend="bwrap")
    assert res.status == "passed", res.stderr
    got = eval(res.stdout)  # our own program's dict of ints
    assert got["unshare_user"] == 1 and got["clone3"] == 38  # EPERM; ENOSYS (libc falls back to clone)
    assert got["memfd"] == 1 and got["shmget"] == 1
    assert got["shm_bytes"] <= _sandbox_cmd.TMPFS_BYTES


@needs_bwrap
def test_bwrap_dev_shm_fills_up_at_its_cap(no_leak):
    code = ("import os\nn = 0\ntry:\n    for i in range(40):\n        with open('/dev/shm/f%d' % i, 'wb') as f:\n"
            "            f.write(b'x' * (8 << 20))\n        n += 8\nexcept OSError as e:\n    print(n, e.errno)\n")
    res = run_python(code, backend="bwrap", memory_mb=512)
    written, errno_ = res.stdout.split()
    assert int(written) <= _sandbox_cmd.TMPFS_BYTES >> 20 and errno_ == "28"  # ENOSPC


# Round three's probe: a program capped at 256 MB held 160 MB of semaphore sets and 160 MB of queued messages
# (kernel memory that no rlimit counts). Each semget asks for a set of 32000 semaphores (~64 bytes each in the
# kernel); each message is 8 KiB. The program stops at 160 MB of each or at the first refusal.
IPC = """\
import ctypes, multiprocessing, os
libc = ctypes.CDLL(None, use_errno=True)
CREATE = 0o1000 | 0o600  # IPC_CREAT
class Msg(ctypes.Structure):
    _fields_ = [("mtype", ctypes.c_long), ("mtext", ctypes.c_char * 8192)]
out = {"sem_bytes": 0, "msg_bytes": 0}
while out["sem_bytes"] < 160 << 20:
    if libc.semget(0, 32000, CREATE) < 0:
        out["sem_errno"] = ctypes.get_errno()
        break
    out["sem_bytes"] += 32000 * 64
m = Msg(1, b"x" * 8192)
while out["msg_bytes"] < 160 << 20:
    q = libc.msgget(0, CREATE)
    if q < 0 or libc.msgsnd(q, ctypes.byref(m), 8192, 0o4000) < 0 or libc.msgsnd(q, ctypes.byref(m), 8192, 0o4000) < 0:
        out["msg_errno"] = ctypes.get_errno()
        break
    out["msg_bytes"] += 2 * 8192
fd = libc.syscall(240 if os.uname().machine == "x86_64" else 180, b"q", os.O_CREAT | os.O_RDWR, 0o600, None)
out["mq_errno"] = ctypes.get_errno() if fd < 0 else 0
lock = multiprocessing.Lock()  # POSIX semaphores live in /dev/shm (capped): honest programs keep them
with lock:
    out["lock"] = True
print(out)
"""


@needs_bwrap
def test_bwrap_denies_system_v_ipc_and_posix_message_queues(no_leak):
    """Before: {'sem_bytes': 167936000, 'msg_bytes': 167772160, 'mq_errno': 0} under memory_mb=256."""
    res = run_python(IPC, backend="bwrap", memory_mb=256, timeout=30)
    assert res.status == "passed", res.stderr
    got = eval(res.stdout)  # our own program's dict
    assert got["sem_bytes"] == 0 and got["sem_errno"] == 1  # EPERM at the first set
    assert got["msg_bytes"] == 0 and got["msg_errno"] == 1
    assert got["mq_errno"] == 1 and got["lock"] is True


@pytest.mark.skipif(FALLBACK is None, reason="no fallback backend works here")
def test_fallbacks_hold_no_posix_message_queue_bytes(no_leak):
    """Without seccomp (unshare, rlimit) RLIMIT_MSGQUEUE = 0 refuses a queue's bytes: EMFILE (before: a queue)."""
    mq = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
          "fd = libc.syscall(240 if os.uname().machine == 'x86_64' else 180, b'q', os.O_CREAT | os.O_RDWR, 0o600, None)"
          "\nprint(ctypes.get_errno() if fd < 0 else 0)\n")
    res = run_python(mq, backend=FALLBACK)
    assert res.status == "passed" and res.stdout.strip() == "24", (res.stdout, res.stderr)


def test_bwrap_command_line_as_root_and_as_a_user(tmp_path, monkeypatch):
    """As a user bwrap makes the user namespace itself: --disable-userns closes it to the program (when this bwrap
    has the flag); as root there is no user namespace and the seccomp filter does that job. Both load the filter."""
    (tmp_path / "main.py").write_text("pass")
    monkeypatch.setattr(_sandbox_cmd, "bwrap_disables_userns", lambda: True)
    for euid, userns in ((0, False), (1000, True)):
        monkeypatch.setattr(_sandbox_cmd.os, "geteuid", lambda euid=euid: euid)
        cmd = _sandbox_cmd.command("bwrap", str(tmp_path), "pass", 0, seccomp_fd=7)
        head = cmd[:cmd.index("--")]
        assert ("--disable-userns" in head) == userns and ("--unshare-all" in head) == userns
        assert head[head.index("--seccomp") + 1] == "7"
        assert head[head.index("/dev/shm") - 3:head.index("/dev/shm")] == ["--size", str(_sandbox_cmd.TMPFS_BYTES),
                                                                          "--tmpfs"]


def test_seccomp_filter_is_known_for_x86_64_and_aarch64_only():
    for m in ("x86_64", "aarch64"):
        prog = _seccomp.build(m)
        assert prog is not None and len(prog) % 8 == 0 and 20 < len(prog) // 8 < 4096
    assert _seccomp.build("sparc64") is None


@needs_bwrap
def test_bwrap_is_resolved_to_an_absolute_path_once(tmp_path, monkeypatch):
    first = _sandbox_cmd.command("bwrap", str(tmp_path), "pass", 0)[0]
    assert os.path.isabs(first) and os.path.basename(first) == "bwrap"
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    assert _sandbox_cmd.command("bwrap", str(tmp_path), "pass", 0)[0] == first != str(fake)


@needs_bwrap
def test_each_run_has_its_own_writable_area(no_leak):
    write = "import os\nfor d in ('/tmp', '/dev/shm', '.'):\n    open(os.path.join(d, 'mine'), 'w').write('x')\n"
    look = "import os\nprint([d for d in ('/tmp', '/dev/shm', '.') if os.path.exists(os.path.join(d, 'mine'))])"
    assert run_python(write, backend="bwrap").status == "passed"
    assert run_python(look, backend="bwrap").stdout.strip() == "[]"


# --- cleanup -----------------------------------------------------------------------------------------------------

DEEP = "import os\nfor _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\nraise SystemExit(1)\n"


def _deep_tree(root: str, depth: int) -> None:
    fd = os.open(root, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(fd)


def _depth(root) -> int:
    """How many directories deep the tree under root goes, following its one subdirectory at each level, whatever
    its name (remove_tree renames the ones it meets); fd-relative: the path is far past PATH_MAX."""
    depth, fd = 0, os.open(root, os.O_RDONLY)
    try:
        while subdirs := [e.name for e in os.scandir(fd) if e.is_dir(follow_symlinks=False)]:
            (name,) = subdirs
            nxt = os.open(name, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd, depth = nxt, depth + 1
        return depth
    finally:
        os.close(fd)


def test_remove_tree_is_iterative_and_bounded(tmp_path, monkeypatch):
    deep = tmp_path / "deep"
    deep.mkdir()
    _deep_tree(str(deep), 3000)  # paths far beyond PATH_MAX: only fd-relative calls can reach the bottom
    assert _depth(deep) == 3000
    # Bounded: the deadline stops it part-way. A clock that moves one second a reading (not the wall clock, which a
    # busy machine stretches) reaches the deadline after 50 directories; the tree is still there, 50 shallower.
    ticks = iter(range(10**6))
    monkeypatch.setattr(cleanup, "time", types.SimpleNamespace(monotonic=lambda: float(next(ticks))))
    assert cleanup.remove_tree(str(deep), 50.0, log=False) is False
    monkeypatch.undo()
    assert deep.exists() and _depth(deep) == 3000 - 50
    # Iterative: with time enough, all of it goes (a recursive walk would stop at Python's recursion limit, and
    # remove_tree never raises, so only the tree left behind would tell).
    shallow = tmp_path / "shallow"
    (shallow / "a" / "b").mkdir(parents=True)
    (shallow / "a" / "b" / "f").write_text("x")
    os.symlink("/etc/hostname", shallow / "a" / "link")
    assert cleanup.remove_tree(str(shallow), time.monotonic() + 30) and not shallow.exists()
    assert os.path.exists("/etc/hostname")
    assert cleanup.remove_tree(str(deep), time.monotonic() + 120) and not deep.exists()


@pytest.mark.skipif(FALLBACK is None, reason="no fallback backend works here")
def test_a_3000_deep_tree_is_the_programs_failure_not_an_exception(no_leak):
    """Under a fallback the tree is on the host; three such programs in a batch do not stop training."""
    deep = f"```python\n{DEEP}```"
    fn = functools.partial(code_exec.code_tests, backend=FALLBACK, timeout=10.0)
    with RewardRunner([("code", fn, 1.0, {"in_process": True})], timeout_s=60.0) as runner:
        t0 = time.monotonic()
        res = runner(["p"] * 4, [deep, HONEST, deep, deep], {"tests": [TESTS] * 4})
    assert res.per_function["code"].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert not res.missing.any()
    assert time.monotonic() - t0 < 4 * (10.0 + 5.0)
    r = run_python(DEEP, backend=FALLBACK, timeout=5.0)
    assert r.status == "failed"
