"""The third attack round on rewards (issue #40): each row of its table as a test that failed before the fix.

Rows 1-2: a library call in a test (`import math as m`, `from math import isclose as close`, cmath, numpy, re; the
import in the same string or its own) is the judge's own call on the plain values the program returned, so no patch,
shadow, replaced module or returned object changes it; a returned re.Match is reduced to what a test can use of it."""

from __future__ import annotations

import pytest

from grpo.sandbox.checks import parse_tests


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def score(code: str, tests, **kw) -> float:
    from grpo.rewards.code_exec import code_tests

    return code_tests([None], [fenced(code)], [tests], timeout=10.0, **kw)[0]


# ------------------------------------------------------------------------------- library calls (rows 1 and 2)
AREA = "import math\ndef area(r):\n    return math.pi * r * r"
PATCH_MATH = "import math\nmath.isclose = lambda *a, **k: True\ndef area(r):\n    return 0"
NUMPY_TESTS = ["import numpy as np", "assert np.allclose(f(1), [1.0, 2.0])"]
NUMPY_HONEST = "import numpy as np\ndef f(x):\n    return np.array([1.0, 2.0]) * x"
SQRT_TESTS = ["import cmath", "assert cmath.isclose(root(-4), 2j)"]
RE_TESTS = ["import re", "assert re.fullmatch(r'[a-z]+', word(1))"]

# (tests, an honest program, a wrong program that scored 1.0 before)
ATTACKS = {
    "alias": (["import math as m", "assert m.isclose(area(2), 12.566370614359172, rel_tol=1e-6)"], AREA, PATCH_MATH),
    "from_as": (["from math import isclose as close", "assert close(area(2), 12.566370614359172)"], AREA, PATCH_MATH),
    "same_string_alias": (["import math as m\nassert m.isclose(area(2), 12.566370614359172)"], AREA, PATCH_MATH),
    "cmath": (SQRT_TESTS, "import cmath\ndef root(x):\n    return cmath.sqrt(x)",
              "import cmath\ncmath.isclose = lambda *a, **k: True\ndef root(x):\n    return 0"),
    "numpy_patched": (NUMPY_TESTS, NUMPY_HONEST,
                      "import numpy as np\nnp.allclose = lambda *a, **k: True\ndef f(x):\n    return [0]"),
    "sys_modules": (NUMPY_TESTS, NUMPY_HONEST,
                    "import sys, types\nfake = types.ModuleType('numpy')\nfake.allclose = lambda *a, **k: True\n"
                    "sys.modules['numpy'] = fake\ndef f(x):\n    return [0]"),
    "import_hook": (NUMPY_TESTS, NUMPY_HONEST,
                    "import builtins\nreal = builtins.__import__\nclass M:\n    allclose = staticmethod(lambda *a, **k:"
                    " True)\nbuiltins.__import__ = lambda n, *a, **k: M if n == 'numpy' else real(n, *a, **k)\n"
                    "def f(x):\n    return [0]"),
    "np_all_shadowed": (["import numpy as np", "assert np.all(np.isclose(f(1), [1.0, 2.0]))"], NUMPY_HONEST,
                        "import numpy as np\nnp.all = lambda *a, **k: True\ndef f(x):\n    return [0.0, 0.0]"),
    "re_patched": (RE_TESTS, "def word(n):\n    return 'abc' * n",
                   "import re\nre.fullmatch = lambda *a, **k: True\ndef word(n):\n    return '123'"),
    "array_function": (NUMPY_TESTS, NUMPY_HONEST,
                       "class A:\n    def __array_function__(self, func, types, args, kwargs):\n        return True\n"
                       "    def __eq__(self, other):\n        return True\ndef f(x):\n    return A()"),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_a_library_call_in_a_test_is_the_judges_own(name):
    tests, honest, wrong = ATTACKS[name]
    plan = parse_tests(tests)
    assert not plan.unverifiable and len(plan.calls) == 1  # judged outside: no test text runs in the sandbox
    assert score(honest, tests) == 1.0
    assert score(wrong, tests) == 0.0  # before: 1.0 (the call ran in the program's interpreter)


def test_an_honest_program_returning_a_re_match_scores_one_with_a_separate_import():
    tests = ["import re", "assert is_word('abc')", "assert is_word('ab1') is None", "assert is_word('xy') is not None",
             "assert re.fullmatch(r'([a-z]+)(\\d)', tag(1)).group(2) == '1'"]
    honest = ("import re\ndef is_word(s):\n    return re.fullmatch(r'[a-z]+', s)\n"
              "def tag(n):\n    return 'ab' + str(n)")
    assert not parse_tests(tests).unverifiable
    assert score(honest, tests) == 1.0  # before: 0.0 (a Match could not leave the sandbox)
    wrong = "def is_word(s):\n    return None\ndef tag(n):\n    return 'ab'"
    assert score(wrong, tests, partial=True) == 0.25  # `is None` only


def test_library_names_resolve_through_every_form_of_import():
    from grpo.sandbox.library import import_table

    table = import_table(["import math as m, numpy", "from cmath import isclose as ci, pi", "from re import *",
                          "import os.path", "def check(candidate):\n    import numpy.linalg as la\n"])
    assert table["m"] == "math" and table["numpy"] == "numpy" and table["ci"] == "cmath.isclose"
    assert table["pi"] == "cmath.pi" and table["fullmatch"] == "re.fullmatch" and table["os"] == "os"
    assert table["la"] == "numpy.linalg"
    # a module the judge does not know, or a function it does not list: unverifiable, never run inside for a verdict
    assert parse_tests(["import os.path\nassert os.path.exists(f(1))"]).unverifiable
    assert parse_tests(["import numpy as np\nassert np.linalg.norm(f(1)) == 1"]).unverifiable


def test_a_two_sided_comparison_wrapped_in_a_call_is_not_verifiable():
    """Row 9: `assert bool(f(1) == f(2))` counted as a call check; a program making both sides equal passed."""
    for t in ("assert bool(f(1) == f(2))", "assert int(f(1) == f(2)) == 1", "assert not (f(1) != f(2))",
              "import numpy as np\nassert np.allclose(f(1), f(2))"):
        assert parse_tests([t]).unverifiable, t
    assert score("def f(x):\n    return 0", ["assert bool(f(1) == f(2))", "assert f(1) == 1"]) == 0.0


# ------------------------------------------------------------------------------------ malformed Unicode (row 5)
def test_a_lone_surrogate_fails_only_its_own_sample():
    """Before: UnicodeEncodeError out of the reward call, for the whole batch."""
    from grpo.rewards.code_exec import code_tests

    ok = [{"input": "", "output": "1"}]
    got = code_tests([None] * 4, [fenced("print(input())"), fenced("x = '\ud800'\nprint(1)"),
                                  fenced("import sys\nprint(len(sys.stdin.buffer.read()))"), fenced("print(1)")],
                     [[{"input": "a\ud800\n", "output": "a"}], ok, [{"input": "\ud800", "output": "3"}], ok])
    assert got == [0.0, 0.0, 1.0, 1.0]  # the data's bytes reach the program as they are; the others score


# ------------------------------------------------------------------------------------------- weights (row 6)
def test_weights_past_a_sane_range_are_refused_at_config_load():
    """Before: reward.weights=[1e20] (or 1e32) was accepted; the float32 variance overflowed and every advantage of
    the step was 0, silently."""
    from grpo import load_config
    from grpo.errors import ConfigError

    for w in ("1e20", "1e32", "-2e6", "nan"):
        with pytest.raises(ConfigError, match=r"reward\.weights\[0\]"):
            load_config("grpo", [f"reward.weights=[{w}]"])
    assert load_config("grpo", ["reward.weights=[1e6]"]).reward.weights == [1e6]


def test_rewards_are_combined_in_float64():
    """1e6 x 1e6 - 1e6 x 999999 is 1e6; summed in float32 it was 983040."""
    from grpo.rewards.runner import RewardRunner

    def one(prompts, completions, **kw):
        return [1e6] * len(completions)

    def other(prompts, completions, **kw):
        return [999999.0] * len(completions)

    one.in_process = other.in_process = True
    with RewardRunner([("one", one, 1e6), ("other", other, -1e6)], max_abs=1e6) as runner:
        assert runner([None], ["c"]).total.tolist() == [1e6]


# ------------------------------------------------------------------------------------- comparisons (row 9)
def test_ints_compare_as_ints_in_io_tests_at_any_magnitude():
    """Before: an expected "1000000.0" accepted a printed 1000001 (within rel_tol 1e-6)."""
    from grpo.sandbox.checks import io_equal

    assert not io_equal("1000001", "1000000.0", 1e-6) and not io_equal("100000000000000000001", "1e20", 1e-6)
    assert io_equal("1000000", "1000000.0", 1e-6) and io_equal("1000000.0000001", "1000000.0", 1e-6)
    io = [{"input": "", "output": "1000000.0\n"}]
    assert score("print(1000001)", io) == 0.0 and score("print(10 ** 6)", io) == 1.0


def test_booleans_are_not_numbers_on_either_side_of_a_comparison():
    """Before: False passed `assert f(1) != 0` (False != 0 is False in Python), True passed `> 0`."""
    tests = ["assert f(1) != 0", "assert f(2) > 0", "assert f(3) != [0]"]
    assert score("def f(x):\n    return False if x != 3 else [False]", tests, partial=True) == 0.0
    assert score("def f(x):\n    return True if x == 2 else 0 if x == 1 else [0]", tests, partial=True) == 0.0
    assert score("def f(x):\n    return 5 if x != 3 else [1]", tests) == 1.0


# ----------------------------------------------------------------------------- frames only from the harness (row 8)
RIGHT_LINES = b"0 1 3\\n1 1 0\\n2 1 4\\n3 1 7\\nend\\n"  # the right values of test_code_forgery's four tests
OWN_LINES = f"""\
import os
for fd in range(3, 64):
    try:
        os.write(fd, b"{RIGHT_LINES.decode()}")
    except OSError:
        pass
os._exit(0)
"""
GRANDCHILD_LINES = f"""\
import os, time
if os.fork() == 0:
    for fd in range(3, 64):
        try:
            os.write(fd, b"{RIGHT_LINES.decode()}")
        except OSError:
            pass
    os._exit(0)
time.sleep(0.5)
os._exit(0)
"""


@pytest.mark.parametrize("program", [OWN_LINES, GRANDCHILD_LINES], ids=["own", "grandchild"])
def test_result_lines_the_harness_did_not_write_are_refused(program, caplog, no_leak):
    """Before: lines with the right values, written into the result pipe by the program (or its grandchild) instead
    of the harness, made a valid frame: 1.0. Each line now carries this run's tag, which the child learns from the
    parent after the fork; lines without it are not the harness's, and the frame is refused."""
    from test_code_forgery import TESTS, score as forgery_score

    assert forgery_score([program], partial=True) == [0.0]
    assert forgery_score(["def add(a, b):\n    return a + b\n"]) == [1.0]
    assert len(TESTS) == 4
