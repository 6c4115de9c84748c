"""The package's layers point one way (docs/ARCHITECTURE.md):

    algo, types, errors  <-  tokens  <-  config  <-  sandbox  <-  models, rewards, tracking  <-  envs
        <-  data, rollout, parallel  <-  warmup  <-  train  <-  compare, bench  <-  cli

Every import between grpo's subpackages, at module level or inside a function, must go to a lower layer. Inside a
function is no exemption: an import moved into a function to hide a cycle is still a cycle. Two edges between
neighbours are also forbidden: data/ never loads a model, and only parallel/ calls torch.distributed. Inside one
folder the modules import each other without a circle, and no source file is over MAX_LINES lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grpo

SRC = Path(grpo.__file__).resolve().parent
LAYERS = {
    "algo": 0, "types": 0, "errors": 0, "scan": 0, "tokens": 0.5,
    "config": 1,
    "sandbox": 1.5,
    "models": 2, "rewards": 2, "tracking": 2,
    "envs": 2.5,
    "data": 3, "rollout": 3, "parallel": 3,
    "warmup": 3.5,
    "train": 4,
    "compare": 5, "bench": 5,
    "cli": 6, "__init__": 6, "__main__": 6,
}
FORBIDDEN = {("data", "models")}
MAX_LINES = 450


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
            elif node.module:  # `from grpo.bench import vocab` imports the module grpo.bench.vocab
                for alias in node.names:
                    yield node.lineno, _submodule(node.module, alias.name) or node.module


def _submodule(package: str, name: str) -> str | None:
    """'grpo.bench.vocab' when `from grpo.bench import vocab` names a module of grpo's source, else None."""
    if not package.startswith("grpo"):
        return None
    base = SRC.parent.joinpath(*package.split("."), name)
    return f"{package}.{name}" if base.with_suffix(".py").exists() or (base / "__init__.py").exists() else None


def _module(path: Path) -> str:
    """src/grpo/data/base.py -> 'grpo.data.base'; src/grpo/data/__init__.py -> 'grpo.data'."""
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _folder_graph(folder: Path) -> dict[str, set[str]]:
    """module -> the modules of the same folder it imports (the folder's __init__ included), at any depth of code.
    An import of a name inside a module (`from grpo.data.base import Task`) is an import of that module."""
    mods = {_module(p): p for p in folder.glob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for _, target in _imports(p):
            hit = max((n for n in mods if target == n or target.startswith(n + ".")), key=len, default=None)
            if hit is not None and hit != m:
                graph[m].add(hit)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of `graph` as [a, b, ..., a], or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


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
    """The checker itself: an import inside a function, a relative import and `from grpo.pkg import module` are found."""
    f = tmp_path / "m.py"
    f.write_text("def g():\n    from grpo.train import loop\n    from ..models import forward\n"
                 "from grpo.bench import vocab as bench_vocab\n")
    found = set(_imports(f, package="grpo.data"))
    assert {(2, "grpo.train.loop"), (3, "grpo.models"), (4, "grpo.bench.vocab")} <= found


def test_no_circle_inside_a_folder():
    folders = sorted({p.parent for p in SRC.rglob("*.py")})
    circles = [" -> ".join(c) for f in folders if (c := _cycle(_folder_graph(f)))]
    assert not circles, "imports in a circle inside one folder:\n  " + "\n  ".join(circles)


def test_the_circle_checker_finds_a_circle(tmp_path):
    """The checker itself, on a folder whose modules import each other through a function-level import."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    pkg = tmp_path / "grpo" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "one.py").write_text("from grpo.pkg.two import f\n")
    (pkg / "two.py").write_text("def f():\n    from grpo.pkg import one\n")
    (pkg / "__init__.py").write_text("")
    graph = {m: set() for m in ("grpo.pkg.one", "grpo.pkg.two")}
    for p in pkg.glob("[ot]*.py"):
        for _, target in _imports(p, package="grpo.pkg"):
            graph[f"grpo.pkg.{p.stem}"].add(target if target != "grpo.pkg" else "grpo.pkg.one")
    assert _cycle(graph)


def test_no_source_file_is_over_max_lines():
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"split these along their seams (over {MAX_LINES} lines): {long}"
