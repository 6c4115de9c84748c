"""The benchmarks' clock (grpo bench, its real-vocabulary part): seconds of work on CPU or CUDA."""

from __future__ import annotations

import os
import time

import torch

__all__ = ["Clock"]


class Clock:
    """Seconds of work. `cpu`: this process's CPU time (all its threads), the default on CPU, where torch runs
    one thread: other tenants' load time-slices the wall clock but not the work. `wall`: wall-clock time, the
    default on CUDA, after waiting for the queued kernels."""

    def __init__(self, device: torch.device, kind: str | None = None):
        self.cuda = device.type == "cuda"
        self.kind = kind or os.environ.get("GRPO_BENCH_CLOCK") or ("wall" if self.cuda else "cpu")
        if self.kind not in ("cpu", "wall"):
            raise ValueError(f"GRPO_BENCH_CLOCK must be 'cpu' or 'wall', got {self.kind!r}")

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.process_time() if self.kind == "cpu" else time.perf_counter()
