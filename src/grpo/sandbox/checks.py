"""Test cases of the code reward, split into what runs in the sandbox and what is judged outside it.

    parse_tests(["assert add(1, 2) == 3"])            -> TestPlan(calls=[CallCheck(holes=("add(1, 2)",), ...)])
    parse_tests("def check(candidate):\\n    assert candidate(2) == 4\\n", entry_point="square")
    parse_tests([{"input": "1 2\\n", "output": "3\\n"}])  -> TestPlan(io=[IOCheck("1 2\\n", "3\\n")])

Forms (a row's `tests`: one string of test code, a list of such strings, or I/O dicts):
  call checks   `assert EXPR` where every piece of EXPR that runs the program's code is a call (or an attribute)
                of a name the program defines: `add(1, 2)`, `candidate([1, 2])`, `Stack().size()`. Those pieces
                ("holes") are the only thing the sandbox evaluates; the rest (the comparison, the expected value,
                abs/len/sorted/set/range/round/isclose, a few str methods of literals, arithmetic, indexing, and
                the library calls of library.py: math, cmath, re, numpy functions through any import of the row,
                `import math as m`, `from math import isclose as close`, in the same string or another) is
                evaluated here, in the trainer, with the trainer's own builtins and imports, by `evaluate_check`
                over the holes' values. The expected side comes from the test text alone: a comparison (or a call)
                with more than one side calling the program, wherever it is (`bool(f(1) == f(2))`), or a call of
                a module the judge does not list (`os.path.exists`, `np.linalg.norm`) cannot be judged here and
                makes the test unverifiable. The expected values never enter the sandbox.
                HumanEval's `def check(candidate): assert ...` is read with `candidate` = the row's entry point;
                a function named like a builtin (entry_point="max") is the program's, never ours.
                Imports become a prelude the sandbox runs after the solution; `NAME = <literal>` is substituted.
  I/O checks    {"input": str, "output": str} (or APPS' {"inputs": [...], "outputs": [...]}): the program reads
                stdin; its stdout is compared here, whitespace-normalised.
  unverifiable  anything else (loops, helper functions, assignments of computed values, `assert` over names the
                checker cannot see): the test source runs in the sandbox as before and the program's own process
                reports whether it raised. That verdict can be forged (docs/rewards.md, threat model).
An assert that calls nothing (`assert True`) does not involve the program and is dropped; one that calls only
builtins (`assert max([1, 5, 3]) == 5`, where the program may define `max`) is unverifiable, never dropped.

Comparison (values_equal, io_equal) and evaluation live in judge.py: exact by default, within a byte budget.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

from grpo.sandbox.judge import (ABS_FLOOR, MAX_BUILD_BYTES, HoleFailed, dry_run, evaluate_check, io_equal,
                                values_equal)
from grpo.sandbox.library import CONSTANTS, LIBRARY, MATCH_METHODS, import_table, qualname

__all__ = ["CallCheck", "IOCheck", "TestPlan", "parse_tests", "evaluate_check", "dry_run", "values_equal",
           "io_equal", "HoleFailed", "ABS_FLOOR", "MAX_BUILD_BYTES", "MAX_SUBSTITUTED_NODES"]

# calls the checker evaluates itself, on plain values (never the program's function of the same name)
_SAFE_CALLS = {"abs", "len", "round", "sorted", "set", "frozenset", "tuple", "list", "min", "max", "sum", "all",
               "any", "float", "int", "str", "bool", "isclose", "range", "dict", "complex"}
# a library's usual name is the library even where the test forgets its import (the program may bind the name)
MAX_SUBSTITUTED_NODES = 20_000  # AST nodes of an assert after its `NAME = literal` constants are substituted
_DEFAULT_MODULES = {"math": "math", "cmath": "cmath", "re": "re", "numpy": "numpy", "np": "numpy"}
_STR_METHODS = {"upper", "lower", "strip", "lstrip", "rstrip", "split", "title", "capitalize", "startswith",
                "endswith", "isdigit", "isalpha", "swapcase", "casefold"}  # called on a literal string: ours



@dataclass(frozen=True)
class CallCheck:
    """One assertion judged outside the sandbox. `holes` are the call expressions (source) the sandbox evaluates;
    `test` is the assertion's expression with hole k replaced by the name `__hole_k__` (an index into `holes`)."""

    source: str
    holes: tuple[str, ...]
    test: ast.expr = field(compare=False, repr=False)


@dataclass(frozen=True)
class IOCheck:
    input: str
    output: str


@dataclass
class TestPlan:
    """A row's tests: call checks (one sandbox run for all), I/O checks (one run each) and unverifiable sources."""

    calls: list[CallCheck] = field(default_factory=list)
    io: list[IOCheck] = field(default_factory=list)
    unverifiable: list[str] = field(default_factory=list)
    prelude: list[str] = field(default_factory=list)  # import statements, run in the sandbox after the solution
    judge_s: float = 0.0  # CPU seconds the judge spent parsing the row (budget.py): charged to each completion
    over_budget: str = ""  # why the row's parse ran past the judge's budget: its completions score 0, unrun

    @property
    def n(self) -> int:
        return len(self.calls) + len(self.io) + len(self.unverifiable)


class _Unsupported(Exception):
    """The statement is not in a form the checker can judge outside the sandbox."""


# ---------------------------------------------------------------------------------------------------- parsing


def parse_tests(tests: Any, entry_point: str | None = None) -> TestPlan:
    """Split a row's `tests` into a TestPlan (see the module docstring). Raises ValueError for a value that is no
    test form at all (a number, a dict without input/output, a `check(candidate)` without an entry point)."""
    plan = TestPlan()
    if tests is None:
        return plan
    items = [tests] if isinstance(tests, (str, dict)) else list(tests)
    # the row's imports, wherever they are (MBPP keeps `import math` in its own string): library.py
    imports = {**_DEFAULT_MODULES, **import_table([i for i in items if isinstance(i, str)])}
    for item in items:
        if isinstance(item, dict):
            plan.io += _io_checks(item)
        elif isinstance(item, str):
            if item.strip():
                _add_source(plan, item, entry_point, imports)
        else:
            raise ValueError(f"a test must be a string of test code or an {{'input', 'output'}} dict, got "
                             f"{type(item).__name__} {item!r:.80}")
    return plan


def _io_checks(item: dict) -> list[IOCheck]:
    if "input" in item and "output" in item:
        return [IOCheck(_text(item["input"], "input"), _text(item["output"], "output"))]
    if "inputs" in item and "outputs" in item and "fn_name" not in item:
        ins, outs = item["inputs"], item["outputs"]
        if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs):
            raise ValueError("an I/O test's 'inputs' and 'outputs' must be lists of the same length")
        return [IOCheck(_text(i, "inputs"), _text(o, "outputs")) for i, o in zip(ins, outs)]
    raise ValueError(f"an I/O test is {{'input': str, 'output': str}} (or {{'inputs': [...], 'outputs': [...]}}), "
                     f"got keys {sorted(item)}")


def _text(v: Any, name: str) -> str:
    if isinstance(v, list):  # APPS keeps some inputs as lists of lines
        v = "\n".join(str(x) for x in v)
    if not isinstance(v, str):
        raise ValueError(f"an I/O test's {name!r} must be a string, got {type(v).__name__}")
    return v


def _add_source(plan: TestPlan, src: str, entry_point: str | None, imports: dict[str, str]) -> None:
    """Add one string of test code: all its asserts as call checks if every statement is supported (an assert the
    checker cannot place makes the whole string one unverifiable test)."""
    try:
        module = ast.parse(src)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # (ValueError: a NUL byte)
        plan.unverifiable.append(src)
        return
    consts: dict[str, ast.expr] = {}
    calls: list[CallCheck] = []
    prelude: list[str] = []
    has_check = any(isinstance(s, ast.FunctionDef) and s.name == "check" for s in module.body)
    if has_check and not entry_point:
        raise ValueError("the tests define check(candidate) but the row has no 'entry_point' column naming the "
                         "function to check")
    try:
        for stmt in module.body:
            _statement(stmt, consts, calls, prelude, entry_point, imports, top=True)
    except (_Unsupported, RecursionError):  # RecursionError: constants nested past the interpreter's depth
        if has_check and not any(_calls_check(s) for s in module.body):
            src = f"{src}\ncheck({entry_point})\n"
        plan.unverifiable.append(src)
        return
    plan.calls += calls
    plan.prelude += [p for p in prelude if p not in plan.prelude]


def _calls_check(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Name)
            and stmt.value.func.id == "check")


def _statement(stmt: ast.stmt, consts: dict, calls: list, prelude: list, entry_point: str | None, imports: dict,
               top: bool) -> None:
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        prelude.append(ast.unparse(stmt))
    elif isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
        pass
    elif (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
          and _is_literal(stmt.value, consts)):
        consts[stmt.targets[0].id] = _substitute(stmt.value, consts, {})
    elif isinstance(stmt, ast.Assert):
        check = _call_check(stmt, consts, {entry_point} - {None}, imports)
        if check is not None:
            calls.append(check)
    elif top and isinstance(stmt, ast.FunctionDef) and stmt.name == "check":
        args = stmt.args
        if (len(args.args) != 1 or args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs
                or stmt.decorator_list):
            raise _Unsupported
        inner = dict(consts)
        inner[args.args[0].arg] = ast.Name(entry_point, ast.Load())
        for s in stmt.body:
            _statement(s, inner, calls, prelude, entry_point, imports, top=False)
    elif top and _calls_check(stmt) and entry_point:
        pass  # check(entry_point): the asserts inside check() are the tests
    else:
        raise _Unsupported


def _is_literal(node: ast.expr, consts: dict) -> bool:
    try:
        ast.literal_eval(_substitute(node, consts, {}))
        return True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


def _substitute(node: ast.expr, consts: dict, holes: dict) -> ast.expr:
    """A copy of `node` with constant names replaced by their literal; _Unsupported when the result would hold more
    than MAX_SUBSTITUTED_NODES nodes (constants built from constants grow exponentially: `b = [a, a, a]`, ...)."""
    size = [_nodes(node, MAX_SUBSTITUTED_NODES)]

    class Sub(ast.NodeTransformer):
        def visit_Name(self, n: ast.Name) -> ast.AST:
            if isinstance(n.ctx, ast.Load) and n.id in consts:
                size[0] += _nodes(consts[n.id], MAX_SUBSTITUTED_NODES)
                if size[0] > MAX_SUBSTITUTED_NODES:
                    raise _Unsupported
                return consts[n.id]
            return n

    return ast.fix_missing_locations(Sub().visit(_copy(node)))


def _nodes(node: ast.AST, limit: int) -> int:
    """The number of nodes under `node`, counted up to limit + 1 (so a huge tree costs no more than the limit)."""
    n = 0
    for _ in ast.walk(node):
        n += 1
        if n > limit:
            break
    return n


def _copy(node: ast.AST) -> ast.AST:
    return ast.parse(ast.unparse(node), mode="eval").body if isinstance(node, ast.expr) else node


def _call_check(stmt: ast.Assert, consts: dict, program: set[str], imports: dict[str, str]) -> CallCheck | None:
    """The assert as a CallCheck; None when it calls nothing at all (`assert True`: no program involved); or
    _Unsupported: calls but no hole (it may test a builtin-named function of the program: `assert max([1, 5]) ==
    5`), a hole that is not the program's code, or an expected side that calls the program."""
    test = _substitute(stmt.test, consts, {})
    if not any(isinstance(n, ast.Call) for n in ast.walk(test)):
        return None
    holes: list[str] = []
    shaped = _Holes(holes, program, imports).visit(test)
    if not holes or not _one_sided(shaped):
        raise _Unsupported
    return CallCheck(ast.unparse(ast.Assert(stmt.test, None)), tuple(holes), ast.fix_missing_locations(shaped))


def _has_hole(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) and n.id.startswith("__hole_") for n in ast.walk(node))


def _one_sided(node: ast.expr) -> bool:
    """Whether every comparison in `node`, wherever it is (`bool(f(1) == f(2))`, `int(...)`), has its expected side
    free of the program: of a comparison's operands, and of a call's arguments (isclose, np.allclose, max, ...), at
    most one calls the program."""
    for n in ast.walk(node):
        if isinstance(n, ast.Compare) and sum(map(_has_hole, [n.left, *n.comparators])) > 1:
            return False  # `0 < f(1) <= 2` is one-sided; `f(1) == f(2)` is not
        if isinstance(n, ast.Call) and not _is_hole(n) and sum(
                map(_has_hole, [*n.args, *(k.value for k in n.keywords)])) > 1:
            return False
    return True


def _is_hole(n: ast.AST) -> bool:
    return isinstance(n, ast.Name) and n.id.startswith("__hole_")


def _name(f: ast.expr) -> str | None:
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _root(node: ast.expr) -> str | None:
    """The name an attribute/call/subscript chain starts from (`Stack().push(1).size` -> 'Stack'); None for a
    literal receiver."""
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


class _Holes(ast.NodeTransformer):
    """Replace every piece that runs program code by `__hole_k__`, checking the rest is judgeable outside.
    program: names that are the program's even when they look like builtins (the entry point); imported: module
    names bound by the row's imports -> qualified names (library.py): a call through one of them is evaluated by
    the judge when the name is in LIBRARY (the call becomes `__lib__<qualname>(...)`), else it is unverifiable."""

    def __init__(self, holes: list[str], program: set[str] = frozenset(), imports: dict | None = None) -> None:
        self.holes, self.program, self.imports = holes, set(program), dict(imports or {})
        for name in self.program:
            self.imports.pop(name, None)  # the entry point is the program's, whatever the test imports

    def _hole(self, node: ast.expr) -> ast.Name:
        root = _root(node)
        if root is None or root in self.imports:
            raise _Unsupported  # library code or a method of a literal: neither the program's nor ours
        self.holes.append(ast.unparse(node))
        return ast.Name(f"__hole_{len(self.holes) - 1}__", ast.Load())

    def _arguments(self, node: ast.Call) -> ast.Call:
        if any(kw.arg is None for kw in node.keywords) or any(isinstance(a, ast.Starred) for a in node.args):
            raise _Unsupported
        node.args = [self.visit(a) for a in node.args]
        for kw in node.keywords:
            kw.value = self.visit(kw.value)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        q = qualname(node.func, self.imports)
        if q is not None:  # a library call: the judge's own, on the values (or unverifiable)
            if q not in LIBRARY:
                raise _Unsupported
            node.func = ast.Name(f"__lib__{q}", ast.Load())
            return self._arguments(node)
        f = node.func
        if (isinstance(f, ast.Attribute) and f.attr in MATCH_METHODS and isinstance(f.value, ast.Call)
                and (qualname(f.value.func, self.imports) or "").startswith("re.")):
            f.value = self.visit(f.value)  # re.fullmatch(p, f(x)).group(1): a method of the judge's own Match
            return self._arguments(node)
        if not _safe_call(node, self.program):
            return self._hole(node)
        if any(kw.arg is None for kw in node.keywords) or any(isinstance(a, ast.Starred) for a in node.args):
            raise _Unsupported
        if isinstance(node.func, ast.Attribute) and not isinstance(node.func.value, ast.Name):  # "abc".upper()
            node.func.value = self.visit(node.func.value)
        node.args = [self.visit(a) for a in node.args]
        for kw in node.keywords:
            kw.value = self.visit(kw.value)
        return node  # the function's name stays: evaluate_check calls the checker's own version

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        q = qualname(node, self.imports)
        if q in CONSTANTS:
            return ast.Constant(CONSTANTS[q])  # math.pi, np.inf, re.IGNORECASE: the judge's values
        return self._hole(node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        q = qualname(node, self.imports)
        if q in CONSTANTS:
            return ast.Constant(CONSTANTS[q])  # from math import pi
        raise _Unsupported  # a name the checker does not know (constants were substituted)

    def generic_visit(self, node: ast.AST) -> ast.AST:
        if not isinstance(node, _ALLOWED):
            raise _Unsupported
        return super().generic_visit(node)


_ALLOWED = (ast.Constant, ast.Tuple, ast.List, ast.Set, ast.Dict, ast.UnaryOp, ast.BinOp, ast.BoolOp, ast.Compare,
            ast.IfExp, ast.Call, ast.Subscript, ast.Slice, ast.keyword, ast.Load, ast.operator, ast.unaryop,
            ast.boolop, ast.cmpop, ast.expr_context)


def _safe_call(node: ast.Call, program: set[str] = frozenset()) -> bool:
    """Whether the checker evaluates this call itself: a builtin of _SAFE_CALLS (not a name the program owns, such
    as its entry point) or a str method of a literal string. (Library calls: _Holes.visit_Call.)"""
    f = node.func
    if isinstance(f, ast.Name):
        return f.id in _SAFE_CALLS and f.id not in program
    if not isinstance(f, ast.Attribute) or isinstance(f.value, ast.Name):
        return False
    return f.attr in _STR_METHODS and isinstance(f.value, ast.Constant) and type(f.value.value) is str
