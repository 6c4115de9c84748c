"""Process memory: the one place that reads the resident-set peak (training metrics, `grpo bench`, `grpo compare`).

peak_rss_mb() is the high-water mark of this process's resident memory (VmHWM on Linux, else ru_maxrss), in MiB.
peak_rss_tree_mb() adds the peaks of the live child processes (the async rollout worker, reward children): an upper
bound of the process tree's peak, since the peaks need not coincide.
reset_peak_rss() restarts that mark (Linux: /proc/self/clear_refs), after returning freed heap to the system, so a
benchmark can measure one section of a process rather than everything before it.
"""

from __future__ import annotations

import ctypes
import gc
import resource

__all__ = ["peak_rss_mb", "peak_rss_tree_mb", "reset_peak_rss"]


def peak_rss_mb() -> float:
    """The process's resident-memory peak since start or the last reset_peak_rss(), in MiB."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB (macOS bytes: not here)


def peak_rss_tree_mb() -> float:
    """This process's peak plus each live descendant's own peak (VmHWM), in MiB."""
    total = peak_rss_mb()
    try:
        import psutil

        children = psutil.Process().children(recursive=True)
    except Exception:  # noqa: BLE001 - psutil missing or /proc unreadable: this process alone
        return total
    for child in children:
        try:
            with open(f"/proc/{child.pid}/status") as f:
                total += next((int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:")), 0.0)
        except (OSError, ValueError):
            continue  # it ended meanwhile
    return total


def reset_peak_rss() -> None:
    """Return freed heap to the system (so the mark is the next section's, not an earlier one's), then reset it."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
