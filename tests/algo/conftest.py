"""Make `grpo` importable from the source tree when the package is not installed."""

import importlib.util
import pathlib
import sys

if importlib.util.find_spec("grpo") is None:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "src"))
