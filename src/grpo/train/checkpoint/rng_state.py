"""The global RNG states of a checkpoint: capture (python, numpy, torch CPU, every CUDA device) and restore, so a
resumed run draws what the uninterrupted one would have drawn."""

from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import torch

__all__ = ["capture_rng_state", "restore_rng_state"]

logger = logging.getLogger("grpo.train.checkpoint")


def capture_rng_state() -> dict[str, Any]:
    """The global RNG states (python `random`, numpy legacy global, torch CPU, every CUDA device).

    Returns plain lists/ints/floats and uint8 tensors only, so `torch.load(weights_only=True)` can read it back.
    Seeded `np.random.Generator` or `torch.Generator` objects a trainer owns are not global: put them in
    trainer_state yourself.
    """
    version, internal, gauss = random.getstate()
    kind, key, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": {"kind": kind, "key": key.tolist(), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore the global RNG states captured by `capture_rng_state` (CUDA only where CUDA is available)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["kind"], np.asarray(n["key"], dtype=np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(state["torch"].cpu())
    cuda = state.get("cuda") or []
    devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if cuda and len(cuda) != devices:
        logger.warning("the RNG state has CUDA states for %d devices, this process sees %d; restoring the "
                       "first %d", len(cuda), devices, min(devices, len(cuda)))
    for i, s in enumerate(cuda[:devices]):
        torch.cuda.set_rng_state(s, i)
