"""Progress of a long phase (the warm-up, an evaluation, the preflight): a bar with an ETA in a terminal, and in a
log (no terminal) one plain line every LOG_EVERY_S seconds, so no phase runs in silence for longer: a heartbeat
thread prints the line when no update came in that time (an evaluation batch or a preflight batch of a large model
takes minutes between updates).

    with Phase("evaluating", total=500, unit="problems", console=console) as ph:
        for batch in ...:
            ...
            ph.update(done)
    ph.elapsed   # seconds the phase took

In a terminal, a phase joins the live step bar when one is running (rich allows one live display at a time),
else it shows a bar of its own that disappears when the phase ends.
"""

from __future__ import annotations

import threading
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


LOG_EVERY_S = 10.0  # in a log: a phase's line at least this often, and no more often


def format_duration(seconds: float) -> str:
    """'4.2 s', '42 s', '2 min 05 s', '1 h 02 min'."""
    if seconds < 9.95:
        return f"{max(seconds, 0.0):.1f} s"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def eta_seconds(elapsed: float, done: float, total: float | None) -> float | None:
    """Time left at the pace so far: elapsed / done * (total - done); None before any progress or without a total."""
    if not total or done <= 0:
        return None
    return elapsed / done * max(total - done, 0)


class Phase:
    """One phase's progress; `console` None or `enabled` False: silent (the timing still works)."""

    def __init__(self, name: str, total: int | None = None, unit: str = "", *, console: Console | None = None,
                 live: Progress | None = None, enabled: bool = True, every_s: float | None = None,
                 clock=time.monotonic, fields: dict | None = None):
        self.name, self.total, self.unit, self.clock = name, total, unit, clock
        self.every_s = LOG_EVERY_S if every_s is None else every_s
        self.fields = fields or {}  # extra task fields the live bar's columns read
        self.console = console if enabled else None
        self.live = live if self.console is not None else None
        self.done, self.elapsed = 0, 0.0
        self._own: Progress | None = None
        self._task = None
        self._lock = threading.Lock()  # the heartbeat and update() print and read _last from two threads
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    @property
    def interactive(self) -> bool:
        return self.console is not None and (self.live is not None or self.console.is_terminal)

    def __enter__(self) -> Phase:
        self.t0 = self._last = self.clock()
        if self.interactive:
            bar = self.live
            if bar is None:
                bar = self._own = Progress(
                    TextColumn("{task.description}"), MofNCompleteColumn(), BarColumn(), TimeElapsedColumn(),
                    TextColumn("eta"), TimeRemainingColumn(), console=self.console, transient=True)
                bar.start()
            self._task = bar.add_task(self.name, total=self.total, completed=0, **self.fields)
        elif self.console is not None:  # a log: the heartbeat speaks when update() has not for every_s
            self._info = ""
            self._beat = threading.Thread(target=self._heartbeat, name=f"progress: {self.name}", daemon=True)
            self._beat.start()
        return self

    def _heartbeat(self) -> None:
        """In a log: print the phase's line whenever every_s passed without one (between two slow updates)."""
        while not self._stop.wait(self.every_s / 4):
            with self._lock:
                now = self.clock()
                if now - self._last >= self.every_s:
                    self._print_line(now)

    def _print_line(self, now: float) -> None:
        self._last = now
        self.console.print(self.line(now - self.t0, self._info), soft_wrap=True, markup=False, highlight=False)

    def update(self, done: int, total: int | None = None, info: str = "") -> None:
        """`done` units of `total` (the total given at the start when None) are finished."""
        self.done, self.total = done, total if total is not None else self.total
        now = self.clock()
        if self._task is not None:
            bar = self._own or self.live
            bar.update(self._task, completed=done, total=self.total,
                       description=f"{self.name} {info}".rstrip())
        elif self.console is not None:
            with self._lock:
                self._info = info
                if now - self._last >= self.every_s:
                    self._print_line(now)

    def line(self, elapsed: float, info: str = "") -> str:
        """'[grpo] warm-up: 300/1000 steps (30%), 1 min 02 s elapsed, eta 2 min 25 s, loss 0.41'."""
        part = f"{self.done}/{self.total} {self.unit}".rstrip() if self.total else f"{self.done} {self.unit}".rstrip()
        if self.total:
            part += f" ({self.done / self.total:.0%})"
        elif not self.done:  # a phase without a count (loading a model): its time alone
            part = ""
        eta = eta_seconds(elapsed, self.done, self.total)
        text = f"[grpo] {self.name}: {part + ', ' if part else ''}{format_duration(elapsed)} elapsed"
        if eta is not None and self.done < (self.total or 0):
            text += f", eta {format_duration(eta)}"
        return text + (f", {info}" if info else "")

    def __exit__(self, *exc) -> None:
        if self._beat is not None:
            self._stop.set()
            self._beat.join()
        self.elapsed = self.clock() - self.t0
        if self._task is not None:
            bar = self._own or self.live
            bar.remove_task(self._task)
            if self._own is not None:
                self._own.stop()
        elif self.console is not None and self.elapsed >= self.every_s and exc[0] is None:
            self.console.print(f"[grpo] {self.name}: done in {format_duration(self.elapsed)}", soft_wrap=True, markup=False,
                               highlight=False)
