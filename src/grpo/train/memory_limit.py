"""How much memory a run may use: train.memory_limit, a number of GiB or `auto`, resolved once before the model loads.

    limit = memory_limit(cfg, device)    MemoryLimit(bytes, how): the plan (train/memory_plan.py) fits the run in it

auto is what this process can have at start, less a margin: the memory available now (the machine's MemAvailable,
or its cgroup's room when a cgroup limit is lower: a container's memory.max), plus what this process already holds,
less AUTO_MARGIN of it (at least AUTO_MARGIN_MIN): room for what the plan does not count (the C library's heap
fragments, a reward's child process, the page cache of the files read). On CUDA: the GPU's free memory, less the same.

A number is the user's: a limit larger than what the machine has available is kept to what it has (said in the
note); the plan refuses a limit that the run cannot meet, naming the settings that would fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["AUTO_MARGIN", "AUTO_MARGIN_MIN", "MemoryLimit", "available_memory", "cgroup_room", "memory_limit",
           "process_rss"]

AUTO_MARGIN = 0.10  # of the memory available at start, kept free under train.memory_limit=auto
AUTO_MARGIN_MIN = 2**30  # at least 1 GiB
GIB = 2**30


@dataclass(frozen=True)
class MemoryLimit:
    bytes: int | None  # None: no limit set and the machine's memory unknown
    how: str  # how it was set, for the plan's line: "train.memory_limit=11.0", "auto: 21.9 GiB available less 2.2"
    where: str = "memory"  # "memory" (RAM) or "GPU memory"
    available: int | None = None  # what this process could have at start (bytes), None when unknown

    def gib(self) -> str:
        return "no limit" if self.bytes is None else f"{self.bytes / GIB:.1f} GiB"


def process_rss() -> int:
    """This process's resident memory now, bytes (0 when unknown)."""
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except Exception:  # noqa: BLE001 - a plan without its runtime part is still a plan
        return 0


def cgroup_room(proc_cgroup: str | Path = "/proc/self/cgroup", root: str | Path = "/sys/fs/cgroup") -> int | None:
    """Bytes this process's cgroup can still grant: its memory limit less what it uses (less the inactive page cache,
    which the kernel reclaims first), the smallest over the cgroup and its ancestors; None without a limit (or where
    it cannot be read). cgroup v2 (memory.max, memory.current, memory.stat's inactive_file) and v1 (memory.limit_in_bytes,
    memory.usage_in_bytes, total_inactive_file). The paths are parameters for tests."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    root = Path(root)
    found = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # v2
            base, files = root, ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):  # v1
            base, files = root / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        rel = Path(path.lstrip("/"))
        for d in [base / rel, *[base / p for p in rel.parents]]:  # the cgroup, then each ancestor up to the root
            room = _room(d, *files)
            if room is not None:
                found.append(room)
    return min(found) if found else None


def _room(d: Path, limit_file: str, usage_file: str, inactive_key: str) -> int | None:
    try:
        raw = (d / limit_file).read_text().strip()
        usage = int((d / usage_file).read_text().strip())
    except (OSError, ValueError):
        return None
    if raw == "max" or not raw.isdigit() or int(raw) >= 2**60:  # no limit ("max"; v1 writes a huge number)
        return None
    inactive = 0
    try:
        for line in (d / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == inactive_key:
                inactive = int(value)
    except (OSError, ValueError):
        pass
    return max(int(raw) - usage + inactive, 0)


def available_memory(device: torch.device) -> tuple[int | None, str]:
    """(bytes this process could have now: free memory plus what it holds; None when unknown, where): the GPU's free
    memory on CUDA, else the machine's available RAM or its cgroup's room, the smaller."""
    from grpo.train.budget import machine_memory

    mem = machine_memory(device)
    if device.type == "cuda":
        return (mem[1] if mem else None), "GPU memory"
    free = mem[1] if mem else None
    room = cgroup_room()
    if room is not None:
        free = room if free is None else min(free, room)
    return (None if free is None else free + process_rss()), "memory"


def memory_limit(cfg, device: torch.device) -> MemoryLimit:
    """train.memory_limit resolved for `device` (see the module docstring)."""
    available, where = available_memory(device)
    setting = cfg.train.memory_limit
    if setting == "auto":
        if available is None:
            return MemoryLimit(None, "auto: the machine's memory is unknown", where, None)
        margin = max(int(AUTO_MARGIN * available), AUTO_MARGIN_MIN)
        return MemoryLimit(max(available - margin, 0), f"train.memory_limit=auto: {available / GIB:.1f} GiB "
                           f"available less a {margin / GIB:.1f} GiB margin", where, available)
    asked = int(float(setting) * GIB)
    if available is not None and asked > available:
        return MemoryLimit(available, f"train.memory_limit={float(setting):g} GiB, more than the "
                           f"{available / GIB:.1f} GiB this machine has available: kept to that", where, available)
    return MemoryLimit(asked, f"train.memory_limit={float(setting):g} GiB", where, available)
