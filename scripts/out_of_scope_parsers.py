"""Measure what docs/rewards.md lists as still out of scope: third-party parsers of policy text that are not linear.

    python scripts/out_of_scope_parsers.py [--output PATH]

Results: --output, else <GRPO_CACHE>/bench-results/out_of_scope_parsers.json (grpo.bench.results); the committed file
the docs quote is rewritten only with `--output bench/results/out_of_scope_parsers.json`.

verifiers' XMLParser (an environment's rubric) on '<answer>' followed by n spaces, n = 500, 1000, 2000: the seconds
per parse and the growth exponent between the last two sizes; math-verify's `verify` of the answer 5 against
'\\boxed{10^{99999999}}' in a child process killed after 20 s (whether it finished). Needs the `verifiers` and `math`
extras.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import time

SIZES = (500, 1000, 2000)
MATH_LIMIT_S = 20.0
COMMITTED = "bench/results/out_of_scope_parsers.json"  # what docs/rewards.md quotes: written only with --output


def xml_parser_seconds() -> dict:
    import verifiers as vf

    parser = vf.XMLParser(["answer"])
    out = {}
    for n in SIZES:
        t = time.perf_counter()
        parser.parse("<answer>" + " " * n)
        out[n] = time.perf_counter() - t
    return out


def _math_verify_child() -> None:
    from math_verify import parse, verify

    verify(parse("\\boxed{5}"), parse("\\boxed{10^{99999999}}"))  # as a math reward compares an answer


def math_verify_finishes(limit_s: float) -> tuple[bool, float]:
    proc = mp.get_context("spawn").Process(target=_math_verify_child)
    t = time.perf_counter()
    proc.start()
    proc.join(limit_s)
    finished = not proc.is_alive()
    if not finished:
        proc.kill()
        proc.join()
    return finished, time.perf_counter() - t


def main() -> int:
    """Time both parsers, print the result and write it (the cache by default, or --output) and say where."""
    p = argparse.ArgumentParser()
    p.add_argument("--output", default=None, help="the results file (default <GRPO_CACHE>/bench-results/"
                   f"out_of_scope_parsers.json; the committed one: {COMMITTED})")
    a = p.parse_args()
    from grpo.bench.results import results_path, wrote
    from grpo.tracking.rundir import check_output_file, write_text_atomic

    if a.output is not None:
        check_output_file(a.output, "--output")
    out = results_path("out_of_scope_parsers.json", a.output)
    xml = xml_parser_seconds()
    exponent = math.log(xml[SIZES[-1]] / xml[SIZES[-2]]) / math.log(SIZES[-1] / SIZES[-2])
    finished, seconds = math_verify_finishes(MATH_LIMIT_S)
    result = {"xml_parser": {"pattern": "<answer> + n spaces", "seconds": {str(n): s for n, s in xml.items()},
                             "exponent": exponent},
              "math_verify": {"input": "\\boxed{10^{99999999}}", "limit_s": MATH_LIMIT_S, "finished": finished,
                              "seconds": seconds},
              "load_before": os.getloadavg()[0], "cpu_count": os.cpu_count()}
    write_text_atomic(out, json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    print(wrote(out, COMMITTED))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
