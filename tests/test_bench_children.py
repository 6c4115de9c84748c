"""grpo/bench/children.py: a benchmark owns its children. A SIGTERM to it ends the child's whole process group (a
grandchild such as the async worker included), removes its temporary directory and exits 143 with one line; a
child that fails is named with its own last words."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from grpo.bench.children import BenchRunError, run_failure
from grpo.errors import UserError


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return open(f"/proc/{pid}/status").read().split("State:")[1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def test_sigterm_ends_the_child_its_grandchild_and_the_temporary_directory(tmp_path):
    """Fails if the child is not ended (the bench's own group only), if the grandchild survives (the child killed
    alone, not its group), if the temporary directory is left, or if the exit is not 143 with the one line."""
    pids = tmp_path / "pids"
    temp = tmp_path / "tmp"
    temp.mkdir()
    # the child starts a grandchild that ignores SIGTERM (as a busy worker might) and records both pids
    grandchild = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
    child = (f"import os, subprocess, sys, time; g = subprocess.Popen([sys.executable, '-c', {grandchild!r}]); "
             f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{g.pid}}'); time.sleep(300)")
    bench = (
        "import sys, tempfile\n"
        "from pathlib import Path\n"
        "from grpo.bench import children\n"
        "from grpo.cli import main\n"
        "def body():\n"
        "    with children.owning_signals('grpo bench --test'), tempfile.TemporaryDirectory() as d:\n"
        f"        p = children.spawn([sys.executable, '-c', {child!r}], {{}}, Path(d) / 'log')\n"
        "        with children.owned(p):\n"
        "            p.wait()\n"
        "try:\n"
        "    body()\n"
        "except children.BenchStopped as e:\n"
        "    print('grpo:', e, file=sys.stderr)\n"
        "    sys.exit(e.exit_code)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", bench], env=os.environ | {"TMPDIR": str(temp)},
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (pids.exists() and len(pids.read_text().split()) == 2) and time.monotonic() < deadline:
        time.sleep(0.1)
    child_pid, grandchild_pid = map(int, pids.read_text().split())
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert ("grpo bench --test stopped by SIGTERM: its running child was ended and its temporary directory "
            "removed") in err, err
    time.sleep(0.5)
    assert not _alive(child_pid)
    assert not _alive(grandchild_pid)
    assert list(temp.iterdir()) == []


def test_a_child_that_refused_its_input_is_the_users_error_with_its_own_words():
    out = "loading...\ngrpo: data.path='x.jsonl': no such file\n"
    err = run_failure("grpo bench --memory: the run a", 2, out)
    assert isinstance(err, UserError) and err.exit_code == 2
    assert str(err) == "grpo bench --memory: the run a refused its input: data.path='x.jsonl': no such file"


def test_a_child_that_crashed_is_named_with_its_last_words():
    err = run_failure("grpo bench --memory: the run a", 1, "Traceback ...\nRuntimeError: boom\n")
    assert isinstance(err, BenchRunError) and err.exit_code == 1
    assert str(err).startswith("grpo bench --memory: the run a failed (exit code 1): Traceback")
    assert str(err).endswith("RuntimeError: boom")
    assert str(run_failure("x", -9, "")) == "x failed (exit code -9): (no output)"
