"""Checks of run directories where they enter: the output directory of `grpo train` (before any model loads) and
the run directory `grpo report` reads. Each failure is one UserError naming the directory or file and the line.

    check_output_dir(path)    ConfigError unless a run can write there (it is created when missing)
    check_output_file(path)   ConfigError unless a results file can be written there (checked before the work)
    write_text_atomic(path)   a file written whole or not at all (a temporary name, then a rename); a full disk is
                              a DiskFullError naming the disk, its free space and the bytes the file needed
    write_bytes_atomic(path)  the same for bytes (the plots)
    check_run_dir(path)       RunDirError unless it is a readable grpo run directory
    disk_full(err, where)     whether an error (or its cause) is "no space left" (ENOSPC / EDQUOT), or torch's own
                              words for a failed write ("unexpected pos") while the disk at `where` is full
    disk_full_message(path)   "the disk is full (...) on <mount>" naming the mount point, its free space, the bytes
                              needed and the path
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from pathlib import Path

from grpo.errors import ConfigError, DiskFullError, RunDirError

__all__ = ["check_output_dir", "check_output_file", "check_run_dir", "disk_full", "disk_full_message",
           "write_bytes_atomic", "write_text_atomic"]

FIELD = "train.output_dir (--output-dir)"


def check_output_dir(path: str | Path) -> Path:
    """`path` as a Path if it is a directory, or can be created as one, and is writable; else ConfigError."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{FIELD}={str(path)!r} is a file, not a directory; pass a directory (it is created when "
                          "missing), e.g. runs/my-run")
    existing = p
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{FIELD}={str(path)!r}: {existing} is a file, so the directory cannot be created there")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{FIELD}={str(path)!r}: no permission to write in {existing}; pass a directory you can "
                          "write to")
    try:  # os.access says yes to root everywhere, /proc and read-only mounts included: a real write, undone
        os.rmdir(tempfile.mkdtemp(prefix=".grpo-probe-", dir=existing))
    except OSError as e:
        raise ConfigError(f"{FIELD}={str(path)!r}: cannot write there ({e.strerror or e} in {existing}); pass a "
                          "directory you can write to") from None
    return p


def check_output_file(path: str | Path, field: str = "--output") -> Path:
    """`path` as a Path if a file can be written there: not empty, not a directory, in an existing folder this process
    can write to (and writable itself when it exists); else ConfigError naming the field. Called before the
    evaluation or benchmark whose results it will hold, so a wrong path costs seconds, not the results."""
    if not str(path).strip():
        raise ConfigError(f"{field} is empty: pass a file path, e.g. results.json")
    p = Path(path).expanduser()
    if p.is_dir():
        raise ConfigError(f"{field}={str(path)!r} is a directory; pass a file path inside it, e.g. "
                          f"{p / 'results.json'}")
    if not p.parent.is_dir():
        raise ConfigError(f"{field}={str(path)!r}: the folder {p.parent} does not exist; create it first")
    if not os.access(p.parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ConfigError(f"{field}={str(path)!r}: no permission to write there; pass a path you can write to")
    return p


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `text` to `path` whole or not at all: a temporary file beside it, fsynced, then renamed over it.
    A full disk is a DiskFullError naming it (the temporary file removed, an older `path` untouched)."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """write_text_atomic for bytes."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)  # first: the free space the message names is the disk's without it
        if disk_full(e):
            raise DiskFullError(f"{disk_full_message(path, len(data))}; nothing was written there") from e
        raise
    finally:
        if tmp.exists():
            tmp.unlink()


_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
# torch's words for a write its C++ stream could not finish (it names no errno): a full disk when the disk is full
_TORCH_WRITE = ("unexpected pos", "PytorchStreamWriter failed", "file write failed", "basic_ios::clear")
_NEARLY_FULL = 16 * 2**20  # bytes free below which a failed write is taken for a full disk


def disk_full(err: BaseException | None, where: str | Path | None = None) -> bool:
    """Whether `err` or an error in its cause/context chain is "no space left on device" (or a disk quota). torch
    reports a full disk as a RuntimeError ("[enforce fail at inline_container.cc:672] unexpected pos", "file write
    failed") without an errno: those count when the disk holding `where` (checked before the partial write there is
    removed) has less than 16 MiB free."""
    seen = set()
    torch_write = False
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in _FULL:
            return True
        if "No space left on device" in str(err) or "Disk quota exceeded" in str(err):
            return True
        torch_write = torch_write or any(m in str(err) for m in _TORCH_WRITE)
        err = err.__cause__ or err.__context__
    if torch_write and where is not None:
        try:
            return shutil.disk_usage(_existing(Path(where))).free < _NEARLY_FULL
        except OSError:
            return False
    return False


def _existing(p: Path) -> Path:
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB', 10 -> '10 B' (the run's disk messages)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def disk_full_message(path: str | Path, needed: int | None = None) -> str:
    """"the disk is full (No space left on device) on <mount point> (F free of T; about N needed) while writing
    <path>": `needed` is what the whole file or directory takes (None: not said)."""
    p = Path(path).absolute()
    here = _existing(p)
    mount = here
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    need = f"about {format_bytes(needed)} needed" if needed else ""
    try:
        usage = shutil.disk_usage(here)
        room = f" ({format_bytes(usage.free)} free of {format_bytes(usage.total)}{'; ' + need if need else ''})"
    except OSError:
        room = f" ({need})" if need else ""
    return f"the disk is full (No space left on device) on {mount}{room} while writing {p}"


def check_run_dir(path: str | Path) -> Path:
    """`path` as a Path if it is a run directory `grpo train` wrote (metrics.jsonl with readable lines); else
    RunDirError naming what is wrong and where."""
    p = Path(path).expanduser()
    what = f"run directory {str(path)!r}"
    if not p.exists():
        raise RunDirError(f"{what}: no such directory; pass the --output-dir of a `grpo train` run")
    if not p.is_dir():
        raise RunDirError(f"{what} is a file, not a directory; pass the --output-dir of a `grpo train` run")
    if not (p / "metrics.jsonl").is_file():
        raise RunDirError(f"{what} has no metrics.jsonl: not a grpo run directory (or a run stopped before its "
                          "first step); pass the --output-dir of a `grpo train` run")
    steps = _check_jsonl(p / "metrics.jsonl")
    _check_jsonl(p / "samples.jsonl")
    if steps == 0:
        raise RunDirError(f"{what}: metrics.jsonl has no steps yet (the run stopped before its first step)")
    summary = p / "summary.json"
    if summary.is_file():
        try:
            json.loads(summary.read_text(encoding="utf-8"))
        except (ValueError, OSError) as e:
            raise RunDirError(f"{summary} is not readable JSON ({e}); delete it or finish the run again") from None
    return p


def _check_jsonl(file: Path) -> int:
    """The number of rows of a JSONL file of the run (0 when missing); RunDirError naming a bad line."""
    if not file.is_file():
        return 0
    rows = 0
    with open(file, "rb") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except ValueError as e:
                raise RunDirError(f"{file} line {number} is not valid JSON ({e}): a write cut off by a kill? Delete "
                                  "that line, or resume the run (`grpo train ... --resume` repairs it)") from None
            if not isinstance(row, dict) or "step" not in row:
                raise RunDirError(f"{file} line {number} is not a step record (a JSON object with 'step')")
            rows += 1
    return rows
