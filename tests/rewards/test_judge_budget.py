"""Issue #51 item 1: one budget (grpo.sandbox.budget.JUDGE_BUDGET_S) holds the whole judgement of a completion: the
judge process's start, its row's parse (with the dry run of the program-free parts) and the evaluation of its
checks. Past it the completion scores 0 (never a pass, never missing) with the reason "judge budget exceeded" in the
reward log, and the judge process is killed and replaced, nothing left behind.

The three shapes of the issue (huge-exponent arithmetic, `sum` over lists of lists, `str` of a shared nested list)
are tried in the test text (the parse stops them) and through the program's values (the evaluation stops them). No
test here times anything: a small budget makes the real stalls short, and the same row judged under the default
budget shows that the budget, not the text, decided (scripts/judge_budget.py measures the times)."""

from __future__ import annotations

import logging
import os
import signal
import threading

import psutil
import pytest

from grpo.rewards import code_exec
from grpo.rewards.code_exec import code_tests, plan_row
from grpo.sandbox import budget, verdict

REASON = "judge budget exceeded"
NESTED = "[[[[[[0] * 40] * 40] * 40] * 40] * 40] * 40"  # 4e9 items through shared lists, each `*` within budget
# the three stalls, as test text: each would run for minutes
STALLS = {
    "round": "assert f(1) == round(5, -10**9)",
    "sum_of_lists": "assert f(1) == sum([[1] * 1000] * 3000, [])",
    "str_of_shared": f"assert f(1) == str({NESTED})",
}
# the same shapes at a size an honest row may have (a fraction of a second): the honest f returns the value
MODERATE = {
    "round": ("assert f(1) == round(5, -10**6)", 0),
    "sum_of_lists": ("assert f(1) == len(sum([[1] * 1000] * 400, []))", 400_000),
    "str_of_shared": ("assert f(1) == len(str([[[[[0] * 18] * 18] * 18] * 18] * 18))", 5_891_004),
}
# the same shapes from the program's values (the parse is cheap; the evaluation meets the cost): (test, honest
# program's value, the attacker's)
FROM_VALUES = {
    "round": ("assert round(5, f(1)) == 0", "-1", "-10**9"),
    "sum_of_lists": ("assert len(sum(f(1) * 3000, [])) == 3000", "[[1]]", "[[1] * 5000]"),
    "str_of_shared": ("assert len(str([[[f(1)] * 40] * 40] * 40)) == 195280", "0", "list(range(5000))"),
}


def program(value: str) -> str:
    return f"```python\ndef f(x):\n    return {value}\n```"


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """No plan kept from another test; a warm judge process (its start is not what these tests are about)."""
    monkeypatch.setattr(code_exec, "_PLANS", {})
    code_tests([None], [program("0")], [["assert f(0) == 0"]])
    assert budget._worker and budget._worker[0].proc.poll() is None
    monkeypatch.setattr(code_exec, "_PLANS", {})


@pytest.fixture
def runs(monkeypatch):
    """The programs the sandbox ran during the test."""
    ran: list[str] = []
    real = verdict.run_python

    def counted(code, **kw):
        ran.append(code)
        return real(code, **kw)

    monkeypatch.setattr(verdict, "run_python", counted)
    return ran


def judge_pid() -> int:
    return budget._worker[0].proc.pid


def assert_replaced(old_pid: int) -> None:
    """The judge process that overran is gone (killed and reaped, not a zombie) and a new one is running."""
    assert not psutil.pid_exists(old_pid)  # a zombie would still exist
    assert len(budget._worker) == 1 and judge_pid() != old_pid and budget._worker[0].proc.poll() is None


@pytest.mark.parametrize("name", sorted(STALLS))
def test_each_stall_in_the_test_text_scores_0_with_the_reason_and_is_not_run(name, monkeypatch, caplog, runs,
                                                                             no_leak):
    caplog.set_level(logging.WARNING, logger="grpo.rewards")
    monkeypatch.setattr(budget, "JUDGE_BUDGET_S", 0.5)  # the stall runs for minutes: only the budget ends it
    old = judge_pid()
    row = [STALLS[name], {"input": "", "output": ""}]  # the I/O test would pass: partial credit is still 0
    out = code_tests([None, None], [program("0"), program("1")], [row, row], partial=True, timeout=5.0)
    assert list(out) == [0.0, 0.0]
    assert out.extras["judge_budget_exceeded"] == [1.0, 1.0]
    assert f"row 0: {REASON} (time: " in caplog.text and "while parsing its tests" in caplog.text
    assert f"{REASON} on 2 of 2 completions" in caplog.text
    assert plan_row(row, None, 0).over_budget.startswith(f"{REASON} (time: ")  # kept: the next step pays nothing
    assert runs == []  # a row over budget is not run: no sandbox time either
    assert_replaced(old)


@pytest.mark.parametrize("name", sorted(MODERATE))
def test_the_budget_is_what_stops_a_shape_an_honest_row_may_have(name, monkeypatch, caplog):
    """The same row, the same honest program: 1.0 under the default budget, 0 with the reason under a budget
    smaller than its parse."""
    caplog.set_level(logging.WARNING, logger="grpo.rewards")
    test, value = MODERATE[name]
    assert code_tests([None], [program(repr(value))], [[test]]) == [1.0]
    assert REASON not in caplog.text
    monkeypatch.setattr(code_exec, "_PLANS", {})
    monkeypatch.setattr(budget, "JUDGE_BUDGET_S", 0.01)
    out = code_tests([None], [program(repr(value))], [[test]])
    assert list(out) == [0.0] and out.extras["judge_budget_exceeded"] == [1.0]
    assert f"{REASON} (time: " in caplog.text and "while parsing" in caplog.text


@pytest.mark.parametrize("name", sorted(FROM_VALUES))
def test_each_stall_through_the_programs_values_scores_0_with_the_reason(name, monkeypatch, caplog, no_leak):
    """A policy cannot write test text, but it writes the values a check evaluates: `round(5, f(1))` with
    f(1) = -10**9. The parse is cheap, the evaluation overruns: that completion scores 0 (with partial=True and its
    I/O test passed too), its honest twin in the same call scores 1."""
    caplog.set_level(logging.WARNING, logger="grpo.rewards")
    monkeypatch.setattr(budget, "JUDGE_BUDGET_S", 1.0)
    test, honest, attack = FROM_VALUES[name]
    row = [test, {"input": "", "output": ""}]
    assert plan_row(row).calls and not plan_row(row).over_budget
    old = judge_pid()
    out = code_tests([None, None], [program(attack), program(honest)], [row, row], partial=True, timeout=5.0)
    assert list(out) == [0.0, 1.0]
    assert out.extras["judge_budget_exceeded"] == [1.0, 0.0]
    assert f"{REASON} on 1 of 2 completions" in caplog.text and "while evaluating its checks" in caplog.text
    assert_replaced(old)


def test_the_rows_parse_is_charged_to_each_of_its_completions(caplog):
    """What the parse spent (plan.judge_s, measured in the judge process) is not there for the evaluation."""
    caplog.set_level(logging.WARNING, logger="grpo.rewards")
    row = ["assert f(1) == 1"]
    plan = plan_row(row, None, 0)
    assert 0 < plan.judge_s < budget.JUDGE_BUDGET_S
    assert code_tests([None], [program("1")], [row]) == [1.0]
    plan.judge_s = budget.JUDGE_BUDGET_S  # as if the parse had taken all of it
    out = code_tests([None], [program("1")], [row])
    assert list(out) == [0.0] and f"{REASON} (no time left) while evaluating its checks" in caplog.text


def test_a_row_whose_parse_and_its_repeat_cannot_fit_is_over_budget_at_once(monkeypatch, caplog, runs, no_leak):
    """Every evaluation computes the expected side again: a row whose parse (with its dry run) fits the budget but
    not twice is decided at its parse, once, instead of being killed at every completion of every step."""
    caplog.set_level(logging.WARNING, logger="grpo.rewards")
    test, value = "assert f(1) == len(str([[[[[0] * 22] * 22] * 22] * 22] * 22))", 15_951_716
    took = plan_row([test]).judge_s  # the parse and its dry run, under the default budget: judged
    assert code_tests([None], [program(str(value))], [[test]]) == [1.0] and len(runs) == 1
    monkeypatch.setattr(code_exec, "_PLANS", {})
    monkeypatch.setattr(budget, "JUDGE_BUDGET_S", 1.1 * took)  # room for one parse, not for a parse and its repeat
    out = code_tests([None], [program(str(value))], [[test]])
    assert list(out) == [0.0] and out.extras["judge_budget_exceeded"] == [1.0]
    assert REASON in caplog.text and len(runs) == 1  # not run (under load the parse itself may be what overran)


def test_a_program_cannot_reach_the_judge_budget_by_what_it_prints_or_patches(no_leak):
    """The budget is the judge's, in the trainer: a program that prints the reason, patches time or sleeps up to
    its own timeout neither passes nor turns another completion's verdict."""
    row = ["assert f(1) == 2", "assert f(2) == 3"]
    cheats = [
        "import sys\ndef f(x):\n    print('judge budget exceeded', file=sys.stderr)\n    return x\n",
        "import time\ntime.monotonic = lambda: 0.0\ntime.perf_counter = lambda: 1e9\ndef f(x):\n    return x\n",
        "import time\ndef f(x):\n    time.sleep(0.3)\n    return x\n",
    ]
    honest = "def f(x):\n    return x + 1\n"
    codes = [f"```python\n{c}```" for c in cheats + [honest]]
    out = code_tests([None] * 4, codes, [row] * 4, partial=True, timeout=5.0)
    assert list(out) == [0.0, 0.0, 0.0, 1.0] and out.extras["judge_budget_exceeded"] == [0.0] * 4


def test_a_judge_process_slow_to_start_is_given_one_more_try(monkeypatch, caplog, no_leak):
    """A loaded machine can make the judge's start alone take the budget: the request is tried once more, so an
    honest row is not kept as over budget for the rest of the process. A second overrun is one."""
    caplog.set_level(logging.INFO, logger="grpo.rewards")
    budget._worker.pop().kill()
    with monkeypatch.context() as m:  # only this worker is slow: it sleeps past the budget before it starts
        m.setattr(budget, "_WORKER_SRC", "import time\ntime.sleep(30)\n" + budget._WORKER_SRC)
        budget._worker.append(budget._Worker())
    slow = judge_pid()
    out = code_tests([None], [program("1")], [["assert f(1) == 1"]])
    assert list(out) == [1.0] and out.extras["judge_budget_exceeded"] == [0.0]
    assert "did not start within" in caplog.text and REASON not in caplog.text
    assert_replaced(slow)
    caplog.clear()
    monkeypatch.setattr(budget, "JUDGE_BUDGET_S", 0.5)
    out = code_tests([None], [program("0")], [[STALLS["round"]]])  # a started judge that overruns: no second try
    assert list(out) == [0.0] and REASON in caplog.text and "did not start" not in caplog.text


def test_a_judge_starved_of_cpu_past_the_budget_still_judges_an_honest_row(monkeypatch, no_leak):
    """The budget stops a judge that computes; one the machine does not run (here: stopped for 1.5 budgets, as a
    loaded machine would) gets up to STARVED_FACTOR budgets, so load alone never fails an honest completion."""
    monkeypatch.setattr(budget, "JUDGE_BUDGET_S", 0.5)
    row = ["assert f(1) == 1", "assert f(2) == 2"]
    plan_row(row)
    pid = judge_pid()
    os.kill(pid, signal.SIGSTOP)
    timer = threading.Timer(0.75, os.kill, (pid, signal.SIGCONT))
    timer.start()
    try:
        out = code_tests([None], [program("x")], [row], timeout=5.0)
    finally:
        timer.join()
        os.kill(pid, signal.SIGCONT)
    assert list(out) == [1.0] and out.extras["judge_budget_exceeded"] == [0.0] and judge_pid() == pid


def test_after_an_overrun_honest_verdicts_are_unchanged(monkeypatch):
    monkeypatch.setattr(budget, "JUDGE_BUDGET_S", 0.5)
    code_tests([None], [program("0")], [[STALLS["round"]]])
    monkeypatch.setattr(budget, "JUDGE_BUDGET_S", 2.0)
    tests = ["assert f(1) == 0", "import math\nassert math.isclose(f(2), 0.0)"]
    out = code_tests([None, None], [program("0"), program("x")], [tests, tests])
    assert list(out) == [1.0, 0.0] and out.extras["judge_budget_exceeded"] == [0.0, 0.0]
