"""The judging half of the code checks (checks.py parses the tests): an assertion evaluated over the values its holes
took in the sandbox, and the comparisons of values and of printed output. Only trusted code runs: the judge's own
builtins, math and the library calls of library.py, on fresh plain values (wire.py), within a byte budget; under
code_tests all of it runs in the judge's own process, under a time and a memory budget (budget.py).

Comparison: exact by default. Integers compare as integers (True is not 1; an int on either side: no tolerance);
floats compare with floats only, within rel_tol = float_tol and an absolute floor ABS_FLOOR (1e-9), so `== 0.0` does
not pass 1e-7. In I/O tests an expected token that is an integer must match character for character ("0012" is not
"12", "1e6" is not "1000000"); an expected float token compares as a float with a printed float, and exactly with
a printed integer ("1000000.0" is not 1000001). Booleans are not numbers: `False != 0` and `True > 0` fail. Values
the checker builds are held to MAX_BUILD_BYTES (`[0] * n`, `s * k`, concatenation, range, list(), x ** k), refused
before they are built.
"""

from __future__ import annotations

import ast
import builtins
import cmath
import math
import re
from decimal import Decimal
from typing import Any

from grpo.sandbox import library
from grpo.sandbox.library import MATCH_METHODS
__all__ = ["evaluate_check", "dry_run", "values_equal", "io_equal", "HoleFailed", "TooLarge", "ABS_FLOOR",
           "MAX_BUILD_BYTES"]

_KEYWORDS = {"round": {"ndigits"}, "sorted": {"reverse"}, "isclose": {"rel_tol", "abs_tol"}}
_MAX_POW = 64  # x ** k: |k| at most this, k a literal
MAX_BUILD_BYTES = 16 * 1024 * 1024  # the largest value the checker builds (a list counts 8 bytes an item)
ABS_FLOOR = 1e-9  # the absolute tolerance of float == float (with rel_tol = float_tol)


class HoleFailed(Exception):
    """A hole the check needs raised in the sandbox, was not serialisable, or has no value."""


class TooLarge(Exception):
    """A value the checker would build is over MAX_BUILD_BYTES (refused before it is built; not a MemoryError, which
    in the judge process means its real memory budget ran out: budget.py)."""


def evaluate_check(check, values: dict[int, Any], float_tol: float = 0.0) -> bool:
    """True if the assertion holds for the holes' `values` (hole index -> plain value; a missing index is a hole
    that failed). Equality compares floats with math.isclose(rel_tol=abs_tol=float_tol). Never raises."""
    try:
        return bool(_Eval(values, float_tol).run(check.test))
    except Exception:  # noqa: BLE001 - a type error, a missing hole, a huge repeat: the test fails
        return False


class _Eval:
    def __init__(self, values: dict[int, Any], tol: float) -> None:
        self.values, self.tol = values, tol

    def run(self, n: ast.expr) -> Any:  # noqa: C901 - one case per node type
        if isinstance(n, ast.Constant):
            return n.value
        if isinstance(n, ast.Name):
            k = int(n.id.removeprefix("__hole_").removesuffix("__"))
            if k not in self.values:
                raise HoleFailed(k)
            return self.values[k]
        if isinstance(n, (ast.Tuple, ast.List, ast.Set)):
            items = [self.run(e) for e in n.elts]
            return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(n)](items)
        if isinstance(n, ast.Dict):
            if any(k is None for k in n.keys):
                raise ValueError("** in a dict display")
            return {self.run(k): self.run(v) for k, v in zip(n.keys, n.values)}
        if isinstance(n, ast.UnaryOp):
            v = self.run(n.operand)
            if isinstance(n.op, ast.Not):
                return not v
            _number(v)
            return {ast.USub: lambda x: -x, ast.UAdd: lambda x: +x, ast.Invert: lambda x: ~x}[type(n.op)](v)
        if isinstance(n, ast.BinOp):
            return _binop(n, self.run(n.left), self.run(n.right))
        if isinstance(n, ast.BoolOp):
            v = None
            for e in n.values:
                v = self.run(e)
                if isinstance(n.op, ast.And) != bool(v):
                    return v
            return v
        if isinstance(n, ast.IfExp):
            return self.run(n.body) if self.run(n.test) else self.run(n.orelse)
        if isinstance(n, ast.Compare):
            left = self.run(n.left)
            for op, e in zip(n.ops, n.comparators):
                right = self.run(e)
                if not self._compare(op, left, right):
                    return False
                left = right
            return True
        if isinstance(n, ast.Subscript):
            return self.run(n.value)[self.run(n.slice)]
        if isinstance(n, ast.Slice):
            return slice(*(None if e is None else self.run(e) for e in (n.lower, n.upper, n.step)))
        if isinstance(n, ast.Call):
            return self._call(n)
        raise ValueError(f"unsupported node {type(n).__name__}")

    def _compare(self, op: ast.cmpop, a: Any, b: Any) -> bool:
        if isinstance(op, ast.Eq):
            return values_equal(a, b, self.tol)
        if isinstance(op, ast.NotEq):  # unequal even with booleans read as numbers: False never passes `!= 0`
            return not values_equal(a, b, self.tol) and not _equal(a, b, self.tol, 0, loose=True)
        if isinstance(op, (ast.Is, ast.IsNot)):
            if not any(x is None or x is True or x is False for x in (a, b)):
                raise ValueError("`is` with something other than None/True/False")
            return (a is b) == isinstance(op, ast.Is)
        if _bool_vs_number(a, b):
            raise TypeError("an order between a bool and a number (booleans are not numbers)")
        return {ast.Lt: lambda: a < b, ast.LtE: lambda: a <= b, ast.Gt: lambda: a > b, ast.GtE: lambda: a >= b,
                ast.In: lambda: a in b, ast.NotIn: lambda: a not in b}[type(op)]()

    def _call(self, n: ast.Call) -> Any:
        name = n.func.id if isinstance(n.func, ast.Name) else n.func.attr
        args = [self.run(a) for a in n.args]
        kwargs = {kw.arg: self.run(kw.value) for kw in n.keywords}
        if name.startswith("__lib__"):  # a library call of the test (library.py): the judge's own
            return library.call(name[len("__lib__"):], args, kwargs)
        if isinstance(n.func, ast.Attribute) and name in MATCH_METHODS:
            receiver = self.run(n.func.value)
            if type(receiver) is not re.Match or kwargs:
                raise TypeError(f".{name}() of something other than the judge's re.Match")
            return getattr(receiver, name)(*args)
        if set(kwargs) - _KEYWORDS.get(name, set()):
            raise ValueError(f"{name}() with keywords {sorted(kwargs)}")
        if isinstance(n.func, ast.Attribute) and not isinstance(n.func.value, ast.Name):  # a method of a literal str
            receiver = self.run(n.func.value)
            if type(receiver) is not str or any(type(a) is not str for a in args):
                raise TypeError("a str method needs str arguments")
            return getattr(str, name)(receiver, *args)
        if name == "isclose":
            return math.isclose(*args, **kwargs)
        if name == "int" and len(args) == 1 and isinstance(args[0], str) and len(args[0]) > 4000:
            raise ValueError("int() of a huge string")
        if name == "range":
            _budget(len(range(*args)) * 8)
        elif name in ("list", "tuple", "set", "frozenset", "sorted", "dict") and args:
            _budget(_length(args[0]) * 8)
        return getattr(builtins, name)(*args, **kwargs)


def dry_run(plan) -> None:
    """Evaluate, once, every part of each call check of `plan` that does not depend on the program (the expected
    side, `round(5, -10**9)`): for the cost only, errors ignored (the check then fails when judged). Runs in the
    judge process at parse time (budget.py), so test text too costly to judge is caught per row, before training
    uses it. A real MemoryError (the judge process's RLIMIT_AS) propagates."""
    ev = _Eval({}, 0.0)
    for check in plan.calls:
        _fixed_parts(check.test, ev)


def _fixed_parts(node: ast.AST, ev: _Eval) -> None:
    if isinstance(node, ast.expr) and not any(isinstance(n, ast.Name) and n.id.startswith("__hole_")
                                              for n in ast.walk(node)):
        if not isinstance(node, ast.Constant):
            try:
                ev.run(node)
            except MemoryError:
                raise
            except Exception:  # noqa: BLE001 - a value error of the expected side: judged (and failed) later
                pass
        return
    for child in ast.iter_child_nodes(node):
        _fixed_parts(child, ev)


def _number(v: Any) -> None:
    if type(v) not in (int, float, bool, complex):
        raise TypeError(f"arithmetic on {type(v).__name__}")


def _budget(nbytes: int) -> None:
    """Refuse, before building it, a value over MAX_BUILD_BYTES (the check then fails: never a trainer's OOM)."""
    if nbytes > MAX_BUILD_BYTES:
        raise TooLarge(f"a value of ~{nbytes} bytes (more than MAX_BUILD_BYTES)")


def _length(v: Any) -> int:
    return len(v) if isinstance(v, (str, list, tuple, set, frozenset, dict, range)) else 0


def _bytes(seq: Any, n: int) -> int:
    """Bytes of a sequence of `n` items of seq's kind: a str 1 a character, a list or tuple 8 an item."""
    return n if type(seq) is str else 8 * n


def _binop(n: ast.BinOp, a: Any, b: Any) -> Any:
    op = type(n.op)
    if op is ast.Add:
        if type(a) in (str, list, tuple) and type(a) is type(b):
            _budget(_bytes(a, len(a) + len(b)))
            return a + b
        _number(a), _number(b)
        return a + b
    if op is ast.Mult:
        seq = [x for x in (a, b) if type(x) in (str, list, tuple)]
        if seq:
            k = b if seq[0] is a else a
            if type(k) is not int or len(seq) != 1:
                raise ValueError("sequence repeated by a non-int")
            _budget(_bytes(seq[0], len(seq[0]) * max(k, 0)))  # length x count, not the count alone
            return a * b
        _number(a), _number(b)
        if type(a) is int and type(b) is int:
            _budget((a.bit_length() + b.bit_length()) // 8)
        return a * b
    if op is ast.Pow:
        if not isinstance(n.right, ast.Constant) or type(b) is not int or abs(b) > _MAX_POW:
            raise ValueError("** needs a small literal exponent")
        _number(a)
        if type(a) is int:
            _budget(a.bit_length() * abs(b) // 8)
        return a**b
    _number(a), _number(b)
    fns = {ast.Sub: lambda: a - b, ast.Div: lambda: a / b, ast.FloorDiv: lambda: a // b, ast.Mod: lambda: a % b}
    if op not in fns:
        raise ValueError(f"operator {op.__name__}")
    return fns[op]()


def values_equal(a: Any, b: Any, tol: float = 0.0) -> bool:
    """== on plain values, exact by default: a bool equals only a bool (True is not 1), an int compares exactly
    with an int or a float (no tolerance where an int is involved), and two floats compare with
    math.isclose(rel_tol=tol, abs_tol=ABS_FLOOR) when tol > 0; [1] != (1,). Depth-limited: never recurses past the
    depth the wire format allows."""
    return _equal(a, b, tol, 0)


def _bool_vs_number(a: Any, b: Any) -> bool:
    return (type(a) is bool) != (type(b) is bool) and {type(a), type(b)} - {bool} <= {int, float, complex}


def _equal(a: Any, b: Any, tol: float, depth: int, loose: bool = False) -> bool:
    """values_equal; loose: a bool equals the number it stands for (only to refuse `!=` between them)."""
    if depth > 100:
        raise RecursionError("values nested too deeply")
    ta, tb = type(a), type(b)
    if (ta is bool or tb is bool) and not loose:
        return ta is tb and a == b
    if ta is float and tb is float and tol > 0:
        return math.isclose(a, b, rel_tol=tol, abs_tol=ABS_FLOOR)
    if tol > 0 and complex in (ta, tb) and {ta, tb} <= {float, complex}:  # an int involved: exact
        return cmath.isclose(a, b, rel_tol=tol, abs_tol=ABS_FLOOR)
    if ta in (list, tuple) or tb in (list, tuple):
        return ta is tb and len(a) == len(b) and all(_equal(x, y, tol, depth + 1, loose) for x, y in zip(a, b))
    if ta is dict or tb is dict:
        return ta is tb and a.keys() == b.keys() and all(_equal(a[k], b[k], tol, depth + 1, loose) for k in a)
    return a == b


def io_equal(got: str, want: str, tol: float = 0.0) -> bool:
    """Stdout against the expected output, whitespace-normalised: leading/trailing blank lines and spaces at the
    ends of lines are ignored, runs of spaces inside a line count as one. With tol > 0, an expected token that is a
    float literal (a '.', an exponent, inf or nan) compares with a printed number within rel_tol = tol and
    ABS_FLOOR; every other token, integers included, must match exactly."""
    g, w = _lines(got), _lines(want)
    if g == w:
        return True
    if tol <= 0 or len(g) != len(w):
        return False
    for gl, wl in zip(g, w):
        gt, wt = gl.split(" "), wl.split(" ")
        if len(gt) != len(wt):
            return False
        for x, y in zip(gt, wt):
            if x != y and not _close_tokens(x, y, tol):
                return False
    return True


def _lines(s: str) -> list[str]:
    return [" ".join(line.split()) for line in s.strip().splitlines()]


def _close_tokens(got: str, want: str, tol: float) -> bool:
    if len(got) > 64 or len(want) > 64 or not _FLOAT_TOKEN.fullmatch(want):  # an integer token: exact only
        return False
    if _INT_TOKEN.fullmatch(got):  # an integer printed: exactly the expected value ("1000000.0" is not 1000001)
        try:
            return Decimal(got) == Decimal(want)
        except ArithmeticError:
            return False
    try:
        fg, fw = float(got), float(want)
    except ValueError:
        return False
    return math.isclose(fg, fw, rel_tol=tol, abs_tol=ABS_FLOOR)


_INT_TOKEN = re.compile(r"[+-]?\d+")
# a float literal as a program prints one: digits with a '.' or an exponent, or inf/nan (bounded length above)
_FLOAT_TOKEN = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+|\d+(?:\.\d*)?[eE][+-]?\d+|inf|nan|infinity)", re.IGNORECASE)
