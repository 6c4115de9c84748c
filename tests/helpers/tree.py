"""A directory's content as a comparable value, for the tests that prove nothing was written, moved or deleted."""

from __future__ import annotations

import hashlib
from pathlib import Path


def tree_digest(root: Path) -> dict[str, str]:
    """{path relative to root: sha256 of the file, or "dir"} of everything under root ({} when it is missing)."""
    root = Path(root)
    if not root.exists():
        return {}
    return {p.relative_to(root).as_posix(): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}
