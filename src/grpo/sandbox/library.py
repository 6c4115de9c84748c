"""The library calls a test may make, evaluated by the judge with its own imports on plain values.

    imports = import_table(["import math as m", "from numpy import allclose as close"])
        -> {"m": "math", "close": "numpy.allclose"}
    qualname(ast.parse("m.isclose", mode="eval").body, imports)  -> "math.isclose"
    call("numpy.allclose", [[1.0, 2.0], [1.0, 2.0]], {})          -> True (the judge's numpy; plain values back)

A test's imports (in the same string or in another string of the row: MBPP keeps `import math` in a setup string)
name modules; a call through any of those names (`import math as m`, `from math import isclose as close`, `cmath`,
`numpy`, `re`) is resolved to its qualified name and, when that name is in LIBRARY, evaluated here, never in the
sandbox: the program cannot patch, shadow or replace what the judge calls (sys.modules, __import__, np.all), and
what it returned reaches the call only as a plain value (wire.py), so an object with its own __eq__ or
__array_function__ never does. A call of an imported module that is not in LIBRARY makes the test unverifiable.
Results are reduced to plain values (a numpy array to a list, a numpy scalar to its Python value); a re.Match stays
the judge's own Match (only its methods in MATCH_METHODS may be called on it).
"""

from __future__ import annotations

import ast
import cmath
import math
import re
from typing import Any

__all__ = ["LIBRARY", "CONSTANTS", "MATCH_METHODS", "import_table", "qualname", "call", "is_library_module"]

_MATH = ("isclose", "sqrt", "fabs", "floor", "ceil", "log", "log2", "log10", "exp", "pow", "gcd", "lcm", "factorial",
         "comb", "perm", "hypot", "trunc", "isqrt", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "degrees",
         "radians", "isfinite", "isnan", "isinf", "prod", "fsum", "copysign", "dist")
_CMATH = ("isclose", "sqrt", "exp", "log", "log10", "phase", "polar", "rect", "isfinite", "isnan", "isinf")
_RE = ("fullmatch", "match", "search", "findall", "split", "sub", "escape")
_NUMPY = ("allclose", "isclose", "array_equal", "array_equiv", "all", "any", "array", "asarray", "sum", "prod",
          "mean", "round", "abs", "sort", "isnan", "isinf", "isfinite", "sqrt", "max", "min", "argmax", "argmin")
_KW = {"isclose": {"rel_tol", "abs_tol"}, "allclose": {"rtol", "atol", "equal_nan"}, "round": {"decimals"},
       "fullmatch": {"flags"}, "match": {"flags"}, "search": {"flags"}, "findall": {"flags"},
       "split": {"maxsplit", "flags"}, "sub": {"count", "flags"}, "log": set(), "array_equal": {"equal_nan"}}
_NUMPY_KW = {"isclose": {"rtol", "atol", "equal_nan"}, "round": {"decimals"}}

# qualified name -> allowed keywords; the function itself is looked up in the judge's own module at call time
LIBRARY: dict[str, frozenset[str]] = {
    **{f"math.{n}": frozenset(_KW.get(n, ())) for n in _MATH},
    **{f"cmath.{n}": frozenset(_KW.get(n, ())) for n in _CMATH},
    **{f"re.{n}": frozenset(_KW.get(n, ())) for n in _RE},
    **{f"numpy.{n}": frozenset(_NUMPY_KW.get(n, _KW.get(n, ()))) for n in _NUMPY},
}
_FLAGS = {"I": re.I, "IGNORECASE": re.I, "M": re.M, "MULTILINE": re.M, "S": re.S, "DOTALL": re.S, "X": re.X,
          "VERBOSE": re.X, "A": re.A, "ASCII": re.A}
CONSTANTS: dict[str, Any] = {
    **{f"math.{n}": getattr(math, n) for n in ("pi", "e", "inf", "nan", "tau")},
    **{f"cmath.{n}": getattr(cmath, n) for n in ("pi", "e", "inf", "nan", "tau", "infj", "nanj")},
    **{f"numpy.{n}": getattr(math, n) for n in ("pi", "e", "inf", "nan")},
    **{f"re.{n}": int(v) for n, v in _FLAGS.items()},
}
MATCH_METHODS = frozenset({"group", "groups", "span", "start", "end", "groupdict"})
_MODULES = {"math": math, "cmath": cmath, "re": re}
_HUGE = 10_000  # math.factorial/comb/perm/pow/exp/lcm of an argument past this: refused (a stall, not a value)


def is_library_module(name: str) -> bool:
    return name in ("math", "cmath", "re", "numpy")


def import_table(sources: list[str]) -> dict[str, str]:
    """Local name -> qualified name for every import statement at the top of `sources` (or inside a top-level
    `def check`): `import numpy as np` -> np: numpy; `from math import isclose as c` -> c: math.isclose; `import
    os.path` -> os: os. `from M import *` of a library module binds each name of LIBRARY/CONSTANTS under M."""
    table: dict[str, str] = {}
    for src in sources:
        try:
            body = ast.parse(src).body
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            continue
        stmts = list(body)
        for s in body:
            if isinstance(s, ast.FunctionDef) and s.name == "check":
                stmts += s.body
        for s in stmts:
            if isinstance(s, ast.Import):
                for a in s.names:
                    table[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(s, ast.ImportFrom) and s.module and not s.level:
                for a in s.names:
                    if a.name == "*":
                        prefix = s.module + "."
                        for q in (*LIBRARY, *CONSTANTS):
                            if q.startswith(prefix) and "." not in q[len(prefix):]:
                                table[q[len(prefix):]] = q
                    else:
                        table[a.asname or a.name] = f"{s.module}.{a.name}"
    return table


def qualname(node: ast.expr, imports: dict[str, str]) -> str | None:
    """The qualified name `node` (a name or an attribute chain) stands for through the test's imports; None when
    its root is not an imported name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in imports:
        return None
    return ".".join([imports[node.id], *reversed(parts)])


def call(name: str, args: list, kwargs: dict) -> Any:
    """The judge's own `name` (a key of LIBRARY) on plain `args`; the result as a plain value (or a re.Match)."""
    module, _, attr = name.rpartition(".")
    if set(kwargs) - LIBRARY[name]:
        raise ValueError(f"{name}() with keywords {sorted(kwargs)}")
    if module == "math" and attr in ("pow", "factorial", "comb", "perm", "exp", "lcm") and any(
            type(a) in (int, float) and abs(a) > _HUGE for a in args):
        raise ValueError(f"math.{attr} of a huge number")
    if module == "numpy":
        import numpy

        fn = getattr(numpy, attr)
        out = fn(*args, **kwargs)
        return out.tolist() if isinstance(out, (numpy.ndarray, numpy.generic)) else out
    return getattr(_MODULES[module], attr)(*args, **kwargs)
