"""Deleting a run's working directory, whatever the program left in it (deep trees, odd names, files it made
read-only), never raising and never taking longer than a deadline; what is left goes to a background janitor."""

from __future__ import annotations

import logging
import os
import queue
import secrets
import threading
import time

logger = logging.getLogger("grpo.rewards")

_JANITOR_S = 300.0  # after a run's own cleanup time, a background thread gets this long more


def remove_tree(path: str, deadline: float, *, log: bool = True) -> bool:
    """Delete directory `path` and everything under it, never raising and stopping at `deadline` (monotonic).

    No recursion and no long paths: each directory met is first renamed to the top level (`path`), so every
    operation is relative to a file descriptor at depth one or two, whatever the tree's depth (a 3,000-deep tree
    costs 3,000 renames). Errors are skipped; what is left when time runs out is logged. -> True if it is gone."""
    try:
        root = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return True
    except OSError:
        _unlink(path)
        return not os.path.lexists(path)
    tag, count = secrets.token_hex(6), 0
    todo = _empty_dir(root, root, tag, 0)
    count = len(todo)
    try:
        while todo and time.monotonic() < deadline:
            name = todo.pop()
            fd = _open_dir(name, root)
            if fd is None:
                continue
            try:
                moved = _empty_dir(fd, root, tag, count)
            finally:
                os.close(fd)
            count += len(moved)
            todo += moved
            try:
                os.rmdir(name, dir_fd=root)
            except OSError:
                pass
    except Exception:  # noqa: BLE001 - cleanup never raises
        pass
    finally:
        os.close(root)
    try:
        os.rmdir(path)
    except OSError:
        pass
    gone = not os.path.lexists(path)
    if not gone and log:
        logger.warning("sandbox cleanup: could not remove all of %s in time; left in place", path)
    return gone


_janitor_queue: queue.SimpleQueue[str] = queue.SimpleQueue()
_janitor_started = threading.Event()


def finish_later(path: str) -> None:
    """Hand a directory the call could not delete in its time to a background thread (the call returns now)."""
    if not _janitor_started.is_set():
        _janitor_started.set()
        threading.Thread(target=_janitor, name="grpo-sandbox-cleanup", daemon=True).start()
    _janitor_queue.put(path)


def _janitor() -> None:
    while True:
        path = _janitor_queue.get()
        remove_tree(path, time.monotonic() + _JANITOR_S)


def _open_dir(name: str, root: int) -> int | None:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        return os.open(name, flags, dir_fd=root)
    except PermissionError:
        try:  # a directory the program made unreadable (same uid): open it up once
            os.chmod(name, 0o700, dir_fd=root, follow_symlinks=False)
            return os.open(name, flags, dir_fd=root)
        except (OSError, NotImplementedError):
            return None
    except OSError:
        return None


def _empty_dir(fd: int, root: int, tag: str, start: int) -> list[str]:
    """Unlink the non-directories in directory `fd`; rename its subdirectories to the top level (`root`) under
    fresh names, which are returned. Errors are skipped."""
    moved: list[str] = []
    try:
        entries = list(os.scandir(fd))
    except OSError:
        return moved
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False):
                if fd == root:
                    moved.append(e.name)
                    continue
                new = f".grpo-rm-{tag}-{start + len(moved)}"
                os.rename(e.name, new, src_dir_fd=fd, dst_dir_fd=root)
                moved.append(new)
            else:
                os.unlink(e.name, dir_fd=fd)
        except OSError:
            continue
    return moved


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
