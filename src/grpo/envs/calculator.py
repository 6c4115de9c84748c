"""The built-in `calculator` tool: exact arithmetic on integers and fractions, parsed with `ast` (never eval).

Allowed: integer and decimal literals (a decimal is the exact fraction it writes: 0.1 is 1/10), + - * / // % **,
unary + and -, parentheses; '×' and '÷' read as * and /. Everything else (names, calls, attribute access,
subscripts, strings, comparisons, '^') is refused with a message naming it. Sizes are bounded: the expression's
length and node count, every intermediate value's digits, and a power's result size is estimated before it is
computed (so 9**9**9 is refused at once instead of hanging).
"""

from __future__ import annotations

import ast
import math
import operator
from fractions import Fraction

MAX_CHARS = 200
MAX_NODES = 100
MAX_DIGITS = 300  # of any numerator or denominator along the way
MAX_BITS = (10 ** MAX_DIGITS).bit_length()  # 10**300 passes, 10**301 does not

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


class CalculatorError(ValueError):
    """A refused or failing expression; its message is what the model reads."""


def _check_size(x: Fraction) -> Fraction:
    if x.numerator.bit_length() > MAX_BITS or x.denominator.bit_length() > MAX_BITS:
        raise CalculatorError(f"result too large (more than {MAX_DIGITS} digits)")
    return x


def _power(base: Fraction, exp: Fraction) -> Fraction:
    if exp.denominator != 1:
        raise CalculatorError("only integer powers are exact")
    e = exp.numerator
    bits = max(base.numerator.bit_length(), base.denominator.bit_length())
    if bits > 1 and abs(e) * (bits - 1) > MAX_BITS:  # |base|^e has at least |e|*(bits-1) bits
        raise CalculatorError(f"result too large (more than {MAX_DIGITS} digits)")
    if base == 0 and e < 0:
        raise CalculatorError("division by zero")
    return _check_size(base ** e)


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise CalculatorError(f"only numbers are allowed, not {node.value!r}")
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise CalculatorError(f"result too large (more than {MAX_DIGITS} digits)")
        return _check_size(Fraction(repr(node.value)) if isinstance(node.value, float) else Fraction(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        v = _eval(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            return _power(a, b)
        if isinstance(node.op, ast.BitXor):
            raise CalculatorError("'^' is not a power here: use **")
        fn = _BINARY.get(type(node.op))
        if fn is None:
            raise CalculatorError(f"operator {type(node.op).__name__} is not allowed")
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and b == 0:
            raise CalculatorError("division by zero")
        return _check_size(Fraction(fn(a, b)))
    what = {ast.Name: "names", ast.Attribute: "attribute access", ast.Call: "function calls",
            ast.Subscript: "subscripts"}.get(type(node), type(node).__name__)
    raise CalculatorError(f"{what} are not allowed: only numbers and + - * / // % ** ( )")


def evaluate(expression: str) -> Fraction:
    """The exact value of an arithmetic expression (module docstring); CalculatorError when refused."""
    if not isinstance(expression, str):
        raise CalculatorError(f"expression must be a string, got {type(expression).__name__}")
    text = expression.replace("×", "*").replace("÷", "/").strip()
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_CHARS:
        raise CalculatorError(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise CalculatorError(f"not an arithmetic expression: {e.msg}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalculatorError(f"expression has more than {MAX_NODES} parts")
    return _eval(tree)


def format_value(x: Fraction) -> str:
    """'42' for an integer, '-7/3' for a fraction."""
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: numbers with + - * / // % ** and parentheses, e.g. "347*56" or "(2+3)/4".
    """
    return format_value(evaluate(expression))


calculator.in_process = True  # pure and bounded: called directly, no thread or timeout needed
