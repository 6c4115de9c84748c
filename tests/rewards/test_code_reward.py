"""The code reward: harness, nonce, statuses, and its use through RewardRunner."""

from __future__ import annotations

import time

import pytest

from grpo import sandbox
from grpo.rewards import RewardRunner, get_reward_function
from grpo.sandbox import verdict
from grpo.sandbox.harness import read_frame
from grpo.rewards.code_exec import code_tests, extract_code
from grpo.sandbox import SandboxResult

TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]


def fenced(code: str) -> str:
    return f"Here is my solution:\n```python\n{code}\n```\nDone."


GOOD = fenced("def add(a, b):\n    return a + b")
WRONG = fenced("def add(a, b):\n    return a - b")


def run(completions, tests=TESTS, **kw):
    kw.setdefault("timeout", 3.0)
    return code_tests(None, completions, tests=[tests] * len(completions), **kw)


def test_extract_code():
    assert extract_code("```python\na = 1\n```\ntext\n```py\nb = 2\n```") == "b = 2\n"
    assert extract_code("```\nc = 3\n```") == "c = 3\n"
    assert extract_code("no code") is None


def test_pass_fail_and_partial(no_leak):
    half = fenced("def add(a, b):\n    return 3")
    assert run([GOOD, WRONG, half]) == [1.0, 0.0, 0.0]
    assert run([GOOD, WRONG, half], partial=True) == [1.0, 0.0, 0.5]


@pytest.mark.parametrize(
    "body",
    [
        "import sys\nsys.exit(0)",
        "import os\nos._exit(0)",
        "def add(a, b):\n    return a + b\nimport sys\nsys.exit(0)",
        "def add(a, b):\n    return a + b\nraise SystemExit(0)",
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    ],
)
def test_exiting_before_the_tests_earns_nothing(body, no_leak):
    assert run([fenced(body)]) == [0.0]


def test_exiting_inside_a_test_fails_that_test(no_leak):
    sneaky = fenced("import sys\ndef add(a, b):\n    sys.exit(0)")
    assert run([sneaky], partial=True) == [0.0]


def test_prints_do_not_disturb_the_verdict(no_leak):
    chatty = fenced(
        "print('3 2 2')\ndef add(a, b):\n    print(a, b)\n    return a + b\nif __name__ == '__main__':\n    input()"
    )
    assert run([chatty]) == [1.0]


def test_string_tests_missing_tests_and_missing_code(no_leak):
    assert code_tests(None, [GOOD], tests=["assert add(2, 2) == 4\nassert add(0, 1) == 1"]) == [1.0]
    assert code_tests(None, [GOOD, GOOD], tests=[[], None]) == [None, None]
    assert run(["def add(a, b): return a + b  (no fence)"]) == [0.0]


def test_timeouts_and_limits_score_zero(no_leak):
    loop = fenced("def add(a, b):\n    while True:\n        pass")
    bomb = fenced("x = bytearray(10 * 1024 ** 3)")
    t0 = time.monotonic()
    assert run([loop, bomb], timeout=2.0) == [0.0, 0.0]
    assert time.monotonic() - t0 < 2.0 + 2.0


def test_sandbox_error_is_no_signal(monkeypatch):
    monkeypatch.setattr(verdict, "run_python", lambda *a, **k: SandboxResult("sandbox_error", "", "no bwrap", 0.0))
    assert run([GOOD]) == [None]


def _frame(key: bytes, body: bytes, state: str = "exit0") -> str:
    """A frame built by hand, as the harness's parent writes it (reference for read_frame)."""
    import hashlib
    import hmac

    rest = f"{state} {len(body)}\n".encode()
    return (b"GRPO-FRAME " + hmac.new(key, rest + body, hashlib.sha256).hexdigest().encode() + b" " + rest
            + body).decode()


def test_read_frame_accepts_only_an_exact_authenticated_frame():
    key, body = b"k" * 32, b"0 1 3\n1 0 ZeroDivisionError\nend\n"
    f = read_frame(_frame(key, body), key, 2)
    assert f is not None and f.complete and f.state == "exit0"
    assert f.results == {0: (True, "3"), 1: (False, "ZeroDivisionError")}
    assert read_frame(_frame(key, body), b"x" * 32, 2) is None  # another key
    assert read_frame(_frame(b"", body), key, 2) is None  # forged without the key
    assert read_frame(_frame(key, body) + "0 1 3\n", key, 2) is None  # bytes after the frame
    assert read_frame("noise\n" + _frame(key, body), key, 2) is None  # bytes before it
    assert read_frame(_frame(key, body)[:-3], key, 2) is None  # cut off
    assert read_frame(_frame(key, b"0 1 3\n0 1 3\nend\n"), key, 2) is None  # an index twice
    assert read_frame(_frame(key, b"5 1 3\nend\n"), key, 2) is None  # an index out of range
    assert read_frame(_frame(key, b"0 1 3\n"), key, 2).complete is False  # no end marker: values kept


def test_programs_run_concurrently(no_leak, monkeypatch):
    """The four programs' sandbox runs overlap: each run's start and end, taken around it in the trainer, share a
    moment when all four were running (one after another, each would start after the previous one ended). No bound
    on the wall time, which a busy machine stretches."""
    from grpo.rewards import code_exec

    spans, inner = [], code_exec.calls_passed

    def timed(*args, **kwargs):
        start = time.monotonic()
        try:
            return inner(*args, **kwargs)
        finally:
            spans.append((start, time.monotonic()))

    monkeypatch.setattr(code_exec, "calls_passed", timed)
    slow = fenced("import time\ntime.sleep(1.0)\ndef add(a, b):\n    return a + b")
    assert run([slow] * 4, max_workers=4) == [1.0] * 4
    assert len(spans) == 4 and max(s for s, _ in spans) < min(e for _, e in spans), spans


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param(b, marks=pytest.mark.skipif(b not in sandbox.available_backends(), reason=f"{b} unavailable"))
        for b in sandbox.BACKENDS
    ],
)
def test_through_the_runner(backend, monkeypatch, no_leak):
    """The acceptance case: sys.exit(0) before the tests earns no reward, under every backend that works here."""
    monkeypatch.setenv("GRPO_SANDBOX_BACKEND", backend)
    fn = get_reward_function("code_tests", timeout=3.0)
    exits = fenced("import sys\nsys.exit(0)\ndef add(a, b):\n    return a + b")
    with RewardRunner([("code", fn, 1.0)], timeout_s=10.0) as runner:
        res = runner(["p"] * 3, [GOOD, WRONG, exits], {"tests": [TESTS] * 3})
    assert res.per_function["code"].tolist() == [1.0, 0.0, 0.0]
    assert not res.missing.any()


def test_a_hanging_test_keeps_the_values_before_it(no_leak):
    """The harness stops waiting at 75 % of the timeout and sends what it has: with partial=True the tests before
    the hang still count."""
    tests = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4", "assert add(5, 5) == 10"]
    hangs = fenced("def add(a, b):\n    while a == 2:\n        pass\n    return a + b")
    t0 = time.monotonic()
    assert list(code_tests(None, [hangs], [tests], timeout=3.0, partial=True)) == [0.5]
    assert time.monotonic() - t0 < 3.0 + 2.0
