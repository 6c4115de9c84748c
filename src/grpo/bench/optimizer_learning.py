"""`python -m grpo.bench.optimizer_learning --model DIR`: optim.name=adamw against adamw_8bit, side by side
on a real model, seed by seed (grpo.bench.paired_learning; results: bench/results/optimizer_learning.json)."""

from __future__ import annotations

import sys

from grpo.bench.paired_learning import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:], "optimizer"))
