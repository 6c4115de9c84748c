"""Loading a checkpoint: verify a committed directory against its manifest, find the newest committed one of a
run (skipping partial or corrupt ones with a warning), and read its parts back into a model, optimizers and
schedulers (`Checkpoint`)."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from grpo.models.builtin import sha256_file
from grpo.train.checkpoint.files import (
    _STALE_PREFIXES,
    _STEP_DIR,
    FORMAT,
    MARKER,
    CheckpointError,
    _load_model,
    _torch_load,
)

__all__ = ["Checkpoint", "latest_checkpoint", "load_checkpoint"]

logger = logging.getLogger("grpo.train.checkpoint")

@dataclass
class Checkpoint:
    """A verified, committed checkpoint. Load its parts into freshly built objects of the same shapes.

    Build the optimizers and schedulers first, then call `load_optimizers` and `load_schedulers`: the loaded
    state overwrites the learning rates a scheduler's constructor sets.
    """

    step: int
    path: Path
    trainer_state: dict[str, Any]
    rng_state: dict[str, Any] = field(repr=False)
    manifest: dict[str, Any] = field(repr=False)

    def load_model_into(self, model: torch.nn.Module) -> None:
        """Load the policy weights strictly; a key mismatch raises CheckpointError naming the keys."""
        _load_model(model, self.path, str(self.path))

    def load_extra_models(self, models: dict[str, torch.nn.Module]) -> None:
        """Load extra models (e.g. {"value": critic}); the names must equal the saved names."""
        self._check_names("extra_models", models)
        for name, m in models.items():
            _load_model(m, self.path / "extra" / name, f"{self.path} extra model {name!r}")

    def load_optimizers(self, optimizers: dict[str, torch.optim.Optimizer]) -> None:
        """Load optimizer state dicts; the names must equal the saved names."""
        self._load_state_dicts("optimizers", "optimizer", optimizers)

    def load_schedulers(self, schedulers: dict[str, Any]) -> None:
        """Load LR scheduler (or any `load_state_dict` object) state; the names must equal the saved names."""
        self._load_state_dicts("schedulers", "scheduler", schedulers)

    def _check_names(self, kind: str, objs: dict[str, Any]) -> None:
        saved = set(self.manifest[kind])
        if set(objs) != saved:
            raise CheckpointError(f"checkpoint {self.path} has {kind} {sorted(saved)}, asked to load "
                                  f"{sorted(objs)}")

    def _load_state_dicts(self, kind: str, prefix: str, objs: dict[str, Any]) -> None:
        self._check_names(kind, objs)
        for name, obj in objs.items():
            f = self.path / f"{prefix}.{name}.pt"
            state = _torch_load(f)
            try:
                obj.load_state_dict(state)
            except Exception as e:
                raise CheckpointError(f"checkpoint {self.path}: {f.name} does not fit {prefix} {name!r}: "
                                      f"{e}") from e


def _verify(path: Path) -> dict[str, Any]:
    """Return the manifest of a committed checkpoint, or raise CheckpointError naming the path and the file."""
    marker = path / MARKER
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist or is not a directory")
    if not marker.is_file():
        raise CheckpointError(f"checkpoint {path} is not committed (no {MARKER} marker)")
    try:
        manifest = json.loads(marker.read_text())
        files, _step = manifest["files"], int(manifest["step"])
        if manifest.get("format") != FORMAT:
            raise ValueError(f"format {manifest.get('format')!r} is not {FORMAT!r}")
    except Exception as e:
        raise CheckpointError(f"checkpoint {path}: bad manifest in {MARKER}: {e}") from e
    for rel, info in files.items():
        f = path / rel
        if not f.is_file():
            raise CheckpointError(f"checkpoint {path}: file {rel} is missing")
        if f.stat().st_size != info["size"]:
            raise CheckpointError(f"checkpoint {path}: file {rel} has {f.stat().st_size} bytes, the manifest "
                                  f"says {info['size']} (truncated or overwritten)")
        if info.get("sha256") and sha256_file(f) != info["sha256"]:
            raise CheckpointError(f"checkpoint {path}: file {rel} does not match its sha256 (corrupt)")
        if rel.endswith(".safetensors"):
            try:
                with safe_open(str(f), framework="pt") as sf:
                    list(sf.keys())
            except Exception as e:
                raise CheckpointError(f"checkpoint {path}: file {rel} is not readable safetensors: {e}") from e
    return manifest


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Verify and open the committed checkpoint directory `path` (no config needed).

    Raises CheckpointError naming the path and the file if it is uncommitted, its manifest is bad, or a file is
    missing, truncated, corrupt or unreadable.
    """
    path = Path(path)
    manifest = _verify(path)
    try:
        trainer_state = json.loads((path / "trainer_state.json").read_text())
    except Exception as e:
        raise CheckpointError(f"checkpoint {path}: cannot read trainer_state.json: {e}") from e
    rng_state = _torch_load(path / "rng_state.pt")
    return Checkpoint(step=int(manifest["step"]), path=path, trainer_state=trainer_state,
                      rng_state=rng_state, manifest=manifest)


def _committed(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of the committed, verified `step-N` dirs under `root`, oldest first; warn about the rest."""
    found = []
    for p in sorted(root.iterdir()) if root.is_dir() else []:
        if p.name.startswith(_STALE_PREFIXES):
            logger.warning("ignoring partial checkpoint directory %s (never committed or left by an "
                           "interrupted save; the next save removes it)", p)
            continue
        m = _STEP_DIR.match(p.name)
        if not m:
            continue
        try:
            manifest = _verify(p)
        except CheckpointError as e:
            logger.warning("ignoring checkpoint directory %s: %s", p, e)
            continue
        if int(manifest["step"]) != int(m.group(1)):
            logger.warning("ignoring checkpoint directory %s: its manifest says step %s", p, manifest["step"])
            continue
        found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest committed checkpoint under `run_dir/checkpoints`, or None.

    Partial, uncommitted or corrupt directories are skipped with a logging warning naming them.
    """
    found = _committed(Path(run_dir) / "checkpoints")
    return found[-1][1] if found else None
