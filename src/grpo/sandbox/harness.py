"""The program the sandbox runs for a row's call checks, and the authenticated frame it answers with.

Two processes inside the sandbox:

  parent (trusted: runs only this code)         child (untrusted from the moment the solution starts)
  makes itself non-dumpable (prctl), forks ->   closes the secret pipe, waits for "go"
  reads the secret key from the pipe fd         .
  (sys.argv[1], the sandbox's `secret`) to EOF  .
  closes it, says "go" + a fresh tag ----------> points fd 1 at /dev/null; runs the solution; runs the prelude;
                                                evaluates each hole (a call expression), encodes its value
  reads result lines from the child's pipe  <--- with the strict encoder (wire.py): "<k> <tag> 1 <value>" or
  until "end <tag>", EOF, the budget;            "<k> <tag> 0 <error>"; then each unverifiable test:
  keeps the lines with the tag (without it),     "<k> <tag> 1 true"
  any other line becomes "forged" (the frame is then refused: the program or its children wrote it);
  kills the child, then writes ONE frame to stdout:
      GRPO-FRAME <hmac-sha256(key, header rest + payload)> <child status> <payload length>\\n<payload>

Why the program cannot forge a verdict:
- There is no verdict inside: the frame carries values, and the expected values never enter the sandbox, so a
  forged frame scores only if it holds the right answers, which is solving the task.
- The key is never in the child's memory (read after the fork), not on stdin, in the environment or a file; the
  parent is non-dumpable, so the child cannot read its memory or its fds through /proc or ptrace (and the seccomp
  filter denies ptrace and process_vm_readv). Without the key no frame passes `read_frame`.
- The child's stdout is /dev/null; only the parent writes the real stdout, once, after the child is gone, and
  `read_frame` requires stdout to be exactly one frame. Exiting early (os._exit, a signal, killing the parent)
  leaves the holes without values: those tests fail.
- Result lines come only from the harness's child code: each carries the run's tag, which exists only from the fork
  on; lines the program (or a grandchild) writes blindly into the pipe lack it and invalidate the frame. (A program
  that digs the tag out of its own interpreter can still write lines: they must hold the right values, as above.)
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re

from grpo.sandbox.wire import ENCODER_SRC, MAX_CHARS, MAX_DEPTH

__all__ = ["build_harness", "read_frame", "Frame", "SETUP_FAILED", "MAX_PAYLOAD"]

SETUP_FAILED = 3  # the parent's exit code when it could not set itself up (before any program code ran)
MAX_PAYLOAD = 48 * 1024  # bytes of result lines kept (the sandbox keeps 64 KiB of stdout)
_HEADER = re.compile(rb"GRPO-FRAME ([0-9a-f]{64}) ([a-z0-9]{1,16}) ([0-9]{1,9})\n")
_INDEX = re.compile(r"0|[1-9][0-9]{0,5}")  # a result line's index as "%d" writes it: ASCII digits only

logger = logging.getLogger("grpo.rewards")
_warned: set[str] = set()

_TEMPLATE = r'''
import os, sys, time
_T0 = time.monotonic()
BUDGET = {budget!r}
SOLUTION = {solution!r}
PRELUDE = {prelude!r}
HOLES = {holes!r}
EXECS = {execs!r}
MAX_PAYLOAD = {max_payload!r}
TAG_CHARS = 32
{encoder}
_encode = _grpo_make_encoder({max_depth!r}, {max_chars!r})


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _child(w, go):
    import traceback
    _compile, _eval, _exec, _write, _exit, _type = compile, eval, exec, _write_all, os._exit, type
    _BaseException, _enumerate, _len = BaseException, enumerate, len
    tag = b""
    while _len(tag) < 1 + TAG_CHARS:  # "g" + this run's tag: the parent holds the key now
        chunk = os.read(go, 1 + TAG_CHARS - _len(tag))
        if not chunk:
            _exit(1)
        tag += chunk
    tag = tag[1:].decode()
    os.close(go)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    ns = {{"__name__": "solution", "__builtins__": __builtins__}}
    try:
        _exec(_compile(SOLUTION, "solution.py", "exec"), ns)
        for src in PRELUDE:
            _exec(_compile(src, "prelude.py", "exec"), ns)
    except _BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        _write(w, ("end %s\n" % tag).encode())
        _exit(1)
    for k, src in _enumerate(HOLES):
        try:
            line = "%d %s 1 %s\n" % (k, tag, _encode(_eval(_compile(src, "test_%d.py" % k, "eval"), ns)))
        except _BaseException as e:
            line = "%d %s 0 %s\n" % (k, tag, _type(e).__name__)
            traceback.print_exc()
        _write(w, line.encode())
    for j, src in _enumerate(EXECS):
        k = _len(HOLES) + j
        try:
            _exec(_compile(src, "test_%d.py" % k, "exec"), ns)
            line = "%d %s 1 true\n" % (k, tag)
        except _BaseException as e:
            line = "%d %s 0 %s\n" % (k, tag, _type(e).__name__)
            traceback.print_exc()
        _write(w, line.encode())
    sys.stderr.flush()
    _write(w, ("end %s\n" % tag).encode())
    _exit(0)


def _own_lines(payload, tag):
    """The child's lines without this run's tag ("<k> <tag> <rest>" -> "<k> <rest>"; "end <tag>" -> "end"); a line
    without the tag was written by someone else (the program, its children): it becomes "forged", which makes the
    frame invalid. A cut last line is dropped (the frame is then incomplete)."""
    lines = payload.split(b"\n")[:-1]
    out = []
    for line in lines:
        parts = line.split(b" ", 2)
        if line == b"end " + tag:
            out.append(b"end")
            break
        out.append(parts[0] + b" " + parts[2] if len(parts) == 3 and parts[1] == tag else b"forged")
    return b"".join(x + b"\n" for x in out)


def _nondumpable():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE = 4
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def _sha256():
    try:
        from _sha256 import sha256  # Python <= 3.11, without loading OpenSSL
    except ImportError:
        try:
            from _sha2 import sha256  # Python >= 3.12
        except ImportError:
            from hashlib import sha256
    return sha256


def _hmac_sha256(key, msg):
    """HMAC-SHA256 (RFC 2104) in hex, as hmac.new(key, msg, hashlib.sha256).hexdigest() computes it."""
    sha256 = _sha256()
    if len(key) > 64:
        key = sha256(key).digest()
    key = key.ljust(64, b"\0")
    inner = sha256(bytes(b ^ 0x36 for b in key) + msg).digest()
    return sha256(bytes(b ^ 0x5C for b in key) + inner).hexdigest()


def _main():
    import select, signal
    try:
        _nondumpable()
        secret_fd = int(sys.argv[1])
        r, w = os.pipe()
        go_r, go_w = os.pipe()
        pid = os.fork()
    except BaseException as e:
        os.write(2, ("grpo-harness: setup failed: %r\n" % (e,)).encode())
        os._exit({setup_failed!r})
    if pid == 0:
        try:
            os.close(secret_fd)
            os.close(r)
            os.close(go_w)
            _child(w, go_r)
        finally:
            os._exit(1)
    os.close(w)
    os.close(go_r)
    key = b""
    while True:
        chunk = os.read(secret_fd, 4096)
        if not chunk:
            break
        key += chunk
    os.close(secret_fd)
    tag = os.urandom(TAG_CHARS // 2).hex().encode()  # this run's: the child learns it only once it is forked
    os.write(go_w, b"g" + tag)
    os.close(go_w)
    end = b"end " + tag + b"\n"
    payload = bytearray()
    poller = select.poll()
    poller.register(r, select.POLLIN | select.POLLHUP)
    while len(payload) <= MAX_PAYLOAD + MAX_PAYLOAD // 2 and not payload.endswith(end):
        left = BUDGET - (time.monotonic() - _T0)
        if left <= 0 or not poller.poll(left * 1000):
            break
        chunk = os.read(r, 65536)
        if not chunk:
            break
        payload += chunk
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    _, status = os.waitpid(pid, 0)
    state = ("exit%d" % os.WEXITSTATUS(status)) if os.WIFEXITED(status) else ("sig%d" % os.WTERMSIG(status))
    body = _own_lines(bytes(payload), tag)[:MAX_PAYLOAD]
    rest = ("%s %d\n" % (state, len(body))).encode()
    mac = _hmac_sha256(key, rest + body)
    _write_all(1, b"GRPO-FRAME " + mac.encode() + b" " + rest + body)
    os._exit(0)


_main()
'''


def build_harness(solution: str, holes: list[str], execs: list[str], prelude: list[str], budget_s: float) -> str:
    """The harness program for one solution (see the module docstring). budget_s: seconds the parent waits for the
    child, counted from its own start (leave room below the sandbox's timeout for the frame to get out)."""
    return _TEMPLATE.format(budget=float(budget_s), solution=solution, prelude=list(prelude), holes=list(holes),
                            execs=list(execs), max_payload=MAX_PAYLOAD, encoder=ENCODER_SRC, max_depth=MAX_DEPTH,
                            max_chars=MAX_CHARS, setup_failed=SETUP_FAILED)


class Frame:
    """A verified frame: `state` is how the child ended ("exit0", "exit1", "sig9", ...); `results` maps an index
    to (ok, text): ok with the encoded value (or "true" for an unverifiable test), else the exception's name.
    An index the child reported twice, or a line that is not well-formed, makes the frame invalid."""

    def __init__(self, state: str, results: dict[int, tuple[bool, str]], complete: bool) -> None:
        self.state, self.results, self.complete = state, results, complete


def read_frame(stdout: str, key: bytes, n_items: int) -> Frame | None:
    """The frame in `stdout` if it is exactly one frame whose MAC verifies with `key` and whose lines are exactly
    what the harness writes for indices 0..n_items-1 (then "end"); None otherwise: a forged, truncated or mangled
    frame, which scores 0 for every test of the run. Never raises on what the program wrote.

    The payload may end in a cut line (the parent stops at MAX_PAYLOAD or at its budget, possibly mid-line): that
    line is dropped and the frame is incomplete; the lines before it count."""
    raw = stdout.encode("utf-8", "surrogateescape")
    m = _HEADER.match(raw)
    if m is None:
        return _refuse("no frame header on stdout (the program was killed, timed out or crashed the harness)")
    body = raw[m.end():]
    if len(body) != int(m.group(3)):
        return _refuse("the frame's length does not match its header")
    rest = raw[len(b"GRPO-FRAME ") + 65:m.end()] + body
    want = hmac.new(key, rest, hashlib.sha256).hexdigest().encode()
    if not hmac.compare_digest(want, m.group(1)):
        return _refuse("the frame's MAC does not verify")
    lines = body.decode("utf-8", "replace").split("\n")[:-1]  # the last piece is "" or a cut line
    complete = bool(lines) and lines[-1] == "end"
    results = _result_lines(lines[:-1] if complete else lines, n_items)
    if results is None:
        return _refuse("the program wrote lines into the harness's result pipe that the harness never writes",
                       warn=True)
    return Frame(m.group(2).decode(), results, complete)


def _result_lines(lines: list[str], n_items: int) -> dict[int, tuple[bool, str]] | None:
    """{index: (ok, text)} of result lines "<k> <0|1> <text>", each index once and below n_items; None when any
    line is not one. The child wrote these lines (the parent only signs them), so the program can write into them."""
    results: dict[int, tuple[bool, str]] = {}
    for line in lines:
        parts = line.split(" ", 2)
        if len(parts) != 3 or not _INDEX.fullmatch(parts[0]) or parts[1] not in ("0", "1"):
            return None  # '²'.isdigit() is True but int('²') raises: ASCII digits only, at most 6
        k = int(parts[0])
        if k >= n_items or k in results:
            return None
        results[k] = (parts[1] == "1", parts[2])
    return results


def _refuse(why: str, warn: bool = False) -> None:
    """Log why a frame was refused (its run scores 0): a frame the program tampered with at WARNING the first time
    in a process, everything else (timeouts and crashes are common) at DEBUG."""
    level = logging.WARNING if warn and why not in _warned else logging.DEBUG
    _warned.add(why)
    logger.log(level, "code harness: frame refused, its tests score 0: %s", why)
    return None
