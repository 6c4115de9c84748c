"""`python -m grpo.bench.correction_learning --model DIR`: bf16 compute (sampler and trainer) with algo.tis_cap=null
against algo.tis_cap=2, side by side on a real model, seed by seed (grpo.bench.paired_learning; results:
bench/results/correction_learning.json): what truncated importance sampling of the sampler's rounding does to
learning."""

from __future__ import annotations

import sys

from grpo.bench.paired_learning import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:], "correction"))
