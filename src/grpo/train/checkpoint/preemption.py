"""Graceful preemption: turn SIGTERM/SIGINT into a flag the training loop checks between steps.

Cluster schedulers (SLURM, Kubernetes, spot instances) send SIGTERM some seconds before they kill a job. Under
`PreemptionGuard` the signal no longer kills the process: it sets `guard.requested`, and the loop finishes the
current step, saves a committed checkpoint, prints how to resume and exits 128 + the signal's number (130 for
SIGINT, 143 for SIGTERM: the run is not finished; `grpo.train.loop` raises `grpo.errors.Preempted`, which the
`grpo` command turns into that code):

    with PreemptionGuard() as guard:
        for step in range(start, total):
            trainer.step()
            if guard.requested:
                path = save_checkpoint(run_dir, step, ...)
                print(f"stopped by {guard.signal_name}; resume with: grpo train ... --resume")
                sys.exit(128 + signal.Signals[guard.signal_name])

A second Ctrl-C (SIGINT) while a stop is already requested raises KeyboardInterrupt at once: the user really
wants out. Signal handlers can only be installed from the main thread; elsewhere the guard is a no-op
(`guard.active` is False) and never sets the flag by itself.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Any

__all__ = ["PreemptionGuard"]


class PreemptionGuard:
    """Context manager: SIGTERM/SIGINT set `requested` (and `signal_name`) instead of stopping the process.

    The previous handlers are restored on exit, also when the block raises. Guards nest: the inner guard
    restores the outer guard's handlers.
    """

    def __init__(self, signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
        self.signals = tuple(signals)
        self.requested = False
        self.signal_name: str | None = None
        self.active = False
        self._previous: dict[signal.Signals, Any] = {}

    def request(self, reason: str) -> None:
        """Ask for a stop without a signal (e.g. a wall-clock limit); `signal_name` becomes `reason`."""
        if not self.requested:
            self.requested, self.signal_name = True, reason

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt(f"second interrupt ({name}) after {self.signal_name}")
        first = not self.requested
        self.request(name)
        # print() / logging are not reentrant-safe inside a signal handler; write to fd 2 directly.
        msg = (f"\n[grpo] received {name}: saving a checkpoint and stopping after the current step "
               f"(press Ctrl-C again to abort now)\n" if first else
               f"\n[grpo] received {name} again: already stopping after the current step\n")
        try:
            os.write(2, msg.encode())
        except OSError:
            pass

    def __enter__(self) -> PreemptionGuard:
        if threading.current_thread() is not threading.main_thread():
            return self
        try:
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        except BaseException:
            self._restore()
            raise
        self.active = True
        return self

    def _restore(self) -> None:
        for sig, prev in self._previous.items():
            # None means "installed outside Python"; the default action is the closest we can restore.
            signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
        self._previous.clear()
        self.active = False

    def __exit__(self, *exc: object) -> None:
        self._restore()
