"""Run-directory writers: metrics.jsonl (one JSON object per step), samples.jsonl (whole groups)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from grpo.errors import DiskFullError


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf; a missing value reads as null
    return value


class JsonlWriter:
    """Appends one JSON object per line, flushed at once, so a killed run keeps every written line."""

    def __init__(self, path: Path, truncate_after_step: int | None = None):
        self.path = Path(path)
        if truncate_after_step is not None and self.path.exists():
            # On resume, drop lines written after the checkpoint so the file shows one consistent history.
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= truncate_after_step]
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(line + "\n" for line in kept))
            os.replace(tmp, self.path)
        self._file = open(self.path, "a", encoding="utf-8")
        self._failed = False

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps({k: _clean(v) for k, v in record.items()}, ensure_ascii=False) + "\n"
        try:
            self._file.write(line)
            self._file.flush()
        except OSError as e:
            from grpo.tracking.rundir import disk_full, disk_full_message

            if disk_full(e):  # the resume drops a line cut short (grpo.train.checkpoint.resume.repair_jsonl)
                self._failed = True
                raise DiskFullError(f"{disk_full_message(self.path, len(line.encode()))}; the line may be cut "
                                    "short, a resume drops it") from e
            raise

    def close(self) -> None:
        try:
            self._file.close()
        except OSError:  # the rest of a line a full disk cut short: write() said so already
            if not self._failed:
                raise


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON through a temporary file and rename, so readers never see half a file (a full disk: DiskFullError
    naming it, grpo.tracking.rundir.write_text_atomic)."""
    from grpo.tracking.rundir import write_text_atomic

    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str))
