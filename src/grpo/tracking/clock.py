"""The wall time of a run and where it went: summary.json's `wall_s` and its parts.

    time/model_s      loading the model, or building the built-in one (the warm-up) when it was not shipped/cached
    time/eval_s       held-out evaluations (before, during and after training)
    time/rl_steps_s   the RL steps (sampling, rewards, updates)
    time/save_s       checkpoints and the final model
    time/other_s      the rest of the wall time (start-up, data, logging, plots)

A resumed run adds its parts to those saved in its checkpoint, as it does its wall time.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

PARTS = ("model", "eval", "rl_steps", "save")
LABELS = {"model": "model", "eval": "evaluations", "rl_steps": "RL steps", "save": "saving", "other": "other"}


class RunClock:
    def __init__(self, saved: dict | None = None):
        self.parts = {k: float((saved or {}).get(k, 0.0)) for k in PARTS}

    def add(self, part: str, seconds: float) -> None:
        self.parts[part] += seconds

    @contextmanager
    def time(self, part: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(part, time.perf_counter() - t0)

    def state(self) -> dict:
        return dict(self.parts)

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
