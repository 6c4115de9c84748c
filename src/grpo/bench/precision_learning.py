"""`python -m grpo.bench.precision_learning --model DIR`: model.compute_dtype=float32 against bfloat16, side by side
on a real model, seed by seed (grpo.bench.paired_learning; results: bench/results/precision_learning.json)."""

from __future__ import annotations

import sys

from grpo.bench.paired_learning import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:], "precision"))
