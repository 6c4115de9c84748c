"""Issue #40, row 4: whatever the judge computes from test text runs in its own process under a time and a real
memory budget (grpo.sandbox.budget), never in the trainer's thread; constants are substituted with a size bound; a
row over budget scores 0 with the reason (issue #51: it was unverifiable, run in the sandbox), named in the log, and
the call returns in bounded time. Each case of the issue's row is a test with a generous time bound (before the
change each one stalled the calling thread, or raised); tests/rewards/test_judge_budget.py holds issue #51's."""

from __future__ import annotations

import logging
import threading
import time
import tracemalloc

import pytest

from grpo.rewards.code_exec import code_tests, plan_row
from grpo.sandbox import budget
from grpo.sandbox.checks import parse_tests

HONEST = "```python\ndef f(x):\n    return 0\n```"
RUN_S = 2.0  # each program's sandbox timeout here
LIMIT_S = budget.JUDGE_BUDGET_S + RUN_S + 5.0  # the judge's budget, one sandbox run, slack for a loaded machine


def within(limit_s: float, fn, *args, **kw):
    """fn(*args, **kw) in a daemon thread: its value, or a failure if it has not returned in limit_s (the thread is
    left behind: before the change these calls ran for minutes)."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn(*args, **kw)), daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(limit_s)
    assert out, f"still running after {limit_s} s"
    return out[0], time.monotonic() - t0


NESTED = "[[[[[[0] * 40] * 40] * 40] * 40] * 40] * 40"  # 4e9 items through shared lists, each `*` within budget
STALLS = {
    "round": "assert f(1) == round(5, -10**9)",
    "sum_of_lists": "assert f(1) == sum([[1] * 1000] * 3000, [])",
    "str_of_shared": f"assert f(1) == str({NESTED})",
    "eq_of_shared": f"assert f(1) == 0 and {NESTED} == {NESTED}",
}


@pytest.mark.parametrize("name", sorted(STALLS))
def test_a_costly_expected_side_is_over_budget_and_the_call_returns(name, caplog):
    caplog.set_level(logging.WARNING, logger="grpo.rewards")
    test = STALLS[name]
    scores, took = within(LIMIT_S, code_tests, [None], [HONEST], [[test, "assert f(2) == 0"]], partial=True,
                          timeout=RUN_S)
    assert "judge budget exceeded" in caplog.text and "row 0" in caplog.text
    plan = plan_row([test, "assert f(2) == 0"], None, 0)  # kept: parsed once per process
    assert plan.over_budget.startswith("judge budget exceeded") and not plan.n
    assert scores == [0.0]  # never unverifiable (forgeable) or missing: 0, even with partial=True


def test_values_within_the_build_budget_do_not_grow_the_trainer(caplog):
    """Seven lists of 2M ints, each within MAX_BUILD_BYTES at 8 bytes an item, are ~500 MB of real memory: before,
    built in the trainer's process (455 MB in 3.5 s); now in the judge process, whose RLIMIT_AS stops it."""
    caplog.set_level(logging.WARNING, logger="grpo.rewards")
    test = "assert f(1) == [" + ", ".join(["list(range(2000000))"] * 7) + "]"
    tracemalloc.start()
    try:
        within(LIMIT_S, code_tests, [None], [HONEST], [[test]], timeout=RUN_S)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50 << 20, f"the trainer's Python allocations peaked at {peak >> 20} MB"
    assert "judge budget exceeded (memory" in caplog.text


def test_constants_substituted_into_each_other_are_bounded():
    """216 bytes of test text (five levels of 12 copies) took 5.4 s to parse before (the issue's 226 bytes: 12.8 s);
    420 nested constants raised RecursionError out of code_tests. Both are now unverifiable within a second or two."""
    levels = "a = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"{n} = [{', '.join([p] * 12)}]\n" for p, n in zip("abcd", "bcde")) + "assert f(1) == e\n"
    plan, took = within(10.0, parse_tests, [levels])
    assert plan.unverifiable == [levels] and took < 1.0
    nested = "a0 = 0\n" + "".join(f"a{k} = [a{k - 1}]\n" for k in range(1, 420)) + "assert f(1) == a419\n"
    plan, took = within(30.0, parse_tests, [nested])
    assert plan.unverifiable == [nested] and took < 5.0
    scores, _ = within(LIMIT_S, code_tests, [None], [HONEST], [[nested]], timeout=RUN_S)
    assert scores == [0.0] or scores == [1.0]  # judged inside (the honest program's f(1) is not the list): no raise


def test_honest_rows_still_judged_outside_and_the_judge_survives_an_overrun():
    within(LIMIT_S, code_tests, [None], [HONEST], [[STALLS["round"] + "  # again"]], timeout=RUN_S)  # a kill
    tests = ["assert f(1) == 0", "import math\nassert math.isclose(f(2), 0.0)"]
    plan = plan_row(tests)
    assert not plan.unverifiable and len(plan.calls) == 2
    assert code_tests([None, None], [HONEST, "```python\ndef f(x):\n    return x\n```"], [tests, tests]) == [1.0, 0.0]


def test_rows_kept_for_the_process_are_told_apart_by_their_whole_text():
    """Plans are kept per process now: two long numpy rows that differ in the middle (repr() elides it) are two."""
    import numpy as np

    a = np.array([f"assert f({i}) == {i}" for i in range(2000)])
    b = a.copy()
    b[1000] = "assert f(1000) == 7"
    assert plan_row(a).calls[1000].source != plan_row(b).calls[1000].source
