"""The pieces a checkpoint is made of, shared by saving (train/checkpoint/save.py) and loading
(train/checkpoint/load.py): the layout constants, CheckpointError, fsync and the manifest's file table, the model's
safetensors I/O, torch.save through a Python file, and the bytes a checkpoint's parts take."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_model

from grpo.models.builtin import sha256_file
from grpo.models.lora import unwrap

MARKER = "COMMITTED"
FORMAT = "grpo-checkpoint"
VERSION = 1
_HASH_LIMIT = 64 * 2**20  # files up to this size get a sha256 in the manifest
_STEP_DIR = re.compile(r"^step-(\d{6,})$")
_STALE_PREFIXES = (".tmp-step-", ".old-step-", ".del-step-")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class CheckpointError(RuntimeError):
    """A checkpoint could not be saved, or a directory is not a valid committed checkpoint."""


def step_dir_name(step: int) -> str:
    """`step-NNNNNN`, the directory name of the checkpoint of `step`."""
    return f"step-{step:06d}"


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


def torch_save(obj: Any, path: Path) -> None:
    """torch.save through a Python file: a full disk is its OSError (ENOSPC) in the error's context, not only
    torch's "[enforce fail at inline_container.cc:672] unexpected pos", which names no disk."""
    with open(path, "wb") as f:
        torch.save(obj, f)


def tensor_bytes(obj: Any) -> int:
    """The bytes of the tensors in `obj` (nested dicts, lists and tuples, e.g. an optimizer's state dict), each
    storage once: about what torch.save writes of it."""
    seen: set = set()
    total = 0
    todo = [obj]
    while todo:
        x = todo.pop()
        if isinstance(x, torch.Tensor):
            key = (x.data_ptr(), x.numel(), x.dtype) if x.numel() else id(x)
            if key not in seen:
                seen.add(key)
                total += x.numel() * x.element_size()
        elif isinstance(x, dict):
            todo.extend(x.values())
        elif isinstance(x, (list, tuple)):
            todo.extend(x)
    return total


def tokenizer_bytes(tokenizer: Any) -> int:
    """About the bytes `tokenizer.save_pretrained` writes: the tokenizer files of the directory it was loaded from
    (0 when it has none)."""
    root = Path(str(getattr(tokenizer, "name_or_path", "") or ""))
    if not str(root) or not root.is_dir():
        return 0
    names = ("tokenizer", "vocab", "merges", "special_tokens_map", "added_tokens", "chat_template", "spiece")
    return sum(f.stat().st_size for f in root.iterdir() if f.is_file() and f.name.startswith(names))


def _file_table(root: Path) -> dict[str, dict[str, Any]]:
    """{relative posix path: {size, sha256 (None above the hash limit)}} for every file under root."""
    table = {}
    for p in sorted(q for q in root.rglob("*") if q.is_file() and q.name != MARKER):
        size = p.stat().st_size
        table[p.relative_to(root).as_posix()] = {"size": size,
                                                 "sha256": sha256_file(p) if size <= _HASH_LIMIT else None}
    return table


def _remove(path: Path) -> None:
    """Delete a directory tree; first rename it to a `.del-` name so a crash mid-delete leaves no half `step-N`."""
    trash = path.with_name(f".del-{path.name}-{os.getpid()}")
    os.rename(path, trash)
    shutil.rmtree(trash)


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
