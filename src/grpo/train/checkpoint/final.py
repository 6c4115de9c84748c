"""Model directories written whole: `final/` and `checkpoints/best/` are each written into a fresh directory and
swapped in, so they hold exactly the model of their step, whatever changed across a resume (issue #41: a LoRA run
resumed with `model.save_merged` switched off kept its old merged weights next to the new adapter, and
`from_pretrained` applied the change twice).

    publish_dir(target, write, what=..., attempts=2, share_with=[...])
        write(tmp) fills `.tmp-<name>-<pid>-<k>/` beside `target`; its files are made readable like the run's other
        files (transformers writes model.safetensors 0600), files identical to a file of the same name in one of
        `share_with` become hard links to it (best/, final/ and the last step checkpoint hold the same weights once,
        issue #42), everything is fsynced, then the directory is renamed over `target` (the old one moved aside
        first and deleted last). A full disk removes the partial directory and retries into a fresh one
        (`attempts` in all), then raises DiskFullError naming the disk and the place; the old `target` is kept.

A hard link is safe here because grpo never writes into a published file: every save is a new directory. A user
who edits a file of final/ in place edits the same file of best/ (`cp` a file before editing it, or
`cp -r --no-preserve=links`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from grpo.errors import DiskFullError
from grpo.tracking.rundir import disk_full, disk_full_message, format_bytes
from grpo.train.checkpoint.files import _fsync, _fsync_tree

__all__ = ["publish_dir", "make_readable", "link_identical"]

logger = logging.getLogger("grpo.train.checkpoint")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def make_readable(root: Path) -> None:
    """Give every file under `root` the mode a plain `open(..., "w")` gives (0666 less the umask: 0644 by default);
    transformers writes model.safetensors through a private temporary file, 0600."""
    mode = 0o666 & ~_umask()
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            os.chmod(p, mode)


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def link_identical(root: Path, share_with: Iterable[Path]) -> int:
    """Replace each file under `root` that is byte-identical to the file of the same relative path in one of
    `share_with` by a hard link to that file. Returns the bytes saved. A file system without hard links (or
    another device) keeps its copies."""
    saved = 0
    others = [Path(d) for d in share_with if d is not None and Path(d).is_dir() and Path(d) != root]
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        rel = p.relative_to(root)
        for other in others:
            twin = other / rel
            if not twin.is_file() or twin.stat().st_size != p.stat().st_size or os.path.samefile(twin, p):
                continue
            if _digest(twin) != _digest(p):
                continue
            link = p.with_name(f".link-{p.name}")
            try:
                os.link(twin, link)
                os.replace(link, p)
            except OSError:
                link.unlink(missing_ok=True)
                continue
            saved += p.stat().st_size
            break
    return saved


def _clean(root: Path, name: str) -> None:
    """Remove what an interrupted publish of `name` left: partial `.tmp-` dirs; an `.old-` copy is put back when
    the new one never arrived (a kill between the two renames)."""
    for p in sorted(root.glob(f".old-{name}-*")):
        if not (root / name).exists():
            os.rename(p, root / name)
            logger.warning("restored %s from %s (a save was interrupted)", root / name, p)
        else:
            shutil.rmtree(p, ignore_errors=True)
    for p in root.glob(f".tmp-{name}-*"):
        shutil.rmtree(p, ignore_errors=True)


def _swap(tmp: Path, target: Path) -> None:
    aside = target.with_name(f".old-{target.name}-{os.getpid()}")
    if target.exists():
        os.rename(target, aside)
    try:
        os.rename(tmp, target)
    except OSError:
        if aside.exists():
            os.rename(aside, target)
        raise
    _fsync(target.parent)
    shutil.rmtree(aside, ignore_errors=True)


def publish_dir(target: str | os.PathLike, write: Callable[[Path], None], *, what: str, attempts: int = 1,
                share_with: Iterable[Path] = (), needed: Callable[[], int | None] | None = None) -> Path:
    """Write a directory with `write(tmp)` and swap it in as `target` (see the module docstring). Returns target.
    needed(): about the bytes the directory takes, for the message of a full disk."""
    target = Path(target)
    root = target.parent
    root.mkdir(parents=True, exist_ok=True)
    _clean(root, target.name)
    share_with = list(share_with)
    last: BaseException | None = None
    for attempt in range(max(1, attempts)):
        tmp = root / f".tmp-{target.name}-{os.getpid()}-{attempt}"
        try:
            tmp.mkdir()
            write(tmp)
            make_readable(tmp)
            link_identical(tmp, share_with)
            _fsync_tree(tmp)
            _swap(tmp, target)
            return target
        except BaseException as e:
            full = isinstance(e, Exception) and disk_full(e, tmp)  # before the partial goes: torch's own words
            shutil.rmtree(tmp, ignore_errors=True)
            if not full:
                raise
            last = e
            if attempt + 1 < attempts:
                logger.warning("%s: %s; retrying into a fresh directory", what, disk_full_message(tmp))
    kept = f"the previous {target} is kept" if target.exists() else f"no {target.name}/ was written"
    try:
        size = needed() if needed is not None else None
    except Exception:  # noqa: BLE001 - an estimate for the message, never the error itself
        size = None
    raise DiskFullError(f"{disk_full_message(target, size)} ({what}; tried {attempts} time(s), a fresh directory "
                        f"each time); nothing half-written is left, {kept}") from last


def disk_report(run_dir: str | os.PathLike) -> str:
    """One line: what the run directory holds on disk (a file hard-linked under two names counted once, where it
    is first met: final/, then checkpoints/best/, then the step checkpoints), the optimizer state in it, and what
    deleting the step checkpoints (kept only for --resume) frees."""
    run_dir = Path(run_dir)
    seen: set[tuple[int, int]] = set()
    parts: dict[str, int] = {}
    optimizer = 0
    steps = sorted((run_dir / "checkpoints").glob("step-*"))
    order = [run_dir / "final", run_dir / "checkpoints" / "best", *steps]
    rest = [p for p in run_dir.iterdir() if p.name not in ("final", "checkpoints")] if run_dir.is_dir() else []
    for part in order + rest:
        files = [part] if part.is_file() else sorted(q for q in part.rglob("*") if q.is_file()) if part.is_dir() \
            else []
        size = 0
        for f in files:
            st = f.stat()
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            size += st.st_size
            if part in steps and f.name.startswith("optimizer."):
                optimizer += st.st_size
        parts[part.relative_to(run_dir).as_posix()] = size
    total = sum(parts.values())
    freed = sum(parts[p.relative_to(run_dir).as_posix()] for p in steps)
    shown = ", ".join(f"{k}/ {format_bytes(v)}" for k, v in parts.items()
                      if k == "final" or k.startswith("checkpoints/"))
    line = f"[grpo] on disk: {format_bytes(total)} in {run_dir} ({shown}; identical files stored once)"
    if steps:
        line += (f". The step checkpoints ({format_bytes(optimizer)} of it optimizer state) are only for --resume: "
                 f"`rm -r {run_dir}/checkpoints/step-*` frees {format_bytes(freed)}; final/ and checkpoints/best/ "
                 "stand alone")
    return line
