"""Where a benchmark writes its results file: the committed one only when asked.

    results_path(name, output)   `output` when the user named one, else <GRPO_CACHE>/bench-results/<name>
    wrote(path, committed, how)  the line a writer prints after writing: where, and how to regenerate the committed file

The files under bench/results/ (and bench/learning/results/) are the ones the docs quote, and tests/test_figures.py
checks every quoted figure against them: a benchmark run with its defaults must not rewrite them, or the suite goes
red on a user who only measured their machine. So a writer's default is a file in the cache (grpo.models.builtin's
cache_root: $GRPO_CACHE or ~/.cache/grpo), and the committed file is rewritten only with `--output` naming it.
"""

from __future__ import annotations

from pathlib import Path

COMMITTED_DIR = "bench/results"


def default_dir() -> Path:
    """The folder benchmarks write to by default: <cache_root()>/bench-results (not created here)."""
    from grpo.models.builtin import cache_root

    return cache_root() / "bench-results"


def results_path(name: str, output: str | Path | None = None) -> Path:
    """Where to write the results file `name` (e.g. "memory.json"; a subfolder allowed: "learning/medium.json"):
    `output` as the user gave it (e.g. bench/results/memory.json, to regenerate what the docs quote), else
    default_dir()/name, its folder created. Checking a user's `output` stays the caller's (check_output_file)."""
    if output is not None and str(output) != "":
        return Path(output).expanduser()
    path = default_dir() / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def is_committed(path: str | Path, committed: str) -> bool:
    """Whether `path` is the committed results file `committed` (a path from the repository root, e.g.
    bench/results/memory.json), from whatever working directory it was named."""
    return Path(path).expanduser().resolve().as_posix().endswith("/" + committed.strip("/"))


def wrote(path: str | Path, committed: str, how: str = "") -> str:
    """The line a writer prints once `path` is written: "wrote PATH", and when PATH is not the committed file
    `committed` (e.g. bench/results/memory.json), that the committed file, which the docs quote, is regenerated
    with `--output committed` (after `how`, the other arguments that measured it, e.g. "--model DIR")."""
    line = f"wrote {path}"
    if not is_committed(path, committed):
        line += (f" (the committed {committed}, which the docs quote, is regenerated with "
                 f"{how + ' ' if how else ''}--output {committed})")
    return line
