"""grpo.algo is pure tensor math: importing it loads torch and nothing heavier."""

import ast
import os
import pathlib
import subprocess
import sys

import grpo.algo

ALGO_DIR = pathlib.Path(grpo.algo.__file__).parent
SRC = ALGO_DIR.parents[1]

PROBE = """
import sys
import torch  # torch itself may import parts of torch.distributed; we check what grpo.algo adds on top
before = set(sys.modules)
import grpo.algo
added = sorted(set(sys.modules) - before)
bad = [m for m in added if not m.startswith("grpo")]
assert "transformers" not in sys.modules, "transformers was imported"
assert not [m for m in added if m.startswith("torch.distributed")], added
assert "grpo.config" not in sys.modules, "grpo.config was imported"
assert not bad, bad
print("ok")
"""


def test_fresh_import_loads_no_transformers_or_distributed():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_sources_import_only_torch_and_the_standard_library():
    allowed = {"__future__", "torch", "typing", "collections", "math", "numbers", "grpo"}
    for path in ALGO_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"
                assert not name.startswith("torch.distributed"), f"{path.name} imports {name}"
                assert not name.startswith("grpo") or name.startswith("grpo.algo"), f"{path.name} imports {name}"


def test_modules_stay_small():
    for path in ALGO_DIR.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 400, path.name
