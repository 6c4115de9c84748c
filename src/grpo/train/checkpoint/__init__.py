"""Checkpoints and everything a run carries across a stop: atomic saves, verified loads, resume, preemption, best.

    save.py        save_checkpoint: write under a temporary name, fsync, manifest, COMMITTED marker, rename
    load.py        Checkpoint, load_checkpoint (verified against the manifest), latest_checkpoint
    files.py       the layout (step-NNNNNN), file tables, model and torch I/O shared by save and load
    rng_state.py   capture and restore every RNG (Python, NumPy, torch CPU and CUDA)
    resume.py      resuming a run: its config checked against the checkpoint's, every stateful piece restored
    preemption.py  SIGTERM/SIGINT -> save, then exit 130 / 143
    best.py        checkpoints/best/, kept when an evaluation beats every earlier one

docs/checkpoints.md describes the layout and the fault behaviour.
"""

from grpo.train.checkpoint.files import CheckpointError
from grpo.train.checkpoint.load import Checkpoint, latest_checkpoint, load_checkpoint
from grpo.train.checkpoint.rng_state import capture_rng_state, restore_rng_state
from grpo.train.checkpoint.save import save_checkpoint

__all__ = ["CheckpointError", "Checkpoint", "save_checkpoint", "load_checkpoint", "latest_checkpoint",
           "capture_rng_state", "restore_rng_state"]
