"""Measure the figures docs/rewards.md gives for the third attack round on rewards (issue #40), as the code is now.

    PYTHONPATH=src python scripts/round_three_figures.py [--output PATH]

Results: --output, else <GRPO_CACHE>/bench-results/round_three.json (grpo.bench.results); the committed file the docs
quote is rewritten only with `--output bench/results/round_three.json`.

- ipc: bytes of System V semaphore sets and queued messages a program under memory_mb=256 holds in bwrap, and the
  errno of its first semget/msgget/mq_open (tests/rewards/test_sandbox_safety.py's program);
- attacks: the score of each round-three wrong program and its honest twin (tests/rewards/test_round_three.py);
- budget: seconds code_tests takes on each costly expected side of row 4 (one completion, a 2 s sandbox timeout
  included), and the peak of the trainer's own Python allocations (tracemalloc) while seven lists of 2M ints are
  judged;
- overhead: milliseconds per completion of judging 4 call checks in the judge process against in the thread.
Needs bubblewrap.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "rewards"), str(ROOT / "tests")]
COMMITTED = "bench/results/round_three.json"  # what docs/rewards.md quotes: written only with --output naming it


def ipc() -> dict:
    from test_sandbox_safety import IPC

    from grpo.sandbox import run_python

    res = run_python(IPC, backend="bwrap", memory_mb=256, timeout=30)
    return eval(res.stdout)  # the test's own program prints a dict of ints


def attacks() -> dict:
    from test_round_three import ATTACKS, score

    return {name: {"honest": score(h, t), "wrong": score(w, t)} for name, (t, h, w) in sorted(ATTACKS.items())}


def budget() -> dict:
    from test_round_three_budget import HONEST, RUN_S, STALLS

    from grpo.rewards.code_exec import code_tests

    out = {}
    for name, test in sorted(STALLS.items()):
        t = time.perf_counter()
        code_tests([None], [HONEST], [[test]], timeout=RUN_S)
        out[f"{name}_s"] = round(time.perf_counter() - t, 2)
    tracemalloc.start()
    code_tests([None], [HONEST], [["assert f(1) == [" + ", ".join(["list(range(2000000))"] * 7) + "]"]],
               timeout=RUN_S)
    out["seven_lists_trainer_peak_mb"] = round(tracemalloc.get_traced_memory()[1] / 2**20, 1)
    tracemalloc.stop()
    return out


def overhead(n: int = 500) -> dict:
    from grpo.sandbox.budget import evaluate_budgeted
    from grpo.sandbox.checks import evaluate_check, parse_tests

    plan = parse_tests([f"assert f({i}) == {2 * i + 1}" for i in range(4)])
    values = [{0: 2 * i + 1} for i in range(4)]
    evaluate_budgeted(plan.calls, values, 1e-6)  # the worker's start
    t = time.perf_counter()
    for _ in range(n):
        evaluate_budgeted(plan.calls, values, 1e-6)
    process_ms = (time.perf_counter() - t) / n * 1e3
    t = time.perf_counter()
    for _ in range(n):
        [evaluate_check(c, v, 1e-6) for c, v in zip(plan.calls, values)]
    thread_ms = (time.perf_counter() - t) / n * 1e3
    return {"judge_process_ms_per_completion": round(process_ms, 3), "in_thread_ms_per_completion": round(thread_ms, 4)}


def main() -> None:
    """Measure the four parts, write them (the cache by default, or --output), print them and say where."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", default=None, help="the results file (default <GRPO_CACHE>/bench-results/"
                    f"round_three.json; the committed one: {COMMITTED})")
    args = ap.parse_args()
    from grpo.bench.results import results_path, wrote
    from grpo.tracking.rundir import check_output_file

    if args.output is not None:
        check_output_file(args.output, "--output")
    out = results_path("round_three.json", args.output)
    result = {"ipc": ipc(), "attacks": attacks(), "budget": budget(), "overhead": overhead()}
    out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(json.dumps(result, indent=2, sort_keys=True))
    print(wrote(out, COMMITTED))


if __name__ == "__main__":
    main()
