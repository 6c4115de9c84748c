"""Console output: a progress bar (step, reward, accuracy, tokens/s, ETA), the seed-style group print-out,
warnings, and the closing summary. Without a terminal it prints one plain line every few steps instead, and the
summary table as wide as its longest value (a log has no width to wrap to).

An accuracy measured on fewer than SMALL_N problems is printed with its standard error (accuracy_text)."""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from grpo.tracking import progress
from grpo.tracking.progress import Phase, format_duration


SMALL_N = 100  # below this many problems an accuracy's noise is worth printing beside it


def standard_error(accuracy: float, n: int) -> float:
    """The standard error of an accuracy measured on n problems: the binomial sqrt(p (1 - p) / n)."""
    return math.sqrt(accuracy * (1.0 - accuracy) / n) if n > 0 else float("nan")


def accuracy_text(accuracy: float, n: int | None) -> str:
    """'0.389 ± 0.115' on fewer than SMALL_N problems (± one standard error), else '0.560'."""
    if n is None or n >= SMALL_N:
        return f"{accuracy:.3f}"
    return f"{accuracy:.3f} ± {standard_error(accuracy, n):.3f}"


class RunConsole:
    def __init__(self, total_steps: int, enabled: bool = True, console: Console | None = None):
        self.console = console or Console(stderr=False, highlight=False, markup=False)
        self.enabled = enabled
        self.interactive = enabled and self.console.is_terminal
        self.total = total_steps
        self._progress = None
        self._task = None
        self._last_plain = 0.0
        self.val_n: int | None = None  # validation problems: the step line's accuracy gets its standard error
        self._step, self._step_t0 = 0, time.time()  # the last finished step, and when the next one began
        self._phases = 0  # phases running (each prints its own lines in a log)
        self._beat: threading.Thread | None = None
        self._stop_beat = threading.Event()

    def print(self, *args, **kwargs) -> None:
        if self._progress is not None:
            self._progress.console.print(*args, **kwargs)
        else:
            self.console.print(*args, **kwargs)

    def start(self, first_step: int = 0) -> None:
        self._step, self._step_t0 = first_step, time.time()
        if not self.interactive:
            if self.enabled and self._beat is None:  # a log: a line while a long step runs (see _heartbeat)
                self._last_plain = time.time()
                self._beat = threading.Thread(target=self._heartbeat, name="progress: steps", daemon=True)
                self._beat.start()
            return
        self._progress = Progress(
            TextColumn("[bold]{task.description}"), MofNCompleteColumn(), BarColumn(), TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=self.console, transient=False,
        )
        self._task = self._progress.add_task("step", total=self.total, completed=first_step, stats="")
        self._progress.start()

    def update(self, step: int, metrics: dict, accuracy: float | None) -> None:
        acc = accuracy_text(accuracy, self.val_n) if accuracy is not None else "-"
        stats = (f"reward {metrics.get('reward/mean', float('nan')):.3f}  val acc {acc}  "
                 f"{metrics.get('perf/gen_tokens_per_s', 0):.0f} tok/s")
        self._step, self._step_t0 = step, time.time()
        if self._progress is not None:
            self._progress.update(self._task, completed=step, stats=stats)
        elif self.enabled and (time.time() - self._last_plain >= progress.LOG_EVERY_S or step == self.total
                               or "eval/val_accuracy" in metrics):
            self._last_plain = time.time()
            print(f"[grpo] step {step}/{self.total}  {stats}", file=sys.stdout, flush=True)

    def _heartbeat(self) -> None:
        """In a log: when a step runs past progress.LOG_EVERY_S with no line (a large model's step takes minutes),
        say so, unless a phase (an evaluation) is printing its own lines."""
        while not self._stop_beat.wait(progress.LOG_EVERY_S / 4):
            now = time.time()
            if self._phases == 0 and now - self._last_plain >= progress.LOG_EVERY_S and self._step < self.total:
                self._last_plain = now
                print(f"[grpo] step {self._step + 1}/{self.total} running, "
                      f"{format_duration(now - self._step_t0)} into it", file=sys.stdout, flush=True)

    @contextlib.contextmanager
    def phase(self, name: str, total: int | None = None, unit: str = ""):
        """A long phase's progress (grpo.tracking.progress.Phase): a row of the live step bar when it runs, else
        a bar of its own in a terminal, or a line every progress.LOG_EVERY_S seconds in a log."""
        self._phases += 1
        try:
            with Phase(name, total, unit, console=self.console, live=self._progress, enabled=self.enabled,
                       fields={"stats": unit}) as ph:
                yield ph
        finally:
            self._phases -= 1
            self._last_plain = time.time()

    def stop(self) -> None:
        if self._beat is not None:
            self._stop_beat.set()
            self._beat.join()
            self._beat = None
            self._stop_beat.clear()
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def print_group(self, step: int, prompt: str, completions: list[str], rewards: list[float], advantages: list[float],
                    mean: float, std: float) -> None:
        """One group laid out like the seed's worked example (section 3.2)."""
        table = Table(title=f"step {step}: {prompt.strip()!r}", show_lines=False)
        for col in ("i", "completion", "reward r_i", "advantage A_i"):
            table.add_column(col)
        for i, (c, r, a) in enumerate(zip(completions, rewards, advantages), 1):
            table.add_row(str(i), repr(c), f"{r:.2f}", f"{a:+.3f}")
        table.caption = f"mean(r) = {mean:.3f}   std(r) = {std:.3f} (population, formula 4.1)   A_i = (r_i - mean) / std"
        self.print(table)

    def summary(self, summary: dict, run_dir, plot_path) -> None:
        table = Table(title="grpo train: done", show_header=False)
        before, after = summary.get("eval/accuracy_before"), summary.get("eval/accuracy_after")
        n, val_n = summary.get("eval/n"), summary.get("eval/val_n")
        small = n is not None and n < SMALL_N or val_n is not None and 0 < val_n < SMALL_N
        if before is not None and after is not None:
            table.add_row("test accuracy", f"{accuracy_text(before, n)} -> {accuracy_text(after, n)}  "
                                            f"({after - before:+.3f}) on {n} problems")
        if summary.get("eval/best_step") is not None:
            table.add_row("best (validation)", f"step {summary['eval/best_step']}: test "
                          f"{accuracy_text(summary['eval/accuracy_best'], n)}, validation "
                          f"{accuracy_text(summary['eval/val_accuracy_best'], val_n)}"
                          + (f" on {val_n} problems" if val_n is not None and val_n < SMALL_N else ""))
        table.add_row("steps", str(summary.get("steps")))
        from grpo.tracking.clock import breakdown

        parts = breakdown(summary)
        table.add_row("wall time", format_duration(summary.get("wall_s", 0)) + (f" ({parts})" if parts else ""))
        table.add_row("run directory", str(run_dir))
        if plot_path:
            table.add_row("plot", str(plot_path))
        if small:
            table.caption = (f"± one standard error, sqrt(p (1 - p) / n), on fewer than {SMALL_N} problems: "
                             "accuracies closer than about two of them may differ by chance")
        self.print_wide(table)
        if summary.get("memory/planned_peak_mb"):  # the plan printed at start (train/memory_plan.py), measured
            peak, limit = summary["memory/peak_rss_mb"], summary.get("memory/limit_mb")
            self.print(f"[grpo] peak memory {peak / 1024:.1f} GiB (this process and its children; planned "
                       f"{summary['memory/planned_peak_mb'] / 1024:.1f} GiB"
                       + (f" within the {limit / 1024:.1f} GiB limit)" if limit else ")"),
                       markup=False, highlight=False)
            if limit and peak > limit:  # the plan met the limit, the run did not: say so, with what to change
                self.print(f"[grpo] warning: the measured peak, {peak / 1024:.1f} GiB, was over train.memory_limit "
                           f"({limit / 1024:.1f} GiB): the plan undercounted this run; set optim.micro_batch_tokens "
                           "lower (or train.memory_limit lower, for a margin) to keep under it",
                           markup=False, highlight=False)

    def print_wide(self, renderable) -> None:
        """Print `renderable` as wide as it needs when there is no terminal (a log): no value wrapped or cut."""
        if self.console.is_terminal:
            self.print(renderable)
            return
        from rich.measure import Measurement

        width = self.console.width
        need = Measurement.get(self.console, self.console.options.update(width=10_000), renderable).maximum
        self.console.width = max(width, need)
        try:
            self.print(renderable)
        finally:
            self.console.width = width
