"""Programs that try to earn the code reward without solving the task: every one scores 0.0 through the public
`code_tests`, the honest solution scores 1.0, and a batch mixing them keeps the honest ones at 1.0.

One test per row of issue 12's table (the attacks that scored 1.0 or 100.0 before), and the attacks on the new
design: forged frames, stolen keys, injected result lines, killing the harness.
"""

from __future__ import annotations

import pytest

from grpo.sandbox import verdict
from grpo.rewards.code_exec import code_tests
from grpo.sandbox import run_python

TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4", "assert add(10, -3) == 7"]
HONEST = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return 12345\n"  # right on no test


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def score(programs: list[str], tests=TESTS, **kw) -> list[float | None]:
    kw.setdefault("timeout", 5.0)
    return list(code_tests(None, [fenced(p) for p in programs], [tests] * len(programs), **kw))


# --- the table of issue 12 ------------------------------------------------------------------------------------

PATCH_COMPILE = """\
import builtins
_c = builtins.compile
builtins.compile = lambda s, f, m, *a, **k: _c('pass' if m == 'exec' else 'None', f, m)
builtins.eval = lambda *a, **k: None
builtins.exec = lambda *a, **k: None
""" + WRONG

NONCE_FROM_STDIN = """\
import os, sys
nonce = sys.stdin.readline().strip()
line = ("%s {passed} 4\\n" % nonce).encode()
for fd in range(1, 32):
    try:
        os.write(fd, line)
    except OSError:
        pass
os._exit(0)
"""

ALWAYS_EQUAL = """\
class Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = object.__hash__
def add(a, b):
    return Anything()
"""

INT_SUBCLASS = """\
class Int(int):
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = int.__hash__
def add(a, b):
    return Int(12345)  # its own value is right on no test: only the __eq__ could make it pass
"""

LOOKUP_MAIN_PY = """\
import os, re, sys
answers = {}
texts = []
for path in ["main.py", "/work/main.py", os.path.abspath(sys.argv[0])]:
    try:
        texts.append(open(path).read())
    except OSError:
        pass
try:
    texts.append(open('/proc/self/cmdline', 'rb').read().decode(errors='replace'))
except OSError:
    pass
for text in texts:
    for args, want in re.findall(r"add\\(([^()]*)\\) == (-?\\d+)", text):
        answers[tuple(int(x) for x in args.split(","))] = int(want)
def add(a, b):
    return answers.get((a, b), 12345)
"""


def test_patched_compile_scores_zero(no_leak):
    assert score([PATCH_COMPILE]) == [0.0]
    assert score([PATCH_COMPILE], partial=True) == [0.0]


def test_nonce_from_stdin_written_to_every_fd_scores_zero(no_leak):
    assert score([NONCE_FROM_STDIN.format(passed=4)]) == [0.0]


def test_inflated_count_with_partial_scores_zero_and_never_above_one(no_leak):
    got = score([NONCE_FROM_STDIN.format(passed=400), HONEST], partial=True)
    assert got == [0.0, 1.0]


def test_object_equal_to_everything_scores_zero(no_leak):
    assert score([ALWAYS_EQUAL]) == [0.0]
    assert score([ALWAYS_EQUAL], partial=True) == [0.0]


def test_int_subclass_equal_to_everything_scores_zero(no_leak):
    assert score([INT_SUBCLASS], partial=True) == [0.0]


def test_reading_the_tests_from_the_working_directory_scores_zero(no_leak):
    assert score([LOOKUP_MAIN_PY], partial=True) == [0.0]


# --- attacks on the new channel -------------------------------------------------------------------------------

FORGE_FRAME = """\
import hmac, hashlib, os
body = b"0 1 3\\n1 1 0\\n2 1 4\\n3 1 7\\nend\\n"
rest = b"exit0 %d\\n" % len(body)
for key in (b"", b"0" * 32):
    frame = b"GRPO-FRAME " + hmac.new(key, rest + body, hashlib.sha256).hexdigest().encode() + b" " + rest + body
    for fd in range(1, 32):
        try:
            os.write(fd, frame)
        except OSError:
            pass
    for path in ["/proc/%d/fd/1" % os.getppid(), "/proc/1/fd/1"]:
        try:
            with open(path, "wb") as f:
                f.write(frame)
        except OSError:
            pass
""" + WRONG

INJECT_LINES = """\
import os
# claim values for every test into every descriptor (the result pipe among them); the harness's own lines then
# repeat the indices, and guessed values are wrong anyway
for fd in range(3, 64):
    try:
        os.write(fd, b"0 1 true\\n1 1 true\\n2 1 true\\n3 1 true\\nend\\n")
    except OSError:
        pass
os._exit(0)
"""

KILL_PARENT = """\
import os, signal
os.kill(os.getppid(), signal.SIGKILL)
""" + HONEST

EXIT_EARLY = "import os\nos._exit(0)\n" + HONEST
RAISE_SYSTEMEXIT_IN_CALL = "import sys\ndef add(a, b):\n    sys.exit(0)\n"
PATCH_WRITERS = """\
import os, sys, json
os.write = lambda fd, data: len(data)
sys.stdout.write = lambda s: len(s)
json.dumps = lambda *a, **k: "true"
""" + WRONG


@pytest.mark.parametrize("program", [FORGE_FRAME, INJECT_LINES, KILL_PARENT, EXIT_EARLY, RAISE_SYSTEMEXIT_IN_CALL,
                                     PATCH_WRITERS],
                         ids=["forge_frame", "inject_lines", "kill_parent", "exit_early", "sys_exit_in_call",
                              "patch_writers"])
def test_channel_attacks_score_zero(program, no_leak):
    assert score([program], partial=True) == [0.0]


STEAL_KEY = """\
import gc, os, sys
ppid = os.getppid()
found = []
for path in ["/proc/%d/mem" % ppid, "/proc/%d/environ" % ppid, "/proc/%d/fd" % ppid]:
    try:
        if path.endswith("/fd"):
            os.listdir(path)
        else:
            open(path, "rb").read(1)
        found.append("OPENED " + path)
    except OSError:
        pass
for fd in range(0, 64):
    try:
        found.append(os.read(fd, 4096).hex())
    except OSError:
        pass
for o in gc.get_objects():
    for v in (list(vars(o).values()) if hasattr(o, "__dict__") and type(vars(o)) is dict else []):
        if type(v) in (bytes, bytearray):
            found.append(bytes(v).hex())
for frame in [sys._getframe(i) for i in range(1, 4) if True]:
    for v in frame.f_locals.values():
        if type(v) in (bytes, bytearray):
            found.append(bytes(v).hex())
try:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(16, ppid, 0, 0) == 0:  # PTRACE_ATTACH
        found.append("PTRACED")
except Exception:
    pass
sys.stderr.write("\\n".join(found))
""" + WRONG


def test_the_key_cannot_be_read_by_the_program(monkeypatch, no_leak):
    key = bytes(range(100, 132))
    monkeypatch.setattr(verdict.secrets, "token_bytes", lambda n: key[:n])
    seen = []

    def spy(*a, **k):
        res = run_python(*a, **k)
        seen.append(res)
        return res

    monkeypatch.setattr(verdict, "run_python", spy)
    assert score([STEAL_KEY], partial=True) == [0.0]
    err = seen[0].stderr
    assert key.hex() not in err and "OPENED" not in err and "PTRACED" not in err, err[-2000:]


# --- honest programs, and mixed batches -----------------------------------------------------------------------


def test_honest_programs_still_pass(no_leak):
    chatty = "import builtins\nprint('0 1 3')\n" + HONEST + "if __name__ == '__main__':\n    input()\n"
    shadowing = "type = None\nint = str\nrepr = None\njson = None\n" + HONEST  # shadows what the harness uses
    assert score([HONEST, chatty, shadowing]) == [1.0, 1.0, 1.0]


def test_a_mixed_batch_keeps_the_honest_ones(no_leak):
    batch = [HONEST, PATCH_COMPILE, NONCE_FROM_STDIN.format(passed=4), HONEST, ALWAYS_EQUAL, INT_SUBCLASS,
             LOOKUP_MAIN_PY, FORGE_FRAME, INJECT_LINES, HONEST]
    want = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert score(batch, max_workers=4) == want
    assert score(batch, max_workers=4, partial=True) == want


def test_partial_reward_is_the_fraction_and_never_above_one(no_leak):
    half = "def add(a, b):\n    return a + b if b > 0 else 0\n"  # wrong on add(10, -3) only
    assert score([half, HONEST, WRONG], partial=True) == [3 / 4, 1.0, 0.0]
    assert score([half, HONEST, WRONG]) == [0.0, 1.0, 0.0]
