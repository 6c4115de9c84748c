"""Test forms of the code reward: what enters the sandbox, what is judged outside, and the strict serializer."""

from __future__ import annotations

import ast
import math

import pytest

from grpo.rewards import RewardRunner
from grpo.sandbox.wire import ENCODER_SRC, WireError, decode
from grpo.sandbox.checks import evaluate_check, io_equal, parse_tests, values_equal
from grpo.rewards.code_exec import code_tests


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


# --- parsing: only call expressions go into the sandbox ---------------------------------------------------------


def test_asserts_become_holes_without_the_expected_values():
    plan = parse_tests(["assert add(1, 2) == 3", "assert 7 == add(3, 4)", "assert sorted(pairs([3, 1])) == [1, 3]",
                        "assert math.isclose(area(2.0), 12.566, rel_tol=1e-3)", "assert is_prime(7)",
                        "assert not is_prime(8)", "assert find(0) is None", "assert abs(half(1) - 0.5) < 1e-6",
                        "import math\nassert Stack().size() == 0", "assert True"])
    assert [c.holes for c in plan.calls] == [("add(1, 2)",), ("add(3, 4)",), ("pairs([3, 1])",), ("area(2.0)",),
                                             ("is_prime(7)",), ("is_prime(8)",), ("find(0)",), ("half(1)",),
                                             ("Stack().size()",)]
    assert plan.unverifiable == [] and plan.prelude == ["import math"]  # `assert True` calls nothing: dropped
    for c in plan.calls:  # no expected value travels: 3, 7, [1, 3], 12.566, 0.5, 0 are absent from the holes
        for lit in ("== 3", "7 ==", "[1, 3]", "12.566", "0.5"):
            assert lit not in " ".join(c.holes)


def test_constants_are_substituted_and_humaneval_check_uses_the_entry_point():
    src = ("METADATA = {'author': 'x'}\nINP = [1, 2, 3]\n\n\ndef check(candidate):\n"
           "    assert candidate(INP) == 6, 'sum'\n    assert candidate([]) == 0\n    assert True\n")
    plan = parse_tests(src, entry_point="total")
    assert [c.holes for c in plan.calls] == [("total([1, 2, 3])",), ("total([])",)]
    with pytest.raises(ValueError, match="entry_point"):
        parse_tests(src)


def test_anything_else_is_unverifiable_as_a_whole():
    loop = "def check(candidate):\n    for i in range(3):\n        assert candidate(i) == i\n"
    plan = parse_tests(["x = add(1, 2)\nassert x == 3", "assert add(1, 2) == expected", "assert add(1, 2) == 3"])
    assert plan.unverifiable == ["x = add(1, 2)\nassert x == 3", "assert add(1, 2) == expected"]
    assert len(plan.calls) == 1
    lp = parse_tests(loop, entry_point="ident")
    assert lp.unverifiable == [loop + "\ncheck(ident)\n"] and lp.calls == []  # the old way still calls check()


def test_io_forms_and_bad_rows():
    assert [(t.input, t.output) for t in parse_tests([{"input": "1 2\n", "output": "3\n"}]).io] == [("1 2\n", "3\n")]
    apps = parse_tests({"inputs": ["1\n", "2\n"], "outputs": ["1\n", "4\n"]})
    assert [(t.input, t.output) for t in apps.io] == [("1\n", "1\n"), ("2\n", "4\n")]
    for bad in ([42], [{"stdin": "1"}], {"inputs": ["1"], "outputs": []}):
        with pytest.raises(ValueError):
            parse_tests(bad)
    assert parse_tests(None).n == parse_tests([]).n == parse_tests("  ").n == 0


# --- judging outside ----------------------------------------------------------------------------------------


def _check(src: str):
    (c,) = parse_tests([src]).calls
    return c


def test_evaluate_check_against_hand_values():
    eq = _check("assert add(1, 2) == 3")
    assert evaluate_check(eq, {0: 3}) and evaluate_check(eq, {0: 3.0}) and evaluate_check(eq, {0: True}) is False
    assert not evaluate_check(eq, {0: 4}) and not evaluate_check(eq, {})  # a failed hole fails the check
    seq = _check("assert pair(1) == (1, 2)")
    assert evaluate_check(seq, {0: (1, 2)}) and not evaluate_check(seq, {0: [1, 2]})  # Python: [1, 2] != (1, 2)
    close = _check("assert f(0.1) == 0.3")
    assert evaluate_check(close, {0: 0.1 + 0.2}, float_tol=1e-9) and not evaluate_check(close, {0: 0.1 + 0.2})
    tol = _check("assert abs(half(1) - 0.5) < 1e-6")
    assert evaluate_check(tol, {0: 0.5000001}) and not evaluate_check(tol, {0: 0.6})
    assert not evaluate_check(tol, {0: "0.5"})  # arithmetic on a string fails, never raises
    assert evaluate_check(_check("assert sorted(g()) == [1, 2]"), {0: [2, 1]})
    assert evaluate_check(_check("assert find(0) is None"), {0: None})
    assert not evaluate_check(_check("assert find(0) is None"), {0: 0})
    assert evaluate_check(_check("assert 0 < f(1) <= 2"), {0: 2}) and not evaluate_check(_check("assert 0 < f(1) <= 2"),
                                                                                        {0: 3})
    assert not evaluate_check(_check("assert f(1) * 3 == 6"), {0: "xx"})  # no sequence repetition by a hole
    assert evaluate_check(_check("assert len(f(1)) == 2 and f(1)[0] == 'a'"), {0: "ab", 1: "ab"})


def test_values_equal_matches_python_equality_on_plain_values_but_bools():
    cases = [(1, 1.0), ([1, (2, 3)], [1, (2, 3)]), ({"a": [1]}, {"a": [1]}), ([1], (1,)), ({1}, {1}),
             ("a", "a"), (None, None), (float("nan"), float("nan")), ({"a": 1}, {"a": 1, "b": 2}), (0, None)]
    for a, b in cases:
        assert values_equal(a, b) == (a == b), (a, b)
    assert not values_equal(True, 1) and not values_equal([False], [0]) and values_equal(True, True)  # issue #28
    assert values_equal([0.1 + 0.2], [0.3], tol=1e-9) and not values_equal([0.1 + 0.2], [0.3])
    assert values_equal({"k": 1.0000001}, {"k": 1.0}, tol=1e-6)
    assert not values_equal({"k": 1.0000001}, {"k": 1}, tol=1e-6)  # an int expected: no tolerance


def test_io_equal_normalises_whitespace():
    assert io_equal("3 \n\n", "3") and io_equal("1  2\n3", "1 2\n3\n") and not io_equal("1 2", "1\n2")
    assert not io_equal("0.3333", "0.33333333") and io_equal("0.3333", "0.33333333", tol=1e-3)


# --- the serializer ---------------------------------------------------------------------------------------------


def _encoder():
    ns: dict = {}
    exec(ENCODER_SRC, ns)  # the sandbox's encoder, here on trusted values
    return ns["_grpo_make_encoder"](64, 32_000)


def test_wire_round_trip_keeps_exact_types():
    enc = _encoder()
    for v in [None, True, 0, -5, 10**30, 1.5, float("inf"), "a\n\"b\u00e9", [1, [2]], (1, "x"), {"a": (1, 2), 3: None},
              {1, 2}, frozenset({"z"}), [], (), {}, 2j, complex(1.5, -0.0)]:
        back = decode(enc(v))
        assert back == v and type(back) is type(v)
    assert math.isnan(decode(enc(float("nan"))))


def test_wire_refuses_anything_but_plain_values():
    enc = _encoder()

    class Int(int):
        def __eq__(self, other):
            return True

    class Anything:
        def __eq__(self, other):
            return True

    for bad in [Anything(), b"bytes", range(3), {"k": Anything()}]:  # (a complex is plain since round three)
        with pytest.raises(ValueError):
            enc(bad)
    # a subclass of a plain type travels as the plain value it holds (its own __eq__ never reaches the judge)
    assert decode(enc(Int(3))) == 3 and type(decode(enc([Int(1)]))[0]) is int
    deep: list = []
    for _ in range(200):
        deep = [deep]
    with pytest.raises(ValueError):
        enc(deep)
    for text in ['{"x": [1]}', '{"t": 1}', '{"d": [[1]]}', '{"s": [[1]]}', '{"d": [[[1], 2]]}', "[" * 5000,
                 "1" * 5000, '{"t": [1], "s": [2]}', "x"]:
        with pytest.raises(WireError):
            decode(text)


# --- through code_tests -----------------------------------------------------------------------------------------


def test_humaneval_rows_with_entry_points(no_leak):
    test = "def check(candidate):\n    assert candidate([1, 2, 3]) == 6\n    assert candidate([]) == 0\n"
    good, bad = fenced("def total(xs):\n    return sum(xs)"), fenced("def total(xs):\n    return len(xs)")
    got = code_tests(None, [good, bad, good], [test] * 3, entry_point=["total", "total", "total"], partial=True)
    assert list(got) == [1.0, 0.5, 1.0]  # len([]) == 0 is right by chance


def test_io_rows(no_leak):
    tests = [{"input": "1 2\n", "output": "3\n"}, {"input": "5 -5\n", "output": "0"}]
    good = fenced("a, b = map(int, input().split())\nprint(a + b)")
    crash = fenced("a, b = map(int, input().split())\nprint(a + b)\nraise SystemExit(1)")
    wrong = fenced("print(3)")
    assert list(code_tests(None, [good, crash, wrong], [tests] * 3, partial=True)) == [1.0, 0.0, 0.5]


def test_unverifiable_tests_run_the_old_way_and_are_counted(no_leak):
    tests = ["assert add(1, 2) == 3", "x = add(2, 2)\nassert x == 4"]
    good, wrong = fenced("def add(a, b):\n    return a + b"), fenced("def add(a, b):\n    return 3")
    with RewardRunner([("code_tests", code_tests, 1.0)], timeout_s=30.0) as runner:
        res = runner(["p"] * 3, [good, wrong, good], {"tests": [tests, tests, ["assert add(0, 0) == 0"]]})
    assert res.per_function["code_tests"].tolist() == [1.0, 0.0, 1.0]
    assert res.metrics["reward/code_tests/unverifiable_frac"] == pytest.approx((0.5 + 0.5 + 0.0) / 3)


def test_float_tolerance_is_a_setting(no_leak):
    prog = fenced("def third(x):\n    return x / 3")
    assert list(code_tests(None, [prog], [["assert third(1) == 0.333333333"]])) == [1.0]
    assert list(code_tests(None, [prog], [["assert third(1) == 0.333333333"]], float_tol=0.0)) == [0.0]
    with pytest.raises(ValueError, match="float_tol"):
        code_tests(None, [prog], [["assert third(1) == 0.3"]], float_tol=-1.0)


def test_parse_errors_name_the_row():
    with pytest.raises(ValueError, match="row 1"):
        code_tests(None, ["x", "y"], [["assert f(1) == 1"], [{"stdin": "1"}]])


def test_no_expected_value_reaches_the_program(monkeypatch, no_leak):
    """What the sandbox receives for a call check holds the calls and nothing of the expected side."""
    from grpo.sandbox import verdict

    seen = []
    real = verdict.run_python
    monkeypatch.setattr(verdict, "run_python", lambda code, **k: seen.append(code) or real(code, **k))
    code_tests(None, [fenced("def add(a, b):\n    return a + b")], [["assert add(1, 2) == 98765"]])
    assert seen and "98765" not in seen[0] and "add(1, 2)" in seen[0]
    assert isinstance(ast.parse(seen[0]), ast.Module)
