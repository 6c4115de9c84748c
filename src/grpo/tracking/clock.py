"""The wall time of a run and where it went: summary.json's `wall_s` and its parts.

    time/model_s      loading the model, or building the built-in one (the warm-up) when it was not shipped/cached
    time/preflight_s  the preflight's sampled groups (grpo.train.preflight), before the first evaluation
    time/eval_s       held-out evaluations (before, during and after training)
    time/rl_steps_s   the RL steps (sampling, rewards, updates)
    time/save_s       checkpoints and the final model
    time/other_s      the rest of the wall time (start-up, data, logging, plots)

A resumed run adds its parts to those saved in its checkpoint, as it does its wall time.

Clock is the benchmarks' clock (grpo bench and its real-vocabulary part): seconds of work on CPU or CUDA.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

import torch

PARTS = ("model", "preflight", "eval", "rl_steps", "save")
LABELS = {"model": "model", "preflight": "preflight", "eval": "evaluations", "rl_steps": "RL steps", "save": "saving",
          "other": "other"}


class RunClock:
    """Seconds per part of the run (PARTS); `saved`: a `state_dict()` of a checkpoint, whose parts carry on."""

    def __init__(self, saved: dict | None = None):
        self.parts = {k: 0.0 for k in PARTS}
        self.load_state_dict(saved or {})

    def add(self, part: str, seconds: float) -> None:
        self.parts[part] += seconds

    @contextmanager
    def time(self, part: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(part, time.perf_counter() - t0)

    def state_dict(self) -> dict:
        return dict(self.parts)

    def load_state_dict(self, state: dict) -> None:
        self.parts = {k: float(state.get(k, 0.0)) for k in PARTS}

    def summary(self, wall_s: float) -> dict:
        """summary.json's time/<part>_s keys; other = wall - the parts (never below 0)."""
        out = {f"time/{k}_s": round(v, 3) for k, v in self.parts.items()}
        out["time/other_s"] = round(max(wall_s - sum(self.parts.values()), 0.0), 3)
        return out


def breakdown(summary: dict) -> str:
    """'model 1 s, evaluations 18 s, RL steps 2 min 31 s, saving 1 s, other 3 s' from summary.json's keys."""
    from grpo.tracking.progress import format_duration

    parts = []
    for key in (*PARTS, "other"):
        value = summary.get(f"time/{key}_s")
        if value is not None:
            parts.append(f"{LABELS[key]} {format_duration(value)}")
    return ", ".join(parts)


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
