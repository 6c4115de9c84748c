"""The parallel tests share the model tests' helpers (tests/models/tiny_hf.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
