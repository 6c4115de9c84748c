"""PreemptionGuard: SIGTERM/SIGINT become a flag; a loop under the guard saves a checkpoint and exits 128 + the
signal's number (143 for SIGTERM), so a scheduler or `&&` sees an unfinished run.

RELIABILITY.md section 9, case 24, and section 10, test 9.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import grpo
from grpo.train.checkpoint import latest_checkpoint, load_checkpoint
from grpo.train.checkpoint.preemption import PreemptionGuard

SRC = str(Path(grpo.__file__).resolve().parents[1])


def wait_for(predicate, timeout: float = 5.0) -> bool:
    """Python runs signal handlers between bytecodes of the main thread; give it a moment."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def test_sigterm_sets_flag_and_handler_is_restored():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with PreemptionGuard() as guard:
        assert guard.active and not guard.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert wait_for(lambda: guard.requested)  # and we are still alive
        assert guard.signal_name == "SIGTERM"
        os.kill(os.getpid(), signal.SIGTERM)  # a second SIGTERM does not raise
        time.sleep(0.01)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    assert not guard.active


def test_second_sigint_raises_keyboard_interrupt():
    with PreemptionGuard() as guard:
        os.kill(os.getpid(), signal.SIGINT)
        assert wait_for(lambda: guard.requested) and guard.signal_name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            wait_for(lambda: False, timeout=5.0)


def test_handlers_restored_when_block_raises_and_guards_nest():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(RuntimeError):
        with PreemptionGuard() as outer:
            with PreemptionGuard() as inner:
                assert signal.getsignal(signal.SIGTERM) == inner._handle
            assert signal.getsignal(signal.SIGTERM) == outer._handle
            raise RuntimeError("boom")
    assert signal.getsignal(signal.SIGTERM) == before


def test_request_without_signal():
    with PreemptionGuard() as guard:
        guard.request("wall-clock limit")
        guard.request("second reason is ignored")
    assert guard.requested and guard.signal_name == "wall-clock limit"


def test_noop_outside_main_thread():
    before = signal.getsignal(signal.SIGTERM)
    result = {}

    def body():
        with PreemptionGuard() as guard:
            result["active"] = guard.active
            result["handler"] = signal.getsignal(signal.SIGTERM)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert result == {"active": False, "handler": before}


LOOP_SCRIPT = textwrap.dedent("""
    import signal, sys, time, torch
    from grpo.train.checkpoint import save_checkpoint
    from grpo.train.checkpoint.preemption import PreemptionGuard

    run_dir = sys.argv[1]
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with PreemptionGuard() as guard:
        for step in range(1, 100000):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward(); opt.step(); opt.zero_grad()
            if step == 1:
                print("ready", flush=True)
            time.sleep(0.005)
            if guard.requested:
                path = save_checkpoint(run_dir, step, model=model, optimizers={"policy": opt}, schedulers={},
                                       trainer_state={"step": step})
                print(f"stopped by {guard.signal_name} at step {step}; resume from {path}", flush=True)
                sys.exit(128 + signal.Signals[guard.signal_name])
    sys.exit(3)
""")


def test_sigterm_in_a_training_loop_saves_and_exits_143(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(LOOP_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, out + err
    assert "stopped by SIGTERM" in out and "received SIGTERM" in err
    path = latest_checkpoint(tmp_path)
    assert path is not None and f"resume from {path}" in out
    step = load_checkpoint(path).trainer_state["step"]
    assert step >= 1 and f"at step {step};" in out
