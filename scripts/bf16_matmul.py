"""bfloat16 against float32 matrix products on this CPU, on the shapes of the models a user starts with, beside the
CPU's bf16 flags: whether `model.frozen_dtype=auto` (grpo.models.precision) is right to keep float32 here.

    python scripts/bf16_matmul.py [--quick] [--output PATH]

Results: --output, else <GRPO_CACHE>/bench-results/bf16_matmul.json (grpo.bench.results); the committed file the docs
quote is rewritten only with `--output bench/results/bf16_matmul.json`. --quick: one small shape, a smoke run.

Each shape (M x K x N) is multiplied `REPEATS` times per dtype after one untimed product, alternating the dtypes;
the median GFLOP/s (2 M K N / seconds) of each, and their ratio, go to the results file with the CPU's model name,
its avx512_bf16 / amx_bf16 flags and the load average (a shared machine slows both dtypes alike).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

# (M, K, N): a micro-batch through the 0.5B MLP, a decode step's LM head of 64 rows (a quarter of Qwen's vocabulary),
# a micro-batch through the 1.5B MLP
SHAPES = [(2048, 896, 4864), (64, 896, 37984), (296, 1536, 8960)]
QUICK_SHAPES = [(64, 64, 64)]  # --quick: the script's path in a fraction of a second (tests/test_bench_results.py)
REPEATS = 3
COMMITTED = "bench/results/bf16_matmul.json"  # what docs/memory.md quotes: written only with --output naming it


def gflops(m: int, k: int, n: int, dtype: torch.dtype) -> list[float]:
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    a @ b
    out = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        a @ b
        out.append(2 * m * k * n / (time.perf_counter() - t) / 1e9)
    return out


def main(argv: list[str] | None = None) -> None:
    """Measure every shape (QUICK_SHAPES with --quick), print a line each, write the results file and say where."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", default=None, help=f"the results file (default <GRPO_CACHE>/bench-results/"
                   f"bf16_matmul.json; the committed one: {COMMITTED})")
    p.add_argument("--quick", action="store_true", help="one small shape: a smoke run, not a measurement")
    args = p.parse_args(argv)
    from grpo.bench.results import results_path, wrote
    from grpo.models.precision import cpu_native_bf16
    from grpo.tracking.rundir import check_output_file

    if args.output is not None:
        check_output_file(args.output, "--output")
    out = results_path("bf16_matmul.json", args.output)

    cpuinfo = Path("/proc/cpuinfo").read_text()
    name = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")), "")
    rows = []
    load = os.getloadavg()[0]
    for m, k, n in QUICK_SHAPES if args.quick else SHAPES:
        f32, bf16 = gflops(m, k, n, torch.float32), gflops(m, k, n, torch.bfloat16)
        row = {"shape": [m, k, n], "float32_gflops": statistics.median(f32), "bfloat16_gflops": statistics.median(bf16)}
        row["bf16_over_fp32"] = row["bfloat16_gflops"] / row["float32_gflops"]
        rows.append(row)
        print(f"{m}x{k}x{n}: float32 {row['float32_gflops']:.1f} GFLOP/s, bfloat16 {row['bfloat16_gflops']:.1f} "
              f"({row['bf16_over_fp32']:.3f}x)")
    result = {"cpu": name, "native_bf16": cpu_native_bf16(), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "load_avg_before": load, "load_avg_after": os.getloadavg()[0],
              "quick": args.quick, "shapes": rows}
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(wrote(out, COMMITTED))


if __name__ == "__main__":
    main()
