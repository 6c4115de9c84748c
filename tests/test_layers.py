"""The package's layers point one way (docs/ARCHITECTURE.md):

    algo, types, errors  <-  tokens  <-  config  <-  models, rewards, tracking  <-  envs  <-  data, rollout, parallel  <-  train
        <-  compare_worker  <-  bench_vocab, bench_engines, bench_workload, bench_report, compare  <-  bench  <-  cli

Every import between grpo's subpackages, at module level or inside a function, must go to a lower layer. Inside a
function is no exemption: an import moved into a function to hide a cycle is still a cycle. Two edges between
neighbours are also forbidden: data/ never loads a model, and only parallel/ calls torch.distributed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grpo

SRC = Path(grpo.__file__).resolve().parent
LAYERS = {
    "algo": 0, "types": 0, "tokens": 0.5,
    "config": 1, "config_hints": 0, "errors": 0,
    "models": 2, "rewards": 2, "tracking": 2,
    "data": 3, "rollout": 3, "parallel": 3, "envs": 2.5,
    "train": 4,
    "bench_vocab": 5, "bench_engines": 5, "bench_workload": 5, "bench_report": 5, "compare": 5, "compare_worker": 4.5, "bench": 5.5,
    "cli": 6, "__init__": 6, "__main__": 6,
}
FORBIDDEN = {("data", "models")}


def _unit(module: str) -> str:
    """'grpo.train.loop' -> 'train'; 'grpo' -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path, package: str | None = None):
    """(line, imported module) of every absolute or relative import in the file, wherever it stands (module level,
    function bodies, conditionals). package: the file's package, for relative imports (default: from its path)."""
    if package is None:
        package = ".".join(path.relative_to(SRC.parent).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                yield node.lineno, ".".join(base + ([node.module] if node.module else []))
            elif node.module == "grpo":  # `from grpo import bench_vocab` imports the module grpo.bench_vocab
                for alias in node.names:
                    yield node.lineno, f"grpo.{alias.name}"
            elif node.module:
                yield node.lineno, node.module


def _edges():
    for path in sorted(SRC.rglob("*.py")):
        src_unit = _unit(".".join(path.relative_to(SRC.parent).with_suffix("").parts))
        for line, target in _imports(path):
            if target == "grpo" or target.startswith("grpo."):
                dst_unit = _unit(target)
                if dst_unit != src_unit:
                    yield f"{path.relative_to(SRC)}:{line}", src_unit, dst_unit, target


def test_every_unit_has_a_layer():
    units = {_unit(".".join(p.relative_to(SRC.parent).with_suffix("").parts)) for p in SRC.rglob("*.py")}
    assert units <= LAYERS.keys(), f"place these in LAYERS: {sorted(units - LAYERS.keys())}"


def test_imports_point_down():
    bad = [f"{where}: {src} imports {target} ({dst}, layer {LAYERS[dst]} >= {LAYERS[src]})"
           for where, src, dst, target in _edges() if LAYERS[dst] >= LAYERS[src]]
    bad += [f"{where}: {src} imports {target}" for where, src, dst, target in _edges() if (src, dst) in FORBIDDEN]
    assert not bad, "imports against the layers:\n  " + "\n  ".join(bad)


def test_only_parallel_calls_torch_distributed():
    bad = [f"{p.relative_to(SRC)}:{line}" for p in SRC.rglob("*.py") if p.parent.name != "parallel"
           for line, target in _imports(p) if target.startswith("torch.distributed")]
    assert not bad, f"torch.distributed outside parallel/: {bad}"


def test_the_checker_sees_hidden_and_relative_imports(tmp_path):
    """The checker itself: an import inside a function, a relative import and `from grpo import module` are found."""
    f = tmp_path / "m.py"
    f.write_text("def g():\n    from grpo.train import loop\n    from ..models import forward\n"
                 "from grpo import bench_vocab\n")
    found = set(_imports(f, package="grpo.data"))
    assert {(2, "grpo.train"), (3, "grpo.models"), (4, "grpo.bench_vocab")} <= found
