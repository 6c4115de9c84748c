"""Atomic, trainer-agnostic checkpoints: save, verify, find the latest, load.

A checkpoint is a directory `run_dir/checkpoints/step-NNNNNN/` holding the model (safetensors, loadable with
`from_pretrained` when the model is a `transformers` model), the tokenizer, optimizer and scheduler state dicts,
RNG states and the trainer's JSON state. It is written into `checkpoints/.tmp-step-NNNNNN-<pid>/`, every file and
directory is fsynced, a `COMMITTED` marker holding a JSON manifest (every file's size, the sha256 of files up to
64 MiB) is written last, and only then is the directory renamed to `step-NNNNNN`. A directory without the marker,
or whose files do not match its manifest, is not a checkpoint: `latest_checkpoint` skips it with a warning and
the next save removes leftover `.tmp-*` directories. Old checkpoints are deleted only after the new one is
committed. See docs/checkpoints.md for the layout and the fault behaviour.

One process (rank 0) saves into a run directory. Sharded (FSDP/DCP) state is out of scope.

This file saves; loading is load.py, the shared layout and file I/O files.py, the RNG states rng_state.py. Every
public name is importable from grpo.train.checkpoint.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from grpo.models.lora import unwrap
from grpo.tracking.rundir import disk_full, disk_full_message
from grpo.train.checkpoint.files import (
    _NAME,
    _STALE_PREFIXES,
    FORMAT,
    MARKER,
    VERSION,
    CheckpointError,
    _file_table,
    _fsync,
    _fsync_tree,
    _remove,
    _save_model,
    step_dir_name,
    tensor_bytes,
    tokenizer_bytes,
    torch_save,
)
from grpo.train.checkpoint.final import link_identical, make_readable
from grpo.train.checkpoint.load import Checkpoint, _committed, _verify, latest_checkpoint, load_checkpoint
from grpo.train.checkpoint.rng_state import capture_rng_state, restore_rng_state

__all__ = ["CheckpointError", "Checkpoint", "save_checkpoint", "load_checkpoint", "latest_checkpoint",
           "capture_rng_state", "restore_rng_state"]

logger = logging.getLogger("grpo.train.checkpoint")

def _fault_hook(stage: str) -> None:
    """Test seam called at each save stage; a no-op. Tests replace it to crash the save at `stage`.

    Stages, in order: after_model, after_tokenizer, after_extra_models, after_optimizers, after_schedulers,
    after_state, before_marker, after_marker (before the rename), after_rename.
    """


# ----------------------------------------------------------------------------------------------- RNG state
# ----------------------------------------------------------------------------------------------- file helpers
# ----------------------------------------------------------------------------------------------- model I/O
# ----------------------------------------------------------------------------------------------- loading
# ----------------------------------------------------------------------------------------------- saving
def _clean_stale(root: Path) -> None:
    """Remove `.tmp-`/`.del-` leftovers of interrupted saves; put back a committed `.old-step-N` if its
    replacement never arrived."""
    for p in sorted(root.iterdir()):
        if not p.name.startswith(_STALE_PREFIXES):
            continue
        if p.name.startswith(".old-step-"):
            final = root / p.name[len(".old-"):].rsplit("-", 1)[0]
            if not final.exists():
                try:
                    _verify(p)
                    os.rename(p, final)
                    logger.warning("restored %s from %s (a re-save was interrupted)", final, p)
                    continue
                except CheckpointError:
                    pass
        logger.warning("removing stale partial checkpoint directory %s", p)
        shutil.rmtree(p, ignore_errors=True)


def _write_contents(tmp: Path, step: int, model, tokenizer, optimizers, schedulers, extra_models,
                    state_json: str) -> dict[str, Any]:
    """Write every part of the checkpoint into `tmp`; returns the manifest (without the file table)."""
    fmt = _save_model(model, tmp)
    _fault_hook("after_model")
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    _fault_hook("after_tokenizer")
    extra_fmt = {name: _save_model(m, tmp / "extra" / name) for name, m in extra_models.items()}
    _fault_hook("after_extra_models")
    for name, opt in optimizers.items():
        torch_save(opt.state_dict(), tmp / f"optimizer.{name}.pt")
    _fault_hook("after_optimizers")
    for name, sched in schedulers.items():
        torch_save(sched.state_dict(), tmp / f"scheduler.{name}.pt")
    _fault_hook("after_schedulers")
    torch_save(capture_rng_state(), tmp / "rng_state.pt")
    (tmp / "trainer_state.json").write_text(state_json)
    _fault_hook("after_state")
    return {"format": FORMAT, "version": VERSION, "step": step,
            "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "model": {"format": fmt, "class": type(unwrap(model)).__name__},
            "tokenizer": tokenizer is not None, "extra_models": extra_fmt,
            "optimizers": sorted(optimizers), "schedulers": sorted(schedulers)}


def _publish(tmp: Path, final: Path) -> None:
    """Rename the committed tmp dir to `final`, replacing an existing `final` via an `.old-` aside dir."""
    aside = None
    if final.exists():
        aside = final.with_name(f".old-{final.name}-{os.getpid()}")
        os.rename(final, aside)
    try:
        os.rename(tmp, final)
    except OSError:
        if aside is not None:
            os.rename(aside, final)
        raise
    _fsync(final.parent)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def _retain(root: Path, keep_last: int, newest: Path) -> None:
    """Delete committed checkpoints beyond the `keep_last` highest steps (never `newest`); warn on failure."""
    if keep_last <= 0:
        return
    found = _committed(root)
    for _step, p in found[:-keep_last]:
        if p == newest:
            continue
        try:
            _remove(p)
        except OSError as e:
            logger.warning("could not delete old checkpoint %s: %s", p, e)


def checkpoint_bytes(model, tokenizer, optimizers: dict, extra_models: dict) -> int | None:
    """About the bytes a checkpoint of these takes (weights, optimizer states, tokenizer files); None when it cannot
    be told."""
    from grpo.models.lora import saved_bytes

    try:
        return (saved_bytes(model) + sum(saved_bytes(m) for m in extra_models.values())
                + sum(tensor_bytes(o.state_dict()) for o in optimizers.values()) + tokenizer_bytes(tokenizer))
    except Exception:  # noqa: BLE001 - an estimate for a message: never the error itself
        return None


def save_checkpoint(run_dir: str | os.PathLike, step: int, *, model: torch.nn.Module, tokenizer: Any = None,
                    optimizers: dict[str, torch.optim.Optimizer], schedulers: dict[str, Any],
                    extra_models: dict[str, torch.nn.Module] | None = None,
                    trainer_state: dict[str, Any], keep_last: int = 2) -> Path:
    """Atomically save a checkpoint to `run_dir/checkpoints/step-NNNNNN` and return that path.

    Args:
      model: the policy; `save_pretrained` is used when it has one, so `from_pretrained(path)` works.
      tokenizer: saved with `save_pretrained` if given.
      optimizers, schedulers: name -> object with `state_dict()`; names are file-name safe ([A-Za-z0-9_.-]).
      extra_models: name -> module saved under `extra/<name>/` (e.g. {"value": critic} for PPO).
      trainer_state: JSON-serialisable trainer state (step, data cursor, controller states, config hash...).
      keep_last: after the commit, delete committed checkpoints beyond the newest `keep_last`; <= 0 keeps all.

    Raises CheckpointError (cause chained) if anything fails before the commit; the tmp dir is then removed and
    earlier checkpoints are untouched. ValueError for bad arguments, before anything is written.
    """
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    extra_models = dict(extra_models or {})
    for kind, names in (("optimizer", optimizers), ("scheduler", schedulers), ("extra model", extra_models)):
        bad = [n for n in names if not _NAME.match(n) or n in (".", "..")]
        if bad:
            raise ValueError(f"{kind} names must match [A-Za-z0-9_.-]+, got {bad}")
    root = Path(run_dir) / "checkpoints"
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    try:
        state_json = json.dumps(trainer_state, indent=1, sort_keys=True)
        root.mkdir(parents=True, exist_ok=True)
        _clean_stale(root)
        tmp.mkdir()
        manifest = _write_contents(tmp, step, model, tokenizer, optimizers, schedulers, extra_models,
                                   state_json)
        make_readable(tmp)  # 0644 like the run's other files (transformers writes its weights 0600)
        link_identical(tmp, [Path(run_dir) / "final", root / "best"])  # the same weights stored once (issue #42)
        manifest["files"] = _file_table(tmp)
        _fsync_tree(tmp)
        _fault_hook("before_marker")
        (tmp / MARKER).write_text(json.dumps(manifest, indent=1))
        _fsync(tmp / MARKER)
        _fsync(tmp)
        _fault_hook("after_marker")
        _publish(tmp, final)
    except BaseException as e:
        full = isinstance(e, Exception) and disk_full(e, tmp)  # before the partial goes: torch's "unexpected pos"
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(e, Exception):  # KeyboardInterrupt, SystemExit: cleaned up, propagate as is
            raise
        if full:
            needed = checkpoint_bytes(model, tokenizer, optimizers, extra_models)
            err = CheckpointError(f"saving checkpoint step {step} to {final} failed: "
                                  f"{disk_full_message(final, needed)}; nothing half-written is left, earlier "
                                  "checkpoints are untouched")
            err.disk_full = True
            raise err from e
        raise CheckpointError(f"saving checkpoint step {step} to {final} failed: {type(e).__name__}: {e}") from e
    _fault_hook("after_rename")
    logger.info("saved checkpoint %s", final)
    _retain(root, keep_last, final)
    return final
