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
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import os
import random
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_model

from grpo.models.builtin import sha256_file
from grpo.models.lora import unwrap

__all__ = ["CheckpointError", "Checkpoint", "save_checkpoint", "load_checkpoint", "latest_checkpoint",
           "capture_rng_state", "restore_rng_state"]

logger = logging.getLogger(__name__)

MARKER = "COMMITTED"
FORMAT = "grpo-checkpoint"
VERSION = 1
_HASH_LIMIT = 64 * 2**20  # files up to this size get a sha256 in the manifest
_STEP_DIR = re.compile(r"^step-(\d{6,})$")
_STALE_PREFIXES = (".tmp-step-", ".old-step-", ".del-step-")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class CheckpointError(RuntimeError):
    """A checkpoint could not be saved, or a directory is not a valid committed checkpoint."""


def _fault_hook(stage: str) -> None:
    """Test seam called at each save stage; a no-op. Tests replace it to crash the save at `stage`.

    Stages, in order: after_model, after_tokenizer, after_extra_models, after_optimizers, after_schedulers,
    after_state, before_marker, after_marker (before the rename), after_rename.
    """


def step_dir_name(step: int) -> str:
    """`step-NNNNNN`, the directory name of the checkpoint of `step`."""
    return f"step-{step:06d}"


# ----------------------------------------------------------------------------------------------- RNG state
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


# ----------------------------------------------------------------------------------------------- file helpers
def _fsync(path: Path) -> None:
    """fsync a file, or a directory so that new entries and renames in it are durable (dirs: not on Windows)."""
    if os.name == "nt" and path.is_dir():
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """fsync every file and directory under `root`, then `root` itself."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            _fsync(Path(dirpath, name))
        _fsync(Path(dirpath))




def _file_table(root: Path) -> dict[str, dict[str, Any]]:
    """{relative posix path: {size, sha256 (None above the hash limit)}} for every file under root."""
    table = {}
    for p in sorted(q for q in root.rglob("*") if q.is_file() and q.name != MARKER):
        size = p.stat().st_size
        table[p.relative_to(root).as_posix()] = {"size": size, "sha256": sha256_file(p) if size <= _HASH_LIMIT else None}
    return table


def _remove(path: Path) -> None:
    """Delete a directory tree; first rename it to a `.del-` name so a crash mid-delete leaves no half `step-N`."""
    trash = path.with_name(f".del-{path.name}-{os.getpid()}")
    os.rename(path, trash)
    shutil.rmtree(trash)


# ----------------------------------------------------------------------------------------------- model I/O
def _save_model(model: torch.nn.Module, directory: Path) -> str:
    """Write weights as safetensors; `save_pretrained` when available. Returns the format name."""
    model = unwrap(model)
    directory.mkdir(parents=True, exist_ok=True)
    if hasattr(model, "save_pretrained"):
        model.save_pretrained(directory, safe_serialization=True)
        return "transformers"
    save_model(model, str(directory / "model.safetensors"), force_contiguous=True)  # drops tied aliases
    return "safetensors"


def _load_model(model: torch.nn.Module, directory: Path, where: str) -> None:
    """Strictly load the safetensors weights in `directory` into `model`.

    Aliases of tied weights may be absent from the file. A PEFT model gets (only) its adapter weights back.
    """
    model = unwrap(model)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"checkpoint {where} has no *.safetensors weights in {directory}")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            weights.update(load_file(str(f)))
        except Exception as e:
            raise CheckpointError(f"checkpoint {where}: cannot read {f}: {e}") from e
    if hasattr(model, "peft_config"):
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        own, optional = get_peft_model_state_dict(model), set()
    else:
        own = model.state_dict()
        storage: dict[int, set[str]] = {}  # tied weights share storage; the saved file keeps one of the names
        for k, t in own.items():
            storage.setdefault(t.data_ptr() if t.numel() else id(t), set()).add(k)
        optional = {k for names in storage.values() if names & weights.keys() for k in names}
    missing = [k for k in own if k not in weights and k not in optional]
    unexpected = [k for k in weights if k not in own]
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {where} ({directory}) does not match {type(model).__name__}: "
                              f"missing keys {missing[:20]}, unexpected keys {unexpected[:20]}")
    try:
        if hasattr(model, "peft_config"):
            set_peft_model_state_dict(model, weights)
        else:
            model.load_state_dict(weights, strict=False)
    except RuntimeError as e:  # shape mismatch
        raise CheckpointError(f"checkpoint {where} ({directory}): {e}") from e


def _torch_load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"checkpoint {path.parent}: cannot read {path.name}: {e}") from e


# ----------------------------------------------------------------------------------------------- loading
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
        torch.save(opt.state_dict(), tmp / f"optimizer.{name}.pt")
    _fault_hook("after_optimizers")
    for name, sched in schedulers.items():
        torch.save(sched.state_dict(), tmp / f"scheduler.{name}.pt")
    _fault_hook("after_schedulers")
    torch.save(capture_rng_state(), tmp / "rng_state.pt")
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
        manifest["files"] = _file_table(tmp)
        _fsync_tree(tmp)
        _fault_hook("before_marker")
        (tmp / MARKER).write_text(json.dumps(manifest, indent=1))
        _fsync(tmp / MARKER)
        _fsync(tmp)
        _fault_hook("after_marker")
        _publish(tmp, final)
    except BaseException as e:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(e, Exception):  # KeyboardInterrupt, SystemExit: cleaned up, propagate as is
            raise
        raise CheckpointError(f"saving checkpoint step {step} to {final} failed: {type(e).__name__}: {e}") from e
    _fault_hook("after_rename")
    logger.info("saved checkpoint %s", final)
    _retain(root, keep_last, final)
    return final
