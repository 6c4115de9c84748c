"""Measure, in one run, how long the code reward judges each stall shape of issue #51 against an honest program.

    PYTHONPATH=src python scripts/judge_budget.py [--output bench/results/judge_budget.json] [--repeats 3]

Each figure is the wall time of one `code_tests` call on one completion (the reward call a training step makes):
- honest: the built-in code task's row (four `assert f(x) == y` of a linear f) and its right program, the first call
  of the process (the judge process's start included) and the next ones;
- the three shapes of tests/rewards/test_judge_budget.py (`round(5, -10**9)`, `sum` over a long list of lists, `str`
  of a shared nested list), once as test text (the row's parse meets the cost) and once through the program's values
  (the evaluation meets it), each on a row the process has not seen, and for the test text the same row once more
  (the next step: the row's plan is kept);
- the same shapes sized so that their expected side takes about 1.5-2.5 s here (under the 3 s parse budget the judge
  had before, which then let every evaluation repeat that cost), with the honest program that returns its value;
- the score, whether "judge budget exceeded" was logged, and each median's ratio to the honest program's (warm).
Timings on a shared machine are noisy: compare the ratios of one run. The JSON goes only to --output (by default
$GRPO_CACHE/bench-results/judge_budget.json) and is printed. Needs bubblewrap.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "rewards"), str(ROOT / "tests")]

HONEST_ROW = ["assert f(0) == 1", "assert f(1) == 3", "assert f(4) == 9", "assert f(7) == 15"]
HONEST = "```python\ndef f(x):\n    return 2 * x + 1\n```"
REASON = "judge budget exceeded"
NEAR = {  # (test, the value an honest f(1) returns): each expected side costs about 1.5-2.5 s on 2 cores
    "round": ("assert f(1) == round(5, -4 * 10**6)", 0),
    "sum_of_lists": ("assert f(1) == len(sum([[1] * 1000] * 1000, []))", 1_000_000),
    "str_of_shared": ("assert f(1) == len(str([[[[[0] * 30] * 30] * 30] * 30] * 30))", 74_575_860),
}


class _Seen(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.text: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.text.append(record.getMessage())


def default_output() -> Path:
    cache = Path(os.environ.get("GRPO_CACHE", Path.home() / ".cache" / "grpo"))
    return cache / "bench-results" / "judge_budget.json"


def timed(code_tests, completion: str, row: list, timeout: float, seen: _Seen) -> dict:
    seen.text.clear()
    t = time.perf_counter()
    out = code_tests([None], [completion], [row], timeout=timeout)
    return {"s": time.perf_counter() - t, "score": out[0], "reason_logged": any(REASON in m for m in seen.text)}


def summary(runs: list[dict], honest_s: float | None = None) -> dict:
    out = {"s": [round(r["s"], 4) for r in runs], "median_s": round(statistics.median(r["s"] for r in runs), 4),
           "scores": [r["score"] for r in runs], "reason_logged": all(r["reason_logged"] for r in runs)}
    if honest_s:
        out["ratio_to_honest"] = round(out["median_s"] / honest_s, 1)
    return out


def measure(repeats: int, timeout: float) -> dict:
    from test_judge_budget import FROM_VALUES, STALLS, program

    from grpo.rewards.code_exec import code_tests
    from grpo.sandbox import budget

    seen = _Seen()
    logging.getLogger("grpo.rewards").addHandler(seen)
    cold = timed(code_tests, HONEST, HONEST_ROW + ["assert f(2) == 5"], timeout, seen)  # the judge's first start
    honest = [timed(code_tests, HONEST, HONEST_ROW + [f"assert f({10 + k}) == {21 + 2 * k}"], timeout, seen)
              for k in range(max(5, repeats))]
    honest_s = statistics.median(r["s"] for r in honest)
    shapes = {}
    for name, test in sorted(STALLS.items()):
        runs, again = [], []
        for k in range(repeats):
            row = [f"{test}  # {k}"]
            runs.append(timed(code_tests, program("0"), row, timeout, seen))
            again.append(timed(code_tests, program("0"), row, timeout, seen))
        shapes[f"{name}/test_text"] = {**summary(runs, honest_s), "same_row_again": summary(again, honest_s)}
    for name, (test, _, attack) in sorted(FROM_VALUES.items()):
        runs = [timed(code_tests, program(attack), [f"{test}  # {k}"], timeout, seen) for k in range(repeats)]
        shapes[f"{name}/program_values"] = summary(runs, honest_s)
    for name, (test, value) in sorted(NEAR.items()):
        runs = [timed(code_tests, program(repr(value)), [f"{test}  # {k}"], timeout, seen) for k in range(repeats)]
        shapes[f"{name}/near_the_old_parse_budget"] = summary(runs, honest_s)
    logging.getLogger("grpo.rewards").removeHandler(seen)
    return {
        "judge_budget_s": getattr(budget, "JUDGE_BUDGET_S", None),
        "program_timeout_s": timeout,
        "honest": {"first_call_s": round(cold["s"], 3), **summary(honest)},
        "shapes": shapes,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", type=Path, default=None, help="where the JSON goes (default: %s)" % default_output())
    ap.add_argument("--repeats", type=int, default=3, help="calls of each shape, each on a new row (default 3)")
    ap.add_argument("--timeout", type=float, default=10.0, help="each program's sandbox timeout (code_tests' default)")
    args = ap.parse_args()
    if args.repeats < 1 or not args.timeout > 0:
        ap.error("--repeats must be at least 1 and --timeout positive")
    output = args.output or default_output()
    output.parent.mkdir(parents=True, exist_ok=True)
    import grpo

    src = Path(grpo.__file__).resolve().parent  # the code measured: this checkout's, or another (a "before" copy)
    commit = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    result = {"machine": {"cpus": os.cpu_count(), "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
                          "python": platform.python_version()},
              "code": {"commit": commit, "dirty": bool(commit) and subprocess.run(
                  ["git", "-C", str(src), "diff", "--quiet", "HEAD", "--", "."]).returncode != 0,
                  "grpo": str(src.relative_to(ROOT)) if src.is_relative_to(ROOT) else str(src)},
              **measure(args.repeats, args.timeout)}
    text = json.dumps(result, indent=2, sort_keys=True) + "\n"
    output.write_text(text)
    print(text, end="")
    print(f"written to {output}", file=sys.stderr)


if __name__ == "__main__":
    main()
